//! Queries over hosts: the stored topology and state of a row, a host by
//! name or id, the devices held on hosts, and revision bumps that wake an
//! agent.

use kumo_api_types::HostState;
use kumo_topology::HostTopology;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect,
};
use uuid::Uuid;

use crate::domain::states::decode;
use crate::entity::{allocations, hosts};
use crate::error::ApiError;

/// What other replicas need to notice of a host, read for every host in
/// one narrow query (no topology): the revision its agent long-polls on,
/// a digest of what the capacity index is built from, and a digest of the
/// rest of the row an agent's requests work with. The allocations under a
/// host change only with its revision (every commit and release bumps it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangeMark {
    pub seen_revision: i64,
    /// The revision placements commit against (the index keeps it).
    pub revision: i64,
    /// A digest of the other columns the index is built from.
    pub capacity: u64,
    /// A digest of the row's other columns but its topology, fabric and
    /// last beat: when it moves, [`HostRows`] forgets the host.
    pub row: u64,
}

#[derive(sea_orm::FromQueryResult)]
struct MarkRow {
    id: Uuid,
    revision: i64,
    network_revision: i64,
    state: String,
    drained: bool,
    scalable_unit: Option<String>,
    underlay_ip: Option<String>,
    topology_digest: Option<String>,
    rails: Option<String>,
    disk_capacity_gib: Option<i64>,
    root_disk_capacity_gib: Option<i64>,
    shares_storage: Option<String>,
    name: String,
    credential_hash: String,
    virt_type: String,
    rejoin_allowed: bool,
    segment_faults: Option<String>,
    edge_uplink: Option<String>,
    transfer_url: Option<String>,
    disk_free_gib: Option<i64>,
    unreachable_since: Option<chrono::DateTime<chrono::Utc>>,
    maintenance_at: Option<chrono::DateTime<chrono::Utc>>,
    maintenance_reason: Option<String>,
    maintenance_told_at: Option<chrono::DateTime<chrono::Utc>>,
}

pub async fn change_marks(
    db: &impl ConnectionTrait,
) -> Result<std::collections::HashMap<Uuid, ChangeMark>, ApiError> {
    use hosts::Column as C;
    use std::hash::{Hash, Hasher};
    let rows: Vec<MarkRow> = hosts::Entity::find()
        .select_only()
        .columns([
            C::Id,
            C::Revision,
            C::NetworkRevision,
            C::State,
            C::Drained,
            C::ScalableUnit,
            C::UnderlayIp,
            C::TopologyDigest,
            C::Rails,
            C::DiskCapacityGib,
            C::RootDiskCapacityGib,
            C::SharesStorage,
            C::Name,
            C::CredentialHash,
            C::VirtType,
            C::RejoinAllowed,
            C::SegmentFaults,
            C::EdgeUplink,
            C::TransferUrl,
            C::DiskFreeGib,
            C::UnreachableSince,
            C::MaintenanceAt,
            C::MaintenanceReason,
            C::MaintenanceToldAt,
        ])
        .into_model()
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let mut capacity = std::collections::hash_map::DefaultHasher::new();
            (
                &r.state,
                r.drained,
                &r.scalable_unit,
                &r.underlay_ip,
                &r.topology_digest,
                &r.rails,
                r.disk_capacity_gib,
                r.root_disk_capacity_gib,
                &r.shares_storage,
            )
                .hash(&mut capacity);
            let mut row = std::collections::hash_map::DefaultHasher::new();
            (
                &r.name,
                &r.credential_hash,
                &r.virt_type,
                r.rejoin_allowed,
                &r.segment_faults,
                &r.edge_uplink,
                &r.transfer_url,
                r.disk_free_gib,
                r.unreachable_since,
                r.maintenance_at,
                &r.maintenance_reason,
                r.maintenance_told_at,
            )
                .hash(&mut row);
            let mark = ChangeMark {
                seen_revision: r.revision.saturating_add(r.network_revision),
                revision: r.revision,
                capacity: capacity.finish(),
                row: row.finish(),
            };
            (r.id, mark)
        })
        .collect())
}

