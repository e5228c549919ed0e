//! Rate cards (platform admins set them; everyone reads them), a tenant's
//! points (admins grant; members read balance, grants and ledger) and
//! monthly statements (JSON, or CSV with `Accept: text/csv`). Amounts are
//! decimal strings, never floats.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::header::{ACCEPT, CONTENT_TYPE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use kumo_api_types::{
    BillingAlert, ClassPrice, GraceExtend, GrantCreate, LedgerCharge, PointGrant, Points,
    RateCardInfo, RateCardPut, Rates, ServiceLevel, Statement, StatementLine, Usage, UsageGroup,
    UsageParams,
};
use kumo_billing::rates::{Price, RateCard};
use kumo_billing::statement::{self, parse_month, Charge};
use kumo_billing::{Decimal, Level};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, Set,
    TransactionTrait,
};
use uuid::Uuid;

use super::Problems;
use crate::app::access::{require_admin, tenant_access};
use crate::app::audit;
use crate::context::Actor;
use crate::context::AppState;
use crate::domain::names;
use crate::entity::{billing_alerts, charges, point_grants, rate_cards, tenant_billing, tenants};
use crate::error::{conflict_if_unique, ApiError};
use crate::http::extract::{Json, Path, Query};
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

/// Add a rate card (platform admins): in force from `effective_from`
/// (default now; never in the past, so nothing charged is re-rated).
#[utoipa::path(
    put, path = "/api/v1/rates", tag = "billing",
    request_body = RateCardPut,
    responses((status = 200, description = "Every card", body = Rates), Problems)
)]
pub async fn put_rates(
    State(st): State<AppState>,
    ctx: Actor,
    Json(body): Json<RateCardPut>,
) -> Result<axum::Json<Rates>, ApiError> {
    require_admin(&ctx.caller, "setting rates")?;
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
    audit::record(&txn, &ctx, "rates.set", None, &from.to_rfc3339()).await?;
    txn.commit().await?;
    rates_now(&st).await.map(axum::Json)
}

async fn rates_now(st: &AppState) -> Result<Rates, ApiError> {
    let book = crate::app::metering::rate_book(&st.db).await?;
    Ok(Rates {
        current: book.at(st.config.clock.now()).map(card_api),
        cards: book.cards().iter().map(card_api).collect(),
        currency: st.config.billing.currency.clone(),
    })
}

/// The rate cards (anyone signed in).
#[utoipa::path(
    get, path = "/api/v1/rates", tag = "billing",
    responses((status = 200, description = "Every card and the one in force", body = Rates), Problems)
)]
pub async fn get_rates(
    State(st): State<AppState>,
    _ctx: Actor,
) -> Result<axum::Json<Rates>, ApiError> {
    rates_now(&st).await.map(axum::Json)
}

/// Grant points to a tenant (platform admins).
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/points/grants", tag = "billing",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = GrantCreate,
    responses((status = 201, description = "Granted", body = PointGrant), Problems)
)]
pub async fn grant(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Json(body): Json<GrantCreate>,
) -> Result<(StatusCode, axum::Json<PointGrant>), ApiError> {
    // Outsiders learn nothing of a foreign tenant, not even that it exists.
    let (tenant, _) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    require_admin(&ctx.caller, "granting points")?;
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
        &ctx,
        "points.grant",
        Some(&tenant),
        &amount.to_string(),
    )
    .await?;
    txn.commit().await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(PointGrant {
            id: g.id,
            amount: amount.to_string(),
            remaining: amount.to_string(),
            granted_at: g.granted_at,
            expires_at: g.expires_at,
            expired: false,
            note: g.note,
        }),
    ))
}

