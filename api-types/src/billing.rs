//! Billing: rate cards and their class prices, point grants and the
//! ledger's charges, a tenant's points and alerts, grace, monthly statements
//! and usage over a period.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::vms::ServiceLevel;

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
