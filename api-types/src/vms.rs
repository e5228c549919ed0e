//! Virtual machines: the create request and its choices (service level,
//! what a lost host or a reclaim does), NICs and the forwards that reach
//! them, the stored spec, state and placement of a VM, its lifecycle events,
//! its GPUs' metrics over time, and the vCPUs and memory a VM gets per GPU
//! unless it asks otherwise.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::hosts::ScheduledEvent;
use crate::public_net::ForwardProtocol;
use crate::storage::{ShareMount, ShareMountRequest};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ServiceLevel {
    #[default]
    Guaranteed,
    Spot,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VmCreate {
    pub name: String,
    /// Whole GPUs; 0 for a CPU-only VM.
    #[serde(default)]
    pub gpus: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    /// Default: 8 per GPU, at least 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u32>,
    /// Default: 48 per GPU, at least 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gib: Option<u32>,
    /// Default 50.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_gib: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    #[serde(default)]
    pub service_level: ServiceLevel,
    #[serde(default)]
    pub ssh_keys: Vec<String>,
    /// Segments of the tenant to attach, in NIC order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<NetworkRequest>,
    /// Available volumes of the tenant to attach: the VM goes on their
    /// host (they must share one), or is refused saying why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<String>,
    /// Project shares to mount (virtiofs; cloud-init mounts each at its
    /// path).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<ShareMountRequest>,
    /// What reclaiming a spot VM does: shut it down for good (the default),
    /// or shelve it, keeping its disk and volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_reclaim: Option<ReclaimAction>,
    /// What happens when its host is lost for good (unreachable longer than
    /// the platform waits): it waits for the host (`lost`, the default),
    /// or is made again on another host from its template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_host_loss: Option<HostLossAction>,
    /// How long its guest has between a notice and being shut down
    /// (checkpointing a large model takes minutes), at most the platform's
    /// `[scheduler] max_notice_secs`: a spot VM's reclaim deadline, and
    /// for any VM, the least warning before a maintenance window acts on
    /// it (a window announced with less lead acts on it that long after
    /// the announcement). Default: the platform's grace for reclaims, the
    /// window's time for maintenance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice_seconds: Option<u32>,
    /// A public address in the same request: a floating address allocated
    /// from the pools (counted in the project's `public_ips`), attached to
    /// the VM's first Ethernet NIC, and SSH (TCP 22) opened in that
    /// segment's ingress rules. Needs a network.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub public_ip: bool,
    /// When no host has room (and no reclaim would make it), wait in the
    /// fair queue as `queued` instead of being refused: admitted in fair
    /// order (the project furthest below its guaranteed share first, then
    /// first come first served), charged nothing while it waits, cancelled
    /// by deleting it, dropped after the platform's `[queue]
    /// expire_after_seconds`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub queue: bool,
    /// Runs on the capacity the project's reservation of this name holds
    /// (while it is active): its GPU model, guaranteed, within the GPUs
    /// reserved. See `Reservation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
}

/// Where a queued VM or cluster stands in the fair queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QueueStanding {
    /// 1 is admitted next, as soon as room for it frees.
    pub position: u32,
    /// Why it waits, e.g. what it is waiting for or who is ahead.
    pub reason: String,
    /// When it is expected to start, if every VM runs the platform's
    /// assumed run time (`[queue] assumed_runtime_seconds`); none when no
    /// host could ever take it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<DateTime<Utc>>,
    pub queued_at: DateTime<Utc>,
    /// When it leaves the queue unplaced.
    pub expires_at: DateTime<Utc>,
}

/// What a lost host does to a VM on it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HostLossAction {
    /// `lost`: charged nothing, counted in no quota, resumed if the host
    /// returns.
    #[default]
    Wait,
    /// Made again on another host: same name, addresses and attachments,
    /// a fresh root disk from its template (volumes on the lost host stay
    /// there, detached). Should the host return, its copy is removed.
    Recreate,
}

impl HostLossAction {
    pub fn is_default(&self) -> bool {
        *self == HostLossAction::Wait
    }

    pub fn as_str(self) -> &'static str {
        match self {
            HostLossAction::Wait => "wait",
            HostLossAction::Recreate => "recreate",
        }
    }
}

/// What reclaiming a spot VM does to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReclaimAction {
    /// Shut down for good (`preempted`; CPU-only ones are suspended).
    #[default]
    ShutDown,
    /// Shelved: its root disk and volumes stay; `unshelve` brings it back.
    Shelve,
}