/// What moved between two readings of the change marks.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MovedMarks {
    /// Their agents' desired state changed.
    pub woken: Vec<Uuid>,
    /// Their capacity inputs changed, or they are new.
    pub reread: Vec<Uuid>,
    /// Only their revision moved (to this one): re-read unless the index
    /// holds that revision already (a change this replica made).
    pub revised: Vec<(Uuid, i64)>,
    /// No longer there.
    pub gone: Vec<Uuid>,
    /// Any part of their mark moved, or they are new or gone: their rows
    /// as agents' requests last read them are stale.
    pub changed: Vec<Uuid>,
}

pub fn moved_marks(
    before: &std::collections::HashMap<Uuid, ChangeMark>,
    now: &std::collections::HashMap<Uuid, ChangeMark>,
) -> MovedMarks {
    let mut out = MovedMarks::default();
    for (id, m) in now {
        let b = before.get(id);
        // A host new since the last reading is woken too: it may have
        // registered here just before that reading and had its desired
        // state moved by another replica since — a long poll held here
        // then slept its 25 s out (the replicas test's flake: A's index
        // followed B's placement in 0.72 s, the poll waited 25 s). A
        // wake-up too many only makes a poll read its row again.
        if b.is_none_or(|b| b.seen_revision != m.seen_revision) {
            out.woken.push(*id);
        }
        if b.is_none_or(|b| b.capacity != m.capacity) {
            out.reread.push(*id);
        } else if b.is_some_and(|b| b.revision != m.revision) {
            out.revised.push((*id, m.revision));
        }
        if b != Some(m) {
            out.changed.push(*id);
        }
    }
    out.gone = before
        .keys()
        .filter(|id| !now.contains_key(id))
        .copied()
        .collect();
    out.changed.extend(&out.gone);
    for v in [
        &mut out.woken,
        &mut out.reread,
        &mut out.gone,
        &mut out.changed,
    ] {
        v.sort_unstable();
    }
    out.revised.sort_unstable();
    out
}

/// Hosts per lease-renewal statement: 4 bound values each, well under
/// SQLite's limit on variables.
const LEASES_PER_STATEMENT: usize = 500;

/// Writes heartbeats renewed in memory: one `UPDATE … CASE` per batch of
/// hosts, each row moved only forward (another replica may have written
/// a later beat of the same host). Returns the statements run.
pub async fn write_leases(
    db: &impl ConnectionTrait,
    renewed: &[(Uuid, chrono::DateTime<chrono::Utc>)],
) -> Result<usize, ApiError> {
    use sea_orm::sea_query::{CaseStatement, Expr};
    let mut statements = 0;
    for batch in renewed.chunks(LEASES_PER_STATEMENT) {
        let mut case = CaseStatement::new();
        for (id, at) in batch {
            case = case.case(
                hosts::Column::Id
                    .eq(*id)
                    .and(hosts::Column::LastHeartbeatAt.lt(*at)),
                Expr::value(*at),
            );
        }
        let case = case.finally(Expr::col(hosts::Column::LastHeartbeatAt));
        hosts::Entity::update_many()
            .col_expr(hosts::Column::LastHeartbeatAt, case.into())
            .filter(hosts::Column::Id.is_in(batch.iter().map(|(id, _)| *id)))
            .exec(db)
            .await?;
        statements += 1;
    }
    Ok(statements)
}

/// Marks a host's desired state as changed, inside the caller's transaction.
pub async fn bump_revision(txn: &DatabaseTransaction, host: Uuid) -> Result<(), ApiError> {
    use sea_orm::sea_query::Expr;
    hosts::Entity::update_many()
        .col_expr(
            hosts::Column::Revision,
            Expr::col(hosts::Column::Revision).add(1),
        )
        .filter(hosts::Column::Id.eq(host))
        .exec(txn)
        .await?;
    Ok(())
}

