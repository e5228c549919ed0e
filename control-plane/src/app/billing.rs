//! Billing use cases: rate cards (platform admins set them; everyone reads
//! them), a tenant's points (admins grant and extend the grace; members
//! read balance, grants and ledger), usage and monthly statements.
//! Amounts are decimal strings, never floats.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use kumo_api_types::{
    BillingAlert, ClassPrice, GraceExtend, GrantCreate, LedgerCharge, PointGrant, Points,
    RateCardInfo, RateCardPut, Rates, ServiceLevel, Statement, StatementLine, Usage, UsageGroup,
    UsageParams,
};
use kumo_billing::rates::{Price, RateCard};
use kumo_billing::statement::{self, parse_month, Charge};
use kumo_billing::{Decimal, Level};
use sea_orm::{ActiveModelTrait, ConnectionTrait, Set, TransactionTrait};
use uuid::Uuid;

use crate::app::access::{require_admin, tenant_access};
use crate::app::audit;
use crate::context::{Actor, AppState};
use crate::domain::names;
use crate::entity::{point_grants, rate_cards, tenants};
use crate::error::{conflict_if_unique, ApiError};
use crate::store::billing::{balance_of, ledger_of, stored_decimal};

/// Largest amount or price accepted: points are not astronomy.
const MAX_AMOUNT: i64 = 1_000_000_000_000;

fn decimal(field: &str, s: &str) -> Result<Decimal, ApiError> {
    let d: Decimal = s
        .parse()
        .map_err(|_| ApiError::field(field, format!("{s:?} is not a decimal number")))?;
    if d.is_sign_negative() || d > Decimal::from(MAX_AMOUNT) || d.scale() > kumo_billing::SCALE {
        return Err(ApiError::field(
            field,
            format!(
                "{s:?}: between 0 and {MAX_AMOUNT}, at most {} decimal places",
                kumo_billing::SCALE
            ),
        ));
    }
    Ok(d.normalize())
}

fn level_api(l: Level) -> ServiceLevel {
    match l {
        Level::Guaranteed => ServiceLevel::Guaranteed,
        Level::Spot => ServiceLevel::Spot,
    }
}

fn card_api(c: &RateCard) -> RateCardInfo {
    RateCardInfo {
        effective_from: c.effective_from,
        prices: c
            .prices
            .iter()
            .map(|(k, p)| {
                (
                    k.clone(),
                    ClassPrice {
                        guaranteed: p.guaranteed.normalize().to_string(),
                        spot: p.spot.normalize().to_string(),
                    },
                )
            })
            .collect(),
    }
}

/// A platform admin adds a rate card, in force from `effective_from`
/// (default now; never in the past, so nothing charged is re-rated).
/// Answers every card.
pub async fn put_rates(
    st: &AppState,
    actor: &Actor,
    body: &RateCardPut,
) -> Result<Rates, ApiError> {
    require_admin(&actor.caller, "setting rates")?;
    let now = st.config.clock.now();
    let from = body.effective_from.unwrap_or(now);
    if from < now {
        return Err(ApiError::field(
            "effective_from",
            "in the past: a rate change never re-rates what was charged",
        ));
    }
    if body.prices.len() > 256 {
        return Err(ApiError::field("prices", "at most 256 classes"));
    }
    let mut prices = BTreeMap::new();
    for (class, p) in &body.prices {
        let at = |f: &str| format!("prices.{class}.{f}");
        prices.insert(
            class.clone(),
            Price {
                guaranteed: decimal(&at("guaranteed"), &p.guaranteed)?,
                spot: decimal(&at("spot"), &p.spot)?,
            },
        );
    }
    let card = RateCard {
        effective_from: from,
        prices,
    };
    card.validate()
        .map_err(|e| ApiError::field("prices", e.to_string()))?;
    let json =
        serde_json::to_string(&card.prices).map_err(|e| ApiError::Internal(e.to_string()))?;
    let txn = st.db.begin().await?;
    rate_cards::ActiveModel {
        id: Set(Uuid::now_v7()),
        effective_from: Set(from),
        prices: Set(json),
        created_at: Set(now),
    }
    .insert(&txn)
    .await
    .map_err(|e| conflict_if_unique(e, || format!("a rate card takes effect at {from} already")))?;
    audit::record(&txn, actor, "rates.set", None, &from.to_rfc3339()).await?;
    txn.commit().await?;
    rates_now(st).await
}

