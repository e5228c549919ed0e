//! Request and response bodies of Kumo's REST API (`/api/v1`).
//!
//! The server derives its OpenAPI document from these types, and the CLI and
//! the tests decode responses with them, so the contract lives in one place.
//! Request bodies reject unknown fields: a misspelt field is an error, not a
//! silently ignored wish.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

/// Media type of every error answer (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem detail. `type` is stable per kind of error; clients
/// branch on it, never on `title` or `detail`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// A URI reference naming the kind of problem, e.g. `/problems/not-found`.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The request id (also in the `x-request-id` header), for support and the audit log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// Field-level validation errors.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
    /// For `quota-exceeded`: the resource whose limit was hit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

/// One page of a list. Pass `next_page_token` back as `page_token` for the next page;
/// it is absent on the last page.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Page<T> {
    pub items: Vec<T>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_page_token: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items per page, 1–500 (default 100).
    pub limit: Option<u32>,
    /// The `next_page_token` of the previous page.
    pub page_token: Option<String>,
}

// ---------------------------------------------------------------- tenants

/// A tenant is a research project: it owns VMs, networks, quota and points.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Tenant {
    pub id: Uuid,
    /// `[a-z][a-z0-9-]{2,62}`, unique, usable in paths instead of the id.
    pub name: String,
    pub display_name: String,
    pub description: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantCreate {
    pub name: String,
    /// Defaults to the name.
    #[serde(default)]
    pub display_name: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
}

/// Fields left out keep their value.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

// ---------------------------------------------------------------- users

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum UserKind {
    /// A person.
    Local,
    /// A robot account for automation; it logs in only with API tokens.
    Service,
    /// A person who logs in through an institution's OpenID Provider.
    Federated,
}

impl UserKind {
    pub fn as_str(self) -> &'static str {
        match self {
            UserKind::Local => "local",
            UserKind::Service => "service",
            UserKind::Federated => "federated",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "local" => Some(UserKind::Local),
            "service" => Some(UserKind::Service),
            "federated" => Some(UserKind::Federated),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct User {
    pub id: Uuid,
    /// `[a-z][a-z0-9._-]{1,62}`, unique.
    pub name: String,
    pub display_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    pub kind: UserKind,
    /// Platform administrator: sees and manages every tenant.
    pub is_admin: bool,
    pub created_at: DateTime<Utc>,
    /// Disabled by an administrator: its tokens fail and it has no
    /// sessions until enabled again.
    #[serde(default)]
    pub disabled: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UserCreate {
    pub name: String,
    #[serde(default)]
    pub display_name: Option<String>,
    #[serde(default)]
    pub email: Option<String>,
    /// Default `local`.
    #[serde(default)]
    pub kind: Option<UserKind>,
    #[serde(default)]
    pub is_admin: bool,
}

/// The caller, with the tenants they belong to.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Me {
    pub user: User,
    pub memberships: Vec<Membership>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Membership {
    pub tenant: String,
    pub tenant_id: Uuid,
    pub role: Role,
}

// ---------------------------------------------------------------- members

/// A member's role in a tenant: viewers read, members act, owners also
/// manage members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Viewer,
    Member,
    Owner,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Member => "member",
            Role::Owner => "owner",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "viewer" => Some(Role::Viewer),
            "member" => Some(Role::Member),
            "owner" => Some(Role::Owner),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Member {
    pub user: String,
    pub user_id: Uuid,
    pub role: Role,
    pub since: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MemberPut {
    pub role: Role,
}

// ---------------------------------------------------------------- tokens

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenCreate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// When the token stops working; none means never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
}

/// Answer to a token creation: the only time the secret is shown.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenCreated {
    pub id: Uuid,
    /// `kumo_<id>_<secret>`; only a hash of it is stored.
    pub token: String,
    pub expires_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TokenInfo {
    pub id: Uuid,
    pub user: String,
    pub description: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
}

// ---------------------------------------------------------------- quota

/// Limits of a tenant. A new tenant starts with zero of everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    /// GPUs per GPU model, e.g. `{"A100-SXM4-40GB": 16}`.
    #[serde(default)]
    pub gpus: BTreeMap<String, u32>,
    #[serde(default)]
    pub vcpus: u32,
    #[serde(default)]
    pub memory_gib: u32,
    #[serde(default)]
    pub vms: u32,
    /// Disk over all the tenant's VMs, GiB.
    #[serde(default)]
    pub disk_gib: u32,
    #[serde(default)]
    pub segments: u32,
    /// RoCE segments, each of which holds one of the fabric's VLANs (a
    /// pool every tenant shares); they count among `segments` too.
    #[serde(default)]
    pub roce_segments: u32,
    #[serde(default)]
    pub public_ips: u32,
    /// Volumes over all the tenant's volumes, GiB.
    #[serde(default)]
    pub volume_gib: u32,
    /// Project shares' sizes together, GiB.
    #[serde(default)]
    pub share_gib: u32,
    /// GPUs per model the platform promises the tenant (each at most its
    /// cap in `gpus`): a request within it gets room, when the fleet is
    /// full, by reclaiming VMs other tenants run above their own (their
    /// borrowed VMs). The guarantees of all tenants together never exceed
    /// the model's GPUs in service.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub guarantee: BTreeMap<String, u32>,
}

/// A GPU model's guaranteed shares against the fleet: all tenants'
/// guarantees together, and the model's GPUs in service now (on hosts not
/// unreachable, retired or in maintenance, less those quarantined or in
/// repair). `promised` above `in_service` means the platform cannot keep
/// every promise until hosts come back or guarantees are lowered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GuaranteeStanding {
    pub model: String,
    pub promised: u64,
    pub in_service: u64,
    /// Tenants promised some of it, with their guarantee.
    pub tenants: BTreeMap<String, u32>,
}

// ---------------------------------------------------------------- audit

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditEntry {
    pub id: i64,
    pub at: DateTime<Utc>,
    /// User name of the actor.
    pub actor: String,
    /// E.g. `tenant.create`, `member.put`, `token.revoke`.
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// What was acted on, e.g. a tenant, user or token name/id.
    pub target: String,
    pub source_ip: String,
    /// The id the server gave the request (the `x-request-id` it answered
    /// with).
    pub request_id: String,
    /// The `x-request-id` the client sent, if it was at most 64 visible
    /// ASCII characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_request_id: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    /// Only this tenant's entries (name or id). Required for tenant owners
    /// who want one tenant; admins see everything without it.
    pub tenant: Option<String>,
    pub limit: Option<u32>,
    pub page_token: Option<String>,
}

// ---------------------------------------------------------------- health

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: String,
}

