//! The hypervisor agent's protocol (`/agent/v1`): registration and
//! heartbeats, the desired state the server hands a host (VMs, disks,
//! volumes, shares, NICs, transfers, consoles), the status reports the agent
//! sends back with the limits on what they may carry, and the GPU telemetry
//! it reads from its guests.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::hosts::ScheduledEvent;
use crate::networks::SegmentKind;
use crate::storage::ShareLimit;
use crate::vms::VmSpec;

/// What an agent read from its GPU guests through their guest agents
/// (`POST /agent/v1/telemetry`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TelemetryReport {
    pub vms: Vec<VmTelemetry>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct VmTelemetry {
    pub vm: Uuid,
    /// The guest's `nvidia-smi` figures, by host GPU.
    #[serde(default)]
    pub gpus: Vec<GpuReading>,
    /// XIDs in the guest's kernel log since the last report, by host GPU.
    #[serde(default)]
    pub xids: Vec<XidReading>,
    /// Why there are no figures (no guest agent, no `nvidia-smi`, garbage
    /// output): the VM's GPUs read as unknown, never as idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GpuReading {
    pub host_bdf: String,
    #[schema(value_type = Object)]
    pub sample: kumo_topology::gpu_telemetry::GpuSample,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct XidReading {
    pub host_bdf: String,
    pub code: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentRegister {
    pub join_token: String,
    pub name: String,
    #[schema(value_type = Object)]
    pub topology: kumo_topology::HostTopology,
    /// `kvm`, or `qemu` for TCG.
    pub virt_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scalable_unit: Option<String>,
    /// The rail each RDMA NIC is cabled to (`mlx5_0` → 0, …). Without it,
    /// the NICs paired with GPUs take rails 0, 1, … in bus order.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rails: BTreeMap<String, u32>,
    /// The host's address on the underlay, its VXLAN tunnel endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub underlay_ip: Option<Ipv4Addr>,
    /// The interface towards the provider network, for an edge host
    /// (`kumo-agent --edge-uplink IFACE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge_uplink: Option<String>,
    /// Where the agent serves volumes being moved to other hosts
    /// (`http://ADDR:PORT`, `kumo-agent --transfer-listen`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer_url: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentRegistered {
    pub host_id: Uuid,
    /// `kumoh_<host id>_<secret>`: the host's own credential from now on.
    pub credential: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentHeartbeat {
    /// A fresh inventory, when it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub topology: Option<kumo_topology::HostTopology>,
    /// The underlay address, so a changed one (or a first one, for a host
    /// registered without) reaches the server without registering again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub underlay_ip: Option<Ipv4Addr>,
    /// The RoCE ports' state (QoS, VFs), when it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub fabric: Option<Vec<vxlan_manager::roce::PortReport>>,
    /// The segments the agent's last pass could not set up on this host,
    /// by VNI, with why; empty when every one converged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment_faults: Option<BTreeMap<u32, String>>,
    /// Where the agent serves volumes being moved, when it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer_url: Option<String>,
    /// What the host still sees of its passed-through devices (AER
    /// counters, presence, PCIe link, RDMA ports), every health interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub health: Option<kumo_topology::health::HostSignals>,
    /// The host's storage: what its pool may hold (less the agent's
    /// reserve) and what is free in it. Absent from agents before it:
    /// the server then does not count that host's disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageCapacity>,
    /// The shared filesystem of project shares, where the host has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shares: Option<SharesStorage>,
}

/// The host's mount of the shared filesystem (`--shares-root`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SharesStorage {
    pub root: String,
    pub capacity_gib: u64,
    pub free_gib: u64,
    /// How shares' sizes hold there.
    pub limit: ShareLimit,
    /// Why shares cannot be used on this host (the filesystem is not
    /// mounted, the root is missing); `None` when they can.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// A host's storage as its agent measures it (`statvfs` of the pool's
/// directory, or the LVM thin pool's size), in whole GiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StorageCapacity {
    /// What volumes and snapshots (and root disks, when they share the
    /// pool's filesystem) may be provisioned on: the pool's size less
    /// the agent's reserve (`--storage-reserve-gib`).
    pub capacity_gib: u64,
    /// Free in the pool now (written data counts, holes do not).
    pub free_gib: u64,
    /// Where VMs' root disks live when that is another filesystem than
    /// the pool's (an LVM pool): its size less the reserve. `None`: the
    /// root disks share the pool's capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_disks_gib: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Power {
    Running,
    Stopped,
    /// Saved to disk with libvirt's managed save (CPU-only spot VMs).
    Suspended,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DesiredVm {
    pub id: Uuid,
    pub name: String,
    pub power: Power,
    /// Reboot when this exceeds what the agent last applied.
    pub power_generation: i64,
    pub spec: VmSpec,
    #[schema(value_type = Object)]
    pub placement: kumo_topology::guest_layout::Placement,
    /// The VM is being reclaimed: tell the guest (`/run/kumo/preemption`)
    /// and, for GPU VMs, ask it to shut down; do not start it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<PreemptionNotice>,
    /// Events scheduled for it (maintenance), kept as JSON at
    /// `/run/kumo/events` in the guest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<ScheduledEvent>,
    /// For a cluster member: the cluster's MPI hostfile, kept at
    /// `/etc/kumo/hostfile` in the guest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostfile: Option<String>,
    /// For a cluster member whose siblings have addresses: `ADDRESS NAME`
    /// lines, kept as a block of the guest's `/etc/hosts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<String>,
    /// The VM's NICs on tenant segments, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<DesiredNic>,
    /// Volumes attached to the VM, in the order they were attached.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<DesiredDisk>,
    /// Project shares the VM mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<DesiredMount>,
}

/// A share as a VM's virtiofs filesystem: the share's directory under the
/// host's shares root is all the guest sees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DesiredMount {
    pub share: Uuid,
    pub tag: String,
    pub path: String,
    pub read_only: bool,
}

/// A share whose directory this host keeps on the shared filesystem
/// (made when missing, its limit set to the size).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DesiredShare {
    pub id: Uuid,
    pub size_gib: u32,
    /// The filesystem's project id for its quota.
    pub project: u32,
    /// Made before: a missing directory is then a fault (the shared
    /// filesystem not mounted, or the data gone), never made again empty.
    #[serde(default)]
    pub made: bool,
}

/// A volume as a VM's disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DesiredDisk {
    pub volume: Uuid,
    pub serial: String,
}

