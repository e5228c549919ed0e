//! A cluster's health from its members' facts, and which members a repair
//! replaces: plain functions over plain data.

use kumo_api_types::{ClusterHealth, ClusterProblem, DeviceState, HostState, MemberFault, VmState};

/// What the rules need of one member.
#[derive(Debug, Clone)]
pub struct MemberFacts<'a> {
    pub name: &'a str,
    pub state: VmState,
    /// The VM's stored reason (why it is in `error`).
    pub reason: Option<&'a str>,
    /// Its host's name and state, when it has one.
    pub host: Option<(&'a str, HostState)>,
    /// Devices it holds that are not healthy: PCI address, what it is
    /// (`gpu`, `nic`) and its state.
    pub devices: Vec<(&'a str, &'a str, DeviceState)>,
}

/// A cluster's health, what is wrong, and whether a repair under way is
/// over (every replaced member running).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assessment {
    pub health: ClusterHealth,
    pub problems: Vec<ClusterProblem>,
    pub repair_done: bool,
}

fn problem(member: &str, fault: MemberFault, detail: String) -> ClusterProblem {
    ClusterProblem {
        member: member.to_owned(),
        fault,
        detail,
    }
}

/// One member's problems, in a fixed order: its host, its VM, its
/// devices.
pub fn member_problems(m: &MemberFacts<'_>, repairing: bool) -> Vec<ClusterProblem> {
    let mut out = Vec::new();
    if let Some((host, HostState::Unreachable)) = m.host {
        out.push(problem(
            m.name,
            MemberFault::HostLost,
            format!("its host {host} stopped answering"),
        ));
    }
    match m.state {
        VmState::Error => out.push(problem(
            m.name,
            MemberFault::VmError,
            m.reason.unwrap_or("the VM failed").to_owned(),
        )),
        VmState::Pending | VmState::Scheduled | VmState::Provisioning if repairing => {
            out.push(problem(
                m.name,
                MemberFault::Replacing,
                match m.state {
                    VmState::Pending => "replaced; waiting for room".to_owned(),
                    _ => format!("replaced; starting on {}", m.host.map_or("?", |h| h.0)),
                },
            ))
        }
        VmState::Stopped
        | VmState::Suspended
        | VmState::Shelving
        | VmState::Shelved
        | VmState::Preempting
        | VmState::Preempted => out.push(problem(
            m.name,
            MemberFault::NotRunning,
            format!("the member is {}", m.state.as_str()),
        )),
        _ => {}
    }
    for (bdf, kind, state) in &m.devices {
        let fault = match state {
            DeviceState::Quarantined | DeviceState::Repairing | DeviceState::Validating => {
                MemberFault::DeviceQuarantined
            }
            DeviceState::Suspect => MemberFault::DeviceSuspect,
            DeviceState::Healthy => continue,
        };
        let what = if *kind == "nic" { "NIC" } else { "GPU" };
        out.push(problem(
            m.name,
            fault,
            format!("its {what} {bdf} is {}", state.as_str()),
        ));
    }
    out
}

/// The cluster's health: `repairing` while a repair's new members are
/// not all running, else `degraded` when any member has a problem.
pub fn assess(repairing: bool, members: &[MemberFacts<'_>]) -> Assessment {
    let problems: Vec<ClusterProblem> = members
        .iter()
        .flat_map(|m| member_problems(m, repairing))
        .collect();
    let replacing = problems.iter().any(|p| p.fault == MemberFault::Replacing);
    let health = if replacing {
        ClusterHealth::Repairing
    } else if problems.is_empty() {
        ClusterHealth::Healthy
    } else {
        ClusterHealth::Degraded
    };
    Assessment {
        health,
        problems,
        repair_done: repairing && !replacing,
    }
}

/// The members a repair replaces (each once, in member order): those with
/// a fault that only replacing mends. A member already going away is not
/// replaced.
pub fn to_replace<'a>(members: &[MemberFacts<'a>]) -> Vec<&'a str> {
    members
        .iter()
        .filter(|m| !matches!(m.state, VmState::Deleting | VmState::Deleted))
        .filter(|m| {
            member_problems(m, false)
                .iter()
                .any(|p| p.fault.replaceable())
        })
        .map(|m| m.name)
        .collect()
}

