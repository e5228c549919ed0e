//! Segment edges: where a segment's gateway, egress and public addresses
//! live. An Ethernet segment needs an edge while its egress is on or a
//! public address or forward leads to one of its NICs; it is placed on the
//! ready edge host carrying the fewest edges, and moved when that host is
//! lost. [`ensure`] brings one segment to that, level-triggered and
//! idempotent; the API's operations call it in their transaction, and the
//! edge keeper runs it over every segment to follow hosts coming and
//! going.
//!
//! A segment's egress address is one of its tenant's public addresses: it
//! counts against the tenant's `public_ips` quota, so no tenant takes a
//! pool's last addresses with segments. Where none can be had (the pools
//! are out of addresses, or the quota is used up) the segment's create or
//! egress switch is refused with the reason; a segment whose address the
//! keeper gives later (one made before a pool existed) shows the reason in
//! its `faults` until it has one, so it never sits silently addressless.

use std::collections::BTreeMap;

use kumo_api_types::{HostState, SegmentKind};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, NotSet,
    QueryFilter, Set, TransactionTrait,
};
use uuid::Uuid;

use crate::app::public_net::{pick, Pick};
use crate::context::AppState;
use crate::domain::states::StoredText;
use crate::entity::{hosts, public_ips, segments, tenants};
use crate::error::ApiError;

/// Hosts that may carry edges now: ready (or draining: an edge does not
/// hold a host's GPUs, so draining one need not move its edges) edge
/// hosts with an underlay address, and how many edges each carries.
async fn edge_hosts(db: &impl ConnectionTrait) -> Result<BTreeMap<Uuid, (String, u64)>, ApiError> {
    let up = hosts::Entity::find()
        .filter(hosts::Column::EdgeUplink.is_not_null())
        .filter(hosts::Column::UnderlayIp.is_not_null())
        .filter(
            hosts::Column::State.is_in([HostState::Ready.to_text(), HostState::Draining.to_text()]),
        )
        .all(db)
        .await?;
    let mut out: BTreeMap<Uuid, (String, u64)> =
        up.into_iter().map(|h| (h.id, (h.name, 0))).collect();
    for s in segments::Entity::find()
        .filter(segments::Column::EdgeHostId.is_not_null())
        .all(db)
        .await?
    {
        if let Some((_, n)) = s.edge_host_id.and_then(|h| out.get_mut(&h)) {
            *n += 1;
        }
    }
    Ok(out)
}

/// The edge host for a segment that needs one: where it is while that
/// host may carry it, else the one with fewest edges (then by name).
fn choose(current: Option<Uuid>, up: &BTreeMap<Uuid, (String, u64)>) -> Option<Uuid> {
    if let Some(h) = current.filter(|h| up.contains_key(h)) {
        return Some(h);
    }
    up.iter()
        .min_by(|a, b| (a.1 .1, &a.1 .0).cmp(&(b.1 .1, &b.1 .0)))
        .map(|(id, _)| *id)
}

/// Whether the segment needs an edge.
async fn needs_edge(db: &impl ConnectionTrait, s: &segments::Model) -> Result<bool, ApiError> {
    if crate::store::segments::stored_kind(s)? != SegmentKind::Ethernet {
        return Ok(false);
    }
    if s.egress {
        return Ok(true);
    }
    let rules = crate::store::public_net::edge_rules(db, &[s.id]).await?;
    Ok(!rules.floating.is_empty() || !rules.forwards.is_empty())
}

/// Why a segment with egress on holds no egress address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoEgress {
    /// The platform has no public IP pool: it offers no egress at all.
    NoPool,
    /// Every pool is out of addresses (in words, naming them).
    PoolsFull(String),
    /// The tenant holds `have` public addresses of its `limit`.
    Quota { have: u64, limit: u32 },
}