#[cfg(test)]
mod tests {

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

    use super::*;

    #[test]
    fn websocket_urls_follow_the_servers_scheme() {
        assert_eq!(websocket_url("http://k:8080/", "/a"), "ws://k:8080/a");
        assert_eq!(
            websocket_url("https://kumo.example", "/a"),
            "wss://kumo.example/a"
        );
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

    #[test]
    fn problem_uses_rfc9457_member_names() {
        let p = Problem {
            kind: "/problems/not-found".into(),
            title: "Not found".into(),
            status: 404,
            detail: None,
            instance: None,
            request_id: None,
            errors: vec![],
            resource: None,
        };
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["type"], "/problems/not-found");
        assert!(v.get("detail").is_none());
        assert!(v.get("errors").is_none());
    }

    #[test]
    fn requests_reject_unknown_fields() {
        let err = serde_json::from_str::<TenantCreate>(r#"{"name":"a","colour":"red"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `colour`"), "{err}");
    }

    #[test]
    fn roles_order_by_power() {
        assert!(Role::Owner > Role::Member && Role::Member > Role::Viewer);
        for r in [Role::Viewer, Role::Member, Role::Owner] {
            assert_eq!(Role::parse(r.as_str()), Some(r));
        }
    }
}

// ---------------------------------------------------------------- hosts

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JoinTokenCreate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Lifetime in seconds (default one day, at most 30 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// How many hosts it may register (default 1, at most 10,000). A join
    /// token never takes the name of a registered host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uses: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JoinTokenCreated {
    pub id: Uuid,
    /// `kumoj_<id>_<secret>`, shown once.
    pub token: String,
    pub expires_at: DateTime<Utc>,
    /// How many hosts it may register.
    pub uses: u32,
}

/// A join token as listed: never its secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JoinTokenInfo {
    pub id: Uuid,
    pub description: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// Registrations it may make, and has made.
    pub uses: u32,
    pub used: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HostState {
    Ready,
    Draining,
    Unreachable,
    Retired,
    /// In its maintenance window: its VMs moved off or stopped; it takes
    /// nothing new until an admin is done with it.
    Maintenance,
}

impl HostState {
    pub const ALL: [HostState; 5] = [
        HostState::Ready,
        HostState::Draining,
        HostState::Unreachable,
        HostState::Retired,
        HostState::Maintenance,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            HostState::Ready => "ready",
            HostState::Draining => "draining",
            HostState::Unreachable => "unreachable",
            HostState::Retired => "retired",
            HostState::Maintenance => "maintenance",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        HostState::ALL.into_iter().find(|h| h.as_str() == s)
    }
}

/// A host's scheduled maintenance window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MaintenanceWindow {
    /// When its VMs are moved off (or stopped) and it goes to
    /// `maintenance`.
    pub at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Schedules (or moves) a host's maintenance window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MaintenanceCreate {
    pub at: DateTime<Utc>,
    /// Told to the tenants whose VMs it moves (at most 200 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What a scheduled event does to a VM when its time comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ScheduledAction {
    /// Shelved and placed on another host, its disks moving with it (as
    /// `unshelve --anywhere` does); `kumo vm evacuate` does it early.
    Evacuate,
    /// A cluster member: replaced on another host (same name and
    /// addresses, a fresh root disk), as `kumo cluster repair` does.
    Replace,
    /// Stopped where it is (it cannot move: suspended, being reclaimed).
    Stop,
    /// Nothing yet: a borrowed VM (above its project's guaranteed share)
    /// may be reclaimed, with its notice, for a project within its own.
    Reclaimable,
}

