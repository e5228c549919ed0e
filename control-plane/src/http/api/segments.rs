//! Tenant segments (Ethernet or RoCE over VXLAN): a VNI leased atomically
//! from the configured ranges, a CIDR with its gateway and MTU, and the
//! VMs' attachments (address and MAC) made in the VM's own transaction.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use axum::extract::State;
use axum::http::StatusCode;
use chrono::Utc;
use kumo_api_types::{Page, PageParams, Role, Segment, SegmentCreate, SegmentIngress, SegmentKind};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseTransaction, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, Set, TransactionTrait,
};
use uuid::Uuid;

use super::Problems;
use crate::app::access::tenant_access;
use crate::app::audit;
use crate::context::Actor;
use crate::context::AppState;
use crate::domain::ipam::{self, Cidr, Lease, NextVni};
use crate::domain::names;
use crate::domain::paging::Paging;
use crate::domain::states::StoredText;
use crate::entity::{segments, vni_leases};
use crate::error::{is_unique_violation, ApiError};
use crate::http::extract::{Json, Path, Query};
use crate::store::segments::{count_attached, stored_kind, stored_rules};

/// Tries at leasing a VNI when other servers lease at the same time. Each
/// round has a winner, so this bounds the concurrent creations that all
/// succeed; a jittered pause between rounds keeps losers from meeting again.
const VNI_ROUNDS: u32 = 64;

fn to_api(s: &segments::Model, tenant: &str, attached: u64) -> Result<Segment, ApiError> {
    let kind = stored_kind(s)?;
    let mtu = u32::try_from(s.mtu).unwrap_or(0);
    Ok(Segment {
        id: s.id,
        name: s.name.clone(),
        tenant: tenant.to_owned(),
        kind,
        cidr: s.cidr.clone(),
        gateway: s.gateway.clone(),
        mtu,
        roce_mtu: (kind == SegmentKind::Roce)
            .then(|| ipam::roce_mtu(mtu))
            .flatten(),
        vni: u32::try_from(s.vni).unwrap_or(0),
        vlan: s.vlan.and_then(|v| u16::try_from(v).ok()),
        attachments: u32::try_from(attached).unwrap_or(u32::MAX),
        ingress: stored_rules(s),
        created_at: s.created_at,
    })
}

/// Leases the lowest free VNI for `segment` inside `txn`. `Ok(None)` when
/// another server took it first (try again in a new transaction).
async fn lease_vni(
    st: &AppState,
    txn: &DatabaseTransaction,
    segment: Uuid,
) -> Result<Option<u32>, ApiError> {
    let net = &st.config.network;
    let rows = vni_leases::Entity::find()
        .order_by_asc(vni_leases::Column::Vni)
        .all(txn)
        .await?;
    let leases: Vec<Lease> = rows
        .iter()
        .map(|l| Lease {
            vni: u32::try_from(l.vni).unwrap_or(0),
            live: l.segment_id.is_some(),
            released_at: l.released_at,
        })
        .collect();
    let now = Utc::now();
    let quarantine = chrono::Duration::from_std(net.vni_quarantine)
        .unwrap_or_else(|_| chrono::Duration::seconds(600));
    let next = ipam::next_vni(&net.vni_ranges, &leases, now, quarantine).ok_or_else(|| {
        ApiError::InsufficientCapacity("every VNI of the configured ranges is in use".into())
    })?;
    match next {
        NextVni::Fresh(vni) => {
            let r = vni_leases::ActiveModel {
                vni: Set(vni as i32),
                segment_id: Set(Some(segment)),
                released_at: Set(None),
            }
            .insert(txn)
            .await;
            match r {
                Ok(_) => Ok(Some(vni)),
                Err(e) if is_unique_violation(&e) => Ok(None),
                Err(e) => Err(e.into()),
            }
        }
        NextVni::Reused(vni) => {
            let r = vni_leases::Entity::update_many()
                .col_expr(vni_leases::Column::SegmentId, Expr::value(Some(segment)))
                .col_expr(
                    vni_leases::Column::ReleasedAt,
                    Expr::value(None::<chrono::DateTime<Utc>>),
                )
                .filter(vni_leases::Column::Vni.eq(vni as i32))
                .filter(vni_leases::Column::SegmentId.is_null())
                .filter(vni_leases::Column::ReleasedAt.lte(now - quarantine))
                .exec(txn)
                .await?;
            Ok((r.rows_affected == 1).then_some(vni))
        }
    }
}