/// Whether an auto-repairing cluster repairs now: degraded by something a
/// repair mends, for at least its delay.
pub fn repair_due(
    a: &Assessment,
    since: Option<chrono::DateTime<chrono::Utc>>,
    delay: chrono::Duration,
    now: chrono::DateTime<chrono::Utc>,
) -> bool {
    a.health == ClusterHealth::Degraded
        && a.problems.iter().any(|p| p.fault.replaceable())
        && since.is_none_or(|s| now - s >= delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str) -> MemberFacts<'_> {
        MemberFacts {
            name,
            state: VmState::Running,
            reason: None,
            host: Some(("h1", HostState::Ready)),
            devices: Vec::new(),
        }
    }

    #[test]
    fn running_members_on_ready_hosts_are_healthy() {
        let a = assess(false, &[member("c-0"), member("c-1")]);
        assert_eq!(a.health, ClusterHealth::Healthy);
        assert!(a.problems.is_empty());
        assert!(!a.repair_done);
    }

    #[test]
    fn each_fault_is_named_with_its_member() {
        let mut lost = member("c-0");
        lost.host = Some(("h7", HostState::Unreachable));
        let mut failed = member("c-1");
        failed.state = VmState::Error;
        failed.reason = Some("qemu exited");
        let mut sick = member("c-2");
        sick.devices = vec![
            ("0000:17:00.0", "gpu", DeviceState::Quarantined),
            ("0000:18:00.0", "nic", DeviceState::Suspect),
        ];
        let mut stopped = member("c-3");
        stopped.state = VmState::Stopped;
        let members = [lost, failed, sick, stopped, member("c-4")];
        let a = assess(false, &members);
        assert_eq!(a.health, ClusterHealth::Degraded);
        let got: Vec<(&str, MemberFault)> = a
            .problems
            .iter()
            .map(|p| (p.member.as_str(), p.fault))
            .collect();
        assert_eq!(
            got,
            [
                ("c-0", MemberFault::HostLost),
                ("c-1", MemberFault::VmError),
                ("c-2", MemberFault::DeviceQuarantined),
                ("c-2", MemberFault::DeviceSuspect),
                ("c-3", MemberFault::NotRunning),
            ]
        );
        assert!(a.problems[0].detail.contains("h7"));
        assert_eq!(a.problems[1].detail, "qemu exited");
        assert!(a.problems[2].detail.contains("GPU 0000:17:00.0"));
        assert!(a.problems[3].detail.contains("NIC 0000:18:00.0"));
        // Only what replacing mends is replaced: not the suspect NIC alone,
        // not the stopped member.
        assert_eq!(to_replace(&members), ["c-0", "c-1", "c-2"]);
    }

    #[test]
    fn a_repair_is_repairing_until_its_members_run_then_done() {
        let mut new = member("c-1");
        new.state = VmState::Pending;
        new.host = None;
        let a = assess(true, &[member("c-0"), new.clone()]);
        assert_eq!(a.health, ClusterHealth::Repairing);
        assert_eq!(a.problems[0].fault, MemberFault::Replacing);
        assert!(!a.repair_done);
        // A pending member without a repair under way is a cluster still
        // being placed, not a fault.
        assert_eq!(assess(false, &[new]).health, ClusterHealth::Healthy);
        let a = assess(true, &[member("c-0"), member("c-1")]);
        assert_eq!(a.health, ClusterHealth::Healthy);
        assert!(a.repair_done);
    }

    #[test]
    fn a_member_on_its_way_out_is_not_replaced() {
        let mut going = member("c-0");
        going.state = VmState::Deleting;
        going.host = Some(("h1", HostState::Unreachable));
        assert!(to_replace(&[going]).is_empty());
    }

    #[test]
    fn repair_waits_for_its_delay_and_only_for_what_it_mends() {
        let t0 = chrono::DateTime::UNIX_EPOCH;
        let delay = chrono::Duration::seconds(60);
        let mut lost = member("c-0");
        lost.host = Some(("h1", HostState::Unreachable));
        let a = assess(false, &[lost]);
        assert!(!repair_due(
            &a,
            Some(t0),
            delay,
            t0 + chrono::Duration::seconds(59)
        ));
        assert!(repair_due(&a, Some(t0), delay, t0 + delay));
        let mut stopped = member("c-0");
        stopped.state = VmState::Stopped;
        let a = assess(false, &[stopped]);
        assert!(!repair_due(&a, Some(t0), delay, t0 + delay * 10));
    }
}