/// An event scheduled for a VM, as the API shows it and as the guest
/// reads it in `/run/kumo/events` (a JSON array of these, `[]` when none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ScheduledEvent {
    /// `maintenance`, or `borrowed` (since `at`).
    pub kind: String,
    /// When it happens.
    pub at: DateTime<Utc>,
    pub action: ScheduledAction,
    /// The host being maintained.
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Host {
    pub id: Uuid,
    pub name: String,
    pub state: HostState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scalable_unit: Option<String>,
    pub virt_type: String,
    pub gpu_models: Vec<String>,
    pub gpus: u32,
    /// Neither held by a VM nor out of service.
    pub gpus_free: u32,
    /// Quarantined, in repair or being validated (see `/api/v1/devices`).
    #[serde(default)]
    pub gpus_out_of_service: u32,
    pub rdma_nics: u32,
    pub cpus: u32,
    /// Whether the host may pass its GPUs and NICs through: an IOMMU on,
    /// IOMMU groups holding only what goes with each device, ACS on the
    /// ports above them, hugepages on KVM hosts. One that is not takes
    /// CPU-only VMs only.
    #[serde(default = "ready")]
    pub passthrough_ready: bool,
    /// Why not, one problem per entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passthrough_problems: Vec<String>,
    /// Hugepage memory free for guests.
    #[serde(default)]
    pub hugepages_free_bytes: u64,
    /// On an NVSwitch host in shared NVSwitch mode, the partitions its
    /// Fabric Manager supports: a multi-GPU VM gets exactly one of these
    /// GPU sets, activated before it starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<NvSwitchPartition>,
    /// Why the host takes 1-GPU VMs only (its Fabric Manager does not answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric_manager_problem: Option<String>,
    /// The host's VXLAN tunnel endpoint; without one it takes no VMs
    /// with networks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub underlay_ip: Option<Ipv4Addr>,
    /// Its scheduled maintenance window, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<MaintenanceWindow>,
    /// An edge host's interface towards the provider network: segments'
    /// gateways and public addresses may be placed there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge_uplink: Option<String>,
    pub registered_at: DateTime<Utc>,
    pub last_heartbeat_at: DateTime<Utc>,
}

fn ready() -> bool {
    true
}

/// An NVSwitch partition: Fabric Manager's id and its GPUs' host addresses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NvSwitchPartition {
    pub id: u32,
    pub gpus: Vec<String>,
}

/// A passed-through device's health (see the README's "Device health").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeviceState {
    Healthy,
    /// Degraded (a narrowed link, correctable errors, a flapping port):
    /// still placeable; clears after a clean period.
    Suspect,
    /// Broken: takes no new VMs until an operator repairs and validates it.
    Quarantined,
    Repairing,
    /// Repaired: the next clean reading makes it healthy.
    Validating,
}

impl DeviceState {
    pub const ALL: [DeviceState; 5] = [
        DeviceState::Healthy,
        DeviceState::Suspect,
        DeviceState::Quarantined,
        DeviceState::Repairing,
        DeviceState::Validating,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeviceState::Healthy => "healthy",
            DeviceState::Suspect => "suspect",
            DeviceState::Quarantined => "quarantined",
            DeviceState::Repairing => "repairing",
            DeviceState::Validating => "validating",
        }
    }

    pub fn parse(s: &str) -> Option<DeviceState> {
        DeviceState::ALL.into_iter().find(|d| d.as_str() == s)
    }

    /// Whether new VMs may be placed on the device.
    pub fn placeable(self) -> bool {
        matches!(self, DeviceState::Healthy | DeviceState::Suspect)
    }
}

/// A passed-through device as its host last reported it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Device {
    pub host: String,
    pub bdf: String,
    /// `gpu` or `nic`.
    pub kind: String,
    pub state: DeviceState,
    /// Why it is in its state (the findings, or the operator's words).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub since: DateTime<Utc>,
    /// When its host last reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_at: Option<DateTime<Utc>>,
    /// The VMs holding it.
    pub vms: Vec<Uuid>,
    /// The last reading: `device` (presence, AER totals, PCIe link) and
    /// `ports` (RDMA ports' state, carrier changes, RoCE counters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub signals: Option<serde_json::Value>,
}

/// The fleet's devices by state, and whether automatic quarantine has
/// reached its limit.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeviceList {
    pub items: Vec<Device>,
    /// Devices per state, over the whole fleet.
    pub counts: BTreeMap<String, u64>,
    /// How many devices may be quarantined automatically.
    pub quarantine_cap: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeviceQuery {
    /// Only this host's devices (name or id).
    #[serde(default)]
    pub host: Option<String>,
    /// Only devices in this state.
    #[serde(default)]
    pub state: Option<DeviceState>,
}