/// Create a segment (members). Its VNI is leased atomically: no two live
/// segments share one, and a freed VNI rests before reuse.
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/segments", tag = "segments",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = SegmentCreate,
    responses((status = 201, description = "Created", body = Segment), Problems)
)]
pub async fn create(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Json(body): Json<SegmentCreate>,
) -> Result<(StatusCode, axum::Json<Segment>), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    access.require(Role::Member, "creating segments")?;
    names::tenant_name("name", &body.name)?;
    let cidr = Cidr::for_tenant("cidr", &body.cidr, &st.config.network.tenant_ranges)?;
    let gateway = match &body.gateway {
        None => cidr.first_host(),
        Some(g) => {
            let g: Ipv4Addr = g
                .parse()
                .map_err(|_| ApiError::field("gateway", format!("{g:?} is not an IPv4 address")))?;
            if !cidr.is_host(g) {
                return Err(ApiError::field(
                    "gateway",
                    format!("{g} is not a host address of {cidr}"),
                ));
            }
            g
        }
    };
    let mtu = ipam::segment_mtu(st.config.network.underlay_mtu, body.mtu)?;
    let ingress = crate::domain::ingress::rules_json("ingress", &body.ingress)?;
    let id = Uuid::now_v7();
    for round in 0..VNI_ROUNDS {
        if round > 0 {
            let pause = rand::random::<u64>() % 10 + 1;
            tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
        }
        let txn = st.db.begin().await?;
        let Some(vni) = lease_vni(&st, &txn, id).await? else {
            continue;
        };
        let vlan = match body.kind {
            SegmentKind::Ethernet => None,
            SegmentKind::Roce => {
                let taken: BTreeSet<i32> = segments::Entity::find()
                    .filter(segments::Column::Vlan.is_not_null())
                    .all(&txn)
                    .await?
                    .into_iter()
                    .filter_map(|s| s.vlan)
                    .collect();
                let free = st
                    .config
                    .network
                    .roce_vlans
                    .clone()
                    .map(i32::from)
                    .find(|v| !taken.contains(v));
                match free {
                    Some(v) => Some(v),
                    None => {
                        return Err(ApiError::InsufficientCapacity(
                            "every RoCE VLAN is in use".into(),
                        ))
                    }
                }
            }
        };
        let row = segments::ActiveModel {
            id: Set(id),
            tenant_id: Set(tenant.id),
            name: Set(body.name.clone()),
            kind: Set(body.kind.to_text().into()),
            cidr: Set(cidr.to_string()),
            gateway: Set(gateway.to_string()),
            mtu: Set(mtu as i32),
            vni: Set(vni as i32),
            created_at: Set(Utc::now()),
            ingress_rules: Set(ingress.clone()),
            vlan: Set(vlan),
        }
        .insert(&txn)
        .await;
        let row = match row {
            Ok(r) => r,
            Err(e) if is_unique_violation(&e) => {
                let exists = segments::Entity::find()
                    .filter(segments::Column::TenantId.eq(tenant.id))
                    .filter(segments::Column::Name.eq(body.name.clone()))
                    .one(&st.db)
                    .await?;
                if exists.is_some() {
                    return Err(ApiError::Conflict(format!(
                        "tenant {:?} already has a segment named {:?}",
                        tenant.name, body.name
                    )));
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        audit::record(&txn, &ctx, "segment.create", Some(&tenant), &body.name).await?;
        txn.commit().await?;
        return Ok((
            StatusCode::CREATED,
            axum::Json(to_api(&row, &tenant.name, 0)?),
        ));
    }
    Err(ApiError::Conflict(
        "could not lease a VNI under contention; retry".into(),
    ))
}

/// List a tenant's segments by name (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/segments", tag = "segments",
    params(("tenant" = String, Path, description = "Tenant name or id"), PageParams),
    responses((status = 200, description = "One page", body = inline(Page<Segment>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<Segment>>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    let paging = Paging::new(q.limit, q.page_token.as_deref())?;
    let mut query = segments::Entity::find()
        .filter(segments::Column::TenantId.eq(tenant.id))
        .order_by_asc(segments::Column::Name);
    if let Some(after) = &paging.after {
        query = query.filter(segments::Column::Name.gt(after.as_str()));
    }
    let rows = query.limit(paging.fetch()).all(&st.db).await?;
    let (rows, next) = paging.finish(rows, |s| s.name.clone());
    let mut items = Vec::with_capacity(rows.len());
    for s in &rows {
        items.push(to_api(
            s,
            &tenant.name,
            count_attached(&st.db, s.id).await?,
        )?);
    }
    Ok(axum::Json(Page {
        items,
        next_page_token: next,
    }))
}

/// Show a segment (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/segments/{segment}", tag = "segments",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("segment" = String, Path, description = "Segment name or id")),
    responses((status = 200, description = "The segment", body = Segment), Problems)
)]
pub async fn show(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, segment)): Path<(String, String)>,
) -> Result<axum::Json<Segment>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    let s = crate::store::segments::find(&st.db, &tenant, &segment).await?;
    let n = count_attached(&st.db, s.id).await?;
    Ok(axum::Json(to_api(&s, &tenant.name, n)?))
}

