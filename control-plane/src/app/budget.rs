//! Budgets at the edge: after each posting, every tenant that was granted
//! points gets its alerts (each once) and, out of points, its VMs stopped
//! as `kumo-billing::budget` decides; new VMs and starts are refused while
//! it is out. All of it shows as alerts on the tenant's points and as VM
//! events.

use chrono::{DateTime, Utc};
use kumo_api_types::{Power, ServiceLevel, VmState};
use kumo_billing::budget::{self, Standing};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QuerySelect, Set,
    TransactionTrait,
};
use uuid::Uuid;

use crate::app::vms::apply_action;
use crate::context::AppState;
use crate::domain::lifecycle::Action;
use crate::domain::states::StoredText;
use crate::entity::{billing_alerts, charges, point_grants, tenant_billing, tenants, vms};
use crate::error::{is_unique_violation, ApiError};
use crate::store::billing::{balance_of, grants_of, ledger_of};
use crate::store::vms::{stored_spec, stored_state};

/// Any GPU model's class: a VM that names no model may get any of them.
pub const ANY_GPU: &str = "gpu:*";

/// The rate classes a VM charges while it runs (its GPUs' class, or
/// [`ANY_GPU`] when it names no model).
pub fn vm_classes(spec: &kumo_api_types::VmSpec) -> Vec<String> {
    let mut out = vec![
        kumo_billing::rates::VCPU.to_owned(),
        kumo_billing::rates::MEMORY_GIB.to_owned(),
        kumo_billing::rates::DISK_GIB.to_owned(),
    ];
    if spec.gpus > 0 {
        out.push(
            spec.gpu_model
                .as_deref()
                .map_or(ANY_GPU.to_owned(), kumo_billing::rates::gpu_class),
        );
    }
    out
}

/// Refuses an operation that would start or grow something chargeable
/// (`classes`: the rate classes it would be charged under, at `level`) for
/// a tenant without points: one never granted any, or one whose grants
/// are spent. What no rate card prices is free and always allowed. Run in
/// the operation's transaction (`db`). Usually one sum in the database:
/// points of grants in force less every charge ever is a lower bound of
/// the balance (charges paid by since-expired grants only make it higher);
/// only when that bound is not positive is the ledger replayed.
pub async fn check(
    db: &impl ConnectionTrait,
    tenant: &tenants::Model,
    classes: &[String],
    level: kumo_billing::Level,
    now: DateTime<Utc>,
) -> Result<(), ApiError> {
    let book = crate::app::metering::rate_book(db).await?;
    let priced = |class: &str| book.price(now, class, level) > kumo_billing::Decimal::ZERO;
    let chargeable = classes.iter().any(|c| {
        if c == ANY_GPU {
            book.at(now).is_some_and(|card| {
                card.prices
                    .keys()
                    .any(|k| k.starts_with("gpu:") && priced(k))
            })
        } else {
            priced(c)
        }
    });
    if !chargeable {
        return Ok(());
    }
    let grant_rows = point_grants::Entity::find()
        .filter(point_grants::Column::TenantId.eq(tenant.id))
        .all(db)
        .await?;
    if grant_rows.is_empty() {
        return Err(ApiError::PointsExhausted(format!(
            "tenant {:?} has never been granted points: nothing chargeable ({}) can be started until points are granted",
            tenant.name,
            classes.join(", ")
        )));
    }
    let in_force: kumo_billing::Decimal = grants_of(&grant_rows)?
        .iter()
        .filter(|g| g.granted_at <= now && now < g.expires_at)
        .map(|g| g.amount)
        .sum();
    let charged: Option<i64> = charges::Entity::find()
        .select_only()
        .column_as(Expr::cust("CAST(SUM(amount_micro) AS BIGINT)"), "charged")
        .filter(charges::Column::TenantId.eq(tenant.id))
        .into_tuple()
        .one(db)
        .await?
        .flatten();
    if in_force - kumo_billing::from_micro(charged.unwrap_or(0)) > kumo_billing::Decimal::ZERO {
        return Ok(());
    }
    let (grants, charged) = ledger_of(db, tenant).await?;
    let b = balance_of(&grants, &charged, now)?;
    if budget::exhausted(&grants_of(&grants)?, &b) {
        return Err(ApiError::PointsExhausted(format!(
            "tenant {:?} has no points left (balance {}): nothing chargeable ({}) can be started or grown until points are granted",
            tenant.name,
            b.balance,
            classes.join(", ")
        )));
    }
    Ok(())
}

/// [`check`] for something a tenant holds (an address, a volume, a
/// snapshot), charged per unit-hour under `class` at the guaranteed level.
pub async fn check_held(
    db: &impl ConnectionTrait,
    tenant: &tenants::Model,
    class: &str,
    now: DateTime<Utc>,
) -> Result<(), ApiError> {
    let classes = [class.to_owned()];
    check(db, tenant, &classes, kumo_billing::Level::Guaranteed, now).await
}