/// An operator's step on a device: `quarantine`, `repair` (it is being
/// worked on) or `validate` (repaired; the next clean reading clears it).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct DeviceAction {
    /// Why, for the device's record and the audit log.
    #[serde(default)]
    pub reason: Option<String>,
}

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

/// What happens to a GPU VM idle for a whole window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum IdleAction {
    /// Its project is told (event, portal, webhook); the VM runs on.
    Notice,
    /// Its project is told, then the VM is shelved: its GPUs go back to
    /// the pool, its disk and volumes are kept.
    Shelve,
}

impl IdleAction {
    pub fn as_str(self) -> &'static str {
        match self {
            IdleAction::Notice => "notice",
            IdleAction::Shelve => "shelve",
        }
    }
}

/// A GPU VM is idle while every one of its GPUs reads below
/// `utilization_pct` (minute means); idle for `hours`, `action` follows.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct IdlePolicy {
    pub utilization_pct: f64,
    pub hours: u32,
    pub action: IdleAction,
}

/// A project's idle policy: the platform's, the project's own where it
/// set one, and what is in force.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct IdlePolicyView {
    pub tenant: String,
    /// What is in force: the project's own or, without one, the platform's.
    pub effective: IdlePolicy,
    pub platform: IdlePolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own: Option<IdlePolicy>,
    /// Where notices are also posted (only scheme and host are shown: a
    /// webhook's address is often its secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookView>,
    /// The longest an exemption may run (owners; administrators any).
    pub max_exemption_days: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WebhookView {
    /// `https://host` of the address; the rest is never shown again.
    pub target: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_delivery_at: Option<DateTime<Utc>>,
    /// `delivered (HTTP 200)`, or why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_result: Option<String>,
}

/// A project's own idle policy (`PUT …/idle-policy`), replacing what it
/// had. Fields left out are the platform's. Owners may only make the
/// policy stricter (a higher threshold, a shorter window, shelving);
/// administrators may set any.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IdlePolicyUpdate {
    #[serde(default)]
    pub utilization_pct: Option<f64>,
    #[serde(default)]
    pub hours: Option<u32>,
    #[serde(default)]
    pub action: Option<IdleAction>,
    /// Where notices are posted as JSON (with a Slack-style `text`):
    /// `https://` to a public address.
    #[serde(default)]
    pub webhook_url: Option<String>,
}

/// An owner's exemption of one VM from the idle policy.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IdleExemptionRequest {
    /// Why (kept in the audit log), 1 to 500 characters.
    pub reason: String,
    /// When it ends; at most the policy's `max_exemption_days` ahead.
    pub until: DateTime<Utc>,
}

/// One GPU VM as the idle policy sees it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct IdleVm {
    pub vm: Uuid,
    pub name: String,
    pub gpus: u32,
    /// Since when all its GPUs read below the threshold; none while busy,
    /// or while they cannot say (unknown is never idle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_since: Option<DateTime<Utc>>,
    /// Minutes counted against the window (from the end of an exemption,
    /// if one ended during the idle spell).
    pub idle_minutes: i64,
    /// Notices sent in this spell: 0, 1 (half the window), 2 (near its
    /// end), 3 (the action was taken).
    pub notices: u8,
    /// When the action falls due if nothing changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exempt_until: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exempt_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exempt_by: Option<String>,
}

/// A project's running GPU VMs under its idle policy
/// (`GET …/idle-vms`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct IdleReport {
    pub policy: IdlePolicy,
    pub vms: Vec<IdleVm>,
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

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Allocation {
    /// `gpu`, `nic` or `cpu`.
    pub kind: String,
    pub key: String,
    pub vm_id: Uuid,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HostDetail {
    #[serde(flatten)]
    pub host: Host,
    /// The topology the agent reported (`HostTopology`).
    #[schema(value_type = Object)]
    pub topology: serde_json::Value,
    /// `nvidia-smi topo -m`-style matrix of the GPUs and RDMA NICs.
    pub matrix: String,
    pub allocations: Vec<Allocation>,
    /// Each RoCE port as the agent last found it: lossless QoS and the VFs
    /// of VMs on RoCE segments (applied, unchanged, unsupported or failed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<Object>)]
    pub fabric: Vec<vxlan_manager::roce::PortReport>,
}

// ---------------------------------------------------------------- templates

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateCreate {
    pub name: String,
    /// Base qcow2 image, as a path on every host.
    pub image_path: String,
    pub os: String,
    pub default_user: String,
    /// Boot this kernel directly (with `initrd_path` and `kernel_cmdline`)
    /// instead of the disk's boot loader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_cmdline: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Template {
    pub id: Uuid,
    pub name: String,
    /// The base image's path on the hosts; shown to platform admins only,
    /// like `kernel_path` and `initrd_path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_path: Option<String>,
    pub os: String,
    pub default_user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_cmdline: Option<String>,
    pub created_at: DateTime<Utc>,
}

// ---------------------------------------------------------------- vms

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SegmentKind {
    /// Virtio NICs on the segment's bridge; VXLAN on the hosts.
    Ethernet,
    /// SR-IOV VFs of the GPUs' paired NICs; lossless (PFC on priority 3).
    Roce,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SegmentCreate {
    pub name: String,
    pub kind: SegmentKind,
    /// An IPv4 network, e.g. `10.1.0.0/24` (prefix 8–29).
    pub cidr: String,
    /// Default: the network's first address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Default: the underlay MTU minus VXLAN's 50 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Who else may reach the segment's VMs. IPv4 from the segment's own
    /// network always may; from anywhere else, only what a rule allows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<IngressRule>,
    /// Whether the VMs reach outside through the segment's gateway
    /// (SNAT to a public address). Default: on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<bool>,
}

/// What may change of a segment after it is made.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SegmentUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum IngressProtocol {
    Tcp,
    Udp,
    Icmp,
    Any,
}

/// Let in IPv4 from `source` of this protocol (and ports).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IngressRule {
    pub protocol: IngressProtocol,
    /// `22` or `8000-8100`; TCP and UDP only; all ports when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<String>,
    /// An IPv4 network, e.g. `192.0.2.0/24` (`0.0.0.0/0` for anywhere).
    pub source: String,
}