/// A tenant's points: balance, grants, the latest charges (members).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/points", tag = "billing",
    params(("tenant" = String, Path, description = "Tenant name or id")),
    responses((status = 200, description = "Balance, grants and ledger", body = Points), Problems)
)]
pub async fn points(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
) -> Result<axum::Json<Points>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    let (grants, charged) = ledger_of(&st.db, &tenant).await?;
    let b = balance_of(&grants, &charged, st.config.clock.now())?;
    let standing = tenant_billing::Entity::find_by_id(tenant.id)
        .one(&st.db)
        .await?;
    let left: BTreeMap<Uuid, (Decimal, bool)> = b
        .grants
        .iter()
        .map(|g| (g.id, (g.remaining, g.expired)))
        .collect();
    let total: Decimal = charged
        .iter()
        .map(|c| stored_decimal("charge", c.id, &c.amount))
        .sum::<Result<Decimal, ApiError>>()?;
    Ok(axum::Json(Points {
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
        alerts: billing_alerts::Entity::find()
            .filter(billing_alerts::Column::TenantId.eq(tenant.id))
            .order_by_desc(billing_alerts::Column::At)
            .all(&st.db)
            .await?
            .into_iter()
            .map(|a| BillingAlert {
                kind: a.kind,
                message: a.message,
                at: a.at,
            })
            .collect(),
    }))
}

/// Keep a tenant's guaranteed VMs running while it is out of points until
/// `until` (platform admins).
#[utoipa::path(
    put, path = "/api/v1/tenants/{tenant}/points/grace", tag = "billing",
    params(("tenant" = String, Path, description = "Tenant name or id")),
    request_body = GraceExtend,
    responses((status = 200, description = "The tenant's points", body = Points), Problems)
)]
pub async fn extend_grace(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Json(body): Json<GraceExtend>,
) -> Result<axum::Json<Points>, ApiError> {
    let (t, _) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    require_admin(&ctx.caller, "extending the grace")?;
    if body.until <= st.config.clock.now() {
        return Err(ApiError::field("until", "must be in the future"));
    }
    let txn = st.db.begin().await?;
    crate::app::budget::extend_grace(&txn, t.id, body.until).await?;
    audit::record(
        &txn,
        &ctx,
        "points.grace",
        Some(&t),
        &body.until.to_rfc3339(),
    )
    .await?;
    txn.commit().await?;
    points(State(st), ctx, Path(tenant)).await
}

async fn charges_between(
    db: &impl ConnectionTrait,
    tenant: &tenants::Model,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<Charge>, ApiError> {
    charges::Entity::find()
        .filter(charges::Column::TenantId.eq(tenant.id))
        .filter(charges::Column::PeriodFrom.gte(from))
        .filter(charges::Column::PeriodFrom.lt(to))
        .all(db)
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

/// A tenant's usage over a period, by VM, resource or day (members).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/usage", tag = "billing",
    params(("tenant" = String, Path, description = "Tenant name or id"), UsageParams),
    responses((status = 200, description = "Usage", body = Usage), Problems)
)]
pub async fn usage(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Query(q): Query<UsageParams>,
) -> Result<axum::Json<Usage>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
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
    let list = charges_between(&st.db, &tenant, from, to).await?;
    let by = match q.group_by {
        UsageGroup::Vm => statement::GroupBy::Vm,
        UsageGroup::Resource => statement::GroupBy::Resource,
        UsageGroup::Day => statement::GroupBy::Day,
    };
    let rows = statement::usage(&list, by);
    let total: Decimal = rows.iter().map(|r| r.amount).sum();
    Ok(axum::Json(Usage {
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
    }))
}

/// A month's statement (members): JSON, or CSV for `Accept: text/csv`.
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/statements/{month}", tag = "billing",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("month" = String, Path, description = "`YYYY-MM`"),
    ),
    responses(
        (status = 200, description = "The statement", body = Statement),
        (status = 200, description = "The statement as CSV", body = String, content_type = "text/csv"),
        Problems
    )
)]
pub async fn statement(
    State(st): State<AppState>,
    ctx: Actor,
    headers: HeaderMap,
    Path((tenant, month)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    let (year, m) =
        parse_month(&month).ok_or_else(|| ApiError::field("month", "expected YYYY-MM"))?;
    let (start, end) = statement::month_bounds(year, m)
        .ok_or_else(|| ApiError::field("month", "expected YYYY-MM"))?;
    let list = charges_between(&st.db, &tenant, start, end).await?;
    let s = statement::statement(&tenant.name, year, m, &list);
    let wants_csv = headers
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/csv"));
    if wants_csv {
        return Ok((
            [(CONTENT_TYPE, "text/csv; charset=utf-8")],
            statement::to_csv(&s),
        )
            .into_response());
    }
    Ok(axum::Json(Statement {
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
    })
    .into_response())
}