async fn standing_row(
    db: &impl ConnectionTrait,
    tenant: Uuid,
) -> Result<Option<tenant_billing::Model>, ApiError> {
    Ok(tenant_billing::Entity::find_by_id(tenant).one(db).await?)
}

/// Records when the points ran out (or that they no longer are).
async fn set_exhausted(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    row: Option<tenant_billing::Model>,
    since: Option<DateTime<Utc>>,
) -> Result<(), ApiError> {
    match row {
        Some(r) if r.exhausted_since != since => {
            let mut a: tenant_billing::ActiveModel = r.into();
            a.exhausted_since = Set(since);
            a.update(db).await?;
        }
        Some(_) => {}
        None if since.is_some() => {
            let row = tenant_billing::ActiveModel {
                tenant_id: Set(tenant),
                exhausted_since: Set(since),
                grace_until: Set(None),
            };
            match row.insert(db).await {
                Ok(_) => {}
                Err(e) if is_unique_violation(&e) => {} // another replica
                Err(e) => return Err(e.into()),
            }
        }
        None => {}
    }
    Ok(())
}

/// An admin's extension of a tenant's grace for its guaranteed VMs.
pub async fn extend_grace(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    until: DateTime<Utc>,
) -> Result<(), ApiError> {
    match standing_row(db, tenant).await? {
        Some(r) => {
            let mut a: tenant_billing::ActiveModel = r.into();
            a.grace_until = Set(Some(until));
            a.update(db).await?;
        }
        None => {
            tenant_billing::ActiveModel {
                tenant_id: Set(tenant),
                exhausted_since: Set(None),
                grace_until: Set(Some(until)),
            }
            .insert(db)
            .await?;
        }
    }
    Ok(())
}

/// One pass over every tenant that was granted points. Safe on several
/// replicas: alerts are unique per subject, and a VM already asked to
/// stop is not asked again.
pub async fn enforce(st: &AppState) -> Result<(), ApiError> {
    let now = st.config.clock.now();
    let tenant_ids: Vec<Uuid> = point_grants::Entity::find()
        .select_only()
        .column(point_grants::Column::TenantId)
        .distinct()
        .into_tuple()
        .all(&st.db)
        .await?;
    for id in tenant_ids {
        let Some(tenant) = tenants::Entity::find_by_id(id).one(&st.db).await? else {
            continue;
        };
        let (grant_rows, charged) = ledger_of(&st.db, &tenant).await?;
        let grants = grants_of(&grant_rows)?;
        let balance = balance_of(&grant_rows, &charged, now)?;
        let row = standing_row(&st.db, id).await?;
        let d = budget::decide(
            &Standing {
                grants: &grants,
                balance: &balance,
                exhausted_since: row.as_ref().and_then(|r| r.exhausted_since),
                grace_until: row.as_ref().and_then(|r| r.grace_until),
            },
            &st.config.billing.alert_thresholds,
            chrono::Duration::from_std(st.config.billing.guaranteed_grace)
                .unwrap_or(chrono::Duration::hours(24)),
            now,
        );
        for a in &d.alerts {
            let alert = billing_alerts::ActiveModel {
                id: Set(Uuid::now_v7()),
                tenant_id: Set(id),
                kind: Set(a.kind.clone()),
                grant_id: Set(a.subject),
                message: Set(a.message.clone()),
                at: Set(now),
            };
            match alert.insert(&st.db).await {
                Ok(_) => tracing::info!(tenant = %tenant.name, kind = %a.kind, "{}", a.message),
                Err(e) if is_unique_violation(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        set_exhausted(&st.db, id, row, d.exhausted_since).await?;
        if d.stop_spot || d.stop_guaranteed {
            stop_tenant_vms(st, id, d.stop_guaranteed, now).await?;
        }
    }
    Ok(())
}

/// Asks the tenant's running spot VMs (and guaranteed ones, with
/// `guaranteed`) to stop, with the reason in their events.
async fn stop_tenant_vms(
    st: &AppState,
    tenant: Uuid,
    guaranteed: bool,
    now: DateTime<Utc>,
) -> Result<(), ApiError> {
    let rows = vms::Entity::find()
        .filter(vms::Column::TenantId.eq(tenant))
        .filter(vms::Column::DesiredPower.eq(Power::Running.to_text()))
        .all(&st.db)
        .await?;
    for vm in rows {
        let spot = stored_spec(&vm)?.service_level == ServiceLevel::Spot;
        if !(spot || guaranteed) || !matches!(stored_state(&vm)?, VmState::Running) {
            continue;
        }
        let txn = st.db.begin().await?;
        match apply_action(&txn, &vm, Action::Stop, "billing: points exhausted", now).await {
            Ok(_) => {
                txn.commit().await?;
                if let Some(h) = vm.host_id {
                    st.signals.notify(h);
                }
            }
            Err(ApiError::Conflict(_)) => {} // changed meanwhile
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