/// A volume the host's storage keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DesiredVolume {
    pub id: Uuid,
    pub size_gib: u32,
    /// Its tenant: long work on it (a snapshot merged, a copy made) is
    /// bounded per tenant on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Uuid>,
    /// Made as a copy of this snapshot `(volume, snapshot)` of this host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<(Uuid, Uuid)>,
    /// Its snapshots to keep (made when missing; others are deleted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<Uuid>,
}

/// What a move between hosts carries.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum TransferKind {
    /// A volume of the host's storage pool (its id is the volume's).
    #[default]
    Volume,
    /// A VM's root disk (its id is the VM's): a shelved VM unshelved on
    /// another host takes it along.
    RootDisk,
}

impl TransferKind {
    pub fn is_volume(&self) -> bool {
        *self == TransferKind::Volume
    }
}

/// A volume (or root disk) of this host being moved to another: serve
/// it to the agent that shows a bearer token whose SHA-256 is
/// `token_sha256` (that agent made the token and told only its hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DesiredExport {
    pub volume: Uuid,
    pub token_sha256: String,
    #[serde(default, skip_serializing_if = "TransferKind::is_volume")]
    pub kind: TransferKind,
    /// Its tenant: long work on it (sending, fetching) is bounded per
    /// tenant on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Uuid>,
}

/// A volume (or root disk) being moved to this host: fetch it from
/// `from` (the source agent's transfer address) with a token of this
/// agent's making, and keep it once its checksum matches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DesiredImport {
    pub volume: Uuid,
    pub size_gib: u32,
    pub from: String,
    #[serde(default, skip_serializing_if = "TransferKind::is_volume")]
    pub kind: TransferKind,
    /// Its tenant: long work on it (sending, fetching) is bounded per
    /// tenant on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Uuid>,
}

/// One NIC of a VM: on an Ethernet segment, a virtio NIC on the host's
/// bridge `kbr<VNI>`; on a RoCE segment, one of the VFs passed through
/// (one per GPU rail), tagged with the segment's VLAN.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DesiredNic {
    pub segment: String,
    pub kind: SegmentKind,
    pub vni: u32,
    pub mac: String,
    /// `10.1.0.5/24`.
    pub address: String,
    pub gateway: String,
    pub mtu: u32,
    /// RoCE: the VLAN the VF carries (the leaf maps it to the VNI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// RoCE: the host VF (`0000:19:00.2`) this NIC is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vf: Option<String>,
}

/// What a spot VM's guest finds at `/run/kumo/preemption`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PreemptionNotice {
    pub vm: Uuid,
    /// After this the VM is shut down (GPU VMs) or suspended (CPU-only).
    pub deadline: DateTime<Utc>,
    /// `shutdown` or `suspend`.
    pub action: String,
}

