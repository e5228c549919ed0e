//! Request and response bodies of Kumo's REST API (`/api/v1`).
//!
//! The server derives its OpenAPI document from these types, and the CLI and
//! the tests decode responses with them, so the contract lives in one place.
//! Request bodies reject unknown fields: a misspelt field is an error, not a
//! silently ignored wish.

use std::collections::BTreeMap;

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
}

impl UserKind {
    pub fn as_str(self) -> &'static str {
        match self {
            UserKind::Local => "local",
            UserKind::Service => "service",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "local" => Some(UserKind::Local),
            "service" => Some(UserKind::Service),
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
    #[serde(default)]
    pub segments: u32,
    #[serde(default)]
    pub public_ips: u32,
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
    pub request_id: String,
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
    use super::*;

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
