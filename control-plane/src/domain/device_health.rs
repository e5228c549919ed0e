//! Each passed-through device's health, from what its host still sees of
//! it (see `kumo_topology::health`):
//!
//! ```text
//! healthy ──(degraded)──▶ suspect ──(clean for a while)──▶ healthy
//!    │                       │
//!    └──────(broken)─────────┴──▶ quarantined ─(repair)─▶ repairing ─(validate)─▶ validating ─(clean)─▶ healthy
//!                                                                                     └─(any finding)─▶ quarantined
//! ```
//!
//! *Broken* (quarantines): the device left the bus or its fatal AER count
//! rose. *Degraded* (suspect): its link trained to fewer lanes than it
//! has, correctable errors arrive faster than the policy's rate, or (a
//! NIC) its RDMA port is down or its carrier flaps. Quarantined, repairing
//! and validating devices take no new placements. Automatic quarantine
//! stops at a share of the fleet: past it a broken device turns suspect,
//! flagged as withheld, and an operator decides.
//!
//! What a guest says (an XID in its kernel log, even 79) is evidence about
//! that guest's VM, never a verdict on shared hardware: it makes the GPU
//! suspect at most ([`guest_says`]). Such a device is quarantined only when
//! a host-side signal agrees (any finding of its host's readings, or the
//! check after its VM lets it go), or an operator decides; it is healthy
//! again once it passes that check ([`released_clean`]) or stays clean for
//! the suspect period.

use chrono::{DateTime, Utc};
use kumo_topology::health::{AerCounts, DeviceSignals};

pub use kumo_api_types::DeviceState;

/// The rules' settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// A suspect device this long without a finding is healthy again.
    pub suspect_clears_after_secs: i64,
    /// Correctable AER errors per minute above which a device is suspect.
    pub correctable_per_minute: f64,
    /// Carrier changes between two readings from which a NIC's link is
    /// flapping.
    pub carrier_flaps: u64,
    /// The share of the fleet's devices that may be quarantined
    /// automatically (at least one device always may).
    pub max_quarantined_share: f64,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            suspect_clears_after_secs: 3600,
            correctable_per_minute: 10.0,
            carrier_flaps: 4,
            max_quarantined_share: 0.1,
        }
    }
}

/// What the server keeps of a device between readings.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub state: DeviceState,
    pub reason: Option<String>,
    /// When the last finding was seen (suspect devices clear from it).
    pub last_finding_at: Option<DateTime<Utc>>,
    /// The previous reading's counters, and when it was taken.
    pub aer: Option<AerCounts>,
    pub carrier_changes: Option<u64>,
    pub read_at: Option<DateTime<Utc>>,
    /// Suspect on a guest's word alone (no host signal yet).
    pub guest_reported: bool,
}

impl Record {
    pub fn new() -> Record {
        Record {
            state: DeviceState::Healthy,
            reason: None,
            last_finding_at: None,
            aer: None,
            carrier_changes: None,
            read_at: None,
            guest_reported: false,
        }
    }
}