impl NoEgress {
    /// What the segment's `faults` say (none where the platform has no
    /// pool: that is how it was set up, not this segment's trouble).
    pub fn fault(&self) -> Option<String> {
        match self {
            NoEgress::NoPool => None,
            NoEgress::PoolsFull(why) => Some(format!(
                "egress has no public address: {why}; its VMs cannot reach the outside until one is free"
            )),
            NoEgress::Quota { have, limit } => Some(format!(
                "egress has no public address: the project holds {have} public IPs (its segments' egress addresses count) and its public_ips quota is {limit}"
            )),
        }
    }

    /// The refusal of a create or egress switch that would leave the
    /// segment without an address (none where there is no pool).
    pub fn refusal(&self, tenant: &tenants::Model) -> Option<ApiError> {
        match self {
            NoEgress::NoPool => None,
            NoEgress::PoolsFull(why) => Some(ApiError::InsufficientCapacity(format!(
                "{why}: a segment with egress needs one; create it with egress off or try later"
            ))),
            NoEgress::Quota { have, limit } => {
                Some(crate::app::public_net::over_quota(tenant, *have, *limit))
            }
        }
    }
}

/// Why the segment cannot be given an egress address now (with the
/// tenant's quota read as it stands); `None` when it can (the keeper gives
/// it within a second).
pub async fn why_no_egress(
    db: &impl ConnectionTrait,
    s: &segments::Model,
    now: chrono::DateTime<chrono::Utc>,
    rest: chrono::Duration,
) -> Result<Option<NoEgress>, ApiError> {
    let pools = crate::store::public_net::pools(db).await?;
    if pools.is_empty() {
        return Ok(Some(NoEgress::NoPool));
    }
    let limit = crate::store::tenancy::load(db, s.tenant_id)
        .await?
        .public_ips;
    let have = crate::store::public_net::count_of_tenant(db, s.tenant_id).await?;
    if have >= u64::from(limit) {
        return Ok(Some(NoEgress::Quota { have, limit }));
    }
    Ok(match pick(db, pools, now, rest).await? {
        Pick::Full(why) => Some(NoEgress::PoolsFull(why)),
        Pick::NoPool => Some(NoEgress::NoPool),
        Pick::Free(..) => None,
    })
}

/// Gives the segment an egress address from the first pool with one
/// free, within its tenant's `public_ips` quota (counted with the tenant's
/// row held); else why not.
async fn give_snat(
    txn: &DatabaseTransaction,
    s: &segments::Model,
    now: chrono::DateTime<chrono::Utc>,
    rest: chrono::Duration,
) -> Result<Result<public_ips::Model, NoEgress>, ApiError> {
    let pools = crate::store::public_net::pools(txn).await?;
    if pools.is_empty() {
        return Ok(Err(NoEgress::NoPool));
    }
    crate::store::tenancy::lock_for_quota(txn, s.tenant_id).await?;
    let limit = crate::store::tenancy::load(txn, s.tenant_id)
        .await?
        .public_ips;
    let have = crate::store::public_net::count_of_tenant(txn, s.tenant_id).await?;
    if have >= u64::from(limit) {
        return Ok(Err(NoEgress::Quota { have, limit }));
    }
    let (pool, ip) = match pick(txn, pools, now, rest).await? {
        Pick::Free(pool, ip) => (pool, ip),
        Pick::Full(why) => return Ok(Err(NoEgress::PoolsFull(why))),
        Pick::NoPool => return Ok(Err(NoEgress::NoPool)),
    };
    let row = public_ips::ActiveModel {
        id: Set(Uuid::now_v7()),
        pool_id: Set(pool.id),
        address: Set(ip.to_string()),
        tenant_id: Set(None),
        segment_id: Set(Some(s.id)),
        attachment_id: NotSet,
        created_at: Set(now),
    };
    let row = row.insert(txn).await?;
    // The segment's tenant holds it: charged like an allocated address.
    let tenant = tenants::Entity::find_by_id(s.tenant_id)
        .one(txn)
        .await?
        .ok_or_else(|| ApiError::Internal(format!("segment {} of a missing tenant", s.id)))?;
    crate::app::metering::public_ip_allocated(txn, &tenant, &row, now).await?;
    Ok(Ok(row))
}