impl ReclaimAction {
    pub fn is_default(&self) -> bool {
        *self == ReclaimAction::ShutDown
    }
}

/// One NIC of a new VM: a segment, and optionally the address it wants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkRequest {
    /// Segment name or id.
    pub segment: String,
    /// Default: the lowest free address of the segment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
}

/// A VM's NIC on a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VmNetwork {
    pub segment: String,
    pub ip: String,
    pub mac: String,
    /// The NIC's 1:1 floating address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_ip: Option<String>,
    /// Ports of public addresses forwarded to the NIC.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forwards: Vec<NicForward>,
}

/// `public_ip:public_port/protocol` reaches the NIC's `private_port`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NicForward {
    pub public_ip: String,
    pub public_port: u16,
    pub protocol: ForwardProtocol,
    pub private_port: u16,
}

/// `203.0.113.10:2222/tcp → 22`.
impl std::fmt::Display for NicForward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}/{} → {}",
            self.public_ip,
            self.public_port,
            self.protocol.as_str(),
            self.private_port
        )
    }
}

impl VmNetwork {
    /// How to reach the NIC's SSH port from outside, if it can be:
    /// through its floating address, or a forward to port 22.
    pub fn ssh_command(&self, user: Option<&str>) -> Option<String> {
        let at = user.map(|u| format!("{u}@")).unwrap_or_default();
        Some(match self.ssh_way_in()? {
            (ip, 22) => format!("ssh {at}{ip}"),
            (ip, port) => format!("ssh -p {port} {at}{ip}"),
        })
    }

    /// The public address and port that reach the NIC's port 22: its
    /// floating address, else a TCP forward to 22.
    pub fn ssh_way_in(&self) -> Option<(&str, u16)> {
        if let Some(ip) = &self.public_ip {
            return Some((ip, 22));
        }
        self.forwards
            .iter()
            .find(|f| f.private_port == 22 && f.protocol == ForwardProtocol::Tcp)
            .map(|f| (f.public_ip.as_str(), f.public_port))
    }
}

/// A VM's request, as stored and as the agent receives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct VmSpec {
    pub gpus: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    pub vcpus: u32,
    pub memory_gib: u32,
    pub disk_gib: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The template's base image path on the host: in the agent's desired
    /// state only; the API never shows it to tenants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_path: Option<String>,
    /// Direct kernel boot, from the template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelBoot>,
    pub service_level: ServiceLevel,
    #[serde(default)]
    pub ssh_keys: Vec<String>,
    #[serde(default, skip_serializing_if = "ReclaimAction::is_default")]
    pub on_reclaim: ReclaimAction,
    #[serde(default, skip_serializing_if = "HostLossAction::is_default")]
    pub on_host_loss: HostLossAction,
    /// Its own notice, seconds: before a reclaim (else the platform's
    /// grace) and before a maintenance window acts on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice_seconds: Option<u32>,
    /// The reservation whose held capacity it runs on (its id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<uuid::Uuid>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KernelBoot {
    pub kernel: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<String>,
    #[serde(default)]
    pub cmdline: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum VmState {
    /// Waiting in the fair queue for room (`queue` in the request): holds
    /// nothing and is charged nothing; see the VM's `queue`.
    Queued,
    Pending,
    Scheduled,
    Provisioning,
    Running,
    Stopped,
    Deleting,
    Deleted,
    Preempting,
    Preempted,
    /// A CPU-only spot VM saved to disk (libvirt managed save) to make
    /// room; it resumes by itself when room returns.
    Suspended,
    Error,
    /// The host is unreachable: the VM may well be running.
    Unknown,
    /// Being shut down to be shelved.
    Shelving,
    /// Shut down with its GPUs, NICs, CPUs and memory given back; its root
    /// disk and volumes stay on the host that holds them. Charged for
    /// storage only. `unshelve` places it again there.
    Shelved,
    /// Its host has been unreachable longer than the platform waits
    /// (`unknown` until then): charged nothing and counted in no quota. It
    /// resumes if its host returns; deleting it forgets it.
    Lost,
}