impl Default for Record {
    fn default() -> Record {
        Record::new()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Finding {
    Vanished,
    FatalAer {
        new: u64,
    },
    /// An XID in the guest's kernel log that speaks of the GPU rather
    /// than of the program using it (see [`xid`]).
    Xid {
        code: u32,
    },
    NarrowLink {
        width: u32,
        max: u32,
    },
    Correctable {
        per_minute: f64,
    },
    PortDown {
        port: u32,
    },
    Flapping {
        changes: u64,
    },
}

impl Finding {
    /// Whether a host seeing it quarantines (else it makes suspect). A
    /// guest's XID never does by itself: see [`guest_says`].
    pub fn breaks(&self) -> bool {
        matches!(self, Finding::Vanished | Finding::FatalAer { .. })
    }

    pub fn words(&self) -> String {
        match self {
            Finding::Vanished => "gone from the PCIe bus".into(),
            Finding::FatalAer { new } => format!("{new} new fatal PCIe (AER) error(s)"),
            Finding::Xid { code: 79 } => {
                "XID 79: the GPU has fallen off the bus (guest kernel log)".into()
            }
            Finding::Xid { code } => {
                format!("XID {code} in the guest's kernel log: {}", xid_words(*code))
            }
            Finding::NarrowLink { width, max } => format!("PCIe link at x{width} of x{max}"),
            Finding::Correctable { per_minute } => {
                format!("{per_minute:.0} correctable PCIe errors a minute")
            }
            Finding::PortDown { port } => format!("RDMA port {port} is down"),
            Finding::Flapping { changes } => {
                format!("link flapping: {changes} carrier changes since the last reading")
            }
        }
    }
}

/// XIDs that speak of the hardware: 79 (fallen off the bus) and these
/// make a GPU suspect (until its host agrees, see [`guest_says`]). The rest (13 graphics engine exception, 31
/// MMU fault, 43 reset channel, …) are usually the program's own faults
/// and say nothing of the GPU.
pub const SUSPECT_XIDS: &[u32] = &[48, 63, 64, 74, 92, 94, 95, 119, 120];

fn xid_words(code: u32) -> &'static str {
    match code {
        48 => "double-bit ECC error",
        63 | 64 => "ECC page retirement or row remapping",
        74 => "NVLink error",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        119 | 120 => "GSP error",
        _ => "a GPU fault",
    }
}

/// What a guest's XID says of its GPU, if anything.
pub fn xid(code: u32) -> Option<Finding> {
    (code == 79 || SUSPECT_XIDS.contains(&code)).then_some(Finding::Xid { code })
}

/// The port-level facts of a NIC, summed over its ports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortFacts {
    /// The first port that is not active.
    pub down: Option<u32>,
    pub carrier_changes: Option<u64>,
}

/// What a reading shows against the record's previous one. Counters that
/// went down (the host rebooted) start afresh.
pub fn findings(
    rec: &Record,
    s: &DeviceSignals,
    ports: PortFacts,
    now: DateTime<Utc>,
    policy: &Policy,
) -> Vec<Finding> {
    let mut out = Vec::new();
    if !s.present {
        out.push(Finding::Vanished);
    }
    if let Some(a) = s.aer {
        let before = rec
            .aer
            .filter(|b| b.fatal <= a.fatal && b.correctable <= a.correctable);
        let new_fatal = a.fatal - before.map_or(0, |b| b.fatal);
        if new_fatal > 0 {
            out.push(Finding::FatalAer { new: new_fatal });
        }
        if let (Some(b), Some(at)) = (before, rec.read_at) {
            let secs = (now - at).num_milliseconds() as f64 / 1000.0;
            if secs > 0.0 {
                let per_minute = (a.correctable - b.correctable) as f64 * 60.0 / secs;
                if per_minute > policy.correctable_per_minute {
                    out.push(Finding::Correctable { per_minute });
                }
            }
        }
    }
    if let Some(l) = s.link.filter(|l| l.narrowed()) {
        out.push(Finding::NarrowLink {
            width: l.width,
            max: l.max_width,
        });
    }
    if let Some(port) = ports.down {
        out.push(Finding::PortDown { port });
    }
    if let (Some(now_c), Some(before)) = (ports.carrier_changes, rec.carrier_changes) {
        let changes = now_c.saturating_sub(before);
        if changes >= policy.carrier_flaps {
            out.push(Finding::Flapping { changes });
        }
    }
    out
}

/// A change of state and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub to: DeviceState,
    pub reason: String,
    /// A broken device that was not quarantined because a quarantine
    /// limit is reached: an operator decides.
    pub withheld: bool,
}

/// Why a broken device may not be quarantined automatically now: what
/// hosts see is bounded by the fleet's share ([`quarantine_cap`]) …
pub const FLEET_FULL: &str = "the fleet's automatic quarantine limit is reached";
/// Why a device a VM let go is quarantined: its host's check after the
/// release (reset, config space, driver, AER) failed.
pub const UNFIT: &str = "did not come back after reset";
/// What a guest's reported finding does to its GPU: a healthy one turns
/// suspect, said to be on the guest's word; anything else stays as it is
/// (a guest cannot take a device out of service, nor bring one back).
pub fn guest_says(rec: &Record, f: &Finding) -> Option<Transition> {
    (rec.state == DeviceState::Healthy).then(|| Transition {
        to: DeviceState::Suspect,
        reason: format!(
            "{} (said by its guest: suspect until its host's checks agree)",
            f.words()
        ),
        withheld: false,
    })
}