/// What [`ensure`] did.
#[derive(Debug, Default)]
pub struct Ensured {
    /// The hosts to wake once committed.
    pub woken: Vec<Uuid>,
    /// Egress is on but the segment holds no address, and why.
    pub no_egress: Option<NoEgress>,
}

/// Brings one segment's edge to what it needs, in the caller's
/// transaction; answers the hosts whose networks changed (the old and new
/// edge hosts and the hosts of the segment's VMs), to wake once committed,
/// and why egress has no address if it has none. An egress address given
/// back rests `rest` before anyone gets it again.
pub async fn ensure(
    db: &DatabaseTransaction,
    s: &segments::Model,
    now: chrono::DateTime<chrono::Utc>,
    rest: chrono::Duration,
) -> Result<Ensured, ApiError> {
    let needs = needs_edge(db, s).await?;
    let want = if needs {
        choose(s.edge_host_id, &edge_hosts(db).await?)
    } else {
        None
    };
    let mut changed = false;
    let mut no_egress = None;
    let snat = crate::store::public_net::snat_of(db, s.id).await?;
    match (needs && s.egress, snat) {
        (true, None) => match give_snat(db, s, now, rest).await? {
            Ok(_) => changed = true,
            Err(why) => no_egress = Some(why),
        },
        (false, Some(old)) => {
            crate::store::public_net::give_back(db, &old, s.tenant_id, now, rest).await?;
            crate::app::metering::public_ip_released(db, &old, now).await?;
            changed = true;
        }
        _ => {}
    }
    let old_host = s.edge_host_id;
    if want != old_host {
        let mut a: segments::ActiveModel = s.clone().into();
        a.edge_host_id = Set(want);
        a.update(db).await?;
        changed = true;
    }
    if !changed {
        return Ok(Ensured {
            woken: Vec::new(),
            no_egress,
        });
    }
    let mut woken = crate::app::host_network::touch_segments(db, vec![s.id]).await?;
    for h in [old_host, want].into_iter().flatten() {
        if !woken.contains(&h) {
            crate::app::host_network::touch_hosts(db, &[h]).await?;
            woken.push(h);
        }
    }
    Ok(Ensured { woken, no_egress })
}

/// Whether a segment is already as [`ensure`] would leave it, from what
/// one read of the whole picture says: its edge is on a host that may
/// carry it exactly when it needs one, and it holds an egress address
/// exactly when its egress is on.
fn settled(
    s: &segments::Model,
    ethernet: bool,
    published: bool,
    has_snat: bool,
    up: &BTreeMap<Uuid, (String, u64)>,
) -> bool {
    let needs = ethernet && (s.egress || published);
    if !needs {
        return s.edge_host_id.is_none() && !has_snat;
    }
    s.edge_host_id.is_some_and(|h| up.contains_key(&h)) && has_snat == s.egress
}

