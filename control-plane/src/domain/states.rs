//! Every state and kind a table stores as text, each with one conversion
//! to and from that text. Reading a value the server does not know (a
//! downgrade, a hand edit) is an error that names the row, never a silent
//! fallback to some other state.

use std::fmt::Display;

use kumo_api_types::{
    ForwardProtocol, HostState, Power, SegmentKind, ShareLimit, ShareState, VmState, VolumeState,
};
use kumo_billing::Level;

use crate::error::ApiError;

/// A state or kind kept in one text column.
pub trait StoredText: Sized + Copy + 'static {
    /// What the column holds, for errors ("VM state").
    const WHAT: &'static str;
    /// Every value, so the conversions can be checked against each other.
    const ALL: &'static [Self];
    fn to_text(self) -> &'static str;

    fn from_text(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.to_text() == s)
    }
}

/// The value of a stored column, or an error naming the row it is in.
pub fn decode<T: StoredText>(table: &str, row: impl Display, text: &str) -> Result<T, ApiError> {
    T::from_text(text).ok_or_else(|| {
        ApiError::Internal(format!("{table} row {row}: unknown {} {text:?}", T::WHAT))
    })
}

impl StoredText for ForwardProtocol {
    const WHAT: &'static str = "forward protocol";
    const ALL: &'static [ForwardProtocol] = &[ForwardProtocol::Tcp, ForwardProtocol::Udp];
    fn to_text(self) -> &'static str {
        self.as_str()
    }
}

impl StoredText for VolumeState {
    const WHAT: &'static str = "volume state";
    const ALL: &'static [VolumeState] = &VolumeState::ALL;
    fn to_text(self) -> &'static str {
        self.as_str()
    }
}

impl StoredText for kumo_api_types::ReservationState {
    const WHAT: &'static str = "reservation state";
    const ALL: &'static [Self] = &[Self::Scheduled, Self::Preparing, Self::Active, Self::Ended];
    fn to_text(self) -> &'static str {
        self.as_str()
    }
}

impl StoredText for kumo_api_types::EndPolicy {
    const WHAT: &'static str = "reservation end policy";
    const ALL: &'static [Self] = &[Self::Release, Self::Stop];
    fn to_text(self) -> &'static str {
        self.as_str()
    }
}

impl StoredText for ShareState {
    const WHAT: &'static str = "share state";
    const ALL: &'static [ShareState] = &ShareState::ALL;
    fn to_text(self) -> &'static str {
        self.as_str()
    }
}

impl StoredText for ShareLimit {
    const WHAT: &'static str = "share limit";
    const ALL: &'static [ShareLimit] = &[ShareLimit::ProjectQuota, ShareLimit::Measured];
    fn to_text(self) -> &'static str {
        match self {
            ShareLimit::ProjectQuota => "project_quota",
            ShareLimit::Measured => "measured",
        }
    }
}

impl StoredText for VmState {
    const WHAT: &'static str = "VM state";
    const ALL: &'static [VmState] = &VmState::ALL;
    fn to_text(self) -> &'static str {
        self.as_str()
    }
}

/// The power a VM should have. `saved` is libvirt's managed save, what
/// the API calls suspended.
impl StoredText for Power {
    const WHAT: &'static str = "desired power";
    const ALL: &'static [Power] = &[Power::Running, Power::Stopped, Power::Suspended];
    fn to_text(self) -> &'static str {
        match self {
            Power::Running => "running",
            Power::Stopped => "stopped",
            Power::Suspended => "saved",
        }
    }
}

impl StoredText for HostState {
    const WHAT: &'static str = "host state";
    const ALL: &'static [HostState] = &HostState::ALL;
    fn to_text(self) -> &'static str {
        self.as_str()
    }
}

impl StoredText for SegmentKind {
    const WHAT: &'static str = "segment kind";
    const ALL: &'static [SegmentKind] = &[SegmentKind::Ethernet, SegmentKind::Roce];
    fn to_text(self) -> &'static str {
        match self {
            SegmentKind::Ethernet => "ethernet",
            SegmentKind::Roce => "roce",
        }
    }
}

impl StoredText for Level {
    const WHAT: &'static str = "service level";
    const ALL: &'static [Level] = &[Level::Guaranteed, Level::Spot];
    fn to_text(self) -> &'static str {
        self.as_str()
    }
}

impl StoredText for kumo_api_types::ClusterHealth {
    const WHAT: &'static str = "cluster health";
    const ALL: &'static [Self] = &kumo_api_types::ClusterHealth::ALL;
    fn to_text(self) -> &'static str {
        self.as_str()
    }
}

/// Whether a cluster's members are all placed or some wait for room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterState {
    /// In the fair queue, its members `queued`.
    Queued,
    Pending,
    Placed,
}

impl StoredText for ClusterState {
    const WHAT: &'static str = "cluster state";
    const ALL: &'static [ClusterState] = &[
        ClusterState::Queued,
        ClusterState::Pending,
        ClusterState::Placed,
    ];
    fn to_text(self) -> &'static str {
        match self {
            ClusterState::Queued => "queued",
            ClusterState::Pending => "pending",
            ClusterState::Placed => "placed",
        }
    }
}

/// What an allocation row holds on its host: a GPU or a NIC (by PCI
/// address), or a CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocationKind {
    Gpu,
    Nic,
    Cpu,
}

impl StoredText for AllocationKind {
    const WHAT: &'static str = "allocation kind";
    const ALL: &'static [AllocationKind] = &[
        AllocationKind::Gpu,
        AllocationKind::Nic,
        AllocationKind::Cpu,
    ];
    fn to_text(self) -> &'static str {
        match self {
            AllocationKind::Gpu => "gpu",
            AllocationKind::Nic => "nic",
            AllocationKind::Cpu => "cpu",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trips<T: StoredText + PartialEq + std::fmt::Debug>() {
        let mut seen = std::collections::BTreeSet::new();
        for v in T::ALL {
            assert!(
                seen.insert(v.to_text()),
                "{} {:?} twice",
                T::WHAT,
                v.to_text()
            );
            assert_eq!(T::from_text(v.to_text()), Some(*v));
        }
        assert_eq!(T::from_text("no-such-value"), None);
    }

    #[test]
    fn every_stored_text_round_trips_and_is_unique() {
        round_trips::<VmState>();
        round_trips::<Power>();
        round_trips::<HostState>();
        round_trips::<SegmentKind>();
        round_trips::<Level>();
        round_trips::<ClusterState>();
        round_trips::<AllocationKind>();
        round_trips::<VolumeState>();
        round_trips::<ShareState>();
        round_trips::<ShareLimit>();
        round_trips::<kumo_api_types::ClusterHealth>();
    }

    #[test]
    fn vm_states_agree_with_the_api_types() {
        for v in <VmState as StoredText>::ALL {
            assert_eq!(VmState::parse(v.to_text()), Some(*v));
        }
    }

    #[test]
    fn an_unknown_value_names_its_row() {
        let e = decode::<VmState>("vms", "0190-abc", "hibernating").unwrap_err();
        let text = format!("{e:?}");
        assert!(text.contains("vms row 0190-abc"), "{text}");
        assert!(text.contains("hibernating"), "{text}");
    }
}
