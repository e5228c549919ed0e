//! The VM lifecycle as rules over states: what a user action or an agent
//! report does. Pure; handlers apply the result in one transaction.

use kumo_api_types::{ActualState, Power, VmState};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Start,
    Stop,
    Reboot,
    Delete,
    Shelve,
    Unshelve,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Start => "start",
            Action::Stop => "stop",
            Action::Reboot => "reboot",
            Action::Delete => "delete",
            Action::Shelve => "shelve",
            Action::Unshelve => "unshelve",
        }
    }

    /// The action a word names (the portal's forms post these).
    pub fn parse(s: &str) -> Option<Action> {
        [
            Action::Start,
            Action::Stop,
            Action::Reboot,
            Action::Delete,
            Action::Shelve,
            Action::Unshelve,
        ]
        .into_iter()
        .find(|a| a.as_str() == s)
    }
}

/// What an accepted action changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    pub state: VmState,
    pub desired_power: Power,
    pub bump_generation: bool,
}

/// `Err` names the state that forbids the action (answered as 409).
pub fn apply(
    state: VmState,
    desired: Power,
    action: Action,
    has_host: bool,
) -> Result<Effect, VmState> {
    use VmState::*;
    let effect = |state, desired_power, bump_generation| {
        Ok(Effect {
            state,
            desired_power,
            bump_generation,
        })
    };
    match (action, state) {
        (_, Deleting | Deleted) => Err(state),
        // Its host is gone: forgotten at once (should the host return, it
        // removes what it had, since the VM is no longer its own).
        (Action::Delete, Lost) => effect(Deleted, Power::Stopped, false),
        (_, Lost) => Err(state),
        // A shelved VM's disk is on a host even though the VM is not: its
        // deletion goes through that host.
        (Action::Delete, Shelved) => effect(Deleting, Power::Stopped, false),
        (Action::Unshelve, Shelved) => effect(Pending, Power::Running, false),
        (_, Shelved | Shelving) => Err(state),
        (Action::Shelve, Running | Stopped | Provisioning | Error) if has_host => {
            effect(Shelving, Power::Stopped, false)
        }
        (Action::Delete, _) if !has_host => effect(Deleted, Power::Stopped, false),
        (Action::Delete, _) => effect(Deleting, Power::Stopped, false),
        // Spot VMs being reclaimed, or reclaimed, and VMs waiting for room
        // can only be deleted (a queued one's deletion is its cancel).
        (_, Preempting | Preempted | Suspended | Pending | Queued) => Err(state),
        (Action::Start, Stopped) => effect(Provisioning, Power::Running, false),
        (Action::Stop, Running | Provisioning | Scheduled | Unknown)
            if desired == Power::Running =>
        {
            effect(state, Power::Stopped, false)
        }
        (Action::Reboot, Running) => effect(Running, Power::Running, true),
        _ => Err(state),
    }
}

/// The actions a user may take now, as the portal's buttons name them
/// (`unshelve-anywhere` beside `unshelve`): those [`apply`] accepts, so a
/// running VM is never offered "start".
pub fn offered(state: VmState, desired: Power, has_host: bool) -> Vec<&'static str> {
    let mut out = Vec::new();
    for a in [
        Action::Start,
        Action::Stop,
        Action::Reboot,
        Action::Shelve,
        Action::Unshelve,
        Action::Delete,
    ] {
        if apply(state, desired, a, has_host).is_ok() {
            out.push(a.as_str());
            if a == Action::Unshelve {
                out.push("unshelve-anywhere");
            }
        }
    }
    out
}

