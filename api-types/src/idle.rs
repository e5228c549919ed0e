//! Idle GPUs: the platform's and a project's idle policy, its webhook,
//! an owner's exemption of a VM, and a project's GPU VMs as the policy sees
//! them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

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