/// The short form the CLI and the portal take: `PROTO[:PORTS]:SOURCE`,
/// e.g. `tcp:22:0.0.0.0/0`, `icmp:10.0.0.0/8`.
impl std::str::FromStr for IngressRule {
    type Err = String;

    fn from_str(s: &str) -> Result<IngressRule, String> {
        let bad = || format!("{s:?}: expected PROTO[:PORTS]:SOURCE, e.g. tcp:22:0.0.0.0/0");
        let parts: Vec<&str> = s.split(':').collect();
        let (proto, ports, source) = match parts.as_slice() {
            [p, src] => (*p, None, *src),
            [p, ports, src] => (*p, Some((*ports).to_owned()), *src),
            _ => return Err(bad()),
        };
        let protocol = match proto {
            "tcp" => IngressProtocol::Tcp,
            "udp" => IngressProtocol::Udp,
            "icmp" => IngressProtocol::Icmp,
            "any" => IngressProtocol::Any,
            _ => return Err(bad()),
        };
        Ok(IngressRule {
            protocol,
            ports,
            source: source.to_owned(),
        })
    }
}

impl std::fmt::Display for IngressRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let proto = match self.protocol {
            IngressProtocol::Tcp => "tcp",
            IngressProtocol::Udp => "udp",
            IngressProtocol::Icmp => "icmp",
            IngressProtocol::Any => "any",
        };
        match &self.ports {
            Some(p) => write!(f, "{proto}:{p}:{}", self.source),
            None => write!(f, "{proto}:{}", self.source),
        }
    }
}

/// A segment's whole ingress rule list, replacing the one before.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SegmentIngress {
    pub rules: Vec<IngressRule>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Segment {
    pub id: Uuid,
    pub name: String,
    pub tenant: String,
    pub kind: SegmentKind,
    pub cidr: String,
    pub gateway: String,
    pub mtu: u32,
    /// For RoCE segments: the RoCE path MTU the NICs will use (the
    /// largest of 1024, 2048 and 4096 under `mtu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roce_mtu: Option<u32>,
    pub vni: u32,
    /// RoCE segments: the VLAN of the VMs' VFs, which the leaf switches
    /// map to the VNI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// VMs' NICs attached (a RoCE VM has one per GPU rail).
    pub attachments: u32,
    #[serde(default)]
    pub ingress: Vec<IngressRule>,
    /// Hosts that could not set the segment up, with why: its VMs there
    /// wait (shown in their `reason`) while the host's other work goes on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<SegmentFault>,
    /// VMs reach outside through the gateway.
    #[serde(default)]
    pub egress: bool,
    /// Where the segment's gateway, egress and public addresses live: an
    /// edge host, once the segment needs one and one is up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge: Option<SegmentEdge>,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SegmentEdge {
    pub host: String,
    /// The public address the VMs' outbound traffic leaves from (VMs with
    /// a floating address leave from that instead); none while the pools
    /// have no free address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snat_address: Option<String>,
}

// ---------------------------------------------------------------- public networking

/// A provider network's addresses, for edges to carry (platform admins).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublicIpPoolCreate {
    pub name: String,
    /// The provider network, e.g. `203.0.113.0/24`.
    pub cidr: String,
    /// Its router: where edges send what leaves.
    pub gateway: String,
    /// `FIRST-LAST`: the addresses Kumo hands out. Default: every host
    /// address of `cidr` but the gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PublicIpPool {
    pub id: Uuid,
    pub name: String,
    pub cidr: String,
    pub gateway: String,
    pub first: String,
    pub last: String,
    /// Addresses in `first..=last`.
    pub size: u32,
    /// Addresses in use: tenants' and segment edges'.
    pub used: u32,
    pub created_at: DateTime<Utc>,
}

/// Allocate a public address to the tenant (members; within the
/// `public_ips` quota).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublicIpAllocate {
    /// Default: the first pool with a free address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
}

