//! What a host's maintenance window does to each VM on it: plain rules.

use chrono::{DateTime, Utc};
use kumo_api_types::{ScheduledAction, ScheduledEvent, VmState};

/// The action a window takes on a VM in `state` (a cluster member or not);
/// `None` for a VM with nothing on the host to move (gone, going, shelved,
/// waiting, lost).
pub fn action_for(state: VmState, cluster_member: bool) -> Option<ScheduledAction> {
    use VmState::*;
    match state {
        Deleting | Deleted | Pending | Shelving | Shelved | Preempted | Lost => None,
        // Placed but never started: placed again elsewhere.
        Scheduled => Some(ScheduledAction::Replace),
        Running | Stopped | Provisioning | Error | Unknown if cluster_member => {
            Some(ScheduledAction::Replace)
        }
        Running | Stopped | Provisioning | Error | Unknown => Some(ScheduledAction::Evacuate),
        Suspended | Preempting => Some(ScheduledAction::Stop),
    }
}

/// The event a VM on a host with a window is told of.
pub fn event_for(
    state: VmState,
    cluster_member: bool,
    host: &str,
    at: DateTime<Utc>,
    reason: Option<&str>,
) -> Option<ScheduledEvent> {
    Some(ScheduledEvent {
        kind: "maintenance".into(),
        at,
        action: action_for(state, cluster_member)?,
        host: host.to_owned(),
        reason: reason.map(str::to_owned),
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
        let at = DateTime::UNIX_EPOCH;
        let e = event_for(VmState::Running, false, "gpu-7", at, Some("firmware")).unwrap();
        assert_eq!(
            (e.kind.as_str(), e.host.as_str(), e.reason.as_deref()),
            ("maintenance", "gpu-7", Some("firmware"))
        );
        assert!(event_for(VmState::Shelved, false, "gpu-7", at, None).is_none());
    }

    #[test]
    fn reasons_are_short_plain_text() {
        assert_eq!(reason("  BMC firmware  ").unwrap(), "BMC firmware");
        assert!(reason(&"x".repeat(201)).is_err());
        assert!(reason("a\u{1b}[31m").is_err());
    }
}