/// The state an agent's report moves a VM to, if any.
pub fn observe(state: VmState, desired: Power, actual: ActualState) -> Option<VmState> {
    use VmState::*;
    match (state, actual) {
        (Deleting, ActualState::Absent) => Some(Deleted),
        (Shelving, ActualState::Absent) => Some(Shelved),
        (Shelving | Shelved, _) => None,
        (Deleting | Deleted | Preempted, _) => None,
        (Preempting, ActualState::Suspended) => Some(Suspended),
        // Shutting down on the notice is expected; the deadline decides.
        (Preempting | Suspended | Pending | Queued, _) => None,
        (_, ActualState::Failed) => Some(Error),
        // Its host came back with it.
        (Lost, ActualState::Running) if desired == Power::Running => Some(Running),
        (Lost, ActualState::Stopped) if desired == Power::Stopped => Some(Stopped),
        (Lost, ActualState::Running | ActualState::Stopped) => Some(Provisioning),
        (Scheduled | Provisioning | Stopped | Unknown | Error, ActualState::Running)
            if desired == Power::Running =>
        {
            Some(Running)
        }
        (Running | Unknown, ActualState::Running) => None,
        (Scheduled | Provisioning | Running | Unknown, ActualState::Stopped)
            if desired == Power::Stopped =>
        {
            Some(Stopped)
        }
        (Running | Unknown, ActualState::Stopped) => Some(Provisioning),
        _ => None,
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn only_what_the_state_allows_is_offered() {
        use VmState::*;
        assert_eq!(
            offered(Running, Power::Running, true),
            ["stop", "reboot", "shelve", "delete"]
        );
        assert_eq!(
            offered(Stopped, Power::Stopped, true),
            ["start", "shelve", "delete"]
        );
        assert_eq!(
            offered(Shelved, Power::Stopped, false),
            ["unshelve", "unshelve-anywhere", "delete"]
        );
        assert_eq!(offered(Pending, Power::Running, false), ["delete"]);
        assert_eq!(offered(Queued, Power::Running, false), ["delete"]);
        assert_eq!(
            apply(Queued, Power::Running, Action::Delete, false)
                .unwrap()
                .state,
            Deleted,
            "cancelled at once: nothing is on a host"
        );
        assert!(offered(Deleting, Power::Stopped, true).is_empty());
    }

    use super::*;
    use VmState::*;

    #[test]
    fn a_lost_vm_can_only_be_deleted_and_resumes_with_its_host() {
        assert_eq!(offered(Lost, Power::Running, true), ["delete"]);
        assert_eq!(
            apply(Lost, Power::Running, Action::Delete, true)
                .unwrap()
                .state,
            Deleted,
            "forgotten at once: its host may never answer"
        );
        assert_eq!(
            observe(Lost, Power::Running, ActualState::Running),
            Some(Running)
        );
        assert_eq!(
            observe(Lost, Power::Stopped, ActualState::Stopped),
            Some(Stopped)
        );
        assert_eq!(
            observe(Lost, Power::Running, ActualState::Stopped),
            Some(Provisioning)
        );
        assert_eq!(
            observe(Lost, Power::Running, ActualState::Failed),
            Some(Error)
        );
    }

    #[test]
    fn legal_and_illegal_actions() {
        assert_eq!(
            apply(Stopped, Power::Stopped, Action::Start, true)
                .unwrap()
                .state,
            Provisioning
        );
        assert_eq!(
            apply(Running, Power::Running, Action::Start, true),
            Err(Running)
        );
        assert_eq!(
            apply(Running, Power::Running, Action::Stop, true)
                .unwrap()
                .desired_power,
            Power::Stopped
        );
        assert_eq!(
            apply(Running, Power::Stopped, Action::Stop, true),
            Err(Running),
            "already stopping"
        );
        assert!(
            apply(Running, Power::Running, Action::Reboot, true)
                .unwrap()
                .bump_generation
        );
        assert_eq!(
            apply(Stopped, Power::Stopped, Action::Reboot, true),
            Err(Stopped)
        );
        assert_eq!(
            apply(Running, Power::Running, Action::Delete, true)
                .unwrap()
                .state,
            Deleting
        );
        assert_eq!(
            apply(Pending, Power::Running, Action::Delete, false)
                .unwrap()
                .state,
            Deleted
        );
        assert_eq!(
            apply(Deleting, Power::Stopped, Action::Start, true),
            Err(Deleting)
        );
        assert_eq!(
            apply(Deleted, Power::Stopped, Action::Delete, true),
            Err(Deleted)
        );
        // Reclaimed spot VMs: deletable, nothing else.
        assert_eq!(
            apply(Preempted, Power::Stopped, Action::Delete, false)
                .unwrap()
                .state,
            Deleted
        );
        assert_eq!(
            apply(Preempting, Power::Running, Action::Start, true),
            Err(Preempting)
        );
        assert_eq!(
            apply(Suspended, Power::Suspended, Action::Stop, true),
            Err(Suspended)
        );
    }

    #[test]
    fn shelving_and_unshelving() {
        assert_eq!(
            apply(Running, Power::Running, Action::Shelve, true),
            Ok(Effect {
                state: Shelving,
                desired_power: Power::Stopped,
                bump_generation: false
            })
        );
        assert_eq!(
            apply(Stopped, Power::Stopped, Action::Shelve, true)
                .unwrap()
                .state,
            Shelving
        );
        assert_eq!(
            apply(Pending, Power::Running, Action::Shelve, false),
            Err(Pending),
            "nothing to shelve yet"
        );
        assert_eq!(
            apply(Shelving, Power::Stopped, Action::Start, true),
            Err(Shelving)
        );
        assert_eq!(
            apply(Shelved, Power::Stopped, Action::Start, false),
            Err(Shelved),
            "a shelved VM is unshelved, not started"
        );
        assert_eq!(
            apply(Shelved, Power::Stopped, Action::Unshelve, false)
                .unwrap()
                .state,
            Pending
        );
        assert_eq!(
            apply(Running, Power::Running, Action::Unshelve, true),
            Err(Running)
        );
        assert_eq!(
            apply(Shelved, Power::Stopped, Action::Delete, false)
                .unwrap()
                .state,
            Deleting,
            "its disk is on a host"
        );
        assert_eq!(
            observe(Shelving, Power::Stopped, ActualState::Stopped),
            None
        );
        assert_eq!(
            observe(Shelving, Power::Stopped, ActualState::Absent),
            Some(Shelved)
        );
    }

    #[test]
    fn agent_reports() {
        assert_eq!(
            observe(Scheduled, Power::Running, ActualState::Running),
            Some(Running)
        );
        assert_eq!(observe(Running, Power::Running, ActualState::Running), None);
        assert_eq!(
            observe(Running, Power::Stopped, ActualState::Stopped),
            Some(Stopped)
        );
        assert_eq!(
            observe(Deleting, Power::Stopped, ActualState::Absent),
            Some(Deleted)
        );
        assert_eq!(
            observe(Deleting, Power::Stopped, ActualState::Running),
            None
        );
        assert_eq!(
            observe(Provisioning, Power::Running, ActualState::Failed),
            Some(Error)
        );
        // A spot VM that shuts down on its notice stays preempting; one
        // that was saved is suspended.
        assert_eq!(
            observe(Preempting, Power::Running, ActualState::Stopped),
            None
        );
        assert_eq!(
            observe(Preempting, Power::Suspended, ActualState::Suspended),
            Some(Suspended)
        );
        // A guest that shut itself down while it should run is brought back.
        assert_eq!(
            observe(Running, Power::Running, ActualState::Stopped),
            Some(Provisioning)
        );
    }
}