/// Replace a segment's ingress rules (members). Hosts with its VMs apply
/// them on their next pass (within a second or so).
#[utoipa::path(
    put, path = "/api/v1/tenants/{tenant}/segments/{segment}/ingress", tag = "segments",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("segment" = String, Path, description = "Segment name or id")),
    request_body = SegmentIngress,
    responses((status = 200, description = "The segment with its new rules", body = Segment), Problems)
)]
pub async fn set_ingress(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, segment)): Path<(String, String)>,
    Json(body): Json<SegmentIngress>,
) -> Result<axum::Json<Segment>, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    access.require(Role::Member, "changing segment rules")?;
    let rules = crate::domain::ingress::rules_json("rules", &body.rules)?;
    let txn = st.db.begin().await?;
    let s = crate::store::segments::find(&txn, &tenant, &segment).await?;
    let mut a: segments::ActiveModel = s.clone().into();
    a.ingress_rules = Set(rules);
    let s = a.update(&txn).await?;
    let hosts = crate::app::host_network::touch_segments(&txn, vec![s.id]).await?;
    audit::record(&txn, &ctx, "segment.ingress", Some(&tenant), &s.name).await?;
    let n = count_attached(&txn, s.id).await?;
    txn.commit().await?;
    for h in hosts {
        st.signals.notify(h);
    }
    Ok(axum::Json(to_api(&s, &tenant.name, n)?))
}

/// Delete a segment without attachments (members); its VNI rests for the
/// configured quarantine before another segment gets it.
#[utoipa::path(
    delete, path = "/api/v1/tenants/{tenant}/segments/{segment}", tag = "segments",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("segment" = String, Path, description = "Segment name or id")),
    responses((status = 204, description = "Deleted"), Problems)
)]
pub async fn delete(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, segment)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    access.require(Role::Member, "deleting segments")?;
    let txn = st.db.begin().await?;
    let s = crate::store::segments::find(&txn, &tenant, &segment).await?;
    let n = count_attached(&txn, s.id).await?;
    if n > 0 {
        return Err(ApiError::Conflict(format!(
            "segment {:?} has {n} VM attachment(s); delete or detach them first",
            s.name
        )));
    }
    // The attachment FK (RESTRICT) makes a concurrent attach fail rather
    // than dangle.
    segments::Entity::delete_by_id(s.id).exec(&txn).await?;
    vni_leases::Entity::update_many()
        .col_expr(vni_leases::Column::SegmentId, Expr::value(None::<Uuid>))
        .col_expr(
            vni_leases::Column::ReleasedAt,
            Expr::value(Some(Utc::now())),
        )
        .filter(vni_leases::Column::Vni.eq(s.vni))
        .exec(&txn)
        .await?;
    audit::record(&txn, &ctx, "segment.delete", Some(&tenant), &s.name).await?;
    txn.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}