/// A device whose VM let it go and that passed its host's check then: one
/// suspect on its guest's word alone is healthy again.
pub fn released_clean(rec: &Record) -> Option<Transition> {
    (rec.state == DeviceState::Suspect && rec.guest_reported).then(|| Transition {
        to: DeviceState::Healthy,
        reason: "passed its host's check after its VM let it go (a guest's report alone never takes a device out)".into(),
        withheld: false,
    })
}

/// Whether a host's findings may take a device out of service: one that
/// breaks, or any finding at all on a device its guest already spoke of
/// (the host agrees with the guest).
pub fn takes_out(rec: &Record, found: &[Finding]) -> bool {
    found.iter().any(Finding::breaks)
        || (rec.state == DeviceState::Suspect && rec.guest_reported && !found.is_empty())
}

/// The next state after a reading's findings; `room` says whether one
/// more device may be quarantined automatically, or why not.
pub fn next(
    rec: &Record,
    found: &[Finding],
    now: DateTime<Utc>,
    policy: &Policy,
    room: Result<(), &str>,
) -> Option<Transition> {
    use DeviceState::*;
    let words = found
        .iter()
        .map(Finding::words)
        .collect::<Vec<_>>()
        .join("; ");
    let broken = takes_out(rec, found);
    let confirms = broken && !found.iter().any(Finding::breaks);
    let words = if confirms {
        format!(
            "{words}, agreeing with its guest: {}",
            rec.reason.as_deref().unwrap_or_default()
        )
    } else {
        words
    };
    match rec.state {
        // An operator is at it: readings wait for their word.
        Repairing | Quarantined => None,
        Validating if !found.is_empty() => Some(Transition {
            to: Quarantined,
            reason: format!("validation failed: {words}"),
            withheld: false,
        }),
        Validating => Some(Transition {
            to: Healthy,
            reason: "validated: a clean reading after repair".into(),
            withheld: false,
        }),
        Healthy | Suspect if broken && room.is_ok() => Some(Transition {
            to: Quarantined,
            reason: words,
            withheld: false,
        }),
        Healthy | Suspect if broken => Some(Transition {
            to: Suspect,
            reason: format!(
                "{words} (not quarantined: {}; an operator decides)",
                room.err().unwrap_or_default()
            ),
            withheld: true,
        })
        .filter(|t| rec.state != Suspect || rec.reason.as_deref() != Some(&t.reason)),
        Healthy if !found.is_empty() => Some(Transition {
            to: Suspect,
            reason: words,
            withheld: false,
        }),
        Suspect if found.is_empty() => rec
            .last_finding_at
            .filter(|at| (now - *at).num_seconds() >= policy.suspect_clears_after_secs)
            .map(|_| Transition {
                to: Healthy,
                reason: format!("clean for {} s", policy.suspect_clears_after_secs),
                withheld: false,
            }),
        Healthy | Suspect => None,
    }
}

/// How many devices of a fleet of `total` may be quarantined
/// automatically.
pub fn quarantine_cap(total: usize, policy: &Policy) -> usize {
    ((total as f64 * policy.max_quarantined_share).floor() as usize).max(1)
}

/// An operator's word on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorAction {
    Quarantine,
    Repair,
    Validate,
}