/// A stored topology; a row that does not parse is a bug, reported as such.
/// Parsed once per document: hosts of one design share it, and a page of
/// VMs or hosts would otherwise parse tens of KiB of JSON per row (it was
/// a sixth of the server's time under the fleet simulator).
pub fn stored_topology(h: &hosts::Model) -> Result<std::sync::Arc<HostTopology>, ApiError> {
    use std::sync::{Arc, LazyLock, Mutex};
    /// Parsed documents by digest; emptied when it holds this many.
    const KEPT: usize = 1024;
    static PARSED: LazyLock<Mutex<std::collections::HashMap<String, Arc<HostTopology>>>> =
        LazyLock::new(Mutex::default);
    let parse = || {
        serde_json::from_str::<HostTopology>(&h.topology)
            .map(Arc::new)
            .map_err(|e| ApiError::Internal(format!("host {} topology: {e}", h.name)))
    };
    // A digest is written with its document; rows from before have none.
    let Some(digest) = h
        .topology_digest
        .as_ref()
        .filter(|_| !h.topology.is_empty())
    else {
        return parse();
    };
    let cached = PARSED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(digest)
        .cloned();
    if let Some(t) = cached {
        return Ok(t);
    }
    // Parsed outside the lock: other requests do not wait on it.
    let t = parse()?;
    let mut cache = PARSED.lock().unwrap_or_else(|e| e.into_inner());
    if cache.len() >= KEPT {
        cache.clear();
    }
    cache.insert(digest.clone(), t.clone());
    Ok(t)
}

/// What keeps a host from passing devices through (empty: ready). KVM
/// hosts back guest memory with hugepages; TCG and test hosts do not.
pub fn passthrough_problems(h: &hosts::Model, topo: &HostTopology) -> Vec<String> {
    kumo_topology::readiness::problems(topo, h.virt_type == "kvm")
}

pub fn host_state(h: &hosts::Model) -> Result<HostState, ApiError> {
    decode("hosts", &h.name, &h.state)
}

pub async fn held(
    db: &impl ConnectionTrait,
    host: Uuid,
) -> Result<Vec<allocations::Model>, ApiError> {
    Ok(allocations::Entity::find()
        .filter(allocations::Column::HostId.eq(host))
        .all(db)
        .await?)
}

/// Every allocation of the given hosts, by host, in one query.
pub async fn held_by_host(
    db: &impl ConnectionTrait,
    hosts: &[Uuid],
) -> Result<std::collections::HashMap<Uuid, Vec<allocations::Model>>, ApiError> {
    let mut by_host: std::collections::HashMap<Uuid, Vec<allocations::Model>> =
        std::collections::HashMap::new();
    for a in allocations::Entity::find()
        .filter(allocations::Column::HostId.is_in(hosts.iter().copied()))
        .all(db)
        .await?
    {
        by_host.entry(a.host_id).or_default().push(a);
    }
    Ok(by_host)
}

/// Every host's name, by id.
pub async fn names(
    db: &impl ConnectionTrait,
) -> Result<std::collections::HashMap<Uuid, String>, ApiError> {
    use sea_orm::QuerySelect;
    Ok(hosts::Entity::find()
        .select_only()
        .column(hosts::Column::Id)
        .column(hosts::Column::Name)
        .into_tuple::<(Uuid, String)>()
        .all(db)
        .await?
        .into_iter()
        .collect())
}

pub async fn find(
    db: &impl ConnectionTrait,
    host_ref: &str,
) -> Result<Option<hosts::Model>, ApiError> {
    Ok(super::name_or_id(
        hosts::Entity::find(),
        hosts::Column::Id,
        hosts::Column::Name,
        host_ref,
    )
    .one(db)
    .await?)
}

/// The state of a host that answers: an operator's drain outlives the
/// host going silent and coming back.
pub fn reachable_state(drained: bool) -> HostState {
    if drained {
        HostState::Draining
    } else {
        HostState::Ready
    }
}

pub async fn by_id(db: &impl ConnectionTrait, id: Uuid) -> Result<Option<hosts::Model>, ApiError> {
    Ok(hosts::Entity::find_by_id(id).one(db).await?)
}

