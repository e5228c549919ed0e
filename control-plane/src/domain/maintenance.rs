//! What a host's maintenance window does to each VM on it: plain rules.

use chrono::{DateTime, Utc};
use kumo_api_types::{ScheduledAction, ScheduledEvent, VmState};

/// The action a window takes on a VM in `state` (a cluster member or not);
/// `None` for a VM with nothing on the host to move (gone, going, shelved,
/// waiting, lost).
pub fn action_for(state: VmState, cluster_member: bool) -> Option<ScheduledAction> {
    use VmState::*;
    match state {
        Deleting | Deleted | Queued | Pending | Shelving | Shelved | Preempted | Lost => None,
        // Placed but never started: placed again elsewhere.
        Scheduled => Some(ScheduledAction::Replace),
        Running | Stopped | Provisioning | Error | Unknown if cluster_member => {
            Some(ScheduledAction::Replace)
        }
        Running | Stopped | Provisioning | Error | Unknown => Some(ScheduledAction::Evacuate),
        Suspended | Preempting => Some(ScheduledAction::Stop),
    }
}

/// A host's maintenance window as its VMs are told of it.
#[derive(Debug, Clone, Copy)]
pub struct Window<'a> {
    pub host: &'a str,
    pub at: DateTime<Utc>,
    /// When it was announced (or last moved).
    pub told_at: Option<DateTime<Utc>>,
    pub reason: Option<&'a str>,
}

/// When the window acts on a VM that asked for `notice` seconds of
/// warning: at the window, or that long after it was announced when that
/// is later (checkpointing a large model takes minutes, and an admin's
/// short notice does not take them away).
pub fn acts_at(w: &Window<'_>, notice: Option<u32>) -> DateTime<Utc> {
    match (w.told_at, notice) {
        (Some(told), Some(n)) => w.at.max(told + chrono::Duration::seconds(i64::from(n))),
        _ => w.at,
    }
}

/// The event a VM on a host with a window is told of: its own time.
pub fn event_for(
    state: VmState,
    cluster_member: bool,
    w: &Window<'_>,
    notice: Option<u32>,
) -> Option<ScheduledEvent> {
    Some(ScheduledEvent {
        kind: "maintenance".into(),
        at: acts_at(w, notice),
        action: action_for(state, cluster_member)?,
        host: w.host.to_owned(),
        reason: w.reason.map(str::to_owned),
    })
}

/// A window's reason as tenants will read it: at most 200 characters, no
/// control characters.
pub fn reason(text: &str) -> Result<String, String> {
    let t = text.trim();
    if t.chars().count() > 200 || t.chars().any(char::is_control) {
        return Err("at most 200 characters, no control characters".into());
    }
    Ok(t.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_replaced_others_evacuated_the_rest_stopped() {
        assert_eq!(
            action_for(VmState::Running, true),
            Some(ScheduledAction::Replace)
        );
        assert_eq!(
            action_for(VmState::Running, false),
            Some(ScheduledAction::Evacuate)
        );
        assert_eq!(
            action_for(VmState::Stopped, false),
            Some(ScheduledAction::Evacuate)
        );
        assert_eq!(
            action_for(VmState::Scheduled, false),
            Some(ScheduledAction::Replace)
        );
        assert_eq!(
            action_for(VmState::Suspended, false),
            Some(ScheduledAction::Stop)
        );
        assert_eq!(
            action_for(VmState::Preempting, false),
            Some(ScheduledAction::Stop)
        );
        for s in [
            VmState::Shelved,
            VmState::Deleting,
            VmState::Pending,
            VmState::Lost,
        ] {
            assert_eq!(action_for(s, false), None, "{s:?}");
        }
        let w = Window {
            host: "gpu-7",
            at: DateTime::UNIX_EPOCH,
            told_at: None,
            reason: Some("firmware"),
        };
        let e = event_for(VmState::Running, false, &w, None).unwrap();
        assert_eq!(
            (e.kind.as_str(), e.host.as_str(), e.reason.as_deref()),
            ("maintenance", "gpu-7", Some("firmware"))
        );
        assert!(event_for(VmState::Shelved, false, &w, None).is_none());
    }

    #[test]
    fn a_vm_gets_its_own_notice_when_the_window_gives_less() {
        let told = DateTime::from_timestamp(1_000_000, 0).unwrap();
        let w = Window {
            host: "gpu-7",
            at: told + chrono::Duration::seconds(300),
            told_at: Some(told),
            reason: None,
        };
        // No notice of its own, or one the window's lead covers: the window.
        assert_eq!(acts_at(&w, None), w.at);
        assert_eq!(acts_at(&w, Some(300)), w.at);
        assert_eq!(acts_at(&w, Some(60)), w.at);
        // Ten minutes asked, five given: ten after the announcement.
        let own = told + chrono::Duration::seconds(600);
        assert_eq!(acts_at(&w, Some(600)), own);
        assert_eq!(
            event_for(VmState::Running, false, &w, Some(600))
                .unwrap()
                .at,
            own
        );
    }

    #[test]
    fn reasons_are_short_plain_text() {
        assert_eq!(reason("  BMC firmware  ").unwrap(), "BMC firmware");
        assert!(reason(&"x".repeat(201)).is_err());
        assert!(reason("a\u{1b}[31m").is_err());
    }
}
