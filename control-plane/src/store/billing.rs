//! Queries over point grants and charges, and the balance they make.

use chrono::{DateTime, Utc};
use kumo_billing::points::{self, Debit, Grant};
use kumo_billing::Decimal;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder};
use uuid::Uuid;

use crate::entity::{billing_alerts, charges, point_grants, tenant_billing, tenants};
use crate::error::ApiError;

pub fn stored_decimal(what: &str, id: Uuid, s: &str) -> Result<Decimal, ApiError> {
    s.parse()
        .map_err(|_| ApiError::Internal(format!("{what} {id}: amount {s:?}")))
}

/// A tenant's grants and charges, as the billing core reads them.
pub async fn ledger_of(
    db: &impl ConnectionTrait,
    tenant: &tenants::Model,
) -> Result<(Vec<point_grants::Model>, Vec<charges::Model>), ApiError> {
    let grants = point_grants::Entity::find()
        .filter(point_grants::Column::TenantId.eq(tenant.id))
        .order_by_asc(point_grants::Column::GrantedAt)
        .all(db)
        .await?;
    let charged = charges::Entity::find()
        .filter(charges::Column::TenantId.eq(tenant.id))
        .order_by_asc(charges::Column::PeriodFrom)
        .all(db)
        .await?;
    Ok((grants, charged))
}

/// Grants as the billing core reads them.
pub fn grants_of(rows: &[point_grants::Model]) -> Result<Vec<Grant>, ApiError> {
    rows.iter()
        .map(|g| {
            Ok(Grant {
                id: g.id,
                amount: stored_decimal("grant", g.id, &g.amount)?,
                granted_at: g.granted_at,
                expires_at: g.expires_at,
            })
        })
        .collect()
}

/// The balance of a tenant at `now`.
pub fn balance_of(
    grants: &[point_grants::Model],
    charged: &[charges::Model],
    now: DateTime<Utc>,
) -> Result<points::Balance, ApiError> {
    // A ledger entry grows and is debited again at each posting: one
    // posted (by any replica) after the caller took `now` would otherwise
    // drop out of the balance whole, with what it held before.
    let now = charged
        .iter()
        .map(|c| c.posted_at)
        .max()
        .map_or(now, |p| p.max(now));
    let gs = grants_of(grants)?;
    let ds = charged
        .iter()
        .map(|c| {
            Ok(Debit {
                amount: stored_decimal("charge", c.id, &c.amount)?,
                at: c.posted_at,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(points::balance(&gs, &ds, now))
}

/// A tenant's charges (or one of its VMs') for periods starting in
/// `[from, to)`.
pub async fn charges_between(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    vm: Option<Uuid>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<charges::Model>, ApiError> {
    let mut q = charges::Entity::find()
        .filter(charges::Column::TenantId.eq(tenant))
        .filter(charges::Column::PeriodFrom.gte(from))
        .filter(charges::Column::PeriodFrom.lt(to));
    if let Some(vm) = vm {
        q = q.filter(charges::Column::VmId.eq(vm));
    }
    Ok(q.all(db).await?)
}

/// A tenant's charges for periods starting at `from` or later.
pub async fn charges_since(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    from: DateTime<Utc>,
) -> Result<Vec<charges::Model>, ApiError> {
    Ok(charges::Entity::find()
        .filter(charges::Column::TenantId.eq(tenant))
        .filter(charges::Column::PeriodFrom.gte(from))
        .all(db)
        .await?)
}

/// A tenant's standing (out of points since, grace until), if it has one.
pub async fn standing(
    db: &impl ConnectionTrait,
    tenant: Uuid,
) -> Result<Option<tenant_billing::Model>, ApiError> {
    Ok(tenant_billing::Entity::find_by_id(tenant).one(db).await?)
}

/// A tenant's billing alerts, newest first.
pub async fn alerts_of(
    db: &impl ConnectionTrait,
    tenant: Uuid,
) -> Result<Vec<billing_alerts::Model>, ApiError> {
    Ok(billing_alerts::Entity::find()
        .filter(billing_alerts::Column::TenantId.eq(tenant))
        .order_by_desc(billing_alerts::Column::At)
        .all(db)
        .await?)
}