/// A host's row without its topology (`topology` reads empty): what an
/// agent's every request authenticates and works with. The topology is a
/// large document (tens of KiB), read whole only where it is used
/// ([`with_topology`]).
pub async fn by_id_without_topology(
    db: &impl ConnectionTrait,
    id: Uuid,
) -> Result<Option<hosts::Model>, ApiError> {
    use sea_orm::sea_query::Expr;
    use sea_orm::Iterable;
    Ok(hosts::Entity::find_by_id(id)
        .select_only()
        .columns(hosts::Column::iter().filter(|c| !matches!(c, hosts::Column::Topology)))
        .column_as(Expr::value(""), "topology")
        .into_model::<hosts::Model>()
        .one(db)
        .await?)
}

/// Hosts' rows (without topology) as agents' requests last read them, so
/// that a beat that changes nothing reads no database: at 2,000 hosts
/// every request of an agent read its host's row, 550 reads a second.
/// A host is forgotten when its change mark moves ([`ChangeMark::row`] and
/// the rest; `Capacity::catch_up` reads them every second, this replica's
/// changes and other replicas' alike), when this replica rewrites the row
/// for its agent (a heartbeat that changed something, a registration)
/// and after [`HostRows::MAX_AGE`]. So a row served here is at most about
/// a second behind the database: a credential replaced or a host retired
/// on another replica is refused here within that second.
#[derive(Default)]
pub struct HostRows {
    inner: std::sync::Mutex<HostRowsInner>,
}

#[derive(Default)]
struct HostRowsInner {
    rows: std::collections::HashMap<Uuid, (hosts::Model, std::time::Instant)>,
    /// Each host's last beat answered here.
    beats: std::collections::HashMap<Uuid, std::time::Instant>,
    /// Moves with every forgetting: a read that began before one may hold
    /// what was just forgotten, and is not kept.
    generation: u64,
}

impl HostRows {
    /// A backstop: no row is kept longer, whatever the marks say.
    pub const MAX_AGE: std::time::Duration = std::time::Duration::from_secs(60);

    fn lock(&self) -> std::sync::MutexGuard<'_, HostRowsInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The host's row, kept or read (and kept).
    pub async fn get(
        &self,
        db: &impl ConnectionTrait,
        id: Uuid,
    ) -> Result<Option<hosts::Model>, ApiError> {
        let generation = {
            let inner = self.lock();
            if let Some((row, at)) = inner.rows.get(&id) {
                if at.elapsed() < Self::MAX_AGE {
                    return Ok(Some(row.clone()));
                }
            }
            inner.generation
        };
        let row = by_id_without_topology(db, id).await?;
        if let Some(r) = &row {
            let mut inner = self.lock();
            if inner.generation == generation {
                inner
                    .rows
                    .insert(id, (r.clone(), std::time::Instant::now()));
            }
        }
        Ok(row)
    }

    /// Notes a beat of the host; true when its last beat here was within
    /// `quiet`. A host only turns unreachable after a silence of the
    /// heartbeat timeout in the database, so one that beat here within
    /// half of it cannot have (its beat is written within a quarter):
    /// the kept row's state stands. After a longer silence the beat
    /// reads the row afresh, and a host back from `unreachable` is
    /// written back at once, whichever replica marked it.
    pub fn beat(&self, id: Uuid, quiet: std::time::Duration) -> bool {
        let now = std::time::Instant::now();
        self.lock()
            .beats
            .insert(id, now)
            .is_some_and(|last| now.duration_since(last) <= quiet)
    }