/// One pass of the edge keeper: the whole picture is read once (a few
/// queries, whatever the number of segments), and only the segments not
/// settled are brought into line, each in its own transaction: one
/// segment's failure is logged and the others go on.
pub async fn keep(st: &AppState) -> Result<(), ApiError> {
    let all = segments::Entity::find().all(&st.db).await?;
    let published = crate::store::public_net::published_segments(&st.db).await?;
    let snat: std::collections::BTreeSet<Uuid> = public_ips::Entity::find()
        .filter(public_ips::Column::SegmentId.is_not_null())
        .all(&st.db)
        .await?
        .into_iter()
        .filter_map(|p| p.segment_id)
        .collect();
    let up = edge_hosts(&st.db).await?;
    let mut due = Vec::new();
    for s in all {
        let ethernet = crate::store::segments::stored_kind(&s)? == SegmentKind::Ethernet;
        if !settled(
            &s,
            ethernet,
            published.contains(&s.id),
            snat.contains(&s.id),
            &up,
        ) {
            due.push((s.tenant_id, s));
        }
    }
    // Tenants in turns: one tenant's many edges never hold back the others'.
    for s in crate::domain::churn::in_turns(due) {
        let outcome = async {
            let txn = st.db.begin().await?;
            // Read again under the transaction: an operation may have
            // moved it since the list was read.
            let Some(s) = segments::Entity::find_by_id(s.id).one(&txn).await? else {
                return Ok(Vec::new());
            };
            let rest = crate::app::public_net::address_rest(st);
            let done = ensure(&txn, &s, st.config.clock.now(), rest).await?;
            txn.commit().await?;
            // A segment still without its egress address shows why in
            // its `faults`; the keeper tries again on its next pass.
            Ok::<_, ApiError>(done.woken)
        }
        .await;
        match outcome {
            Ok(woken) => {
                for h in woken {
                    st.signals.notify(h);
                }
            }
            // Two replicas giving out the same address: one loses and its
            // next pass finds the segment done.
            Err(e) => {
                tracing::warn!(segment = %s.name, error = %e, "could not keep the segment's edge")
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keeper_leaves_settled_segments_alone() {
        let h = Uuid::from_u128(1);
        let up: BTreeMap<Uuid, (String, u64)> = [(h, ("edge-a".to_owned(), 1))].into();
        let seg = |egress: bool, edge: Option<Uuid>| segments::Model {
            id: Uuid::from_u128(9),
            tenant_id: Uuid::from_u128(8),
            name: "lan".into(),
            kind: "ethernet".into(),
            cidr: "10.1.0.0/24".into(),
            gateway: "10.1.0.1".into(),
            mtu: 1450,
            vni: 5000,
            created_at: chrono::DateTime::UNIX_EPOCH,
            ingress_rules: None,
            vlan: None,
            egress,
            edge_host_id: edge,
        };
        assert!(settled(&seg(true, Some(h)), true, false, true, &up));
        assert!(
            !settled(&seg(true, Some(h)), true, false, false, &up),
            "no egress address yet"
        );
        assert!(
            !settled(&seg(true, Some(Uuid::from_u128(2))), true, false, true, &up),
            "its host is gone"
        );
        assert!(
            !settled(&seg(true, None), true, false, false, &up),
            "not placed"
        );
        assert!(
            settled(&seg(false, None), true, false, false, &up),
            "needs nothing"
        );
        assert!(
            !settled(&seg(false, Some(h)), true, false, false, &up),
            "an edge to give up"
        );
        assert!(
            settled(&seg(false, Some(h)), true, true, false, &up),
            "a floating address keeps it"
        );
        assert!(
            !settled(&seg(false, Some(h)), true, true, true, &up),
            "egress off: its address goes"
        );
        assert!(
            settled(&seg(false, None), false, true, false, &up),
            "RoCE never has one"
        );
    }

    #[test]
    fn an_edge_stays_while_its_host_may_carry_it_else_goes_to_the_least_loaded() {
        let (a, b, c) = (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3));
        let up: BTreeMap<Uuid, (String, u64)> = [
            (a, ("edge-a".to_owned(), 5)),
            (b, ("edge-b".to_owned(), 2)),
            (c, ("edge-c".to_owned(), 2)),
        ]
        .into();
        assert_eq!(choose(Some(a), &up), Some(a), "no needless move");
        assert_eq!(choose(None, &up), Some(b), "fewest edges, then name");
        assert_eq!(
            choose(Some(Uuid::from_u128(9)), &up),
            Some(b),
            "its host is gone"
        );
        assert_eq!(choose(Some(a), &BTreeMap::new()), None);
    }
}
