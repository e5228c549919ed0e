//! Storage that outlives VMs: block volumes on one host's pool (with
//! snapshots, moves and attaching), and project shares on the filesystem
//! every host mounts, with how VMs mount them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// Where a volume is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum VolumeState {
    /// Its host has not made it yet.
    Creating,
    /// Made, attached to no VM.
    Available,
    /// A disk of a VM (hot-plugged into it when it runs).
    Attached,
    /// Its host is removing it.
    Deleting,
    /// Its host could not make or change it (`reason` says why).
    Error,
    /// Being copied to another host (`moving_to`); usable there once the
    /// copy is whole and its checksum matches.
    Moving,
}

impl VolumeState {
    pub const ALL: [VolumeState; 6] = [
        VolumeState::Creating,
        VolumeState::Available,
        VolumeState::Attached,
        VolumeState::Deleting,
        VolumeState::Error,
        VolumeState::Moving,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            VolumeState::Creating => "creating",
            VolumeState::Available => "available",
            VolumeState::Attached => "attached",
            VolumeState::Deleting => "deleting",
            VolumeState::Error => "error",
            VolumeState::Moving => "moving",
        }
    }
}

/// A block volume that outlives VMs: it lives on one host's storage pool
/// and is a disk of at most one VM on that host at a time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Volume {
    pub id: Uuid,
    pub name: String,
    pub tenant: String,
    pub size_gib: u32,
    pub state: VolumeState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The host whose storage holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The VM it is a disk of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm: Option<String>,
    /// While `moving`: the host it is being copied to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving_to: Option<String>,
    /// The disk's serial: in the guest it is
    /// `/dev/disk/by-id/virtio-<serial>`.
    pub serial: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Volume {
    /// Where the guest finds it.
    pub fn guest_path(&self) -> String {
        format!("/dev/disk/by-id/virtio-{}", self.serial)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeCreate {
    pub name: String,
    /// GiB; made from a snapshot, at least the snapshot's size (0: that size).
    #[serde(default)]
    pub size_gib: u32,
    /// `VOLUME@SNAPSHOT`: a copy of a snapshot of the tenant's, made on
    /// that volume's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<String>,
    /// Make it on this VM's host (so it can be attached to it); otherwise
    /// Kumo picks a host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm: Option<String>,
}

/// A new, larger size (a detached volume only grows).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeResize {
    pub size_gib: u32,
}

/// A point-in-time copy of a detached volume, kept on its host; new
/// volumes are made from it there. Charged per GiB-hour (`snapshot_gib`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VolumeSnapshot {
    pub id: Uuid,
    pub name: String,
    pub volume: String,
    pub size_gib: u32,
    /// `creating`, `available` or `deleting`.
    pub state: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeSnapshotCreate {
    pub name: String,
}

/// Where a detached volume goes: its host's agent sends it to `host`'s
/// agent, which keeps it once the copy is whole and its checksum matches.
/// Naming the host it is on cancels a move under way.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeMove {
    pub host: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeAttach {
    /// A VM on the volume's host.
    pub vm: String,
}

/// Where a project share is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ShareState {
    /// Its directory is not made yet.
    Creating,
    /// Made: VMs of the project may mount it.
    Available,
    /// Its directory and data are being removed.
    Deleting,
    /// Its directory could not be made or changed (`reason` says why).
    Error,
}

impl ShareState {
    pub const ALL: [ShareState; 4] = [
        ShareState::Creating,
        ShareState::Available,
        ShareState::Deleting,
        ShareState::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ShareState::Creating => "creating",
            ShareState::Available => "available",
            ShareState::Deleting => "deleting",
            ShareState::Error => "error",
        }
    }
}

/// How a share's size limit holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ShareLimit {
    /// The filesystem's project quota: a write past the size fails with
    /// "Disk quota exceeded".
    ProjectQuota,
    /// The filesystem has no project quotas: usage is measured, and past
    /// the size the share turns read-only at each VM's next start.
    Measured,
}

/// A project share: a directory with a size limit on the filesystem that
/// every host mounts at the same place (Lustre, NFS, CephFS), mounted into
/// the project's VMs with virtiofs. Charged per GiB-hour of its size
/// (`share_gib`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Share {
    pub id: Uuid,
    pub name: String,
    pub tenant: String,
    pub size_gib: u32,
    pub state: ShareState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Bytes written in it, as last measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// How its size holds, once made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<ShareLimit>,
    /// Past its size where the filesystem cannot stop writes: its mounts
    /// are read-only from each VM's next start.
    #[serde(default)]
    pub read_only: bool,
    /// The VMs that mount it.
    #[serde(default)]
    pub mounts: Vec<ShareMount>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A share in a VM: where the guest mounts it and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ShareMount {
    pub share: String,
    pub vm: String,
    /// The guest's mount point.
    pub path: String,
    pub read_only: bool,
    /// The virtiofs tag: `mount -t virtiofs TAG PATH` in the guest.
    pub tag: String,
    /// How the mount stands: `mounted` (in the VM's definition, running),
    /// `at the next start` (added to a running VM), or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShareCreate {
    pub name: String,
    pub size_gib: u32,
}

/// A new, larger size (a share only grows).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShareGrow {
    pub size_gib: u32,
}

/// A share to mount in a VM (at create, or later).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShareMountRequest {
    /// The tenant's share, by name or id.
    pub share: String,
    /// The guest's mount point; default `/mnt/<share>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default)]
    pub read_only: bool,
}

impl ShareMountRequest {
    /// `NAME[:/PATH][:ro]`, the CLI's `--share`.
    pub fn parse(s: &str) -> Result<ShareMountRequest, String> {
        let mut parts = s.split(':');
        let share = parts.next().unwrap_or_default().to_owned();
        if share.is_empty() {
            return Err(format!("{s:?}: NAME[:/PATH][:ro]"));
        }
        let mut r = ShareMountRequest {
            share,
            path: None,
            read_only: false,
        };
        for p in parts {
            match p {
                "ro" if !r.read_only => r.read_only = true,
                "rw" if !r.read_only => {}
                p if p.starts_with('/') && r.path.is_none() && !r.read_only => {
                    r.path = Some(p.to_owned())
                }
                _ => return Err(format!("{s:?}: NAME[:/PATH][:ro]")),
            }
        }
        Ok(r)
    }
}
