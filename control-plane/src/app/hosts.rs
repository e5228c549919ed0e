//! Host credentials with a lifecycle: join tokens (good for a counted
//! number of registrations, listable, revocable), registration (audited,
//! never taking a registered host's name unless its current credential is
//! shown or an administrator allowed a re-join), and re-join.

use std::net::Ipv4Addr;

use chrono::{DateTime, Duration, Utc};
use kumo_api_types::{
    AgentRegister, HostState, JoinTokenCreate, JoinTokenCreated, JoinTokenInfo, Page, PageParams,
};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect, Set, TransactionTrait,
};
use uuid::Uuid;

use crate::app::access::require_admin;
use crate::app::{audit, auth};
use crate::context::{Actor, AppState, Origin};
use crate::domain::names;
use crate::domain::paging::Paging;
use crate::domain::states::StoredText;
use crate::entity::{hosts, join_tokens};
use crate::error::{conflict_if_unique, ApiError};

pub const DEFAULT_JOIN_TTL_SECS: u64 = 86_400;
pub const MAX_JOIN_TTL_SECS: u64 = 30 * 86_400;
/// The most registrations one join token may make.
pub const MAX_JOIN_USES: u32 = 10_000;

/// An administrator mints a join token (shown once) for `uses` hosts.
pub async fn create_join_token(
    st: &AppState,
    actor: &Actor,
    body: &JoinTokenCreate,
) -> Result<JoinTokenCreated, ApiError> {
    require_admin(&actor.caller, "creating join tokens")?;
    let description = body.description.clone().unwrap_or_default();
    names::text("description", &description, 255)?;
    let ttl = body.ttl_seconds.unwrap_or(DEFAULT_JOIN_TTL_SECS);
    if !(60..=MAX_JOIN_TTL_SECS).contains(&ttl) {
        return Err(ApiError::field(
            "ttl_seconds",
            format!("between 60 and {MAX_JOIN_TTL_SECS}"),
        ));
    }
    let uses = body.uses.unwrap_or(1);
    if !(1..=MAX_JOIN_USES).contains(&uses) {
        return Err(ApiError::field(
            "uses",
            format!("between 1 and {MAX_JOIN_USES}"),
        ));
    }
    let now = actor.at;
    let expires_at = now + Duration::seconds(ttl as i64);
    let minted = auth::mint_prefixed(auth::JOIN_PREFIX, Uuid::now_v7());
    let txn = st.db.begin().await?;
    join_tokens::ActiveModel {
        id: Set(minted.id),
        secret_hash: Set(minted.secret_hash),
        description: Set(description),
        created_at: Set(now),
        expires_at: Set(expires_at),
        revoked_at: Set(None),
        max_uses: Set(uses as i32),
        used: Set(0),
    }
    .insert(&txn)
    .await?;
    audit::record(
        &txn,
        actor,
        "host.join_token.create",
        None,
        &minted.id.to_string(),
    )
    .await?;
    txn.commit().await?;
    Ok(JoinTokenCreated {
        id: minted.id,
        token: minted.token,
        expires_at,
        uses,
    })
}

fn join_token_info(t: join_tokens::Model) -> JoinTokenInfo {
    JoinTokenInfo {
        id: t.id,
        description: t.description,
        created_at: t.created_at,
        expires_at: t.expires_at,
        uses: u32::try_from(t.max_uses).unwrap_or(0),
        used: u32::try_from(t.used).unwrap_or(0),
        revoked_at: t.revoked_at,
    }
}

/// Every join token, oldest first, with its uses (administrators).
pub async fn list_join_tokens(
    st: &AppState,
    actor: &Actor,
    q: &PageParams,
) -> Result<Page<JoinTokenInfo>, ApiError> {
    require_admin(&actor.caller, "listing join tokens")?;
    let paging = Paging::new(q.limit, q.page_token.as_deref())?;
    let mut query = join_tokens::Entity::find().order_by_asc(join_tokens::Column::Id);
    if let Some(after) = &paging.after {
        let after = Uuid::try_parse(after)
            .map_err(|_| ApiError::field("page_token", "not a page token returned by this API"))?;
        query = query.filter(join_tokens::Column::Id.gt(after));
    }
    let rows = query.limit(paging.fetch()).all(&st.db).await?;
    let (rows, next) = paging.finish(rows, |t| t.id.to_string());
    Ok(Page {
        items: rows.into_iter().map(join_token_info).collect(),
        next_page_token: next,
    })
}