async fn rates_now(st: &AppState) -> Result<Rates, ApiError> {
    let book = crate::app::metering::rate_book(&st.db).await?;
    Ok(Rates {
        current: book.at(st.config.clock.now()).map(card_api),
        cards: book.cards().iter().map(card_api).collect(),
        currency: st.config.billing.currency.clone(),
    })
}

/// Every rate card and the one in force (anyone signed in).
pub async fn rates(st: &AppState, _actor: &Actor) -> Result<Rates, ApiError> {
    rates_now(st).await
}

/// A platform admin grants points to a tenant.
pub async fn grant(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    body: &GrantCreate,
) -> Result<PointGrant, ApiError> {
    // Outsiders learn nothing of a foreign tenant, not even that it exists.
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    require_admin(&actor.caller, "granting points")?;
    let amount = decimal("amount", &body.amount)?;
    if amount.is_zero() {
        return Err(ApiError::field("amount", "must be positive"));
    }
    let now = st.config.clock.now();
    if body.expires_at <= now {
        return Err(ApiError::field("expires_at", "must be in the future"));
    }
    if let Some(n) = &body.note {
        names::text("note", n, 500)?;
    }
    let txn = st.db.begin().await?;
    let g = point_grants::ActiveModel {
        id: Set(Uuid::now_v7()),
        tenant_id: Set(tenant.id),
        amount: Set(amount.to_string()),
        granted_at: Set(now),
        expires_at: Set(body.expires_at),
        note: Set(body.note.clone()),
        created_at: Set(now),
    }
    .insert(&txn)
    .await?;
    audit::record(
        &txn,
        actor,
        "points.grant",
        Some(&tenant),
        &amount.to_string(),
    )
    .await?;
    txn.commit().await?;
    Ok(PointGrant {
        id: g.id,
        amount: amount.to_string(),
        remaining: amount.to_string(),
        granted_at: g.granted_at,
        expires_at: g.expires_at,
        expired: false,
        note: g.note,
    })
}

/// A tenant's points: balance, grants, the latest charges, its standing
/// and alerts (members).
pub async fn points(st: &AppState, actor: &Actor, tenant: &str) -> Result<Points, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let (grants, charged) = ledger_of(&st.db, &tenant).await?;
    let b = balance_of(&grants, &charged, st.config.clock.now())?;
    let standing = crate::store::billing::standing(&st.db, tenant.id).await?;
    let left: BTreeMap<Uuid, (Decimal, bool)> = b
        .grants
        .iter()
        .map(|g| (g.id, (g.remaining, g.expired)))
        .collect();
    let total: Decimal = charged
        .iter()
        .map(|c| stored_decimal("charge", c.id, &c.amount))
        .sum::<Result<Decimal, ApiError>>()?;
    Ok(Points {
        tenant: tenant.name.clone(),
        currency: st.config.billing.currency.clone(),
        balance: b.balance.to_string(),
        owed: b.owed.to_string(),
        grants: grants
            .iter()
            .map(|g| {
                let (remaining, expired) = left.get(&g.id).copied().unwrap_or_default();
                PointGrant {
                    id: g.id,
                    amount: g.amount.clone(),
                    remaining: remaining.to_string(),
                    granted_at: g.granted_at,
                    expires_at: g.expires_at,
                    expired,
                    note: g.note.clone(),
                }
            })
            .collect(),
        ledger: charged
            .iter()
            .rev()
            .take(100)
            .map(|c| {
                Ok(LedgerCharge {
                    vm: c.vm_name.clone(),
                    resource: c.class.clone(),
                    service_level: level_api(crate::app::metering::stored_level(
                        "charges", c.id, &c.level,
                    )?),
                    from: c.period_from,
                    to: c.period_to,
                    seconds: c.seconds,
                    rate_per_hour: c.per_hour.clone(),
                    amount: c.amount.clone(),
                })
            })
            .collect::<Result<_, ApiError>>()?,
        charged: total.normalize().to_string(),
        exhausted_since: standing.as_ref().and_then(|r| r.exhausted_since),
        grace_until: standing.as_ref().and_then(|r| r.grace_until),
        alerts: crate::store::billing::alerts_of(&st.db, tenant.id)
            .await?
            .into_iter()
            .map(|a| BillingAlert {
                kind: a.kind,
                message: a.message,
                at: a.at,
            })
            .collect(),
    })
}