    /// Drops the hosts' kept rows; reads under way are not kept.
    pub fn forget<'a>(&self, ids: impl IntoIterator<Item = &'a Uuid>) {
        let mut inner = self.lock();
        inner.generation = inner.generation.wrapping_add(1);
        for id in ids {
            inner.rows.remove(id);
        }
    }

    /// How many rows are kept (for tests).
    pub fn len(&self) -> usize {
        self.lock().rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The host whole: `h` itself, or its row read again when `h` was read
/// without its topology.
pub async fn with_topology<'h>(
    db: &impl ConnectionTrait,
    h: &'h hosts::Model,
) -> Result<std::borrow::Cow<'h, hosts::Model>, ApiError> {
    if !h.topology.is_empty() {
        return Ok(std::borrow::Cow::Borrowed(h));
    }
    let whole = by_id(db, h.id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("host {}", h.name)))?;
    Ok(std::borrow::Cow::Owned(whole))
}

/// The hosts with these ids, in one query.
pub async fn by_ids(
    db: &impl ConnectionTrait,
    ids: impl IntoIterator<Item = Uuid>,
) -> Result<Vec<hosts::Model>, ApiError> {
    Ok(hosts::Entity::find()
        .filter(hosts::Column::Id.is_in(ids))
        .all(db)
        .await?)
}

/// Up to `limit` hosts by name, after the name `after`.
pub async fn page(
    db: &impl ConnectionTrait,
    after: Option<&str>,
    limit: u64,
) -> Result<Vec<hosts::Model>, ApiError> {
    let mut query = hosts::Entity::find().order_by_asc(hosts::Column::Name);
    if let Some(after) = after {
        query = query.filter(hosts::Column::Name.gt(after));
    }
    Ok(query.limit(limit).all(db).await?)
}

/// The hosts whose agents reported segments they could not set up.
pub async fn with_segment_faults(db: &impl ConnectionTrait) -> Result<Vec<hosts::Model>, ApiError> {
    Ok(hosts::Entity::find()
        .filter(hosts::Column::SegmentFaults.is_not_null())
        .all(db)
        .await?)
}

/// Hosts' names and states by id, without their topologies.
pub async fn names_and_states(
    db: &impl ConnectionTrait,
    ids: impl IntoIterator<Item = Uuid>,
) -> Result<std::collections::HashMap<Uuid, (String, HostState)>, ApiError> {
    let ids: Vec<Uuid> = ids.into_iter().collect();
    let mut out = std::collections::HashMap::new();
    for chunk in ids.chunks(500) {
        let rows: Vec<(Uuid, String, String)> = hosts::Entity::find()
            .select_only()
            .column(hosts::Column::Id)
            .column(hosts::Column::Name)
            .column(hosts::Column::State)
            .filter(hosts::Column::Id.is_in(chunk.iter().copied()))
            .into_tuple()
            .all(db)
            .await?;
        for (id, name, state) in rows {
            let state = crate::domain::states::decode("hosts", id, &state)?;
            out.insert(id, (name, state));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moved_marks_wake_revised_and_new_hosts_and_reread_changed_ones() {
        let (a, b, c, d, e) = (
            Uuid::from_u128(1),
            Uuid::from_u128(2),
            Uuid::from_u128(3),
            Uuid::from_u128(4),
            Uuid::from_u128(5),
        );
        let m = |seen, revision, capacity, row| ChangeMark {
            seen_revision: seen,
            revision,
            capacity,
            row,
        };
        let before = [
            (a, m(1, 1, 7, 9)),
            (b, m(5, 5, 7, 9)),
            (c, m(3, 3, 7, 9)),
            (e, m(4, 4, 7, 9)),
        ]
        .into();
        // a: a placement (revision); b: drained (capacity); c: gone;
        // d: new (woken: its revision may have moved since it came);
        // e: a new credential (only the rest of its row).
        let now = [
            (a, m(2, 2, 7, 9)),
            (b, m(5, 5, 8, 9)),
            (d, m(0, 0, 7, 9)),
            (e, m(4, 4, 7, 10)),
        ]
        .into();
        assert_eq!(
            moved_marks(&before, &now),
            MovedMarks {
                woken: vec![a, d],
                reread: vec![b, d],
                revised: vec![(a, 2)],
                gone: vec![c],
                changed: vec![a, b, c, d, e],
            }
        );
        assert_eq!(moved_marks(&now, &now), MovedMarks::default());
    }
}