/// Which NIC: a VM and, for a VM on several segments, the segment.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublicIpAttach {
    pub vm: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<String>,
}

/// A NIC a public address leads to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NicRef {
    pub vm: String,
    pub segment: String,
    pub ip: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PublicIp {
    pub id: Uuid,
    pub address: String,
    pub pool: String,
    pub tenant: String,
    /// The NIC it is the 1:1 floating address of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attached: Option<NicRef>,
    pub created_at: DateTime<Utc>,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ForwardProtocol {
    Tcp,
    Udp,
}

impl ForwardProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            ForwardProtocol::Tcp => "tcp",
            ForwardProtocol::Udp => "udp",
        }
    }
}

/// `public_ip:public_port/protocol` → the VM's NIC's `private_port`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PortForwardCreate {
    /// One of the tenant's public addresses, not attached to a NIC.
    pub public_ip: String,
    pub protocol: ForwardProtocol,
    pub public_port: u16,
    pub vm: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<String>,
    pub private_port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PortForward {
    pub id: Uuid,
    pub tenant: String,
    pub public_ip: String,
    pub protocol: ForwardProtocol,
    pub public_port: u16,
    pub to: NicRef,
    pub private_port: u16,
    pub created_at: DateTime<Utc>,
}

/// A host that could not set a segment up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SegmentFault {
    pub host: String,
    pub message: String,
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
    pub const ALL: [VmState; 15] = [
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

// ---------------------------------------------------------------- volumes

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

// ---------------------------------------------------------------- shares

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

// ---------------------------------------------------------------- clusters

/// A training cluster: `size` identical VMs placed all or nothing, in one
/// scalable unit when one has room, rail-aligned.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterCreate {
    /// Also the members' name prefix: `NAME-0`, `NAME-1`, …
    pub name: String,
    pub size: u32,
    /// GPUs per member.
    #[serde(default)]
    pub gpus: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gib: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_gib: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    #[serde(default)]
    pub service_level: ServiceLevel,
    #[serde(default)]
    pub ssh_keys: Vec<String>,
    /// Segments every member joins (names or ids); the hostfile then names
    /// members by their address on the first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<String>,
    /// Project shares every member mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<ShareMountRequest>,
    /// Replace failed members without being asked, `repair_delay_seconds`
    /// after the cluster became degraded (`kumo cluster repair` does it by
    /// hand).
    #[serde(default)]
    pub auto_repair: bool,
    /// How long a degraded cluster waits before it repairs itself (a host
    /// that is only rebooting comes back within it). At most a day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair_delay_seconds: Option<u32>,
    /// Members' worth of the cluster's shape kept free in its scalable
    /// unit for repairs (at most the cluster's size; guaranteed clusters
    /// only). No other tenant's guaranteed VM is placed on them; spot VMs
    /// may run there and are reclaimed, with notice, when a repair needs
    /// the room. Charged at the `spare_gpu:<model>` rate while the cluster
    /// lives.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub spares: u32,
    /// Whether the members must share one scalable unit: `preferred` (the
    /// default: one unit when one has room, else the fewest units) or
    /// `required` (refused when no unit has room; repairs wait for room in
    /// the unit rather than leave it).
    #[serde(default)]
    pub single_su: SingleSu,
}

/// How strictly a cluster keeps to one scalable unit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SingleSu {
    #[default]
    Preferred,
    Required,
}

impl SingleSu {
    pub fn as_str(self) -> &'static str {
        match self {
            SingleSu::Preferred => "preferred",
            SingleSu::Required => "required",
        }
    }

    pub fn parse(s: &str) -> Option<SingleSu> {
        match s {
            "preferred" => Some(SingleSu::Preferred),
            "required" => Some(SingleSu::Required),
            _ => None,
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The longest an auto-repairing cluster may wait before it repairs.
pub const MAX_REPAIR_DELAY_SECONDS: u32 = 86_400;
/// What `auto_repair` waits for unless told otherwise.
pub const DEFAULT_REPAIR_DELAY_SECONDS: u32 = 120;

/// Whether a cluster's members are all well.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClusterHealth {
    /// Every member running on a reachable host with healthy devices.
    Healthy,
    /// A member is not (see `problems`).
    Degraded,
    /// Failed members were replaced and the new ones are not all running
    /// yet.
    Repairing,
}

impl ClusterHealth {
    pub const ALL: [ClusterHealth; 3] = [
        ClusterHealth::Healthy,
        ClusterHealth::Degraded,
        ClusterHealth::Repairing,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ClusterHealth::Healthy => "healthy",
            ClusterHealth::Degraded => "degraded",
            ClusterHealth::Repairing => "repairing",
        }
    }
}

/// Why a member is not well.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MemberFault {
    /// Its host stopped answering (its VM may be running; nobody can tell).
    HostLost,
    /// Its host is retired or being drained.
    HostLeaving,
    /// The VM is in `error`.
    VmError,
    /// A GPU or NIC it holds is quarantined.
    DeviceQuarantined,
    /// A GPU or NIC it holds is suspect (degraded; still usable).
    DeviceSuspect,
    /// The member is stopped, suspended, shelved or preempted.
    NotRunning,
    /// Being replaced: waiting for room or booting.
    Replacing,
}