impl VmState {
    pub fn as_str(self) -> &'static str {
        match self {
            VmState::Queued => "queued",
            VmState::Pending => "pending",
            VmState::Scheduled => "scheduled",
            VmState::Provisioning => "provisioning",
            VmState::Running => "running",
            VmState::Stopped => "stopped",
            VmState::Deleting => "deleting",
            VmState::Deleted => "deleted",
            VmState::Preempting => "preempting",
            VmState::Preempted => "preempted",
            VmState::Suspended => "suspended",
            VmState::Error => "error",
            VmState::Unknown => "unknown",
            VmState::Shelving => "shelving",
            VmState::Shelved => "shelved",
            VmState::Lost => "lost",
        }
    }

    /// Every state, in lifecycle order.
    pub const ALL: [VmState; 16] = [
        VmState::Queued,
        VmState::Pending,
        VmState::Scheduled,
        VmState::Provisioning,
        VmState::Running,
        VmState::Stopped,
        VmState::Deleting,
        VmState::Deleted,
        VmState::Preempting,
        VmState::Preempted,
        VmState::Suspended,
        VmState::Error,
        VmState::Unknown,
        VmState::Shelving,
        VmState::Shelved,
        VmState::Lost,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        VmState::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PlacedGpu {
    pub host_bdf: String,
    pub guest_bdf: String,
    pub model: String,
    /// The RDMA NIC paired with this GPU, as the host names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nic: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nic_guest_bdf: Option<String>,
    /// On a RoCE segment: the NIC's VF that is passed through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nic_vf: Option<String>,
    /// The guest NUMA node the GPU sits on.
    #[serde(default)]
    pub guest_numa: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GuestNuma {
    pub guest_node: u32,
    pub host_node: u32,
    pub vcpus: String,
    pub host_cpus: String,
    pub memory_mib: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct VmPlacement {
    pub gpus: Vec<PlacedGpu>,
    pub numa: Vec<GuestNuma>,
    /// `efi` (OVMF) for a VM with devices passed through, whose 64-bit
    /// BARs need an aperture only UEFI firmware maps; `bios` otherwise.
    #[serde(default = "bios")]
    pub firmware: String,
    /// The guest's 64-bit PCI MMIO aperture, sized from its devices' BARs
    /// (an H100's framebuffer BAR alone is 128 GiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmio64_bytes: Option<u64>,
    /// The guest CPU's physical address width: reaches its memory and
    /// that aperture.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phys_bits: Option<u8>,
}

fn bios() -> String {
    "bios".into()
}

impl VmPlacement {
    /// How the guest boots, in a line: firmware, aperture, address width.
    pub fn boot_line(&self) -> String {
        match (self.firmware.as_str(), self.mmio64_bytes, self.phys_bits) {
            ("efi", Some(bytes), Some(bits)) => format!(
                "UEFI (OVMF), 64-bit MMIO aperture {} GiB, {bits}-bit guest addresses",
                bytes.div_ceil(1 << 30)
            ),
            ("efi", _, _) => {
                "UEFI (OVMF), aperture unknown: the host could not read its devices' BARs".into()
            }
            _ => "BIOS".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Vm {
    pub id: Uuid,
    pub name: String,
    pub tenant: String,
    pub state: VmState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub spec: VmSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<VmPlacement>,
    /// What the host agent last reported about the guest, e.g.
    /// `nccl-topology written` or why it could not be written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_condition: Option<String>,
    /// A spot VM being reclaimed: when it will be shut down (or suspended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempt_deadline: Option<DateTime<Utc>>,
    /// What is scheduled for it (its host's maintenance), also in the guest
    /// at `/run/kumo/events`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scheduled_events: Vec<ScheduledEvent>,
    /// The training cluster it is a member of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// A guaranteed VM running above its project's guaranteed share of its
    /// GPU model: it may be reclaimed, with notice, for a project within
    /// its own share, and may be charged at the `borrowed_gpu:<model>` rate.
    /// (Since when.) Also an event in `scheduled_events` and in the guest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowed_since: Option<DateTime<Utc>>,
    /// A `queued` VM's place in the fair queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueStanding>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<VmNetwork>,
    /// Project shares it mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<ShareMount>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct VmEvent {
    pub id: i64,
    pub vm_id: Uuid,
    pub at: DateTime<Utc>,
    /// E.g. `created`, `scheduled`, `running`, `stopped`, `deleted`, `error`.
    pub kind: String,
    pub message: String,
}

/// A VM's GPUs over time, a point per step (`GET …/vms/{vm}/metrics`).
/// The figures come from inside the guest: advisory, never billed on.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VmMetrics {
    pub vm: Uuid,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub step_minutes: u32,
    /// `ok`; `unknown` (the guest did not say: no guest agent or
    /// `nvidia-smi`; see `telemetry_reason`); `none` (no reading yet).
    pub telemetry: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_at: Option<DateTime<Utc>>,
    pub gpus: Vec<GpuSeries>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct GpuSeries {
    pub host_bdf: String,
    /// Steps without a reading are left out.
    pub points: Vec<GpuPoint>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GpuPoint {
    /// The step's start.
    pub at: DateTime<Utc>,
    /// Readings in the step.
    pub samples: u32,
    /// Mean and highest utilisation, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization_max_pct: Option<f64>,
    /// Highest memory in use, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_total_mib: Option<u64>,
    /// Highest core temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_c: Option<f64>,
    /// Mean board power.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_w: Option<f64>,
    /// Uncorrectable ECC errors since the guest's driver loaded (highest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_uncorrected: Option<u64>,
    /// Clock throttle reasons seen in the step (NVML's names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub throttle_reasons: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MetricsQuery {
    /// Start [default: 24 h before `to`]; at most 30 days back.
    #[serde(default)]
    pub from: Option<DateTime<Utc>>,
    /// End [default: now].
    #[serde(default)]
    pub to: Option<DateTime<Utc>>,
    /// Minutes per point, 1 to 1440 [default: so that there are at most
    /// 1440 points].
    #[serde(default)]
    pub step_minutes: Option<u32>,
}

/// vCPUs and GiB of memory a VM gets per GPU unless it asks otherwise:
/// what fits on the GPUs' own NUMA nodes of every supported machine (a
/// DGX A100's four GPU nodes hold about 500 GiB for its eight GPUs).
pub const DEFAULT_VCPUS_PER_GPU: u32 = 8;
pub const DEFAULT_MEMORY_GIB_PER_GPU: u32 = 48;

impl VmCreate {
    pub fn vcpus_or_default(&self) -> u32 {
        self.vcpus
            .unwrap_or((DEFAULT_VCPUS_PER_GPU * self.gpus).max(2))
    }

    pub fn memory_gib_or_default(&self) -> u32 {
        self.memory_gib
            .unwrap_or((DEFAULT_MEMORY_GIB_PER_GPU * self.gpus).max(4))
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UnshelveParams {
    /// Place it on any host with room, moving its root disk and volumes
    /// there, instead of waiting for room on the host holding them.
    pub anywhere: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placement_says_how_its_guest_boots() {
        let mut p = VmPlacement {
            gpus: vec![],
            numa: vec![],
            firmware: "efi".into(),
            mmio64_bytes: Some(1025 << 30),
            phys_bits: Some(42),
        };
        assert_eq!(
            p.boot_line(),
            "UEFI (OVMF), 64-bit MMIO aperture 1025 GiB, 42-bit guest addresses"
        );
        p.mmio64_bytes = None;
        assert!(p.boot_line().contains("aperture unknown"));
        // A placement from a server before firmware was shown reads BIOS.
        let old: VmPlacement = serde_json::from_str(r#"{"gpus": [], "numa": []}"#).unwrap();
        assert_eq!(old.boot_line(), "BIOS");
    }

    #[test]
    fn the_ssh_command_goes_through_what_reaches_port_22() {
        let mut n = VmNetwork {
            segment: "lan".into(),
            ip: "10.1.0.2".into(),
            mac: "02:6b:00:00:00:02".into(),
            public_ip: None,
            forwards: vec![NicForward {
                public_ip: "203.0.113.10".into(),
                public_port: 8080,
                protocol: ForwardProtocol::Tcp,
                private_port: 80,
            }],
        };
        assert_eq!(n.ssh_command(Some("ubuntu")), None, "no way in to port 22");
        n.forwards.push(NicForward {
            public_ip: "203.0.113.10".into(),
            public_port: 2222,
            protocol: ForwardProtocol::Tcp,
            private_port: 22,
        });
        assert_eq!(
            n.ssh_command(Some("ubuntu")).as_deref(),
            Some("ssh -p 2222 ubuntu@203.0.113.10")
        );
        n.public_ip = Some("203.0.113.11".into());
        assert_eq!(n.ssh_command(None).as_deref(), Some("ssh 203.0.113.11"));
    }
}