/// A platform admin keeps a tenant's guaranteed VMs running while it is
/// out of points until `until`. Answers the tenant's points.
pub async fn extend_grace(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    body: &GraceExtend,
) -> Result<Points, ApiError> {
    let (t, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    require_admin(&actor.caller, "extending the grace")?;
    if body.until <= st.config.clock.now() {
        return Err(ApiError::field("until", "must be in the future"));
    }
    let txn = st.db.begin().await?;
    crate::app::budget::extend_grace(&txn, t.id, body.until).await?;
    audit::record(
        &txn,
        actor,
        "points.grace",
        Some(&t),
        &body.until.to_rfc3339(),
    )
    .await?;
    txn.commit().await?;
    points(st, actor, tenant).await
}

/// A tenant's charges (or one VM's) for periods starting in `[from, to)`,
/// as the billing core reads them.
async fn charges_between(
    db: &impl ConnectionTrait,
    tenant: &tenants::Model,
    vm: Option<Uuid>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<Charge>, ApiError> {
    crate::store::billing::charges_between(db, tenant.id, vm, from, to)
        .await?
        .iter()
        .map(|c| {
            Ok(Charge {
                vm: c.vm_id,
                vm_name: c.vm_name.clone(),
                class: c.class.clone(),
                level: crate::app::metering::stored_level("charges", c.id, &c.level)?,
                from: c.period_from,
                seconds: c.seconds,
                per_hour: stored_decimal("charge", c.id, &c.per_hour)?,
                amount: stored_decimal("charge", c.id, &c.amount)?,
            })
        })
        .collect()
}

/// A tenant's usage over a period (default: this month so far), by VM,
/// resource or day (members).
pub async fn usage(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    q: &UsageParams,
) -> Result<Usage, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let now = st.config.clock.now();
    let (y, m) = statement::month_of(now);
    let from = match q.from {
        Some(f) => f,
        None => statement::month_bounds(y, m).map(|b| b.0).unwrap_or(now),
    };
    let to = q.to.unwrap_or(now);
    if to <= from || to - from > chrono::Duration::days(400) {
        return Err(ApiError::field(
            "to",
            "after `from`, at most 400 days later",
        ));
    }
    let list = charges_between(&st.db, &tenant, None, from, to).await?;
    let by = match q.group_by {
        UsageGroup::Vm => statement::GroupBy::Vm,
        UsageGroup::Resource => statement::GroupBy::Resource,
        UsageGroup::Day => statement::GroupBy::Day,
    };
    let rows = statement::usage(&list, by);
    let total: Decimal = rows.iter().map(|r| r.amount).sum();
    Ok(Usage {
        tenant: tenant.name.clone(),
        from,
        to,
        group_by: q.group_by,
        total: total.normalize().to_string(),
        rows: rows
            .into_iter()
            .map(|r| kumo_api_types::UsageRow {
                key: r.key,
                seconds: r.seconds,
                amount: r.amount.to_string(),
            })
            .collect(),
    })
}

/// Points charged to one of a tenant's VMs since the first of this month
/// (UTC) (members): its charges only, not the whole project's.
pub async fn vm_cost_this_month(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    vm: Uuid,
) -> Result<String, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let now = st.config.clock.now();
    let (y, m) = statement::month_of(now);
    let from = statement::month_bounds(y, m).map(|b| b.0).unwrap_or(now);
    let list = charges_between(&st.db, &tenant, Some(vm), from, now).await?;
    let total: Decimal = list.iter().map(|c| c.amount).sum();
    Ok(total.normalize().to_string())
}

/// A tenant's statement for `month` (`YYYY-MM`) (members), as the billing
/// core makes it: [`statement_view`] shows it as JSON,
/// `kumo_billing::statement::to_csv` as CSV.
pub async fn statement(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    month: &str,
) -> Result<statement::Statement, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let (year, m) =
        parse_month(month).ok_or_else(|| ApiError::field("month", "expected YYYY-MM"))?;
    let (start, end) = statement::month_bounds(year, m)
        .ok_or_else(|| ApiError::field("month", "expected YYYY-MM"))?;
    let list = charges_between(&st.db, &tenant, None, start, end).await?;
    Ok(statement::statement(&tenant.name, year, m, &list))
}

/// A statement as the API shows it in JSON.
pub fn statement_view(s: statement::Statement) -> Statement {
    Statement {
        tenant: s.tenant,
        month: s.month,
        total: s.total.to_string(),
        lines: s
            .lines
            .into_iter()
            .map(|l| StatementLine {
                vm: l.vm,
                resource: l.resource,
                service_level: level_api(l.service_level),
                seconds: l.seconds,
                rate_per_hour: l.rate_per_hour.to_string(),
                amount: l.amount.to_string(),
            })
            .collect(),
    }
}