/// Revokes a join token: it registers nothing more (administrators).
pub async fn revoke_join_token(st: &AppState, actor: &Actor, id: &str) -> Result<(), ApiError> {
    require_admin(&actor.caller, "revoking join tokens")?;
    let not_found = || ApiError::not_found(format!("join token {id:?}"));
    let id = Uuid::try_parse(id).map_err(|_| not_found())?;
    let txn = st.db.begin().await?;
    let t = join_tokens::Entity::find_by_id(id)
        .one(&txn)
        .await?
        .ok_or_else(not_found)?;
    if t.revoked_at.is_none() {
        let mut a: join_tokens::ActiveModel = t.into();
        a.revoked_at = Set(Some(actor.at));
        a.update(&txn).await?;
        audit::record(&txn, actor, "host.join_token.revoke", None, &id.to_string()).await?;
    }
    txn.commit().await?;
    Ok(())
}

/// An administrator lets a registered host join again with a join token
/// (a reinstalled machine that lost its credential): the old credential
/// is revoked at once, and the next registration under the name is let in.
pub async fn allow_rejoin(st: &AppState, actor: &Actor, host: &str) -> Result<(), ApiError> {
    require_admin(&actor.caller, "re-joining hosts")?;
    let txn = st.db.begin().await?;
    let h = crate::store::hosts::find(&txn, host)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("host {host:?}")))?;
    let (id, name) = (h.id, h.name.clone());
    let mut a: hosts::ActiveModel = h.into();
    // No secret hashes to this: the old credential is dead.
    a.credential_hash = Set(String::new());
    a.rejoin_allowed = Set(true);
    a.update(&txn).await?;
    audit::record(&txn, actor, "host.rejoin", None, &name).await?;
    txn.commit().await?;
    st.capacity.host_rows.forget([&id]);
    Ok(())
}

pub fn validate_topology(t: &kumo_topology::HostTopology) -> Result<(), ApiError> {
    t.plausible().map_err(|m| ApiError::field("topology", m))
}

pub fn check_underlay(ip: Option<Ipv4Addr>) -> Result<(), ApiError> {
    match ip {
        Some(u)
            if u.is_unspecified() || u.is_loopback() || u.is_multicast() || u.is_broadcast() =>
        {
            Err(ApiError::field(
                "underlay_ip",
                format!("{u} is not a unicast address another host can reach"),
            ))
        }
        _ => Ok(()),
    }
}

/// Whether a unique violation is the underlay address's (SQLite names the
/// column, PostgreSQL the index).
pub fn names_underlay(e: &sea_orm::DbErr) -> bool {
    matches!(e.sql_err(), Some(sea_orm::SqlErr::UniqueConstraintViolation(m)) if m.contains("underlay_ip"))
}

pub fn underlay_taken(e: sea_orm::DbErr, ip: Option<Ipv4Addr>) -> ApiError {
    conflict_if_unique(e, || {
        format!(
            "underlay address {} belongs to another host",
            ip.map(|i| i.to_string()).unwrap_or_default()
        )
    })
}

/// A host's tunnel endpoint changed: every host may have it in a flood
/// list. Rare (a re-addressed host), so all hosts look again.
pub async fn underlay_moved(db: &impl ConnectionTrait) -> Result<(), ApiError> {
    hosts::Entity::update_many()
        .col_expr(
            hosts::Column::NetworkRevision,
            Expr::col(hosts::Column::NetworkRevision).add(1),
        )
        .exec(db)
        .await?;
    Ok(())
}

/// What a registration asks for, checked and serialised before any
/// row is touched.
struct Registration {
    topology: String,
    underlay: Option<String>,
    rails: Option<String>,
    edge_uplink: Option<String>,
    transfer_url: Option<String>,
}

