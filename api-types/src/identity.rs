//! Who may do what: tenants (the research projects), users and the
//! tenants they belong to, members and their roles, API tokens, a tenant's
//! quota and the fleet's standing against its guarantees, and the audit log.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

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

#[cfg(test)]
mod tests {
    use super::*;

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