impl OperatorAction {
    /// In the order an operator's forms offer them.
    pub const ALL: [OperatorAction; 3] = [
        OperatorAction::Repair,
        OperatorAction::Validate,
        OperatorAction::Quarantine,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OperatorAction::Quarantine => "quarantine",
            OperatorAction::Repair => "repair",
            OperatorAction::Validate => "validate",
        }
    }

    pub fn parse(s: &str) -> Option<OperatorAction> {
        OperatorAction::ALL.into_iter().find(|a| a.as_str() == s)
    }

    /// The state it leads to from `from`, or why it cannot.
    pub fn apply(self, from: DeviceState) -> Result<DeviceState, String> {
        use DeviceState::*;
        match (self, from) {
            (OperatorAction::Quarantine, _) => Ok(Quarantined),
            (OperatorAction::Repair, Quarantined | Suspect | Validating) => Ok(Repairing),
            (OperatorAction::Validate, Repairing | Quarantined) => Ok(Validating),
            (a, s) => Err(format!(
                "a {} device cannot be {}",
                s.as_str(),
                match a {
                    OperatorAction::Quarantine => "quarantined",
                    OperatorAction::Repair => "sent to repair (quarantine it first)",
                    OperatorAction::Validate => "validated (repair it first)",
                }
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kumo_topology::health::LinkState;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    fn clean() -> DeviceSignals {
        DeviceSignals {
            bdf: "0000:18:00.0".into(),
            kind: "gpu".into(),
            present: true,
            aer: Some(AerCounts::default()),
            link: Some(LinkState {
                speed: 25,
                max_speed: 320,
                width: 16,
                max_width: 16,
            }),
        }
    }

    fn read(rec: &Record, s: &DeviceSignals, now: i64) -> Vec<Finding> {
        findings(rec, s, PortFacts::default(), at(now), &Policy::default())
    }

    #[test]
    fn an_idle_gpus_slow_link_is_clean_and_each_fault_is_named() {
        let rec = Record::new();
        assert!(read(&rec, &clean(), 0).is_empty());
        let gone = DeviceSignals {
            present: false,
            aer: None,
            link: None,
            ..clean()
        };
        assert_eq!(read(&rec, &gone, 0), vec![Finding::Vanished]);
        let mut fatal = clean();
        fatal.aer = Some(AerCounts {
            fatal: 2,
            ..Default::default()
        });
        assert_eq!(read(&rec, &fatal, 0), vec![Finding::FatalAer { new: 2 }]);
        let seen = Record {
            aer: fatal.aer,
            read_at: Some(at(0)),
            ..Record::new()
        };
        assert!(
            read(&seen, &fatal, 60).is_empty(),
            "old fatal errors count once"
        );
        let mut narrow = clean();
        narrow.link = narrow.link.map(|l| LinkState { width: 8, ..l });
        assert_eq!(
            read(&rec, &narrow, 0),
            vec![Finding::NarrowLink { width: 8, max: 16 }]
        );
    }

    #[test]
    fn correctable_errors_count_by_their_rate() {
        let rec = Record {
            aer: Some(AerCounts::default()),
            read_at: Some(at(0)),
            ..Record::new()
        };
        let mut s = clean();
        s.aer = Some(AerCounts {
            correctable: 5,
            ..Default::default()
        });
        assert!(read(&rec, &s, 60).is_empty(), "5 a minute is below 10");
        s.aer = Some(AerCounts {
            correctable: 50,
            ..Default::default()
        });
        assert!(matches!(
            read(&rec, &s, 60)[..],
            [Finding::Correctable { .. }]
        ));
        // Counters that went down: the host rebooted, a new baseline.
        let after = Record {
            aer: Some(AerCounts {
                correctable: 900,
                ..Default::default()
            }),
            read_at: Some(at(0)),
            ..Record::new()
        };
        assert!(read(&after, &s, 60).is_empty());
    }

    #[test]
    fn a_guests_word_makes_suspect_and_only_a_host_signal_takes_out() {
        let p = Policy::default();
        let xid79 = xid(79).unwrap();
        assert!(!xid79.breaks(), "a guest's XID 79 alone breaks nothing");
        let t = guest_says(&Record::new(), &xid79).unwrap();
        assert_eq!(t.to, DeviceState::Suspect);
        assert!(t.reason.contains("said by its guest"), "{}", t.reason);
        // A guest neither quarantines nor clears what is out already.
        for state in [
            DeviceState::Suspect,
            DeviceState::Quarantined,
            DeviceState::Repairing,
        ] {
            let rec = Record {
                state,
                ..Record::new()
            };
            assert_eq!(guest_says(&rec, &xid79), None, "{state:?}");
        }
        let on_its_word = Record {
            state: DeviceState::Suspect,
            reason: Some(t.reason.clone()),
            last_finding_at: Some(at(0)),
            guest_reported: true,
            ..Record::new()
        };
        // Its host agrees (even a degraded reading): quarantined, within
        // the fleet's cap.
        let narrow = [Finding::NarrowLink { width: 8, max: 16 }];
        let t = next(&on_its_word, &narrow, at(10), &p, Ok(())).unwrap();
        assert_eq!(t.to, DeviceState::Quarantined);
        assert!(t.reason.contains("agreeing with its guest"), "{}", t.reason);
        let t = next(&on_its_word, &narrow, at(10), &p, Err(FLEET_FULL)).unwrap();
        assert_eq!((t.to, t.withheld), (DeviceState::Suspect, true));
        // A host-suspect device is not taken out by more of the same.
        let host_suspect = Record {
            guest_reported: false,
            ..on_its_word.clone()
        };
        assert_eq!(next(&host_suspect, &narrow, at(10), &p, Ok(())), None);
        // Clean after its VM left: back by itself; a host's suspect is not.
        assert_eq!(
            released_clean(&on_its_word).map(|t| t.to),
            Some(DeviceState::Healthy)
        );
        assert_eq!(released_clean(&host_suspect), None);
        assert_eq!(released_clean(&Record::new()), None);
    }

    #[test]
    fn states_follow_the_rules() {
        let p = Policy::default();
        let healthy = Record::new();
        let t = next(&healthy, &[Finding::Vanished], at(0), &p, Ok(())).unwrap();
        assert_eq!((t.to, t.withheld), (DeviceState::Quarantined, false));
        let t = next(&healthy, &[Finding::Vanished], at(0), &p, Err(FLEET_FULL)).unwrap();
        assert_eq!(
            (t.to, t.withheld),
            (DeviceState::Suspect, true),
            "the cap holds"
        );
        let t = next(
            &healthy,
            &[Finding::NarrowLink { width: 8, max: 16 }],
            at(0),
            &p,
            Ok(()),
        )
        .unwrap();
        assert_eq!(t.to, DeviceState::Suspect);

        let suspect = Record {
            state: DeviceState::Suspect,
            last_finding_at: Some(at(0)),
            ..Record::new()
        };
        assert_eq!(
            next(&suspect, &[], at(3599), &p, Ok(())),
            None,
            "not clean long enough"
        );
        assert_eq!(
            next(&suspect, &[], at(3600), &p, Ok(())).unwrap().to,
            DeviceState::Healthy
        );

        let q = Record {
            state: DeviceState::Quarantined,
            ..Record::new()
        };
        assert_eq!(
            next(&q, &[], at(0), &p, Ok(())),
            None,
            "never clears by itself"
        );
        let r = Record {
            state: DeviceState::Repairing,
            ..Record::new()
        };
        assert_eq!(next(&r, &[Finding::Vanished], at(0), &p, Ok(())), None);
        let v = Record {
            state: DeviceState::Validating,
            ..Record::new()
        };
        assert_eq!(
            next(&v, &[], at(0), &p, Ok(())).unwrap().to,
            DeviceState::Healthy
        );
        assert_eq!(
            next(
                &v,
                &[Finding::NarrowLink { width: 8, max: 16 }],
                at(0),
                &p,
                Ok(())
            )
            .unwrap()
            .to,
            DeviceState::Quarantined
        );
    }

    #[test]
    fn operators_repair_then_validate() {
        use DeviceState::*;
        assert_eq!(OperatorAction::Repair.apply(Quarantined), Ok(Repairing));
        assert_eq!(OperatorAction::Validate.apply(Repairing), Ok(Validating));
        assert!(OperatorAction::Validate.apply(Healthy).is_err());
        assert!(OperatorAction::Repair.apply(Healthy).is_err());
        assert_eq!(OperatorAction::Quarantine.apply(Healthy), Ok(Quarantined));
        assert!(!Quarantined.placeable() && !Repairing.placeable() && !Validating.placeable());
        assert!(Suspect.placeable());
    }

    #[test]
    fn the_cap_is_a_share_and_at_least_one() {
        let p = Policy::default();
        assert_eq!(quarantine_cap(8, &p), 1);
        assert_eq!(quarantine_cap(100, &p), 10);
        assert_eq!(quarantine_cap(0, &p), 1);
    }
}