fn checked(body: &AgentRegister) -> Result<Registration, ApiError> {
    names::tenant_name("name", &body.name)?;
    if !matches!(body.virt_type.as_str(), "kvm" | "qemu") {
        return Err(ApiError::field("virt_type", "kvm or qemu"));
    }
    if let Some(su) = &body.scalable_unit {
        names::tenant_name("scalable_unit", su)?;
    }
    validate_topology(&body.topology)?;
    check_underlay(body.underlay_ip)?;
    if let Some(url) = &body.transfer_url {
        names::transfer_url("transfer_url", url)?;
    }
    if let Some(up) = &body.edge_uplink {
        names::interface("edge_uplink", up)?;
        if body.underlay_ip.is_none() {
            return Err(ApiError::field(
                "edge_uplink",
                "an edge host needs an underlay address (its segments' VXLAN)",
            ));
        }
    }
    if body.rails.len() > kumo_scheduler::profile::MAX_SLOTS
        || body.rails.values().any(|r| *r > 1024)
        || body.rails.keys().any(|k| k.len() > 64)
    {
        return Err(ApiError::field("rails", "at most 64 NICs, rails 0 to 1024"));
    }
    let rails = (!body.rails.is_empty())
        .then(|| serde_json::to_string(&body.rails))
        .transpose()
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let topology =
        serde_json::to_string(&body.topology).map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(Registration {
        topology,
        underlay: body.underlay_ip.map(|u| u.to_string()),
        rails,
        edge_uplink: body.edge_uplink.clone(),
        transfer_url: body.transfer_url.clone(),
    })
}

fn invalid_join_token() -> ApiError {
    ApiError::Unauthenticated("invalid, expired, used or revoked join token".into())
}

/// The join token, if it is genuine, unrevoked, unexpired and has a use
/// left (read only).
async fn usable_join_token(
    db: &impl ConnectionTrait,
    token: &str,
    now: DateTime<Utc>,
) -> Result<join_tokens::Model, ApiError> {
    let (token_id, secret) =
        auth::parse_prefixed(token, auth::JOIN_PREFIX).ok_or_else(invalid_join_token)?;
    let jt = join_tokens::Entity::find_by_id(token_id)
        .one(db)
        .await?
        .filter(|jt| {
            auth::secret_matches(secret, &jt.secret_hash)
                && jt.revoked_at.is_none()
                && jt.expires_at > now
                && jt.used < jt.max_uses
        })
        .ok_or_else(invalid_join_token)?;
    Ok(jt)
}

/// Spends one use of the join token inside `txn`: it must be unrevoked,
/// unexpired and have a use left. The count is conditional on one being
/// left, so the database decides between registrations racing for the
/// last one; a registration that fails later rolls the use back.
async fn spend_join_token(
    txn: &impl ConnectionTrait,
    token: &str,
    now: DateTime<Utc>,
) -> Result<join_tokens::Model, ApiError> {
    let jt = usable_join_token(txn, token, now).await?;
    let counted = join_tokens::Entity::update_many()
        .col_expr(
            join_tokens::Column::Used,
            Expr::col(join_tokens::Column::Used).add(1),
        )
        .filter(join_tokens::Column::Id.eq(jt.id))
        .filter(Expr::col(join_tokens::Column::Used).lt(Expr::col(join_tokens::Column::MaxUses)))
        .exec(txn)
        .await?;
    if counted.rows_affected != 1 {
        return Err(invalid_join_token());
    }
    Ok(jt)
}

/// Whether the agent may take a registered host's name: it shows that
/// host's current credential, or an administrator allowed a re-join.
fn may_rejoin(h: &hosts::Model, current: Option<&str>) -> Result<(), ApiError> {
    let shows_credential = current
        .and_then(|c| auth::parse_prefixed(c, auth::HOST_PREFIX))
        .is_some_and(|(cid, s)| cid == h.id && auth::secret_matches(s, &h.credential_hash));
    if h.rejoin_allowed || shows_credential {
        return Ok(());
    }
    Err(ApiError::Conflict(format!(
        "host {:?} is registered: its agent re-joins with its current credential, \
         or an administrator allows it with `kumo host rejoin {}`",
        h.name, h.name
    )))
}

/// A registered host's row taken by its re-joining agent: a new
/// credential and inventory, reachable again.
async fn rejoin_row(
    txn: &DatabaseTransaction,
    h: hosts::Model,
    body: &AgentRegister,
    reg: Registration,
    credential_hash: String,
) -> Result<(), ApiError> {
    let drained = h.drained;
    let moved = h.underlay_ip != reg.underlay;
    let mut a: hosts::ActiveModel = h.into();
    a.underlay_ip = Set(reg.underlay);
    a.credential_hash = Set(credential_hash);
    a.topology_digest = Set(Some(auth::hash_secret(&reg.topology)));
    a.topology = Set(reg.topology);
    a.virt_type = Set(body.virt_type.clone());
    a.scalable_unit = Set(body.scalable_unit.clone());
    a.rails = Set(reg.rails);
    a.edge_uplink = Set(reg.edge_uplink);
    a.transfer_url = Set(reg.transfer_url);
    a.state = Set(crate::store::hosts::reachable_state(drained)
        .to_text()
        .into());
    a.last_heartbeat_at = Set(chrono::Utc::now()); // wall clock: liveness
    a.unreachable_since = Set(None);
    a.rejoin_allowed = Set(false);
    a.update(txn)
        .await
        .map_err(|e| underlay_taken(e, body.underlay_ip))?;
    if moved {
        underlay_moved(txn).await?;
    }
    Ok(())
}