/// Everything that should exist on a host; what is not listed should not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DesiredState {
    pub revision: i64,
    pub vms: Vec<DesiredVm>,
    /// VMs being deleted: remove them if present and report them `absent`.
    /// (Domains of Kumo's that are in neither list are removed as well.)
    #[serde(default)]
    pub remove: Vec<Uuid>,
    /// VMs being shelved: shut them down and undefine them, keeping their
    /// files (root disk, seed); report them `absent` once no domain is left.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shelve: Vec<Uuid>,
    /// The host's tenant networks (`kumo-vxlan`'s state document): every
    /// segment with a VM here, its other hosts and their VMs. Absent for a
    /// host without an underlay address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub network: Option<vxlan_manager::DesiredState>,
    /// The volumes this host's storage keeps (made when missing, grown
    /// when smaller).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<DesiredVolume>,
    /// Volumes to delete: the only way a volume's data goes (one in
    /// neither list is left alone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delete_volumes: Vec<Uuid>,
    /// Volumes of this host that other hosts are fetching.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exports: Vec<DesiredExport>,
    /// Volumes (and root disks) this host fetches from others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub imports: Vec<DesiredImport>,
    /// Root disks this host keeps of VMs that now run elsewhere (moved
    /// away, or deleted while moving): delete them and report them
    /// `absent` under `root_disks`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop_disks: Vec<Uuid>,
    /// Serial consoles people asked for: dial the server at
    /// `/agent/v1/console/{session}` (a websocket, with the host's
    /// credential) and bridge it to the VM's console. Each session is
    /// answered once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consoles: Vec<DesiredConsole>,
    /// Shares whose directories this host keeps (and measures).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<DesiredShare>,
    /// Shares to delete, directory and data.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delete_shares: Vec<Uuid>,
}

/// A console to dial for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DesiredConsole {
    pub session: Uuid,
    pub vm: Uuid,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ActualState {
    Running,
    Stopped,
    /// No such domain (any more).
    Absent,
    /// Shut off with a managed-save image: resumes where it left off.
    Suspended,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VmStatus {
    pub id: Uuid,
    pub state: ActualState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The guest's condition (NCCL file written, or why not), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest: Option<String>,
    /// Whether the preemption notice reached the guest, once per change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
    /// How each of its project shares stands in it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<MountReport>,
}

/// A share in a VM as its host sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MountReport {
    pub share: Uuid,
    /// `mounted`, `at the next start: …`, or why it failed.
    pub condition: String,
}

/// The most characters a status entry's `reason`, `guest` or `notice`
/// may carry; the server drops an entry with more.
pub const REPORT_TEXT_MAX: usize = 1000;

/// The most project shares one VM mounts.
pub const MOUNTS_MAX: usize = 16;

impl VmStatus {
    /// The entry with its texts made fit to report: control characters
    /// (other than line ends) become spaces and each text is cut to
    /// [`REPORT_TEXT_MAX`] characters. Guests and libvirt write these
    /// texts; one VM's garbage must not cost its host the whole report.
    pub fn bounded(mut self) -> VmStatus {
        for t in [&mut self.reason, &mut self.guest, &mut self.notice]
            .into_iter()
            .flatten()
        {
            *t = report_text(t);
        }
        for m in &mut self.mounts {
            m.condition = report_text(&m.condition);
        }
        self
    }

    /// Whether every text fits what the server accepts.
    pub fn texts_fit(&self) -> bool {
        [&self.reason, &self.guest, &self.notice]
            .into_iter()
            .flatten()
            .all(|t| report_text(t) == *t)
            && self.mounts.len() <= MOUNTS_MAX
            && self
                .mounts
                .iter()
                .all(|m| report_text(&m.condition) == m.condition)
    }
}

fn report_text(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() && c != '\n' { ' ' } else { c })
        .take(REPORT_TEXT_MAX)
        .collect()
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusReport {
    pub vms: Vec<VmStatus>,
    /// The host's volumes, as its storage holds them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeStatus>,
    /// Root disks being imported (by VM id), and those dropped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub root_disks: Vec<VolumeStatus>,
    /// Devices a VM let go of that failed their check (reset, config
    /// space, driver, AER) before going back to the pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unfit: Vec<UnfitDevice>,
    /// The shares this host keeps, as their directories stand.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<ShareStatus>,
}

/// A kept share's directory: made (with its usage), absent, or failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShareStatus {
    pub id: Uuid,
    pub state: VolumeActual,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<ShareLimit>,
    /// The measuring walk stopped at its file limit: `used_bytes` is a
    /// lower bound.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub uncounted: bool,
}

/// The most unfit devices one status report may carry.
pub const UNFIT_MAX: usize = 128;

/// A device that did not come back after a VM let it go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UnfitDevice {
    /// The VM that held it.
    pub vm: Uuid,
    /// Its host PCI address.
    pub bdf: String,
    /// What the check found, in words.
    pub problem: String,
}

/// What a host's storage holds of a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeStatus {
    pub id: Uuid,
    pub state: VolumeActual,
    /// Its size as made, GiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_gib: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its snapshots as the host holds them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<Uuid>,
    /// An import's token, as its SHA-256 (hex): what the source agent
    /// checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_sha256: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum VolumeActual {
    Ready,
    /// Not (any more) in the host's storage.
    Absent,
    Failed,
    /// Being fetched from another host (not usable yet).
    Importing,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DesiredParams {
    /// Answer at once if the host's revision is above this; otherwise wait
    /// (up to 25 s) for a change.
    pub after: Option<i64>,
}