impl MemberFault {
    /// Whether `kumo cluster repair` replaces a member for it: the member
    /// cannot come back by itself or by its owner's hand. A suspect device
    /// still works, and a stopped member is its owner's to start.
    pub fn replaceable(self) -> bool {
        matches!(
            self,
            MemberFault::HostLost | MemberFault::VmError | MemberFault::DeviceQuarantined
        )
    }
}

/// One member's trouble.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClusterProblem {
    pub member: String,
    pub fault: MemberFault,
    /// What, in words (the host, the device, the VM's reason).
    pub detail: String,
}

/// An event of a cluster's life: its health changing, repairs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClusterEvent {
    pub id: i64,
    pub at: DateTime<Utc>,
    /// `healthy`, `degraded`, `repairing`, `repair`, `repair-placed`, …
    pub kind: String,
    pub message: String,
}

/// What a repair did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClusterRepair {
    /// The members replaced (placed anew, or waiting for room).
    pub replaced: Vec<String>,
    /// Members with trouble a repair does not mend (suspect devices,
    /// stopped members), each with why.
    pub left: Vec<ClusterProblem>,
    pub cluster: Cluster,
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

impl ClusterCreate {
    /// Member `i` as a VM request.
    pub fn member(&self, i: u32) -> VmCreate {
        VmCreate {
            name: format!("{}-{i}", self.name),
            gpus: self.gpus,
            gpu_model: self.gpu_model.clone(),
            vcpus: self.vcpus,
            memory_gib: self.memory_gib,
            disk_gib: self.disk_gib,
            template: self.template.clone(),
            service_level: self.service_level,
            ssh_keys: self.ssh_keys.clone(),
            networks: self
                .networks
                .iter()
                .map(|s| NetworkRequest {
                    segment: s.clone(),
                    ip: None,
                })
                .collect(),
            volumes: Vec::new(),
            shares: self.shares.clone(),
            on_reclaim: None,
            on_host_loss: None,
            notice_seconds: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClusterMember {
    pub name: String,
    pub state: VmState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scalable_unit: Option<String>,
    /// The rail of each GPU's NIC, in guest GPU order.
    pub rails: Vec<Option<u32>>,
    /// Its address on the cluster's first segment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Cluster {
    pub id: Uuid,
    pub name: String,
    pub tenant: String,
    pub size: u32,
    /// `placed`, or `pending` while spot VMs are reclaimed for it.
    pub state: String,
    pub spec: VmSpec,
    pub members: Vec<ClusterMember>,
    /// An MPI hostfile: one member per line with its GPUs as slots.
    pub hostfile: String,
    pub health: ClusterHealth,
    /// What keeps it from `healthy`, per member.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<ClusterProblem>,
    /// When its health or what is wrong last changed (an auto-repair
    /// waits its delay from then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_since: Option<DateTime<Utc>>,
    pub auto_repair: bool,
    /// How long it stays degraded before it repairs itself.
    pub repair_delay_seconds: u32,
    #[serde(default)]
    pub single_su: SingleSu,
    /// Members' worth of spare capacity kept in `spare_unit`.
    #[serde(default)]
    pub spares: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spare_unit: Option<String>,
    /// How many of the spares the unit has room for now (spot VMs on them
    /// counted as gone): fewer than `spares` after a repair used one, or
    /// a host of the unit left service.
    #[serde(default)]
    pub spares_ready: u32,
    pub created_at: DateTime<Utc>,
}

// ---------------------------------------------------------------- agent protocol

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

/// A VM's serial console, authorised: open `url` (a websocket on this
/// server) before `expires_at`, once. Binary messages carry the
/// terminal's bytes both ways: first the console's scrollback, then, after
/// the `live` event, what it prints now. Text messages from the server are
/// [`ConsoleEvent`]s; text messages to it are [`ConsoleControl`]s.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ConsoleTicket {
    /// `/api/v1/consoles/{ticket}`.
    pub url: String,
    /// The one-time secret in `url` (shown once, never kept).
    pub ticket: String,
    pub expires_at: DateTime<Utc>,
    /// Whether keystrokes are sent (else the console is read-only).
    pub write: bool,
    /// Who writes on the console now, if someone does (a writer opening
    /// it takes it over; they are told).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConsoleMode {
    /// Type into it (members and owners); one writer at a time.
    #[default]
    Write,
    /// Watch it (any member of the tenant, viewers too).
    Read,
}

/// The websocket URL of `path` on the server at `server` (`http://` →
/// `ws://`, `https://` → `wss://`): consoles, for people and agents alike.
pub fn websocket_url(server: &str, path: &str) -> String {
    let server = server.trim_end_matches('/');
    let base = if let Some(rest) = server.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if let Some(rest) = server.strip_prefix("http://") {
        format!("ws://{rest}")
    } else {
        server.to_owned()
    };
    format!("{base}{path}")
}

/// A text message a person's console websocket sends (binary messages are
/// the terminal's bytes): the terminal's size, or keys the serial line
/// cannot carry. Both are for the writer only; a viewer's are dropped.
/// The server passes them on to the VM's agent as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ConsoleControl {
    /// The terminal's size: the agent sets it on the guest's serial line
    /// (`stty rows … cols …` through the guest agent, when there is one),
    /// so full-screen programs fit and get `SIGWINCH`.
    Resize { cols: u16, rows: u16 },
    /// Keys pressed on the VM's keyboard (not its serial line).
    Keys { keys: ConsoleKeys },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConsoleKeys {
    CtrlAltDel,
}

/// A text message the server sends on a person's console websocket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ConsoleEvent {
    /// Everything before this was the console's scrollback (what it
    /// printed before this session, up to about 1 MiB, from boot); live
    /// output follows.
    Live,
    /// This session took writing over from `from` (who is now read-only).
    TookOver { from: String },
    /// `by` took writing over: this session is read-only now.
    TakenOver { by: String },
    /// This session is read-only now, and why (its holder's role in the
    /// project no longer allows writing).
    ReadOnly { reason: String },
    /// The session ended, and why.
    Closed { reason: String },
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ConsoleParams {
    /// `write` (default) or `read`.
    pub mode: Option<ConsoleMode>,
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
pub struct UnshelveParams {
    /// Place it on any host with room, moving its root disk and volumes
    /// there, instead of waiting for room on the host holding them.
    pub anywhere: Option<bool>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DesiredParams {
    /// Answer at once if the host's revision is above this; otherwise wait
    /// (up to 25 s) for a change.
    pub after: Option<i64>,
}

// ---------------------------------------------------------------- billing

/// The price of one unit-hour of a resource class (decimal strings).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClassPrice {
    pub guaranteed: String,
    pub spot: String,
}

/// A rate card to add: in force from `effective_from` (default: now; never
/// earlier) until the next card. Classes: `gpu:<model>`, `vcpu`,
/// `memory_gib`, `disk_gib` (per unit-hour), `public_ip` (per address-hour).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RateCardPut {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_from: Option<DateTime<Utc>>,
    pub prices: BTreeMap<String, ClassPrice>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RateCardInfo {
    pub effective_from: DateTime<Utc>,
    pub prices: BTreeMap<String, ClassPrice>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Rates {
    /// The card in force now, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<RateCardInfo>,
    /// Every card, oldest first (future ones included).
    pub cards: Vec<RateCardInfo>,
    pub currency: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantCreate {
    /// Points, a positive decimal string.
    pub amount: String,
    pub expires_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PointGrant {
    pub id: Uuid,
    pub amount: String,
    /// What is left of it (0 once expired).
    pub remaining: String,
    pub granted_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub expired: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One posted charge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LedgerCharge {
    pub vm: String,
    pub resource: String,
    pub service_level: ServiceLevel,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub seconds: i64,
    pub rate_per_hour: String,
    pub amount: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Points {
    pub tenant: String,
    pub currency: String,
    /// Points left on grants in force, less what is owed (may be negative).
    pub balance: String,
    /// Charged with no points to pay it, until the next grant.
    pub owed: String,
    pub grants: Vec<PointGrant>,
    /// The latest charges, newest first (at most 100).
    pub ledger: Vec<LedgerCharge>,
    /// Every charge posted so far.
    pub charged: String,
    /// Since when the points are exhausted, if they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exhausted_since: Option<DateTime<Utc>>,
    /// An admin's extension of the grace for guaranteed VMs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_until: Option<DateTime<Utc>>,
    /// Budget alerts, newest first.
    pub alerts: Vec<BillingAlert>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BillingAlert {
    /// `spent-80`, `spent-100`, `exhausted`.
    pub kind: String,
    pub message: String,
    pub at: DateTime<Utc>,
}

/// Keep a tenant's guaranteed VMs running while out of points until then.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GraceExtend {
    pub until: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StatementLine {
    pub vm: String,
    pub resource: String,
    pub service_level: ServiceLevel,
    pub seconds: i64,
    pub rate_per_hour: String,
    pub amount: String,
}

/// A month's charges; `total` is exactly the sum of the lines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Statement {
    pub tenant: String,
    /// `2026-11`.
    pub month: String,
    pub lines: Vec<StatementLine>,
    pub total: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum UsageGroup {
    #[default]
    Vm,
    Resource,
    Day,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageParams {
    /// Start (RFC 3339) [default: the first of this month, UTC].
    pub from: Option<DateTime<Utc>>,
    /// End, exclusive [default: now].
    pub to: Option<DateTime<Utc>>,
    #[serde(default)]
    pub group_by: UsageGroup,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UsageRow {
    /// The VM, the resource class, or the UTC day.
    pub key: String,
    pub seconds: i64,
    pub amount: String,
}

/// Charges of pieces starting in `[from, to)`, summed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    pub tenant: String,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub group_by: UsageGroup,
    pub rows: Vec<UsageRow>,
    pub total: String,
}