/// A new host's row, ready.
async fn insert_row(
    txn: &DatabaseTransaction,
    id: Uuid,
    body: &AgentRegister,
    reg: Registration,
    credential_hash: String,
    now: DateTime<Utc>,
) -> Result<(), ApiError> {
    hosts::ActiveModel {
        id: Set(id),
        name: Set(body.name.clone()),
        state: Set(HostState::Ready.to_text().into()),
        credential_hash: Set(credential_hash),
        topology_digest: Set(Some(auth::hash_secret(&reg.topology))),
        topology: Set(reg.topology),
        scalable_unit: Set(body.scalable_unit.clone()),
        registered_at: Set(now),
        last_heartbeat_at: Set(chrono::Utc::now()), // wall clock: liveness
        revision: Set(1),
        virt_type: Set(body.virt_type.clone()),
        rails: Set(reg.rails),
        drained: Set(false),
        underlay_ip: Set(reg.underlay),
        network_revision: Set(0),
        fabric: Set(None),
        rejoin_allowed: Set(false),
        segment_faults: Set(None),
        edge_uplink: Set(reg.edge_uplink),
        transfer_url: Set(reg.transfer_url),
        // Known from the agent's first heartbeat with them.
        disk_capacity_gib: Set(None),
        disk_free_gib: Set(None),
        root_disk_capacity_gib: Set(None),
        shares_storage: Set(None),
        unreachable_since: Set(None),
        maintenance_at: Set(None),
        maintenance_reason: Set(None),
        maintenance_told_at: Set(None),
    }
    .insert(txn)
    .await
    .map_err(|e| {
        if names_underlay(&e) {
            underlay_taken(e, body.underlay_ip)
        } else {
            conflict_if_unique(e, || {
                format!("host {:?} registered concurrently; retry", body.name)
            })
        }
    })?;
    Ok(())
}

/// An agent registers with a join token (one use of it). A new name makes
/// a host; a registered name is taken only as [`may_rejoin`] says, and the
/// old credential dies. Answers the host id and its new credential; the
/// registration is audited with the join token that made it.
pub async fn register(
    st: &AppState,
    body: &AgentRegister,
    current: Option<&str>,
    origin: &Origin,
) -> Result<(Uuid, String), ApiError> {
    let now = origin.at;
    // The token first: without a usable one, a probe learns nothing about
    // what else it sent. (Spent below, in the registration's transaction.)
    usable_join_token(&st.db, &body.join_token, now).await?;
    let reg = checked(body)?;
    let txn = st.db.begin().await?;
    let jt = spend_join_token(&txn, &body.join_token, now).await?;
    let existing = hosts::Entity::find()
        .filter(hosts::Column::Name.eq(body.name.clone()))
        .one(&txn)
        .await?;
    let id = existing.as_ref().map(|h| h.id).unwrap_or_else(Uuid::now_v7);
    let minted = auth::mint_prefixed(auth::HOST_PREFIX, id);
    let action = match existing {
        Some(h) => {
            may_rejoin(&h, current)?;
            rejoin_row(&txn, h, body, reg, minted.secret_hash).await?;
            "host.rejoin.register"
        }
        None => {
            insert_row(&txn, id, body, reg, minted.secret_hash, now).await?;
            "host.register"
        }
    };
    audit::record_by(
        &txn,
        &audit::Who {
            name: format!("join-token:{}", jt.id),
            source_ip: &origin.source_ip,
            request_id: &origin.request_id,
            client_request_id: origin.client_request_id.as_deref(),
            at: now,
            tenant: None,
        },
        action,
        &body.name,
    )
    .await?;
    txn.commit().await?;
    // Its old credential is refused here at once (other replicas follow
    // within a second: the row's mark moved).
    st.capacity.host_rows.forget([&id]);
    st.capacity.refresh_host(&st.db, id).await?;
    tracing::info!(host = %body.name, %id, action, "host registered");
    Ok((id, minted.token))
}
