//! The server's copy of the scheduler's capacity index, kept in step with
//! the database by changes: a host is re-read after every change this
//! server makes to it and after every commit it loses, and, every second,
//! the hosts whose change marks moved (changes made by other replicas:
//! one narrow query over all hosts, then only the changed ones re-read,
//! [`Capacity::catch_up`]). The whole fleet is re-read only as a rare
//! consistency check ([`REFRESH`]). The index may lag; it is never trusted
//! over the database, whose commit checks the host's revision and the
//! allocation rows.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kumo_api_types::{HostState, VmState};
use kumo_scheduler::index::VmInput;
use kumo_scheduler::{DiskUse, HostDisk, HostInput, HostProfile, HostUse, Index, Pool};
use kumo_topology::guest_layout::Placement;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QuerySelect};
use uuid::Uuid;

use crate::entity::{hosts, vms, volume_snapshots, volumes};
use crate::error::ApiError;
use crate::store::hosts::{host_state, passthrough_problems, stored_topology};
use crate::store::vms::{stored_placement, stored_spec, stored_state};

/// How often the whole index is re-read, a consistency check: changes
/// reach it through [`Capacity::catch_up`].
pub const REFRESH: Duration = Duration::from_secs(300);
/// Hosts read per query by [`Capacity::refresh_all`].
const REFRESH_PAGE: u64 = 100;

/// See [`Capacity::spares_pending`].
pub struct SparesPending<'a> {
    capacity: &'a Capacity,
    cluster: Uuid,
    committed: bool,
}

impl SparesPending<'_> {
    /// The cluster's row (with its spares) is committed.
    pub fn committed(mut self) {
        self.committed = true;
    }
}

impl Drop for SparesPending<'_> {
    fn drop(&mut self) {
        self.capacity
            .reserving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.cluster);
        if !self.committed {
            self.capacity
                .lock()
                .spares
                .retain(|s| s.cluster != self.cluster);
        }
    }
}

/// Reservations applied to the index and not yet committed (see
/// [`Capacity::in_flight`]): however the admission ends (committed,
/// lost, or its request dropped mid-way), dropping this lets readings
/// decide their holds again.
pub struct InFlight<'a> {
    capacity: &'a Capacity,
    vms: Vec<Uuid>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut index = self.capacity.lock();
        for vm in &self.vms {
            index.landed(*vm);
        }
    }
}

pub struct Capacity {
    index: Mutex<Index>,
    /// Profiles by topology and rails, so an unchanged host is not
    /// re-derived on every refresh; with them the devices a host that is
    /// not ready for passthrough keeps out of placements.
    profiles: Mutex<HashMap<u64, Derived>>,
    /// `[storage] overcommit`: how many times its storage a host may
    /// provision.
    overcommit: f64,
    /// Each host's change mark when last caught up.
    /// `None` until first read.
    marks: Mutex<Option<HashMap<Uuid, crate::store::hosts::ChangeMark>>>,
    /// When the last catch-up began reading the marks.
    caught_up_at: Mutex<Option<std::time::Instant>>,
    /// New clusters whose spares are in the index but not yet committed:
    /// a reload of the spares from the database keeps them.
    reserving: Mutex<std::collections::HashSet<Uuid>>,
    /// Hosts the fair queue's waiting requests are planned on (its last
    /// pass): new requests keep off them, so those ahead are not delayed.
    held_for_queue: Mutex<Vec<Uuid>>,
    /// Hosts' rows as their agents' requests last read them; the marks
    /// read here say when to forget them.
    pub host_rows: crate::store::hosts::HostRows,
}

impl Default for Capacity {
    fn default() -> Self {
        Self::with_overcommit(1.0)
    }
}

#[derive(Clone)]
struct Derived {
    profile: Arc<HostProfile>,
    unready: Arc<[kumo_topology::Bdf]>,
}

pub fn host_use(h: &hosts::Model) -> Result<HostUse, ApiError> {
    Ok(match host_state(h)? {
        // A window ahead: nothing new goes there (its VMs are about to
        // move off).
        HostState::Ready if h.maintenance_at.is_some() => HostUse::Draining,
        HostState::Ready => HostUse::Ready,
        HostState::Draining => HostUse::Draining,
        HostState::Unreachable | HostState::Retired | HostState::Maintenance => {
            HostUse::Unavailable
        }
    })
}

/// Whether a VM in this state holds its share of its host.
pub fn holds(state: VmState) -> bool {
    !matches!(
        state,
        VmState::Queued
            | VmState::Pending
            | VmState::Suspended
            | VmState::Deleted
            | VmState::Shelved
    )
}

pub fn stored_rails(h: &hosts::Model) -> BTreeMap<String, u32> {
    h.rails
        .as_deref()
        .and_then(|r| serde_json::from_str(r).ok())
        .unwrap_or_default()
}

impl Capacity {
    /// An empty index whose hosts may provision `overcommit` times their
    /// storage.
    pub fn with_overcommit(overcommit: f64) -> Capacity {
        Capacity {
            index: Mutex::default(),
            profiles: Mutex::default(),
            overcommit,
            marks: Mutex::default(),
            caught_up_at: Mutex::default(),
            reserving: Mutex::default(),
            held_for_queue: Mutex::default(),
            host_rows: Default::default(),
        }
    }

    /// Follows changes made elsewhere (other replicas, jobs that change
    /// rows without re-reading): reads every host's change mark, wakes the
    /// long polls of hosts whose revision moved and re-reads the hosts
    /// whose capacity inputs moved, new hosts included; hosts gone leave
    /// the index. The first call only records the marks (the caller then
    /// reads the whole index). Returns the hosts re-read.
    pub async fn catch_up(
        &self,
        db: &impl ConnectionTrait,
        signals: &crate::signals::HostSignals,
    ) -> Result<usize, ApiError> {
        *self.caught_up_at.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(std::time::Instant::now());
        let now = crate::store::hosts::change_marks(db).await?;
        let before = self
            .marks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(now.clone());
        let Some(before) = before else {
            return Ok(0);
        };
        let moved = crate::store::hosts::moved_marks(&before, &now);
        if !moved.changed.is_empty() {
            self.host_rows.forget(&moved.changed);
        }
        if moved != crate::store::hosts::MovedMarks::default() {
            tracing::debug!(?moved, "hosts changed elsewhere");
        }
        for id in &moved.woken {
            tracing::debug!(host = %id, "woken by a change elsewhere");
            signals.notify(*id);
        }
        let stale: Vec<Uuid> = {
            let index = self.lock();
            moved
                .revised
                .iter()
                .filter(|(id, r)| index.host(*id).is_none_or(|h| h.revision != *r))
                .map(|(id, _)| *id)
                .collect()
        };
        for id in moved.reread.iter().chain(&stale) {
            self.refresh_host(db, *id).await?;
        }
        {
            let mut index = self.lock();
            for id in &moved.gone {
                index.remove(*id);
            }
        }
        self.load_spares(db).await?;
        Ok(moved.reread.len() + stale.len())
    }

    /// [`Capacity::catch_up`] unless one began within `fresh`: a full
    /// fleet refuses every create, and a scan of every host's mark per
    /// refusal (26 ms at 2,000 hosts on SQLite, ten a second) held the
    /// one connection a quarter of the time.
    pub async fn catch_up_unless(
        &self,
        db: &impl ConnectionTrait,
        signals: &crate::signals::HostSignals,
        fresh: std::time::Duration,
    ) -> Result<usize, ApiError> {
        let recent = self
            .caught_up_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|t| t.elapsed() < fresh);
        if recent {
            return Ok(0);
        }
        self.catch_up(db, signals).await
    }

    /// A new cluster's spares go into the index ahead of their commit:
    /// reloads keep them meanwhile, and they leave the index again when
    /// the guard is dropped uncommitted (a failed commit, or a request
    /// abandoned mid-commit).
    pub fn spares_pending(&self, cluster: Uuid) -> SparesPending<'_> {
        self.reserving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(cluster);
        SparesPending {
            capacity: self,
            cluster,
            committed: false,
        }
    }

    fn reserving_now(&self) -> std::collections::HashSet<Uuid> {
        self.reserving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Re-reads every cluster's spares (a few rows: clusters keeping
    /// spares), keeping those of clusters being created.
    pub async fn load_spares(&self, db: &impl ConnectionTrait) -> Result<(), ApiError> {
        // Pending before the read, or still pending after it: a cluster
        // committed in between is in the rows or in the first set.
        let mut reserving = self.reserving_now();
        let rows = crate::store::clusters::with_spares(db).await?;
        reserving.extend(self.reserving_now());
        let mut index = self.lock();
        let mut spares: Vec<kumo_scheduler::Spare> = index
            .spares
            .iter()
            .filter(|s| reserving.contains(&s.cluster))
            .cloned()
            .collect();
        for c in &rows {
            if reserving.contains(&c.id) {
                continue; // in the index already
            }
            let spec = match crate::store::clusters::stored_cluster_spec(c) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(cluster = %c.id, error = %e, "cluster's spares not kept: unreadable spec");
                    continue;
                }
            };
            // A unit or model no host has any more: nothing to keep.
            let unit = match &c.spare_unit {
                Some(u) => match index.unit_id(u) {
                    Some(id) => Some(id),
                    None => continue,
                },
                None => None,
            };
            let model = match &c.spare_model {
                Some(m) => match index.model_id(m) {
                    Some(id) => Some(id),
                    None => continue,
                },
                None => None,
            };
            let shape = kumo_scheduler::Request {
                gpus: spec.gpus,
                model,
                vcpus: spec.vcpus,
                memory_mib: u64::from(spec.memory_gib) * 1024,
                ..Default::default()
            };
            let count = u32::try_from(c.spares).unwrap_or(0);
            spares.push(kumo_scheduler::Spare::of(c.id, unit, &shape, count));
        }
        index.spares = spares;
        Ok(())
    }

    /// Owns the in-flight marks of `vms`, which the reservation put in
    /// the index under its lock ([`Index::in_flight`]).
    pub fn in_flight(&self, vms: Vec<Uuid>) -> InFlight<'_> {
        InFlight {
            capacity: self,
            vms,
        }
    }

    pub fn held_for_queue(&self) -> Vec<Uuid> {
        self.held_for_queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn hold_for_queue(&self, hosts: Vec<Uuid>) {
        *self
            .held_for_queue
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = hosts;
    }

    pub fn lock(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn overcommit(&self) -> f64 {
        self.overcommit
    }
}

// ---- disks ----------------------------------------------------------------

/// What a host's storage may hold, as its agent last said; `None` for an
/// agent that does not say (its disk is not counted).
pub fn host_disk(h: &hosts::Model) -> Option<HostDisk> {
    let gib = |g: i64| u64::try_from(g).unwrap_or(0);
    Some(HostDisk {
        capacity_gib: gib(h.disk_capacity_gib?),
        root_capacity_gib: h.root_disk_capacity_gib.map(gib),
    })
}

/// A VM's root disk, GiB.
fn root_disk_gib(v: &vms::Model) -> Result<u64, ApiError> {
    Ok(u64::from(stored_spec(v)?.disk_gib))
}

/// The root disks on `host` among `rows` (VMs placed there, or whose disk
/// is there): `(those of VMs holding a share of the host, the others)`.
/// A VM placed there holds its disk there in every state (suspended, or
/// being deleted); one shelved there, or moving away, holds it there too.
fn root_disks_on(rows: &[vms::Model], host: Uuid) -> Result<(u64, u64), ApiError> {
    let (mut holding, mut other) = (0u64, 0u64);
    for v in rows {
        let placed_here = v.host_id == Some(host);
        if !placed_here && v.disk_host_id != Some(host) {
            continue;
        }
        let gib = root_disk_gib(v)?;
        if placed_here && holds(stored_state(v)?) && v.placement.is_some() {
            holding += gib;
        } else {
            other += gib;
        }
    }
    Ok((holding, other))
}

/// A volume's id, size and hosts: where it is, where it is moving, where
/// its old copy still is.
type VolumeAt = (Uuid, i64, Uuid, Option<Uuid>, Option<Uuid>);

/// Provisioned GiB of volumes and snapshots per host: volumes there,
/// volumes moving there (a move holds room at both ends), old copies not
/// removed yet, and every snapshot at its volume's size. Of one host, or
/// of all.
async fn volume_gib(
    db: &impl ConnectionTrait,
    host: Option<Uuid>,
) -> Result<HashMap<Uuid, u64>, ApiError> {
    use sea_orm::Condition;
    let mut q = volumes::Entity::find().select_only().columns([
        volumes::Column::Id,
        volumes::Column::SizeGib,
        volumes::Column::HostId,
        volumes::Column::MoveToHostId,
        volumes::Column::MovedFromHostId,
    ]);
    if let Some(h) = host {
        q = q.filter(
            Condition::any()
                .add(volumes::Column::HostId.eq(h))
                .add(volumes::Column::MoveToHostId.eq(h))
                .add(volumes::Column::MovedFromHostId.eq(h)),
        );
    }
    let rows: Vec<VolumeAt> = q.into_tuple().all(db).await?;
    let mut out: HashMap<Uuid, u64> = HashMap::new();
    let mut home: HashMap<Uuid, Uuid> = HashMap::with_capacity(rows.len());
    for (id, size, on, to, from) in &rows {
        let gib = u64::try_from(*size).unwrap_or(0);
        let mut at = vec![*on];
        at.extend(to.iter().chain(from.iter()).filter(|h| *h != on));
        for h in at {
            *out.entry(h).or_default() += gib;
        }
        home.insert(*id, *on);
    }
    let mut snaps = volume_snapshots::Entity::find().select_only().columns([
        volume_snapshots::Column::VolumeId,
        volume_snapshots::Column::SizeGib,
    ]);
    if host.is_some() {
        snaps = snaps.filter(volume_snapshots::Column::VolumeId.is_in(home.keys().copied()));
    }
    let snaps: Vec<(Uuid, i64)> = snaps.into_tuple().all(db).await?;
    for (volume, size) in snaps {
        if let Some(h) = home.get(&volume) {
            *out.entry(*h).or_default() += u64::try_from(size).unwrap_or(0);
        }
    }
    if let Some(h) = host {
        out.retain(|k, _| *k == h);
    }
    Ok(out)
}

/// The VMs with a root disk on `host`: placed there, shelved there or
/// moving away from it.
async fn vms_with_disks_on(
    db: &impl ConnectionTrait,
    host: Uuid,
) -> Result<Vec<vms::Model>, ApiError> {
    use sea_orm::Condition;
    Ok(vms::Entity::find()
        .filter(
            Condition::any()
                .add(vms::Column::HostId.eq(host))
                .add(vms::Column::DiskHostId.eq(host)),
        )
        .all(db)
        .await?)
}

/// What is provisioned on one host's storage, read in the caller's
/// transaction.
pub async fn disk_use(db: &impl ConnectionTrait, host: Uuid) -> Result<DiskUse, ApiError> {
    let volumes_gib = volume_gib(db, Some(host))
        .await?
        .get(&host)
        .copied()
        .unwrap_or(0);
    let (holding, other) = root_disks_on(&vms_with_disks_on(db, host).await?, host)?;
    Ok(DiskUse {
        volumes_gib,
        root_gib: holding + other,
    })
}

/// The ready hosts, those with the fewest volumes first (ties by name):
/// where a volume goes when nothing ties it to a host.
pub async fn ready_hosts_by_volumes(
    db: &impl ConnectionTrait,
) -> Result<Vec<hosts::Model>, ApiError> {
    use sea_orm::QueryOrder;
    let mut hosts = hosts::Entity::find()
        .filter(hosts::Column::State.eq(HostState::Ready.as_str()))
        .order_by_asc(hosts::Column::Name)
        .all(db)
        .await?;
    let mut count: HashMap<Uuid, usize> = HashMap::new();
    for v in volumes::Entity::find()
        .select_only()
        .column(volumes::Column::HostId)
        .into_tuple::<Uuid>()
        .all(db)
        .await?
    {
        *count.entry(v).or_default() += 1;
    }
    // Stable: names stay in order among equals.
    hosts.sort_by_key(|h| count.get(&h.id).copied().unwrap_or(0));
    Ok(hosts)
}

/// What is provisioned on every host's storage (hosts with nothing on
/// them are absent).
pub async fn disk_use_all(db: &impl ConnectionTrait) -> Result<HashMap<Uuid, DiskUse>, ApiError> {
    let mut out: HashMap<Uuid, DiskUse> = HashMap::new();
    for (h, gib) in volume_gib(db, None).await? {
        out.entry(h).or_default().volumes_gib = gib;
    }
    let rows = vms::Entity::find()
        .filter(
            sea_orm::Condition::any()
                .add(vms::Column::HostId.is_not_null())
                .add(vms::Column::DiskHostId.is_not_null()),
        )
        .all(db)
        .await?;
    for v in &rows {
        let gib = root_disk_gib(v)?;
        let mut at: Vec<Uuid> = v.host_id.into_iter().collect();
        at.extend(v.disk_host_id.filter(|d| Some(*d) != v.host_id));
        for h in at {
            out.entry(h).or_default().root_gib += gib;
        }
    }
    Ok(out)
}

/// GiB free for `pool` on `h` with `used` provisioned; `None` when its
/// agent did not say what its storage holds.
pub fn disk_free(h: &hosts::Model, used: &DiskUse, pool: Pool, overcommit: f64) -> Option<i64> {
    host_disk(h).map(|d| d.free_gib(used, pool, overcommit))
}

/// What the index is told of a host's disk: room for root disks before
/// the disks of the VMs it holds (those are the holds' own).
fn index_disk_free(
    h: &hosts::Model,
    volumes_gib: u64,
    rows: &[vms::Model],
    overcommit: f64,
) -> Result<Option<i64>, ApiError> {
    let (_, other) = root_disks_on(rows, h.id)?;
    let used = DiskUse {
        volumes_gib,
        root_gib: other,
    };
    Ok(disk_free(h, &used, Pool::RootDisks, overcommit))
}

/// What a host's profile is derived from: its topology (by digest, or by
/// the text for rows from before digests) and its rails.
fn profile_key(h: &hosts::Model) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    match &h.topology_digest {
        Some(d) => d.hash(&mut hasher),
        None => h.topology.hash(&mut hasher),
    }
    h.rails.hash(&mut hasher);
    h.virt_type.hash(&mut hasher);
    hasher.finish()
}

impl Capacity {
    fn cached_profile(&self, h: &hosts::Model) -> Option<Derived> {
        let profiles = self.profiles.lock().unwrap_or_else(|e| e.into_inner());
        profiles.get(&profile_key(h)).cloned()
    }

    fn profile(&self, h: &hosts::Model) -> Result<Derived, ApiError> {
        if let Some(p) = self.cached_profile(h) {
            return Ok(p);
        }
        let topo = stored_topology(h)?;
        let profile = self
            .lock()
            .profile(&topo, &stored_rails(h))
            .map_err(|e| ApiError::Internal(format!("host {}: {e}", h.name)))?;
        // Not ready for passthrough: every GPU and NIC stays out of
        // placements, as a quarantined one does; CPU-only VMs still go.
        let unready: Arc<[kumo_topology::Bdf]> = if passthrough_problems(h, &topo).is_empty() {
            Arc::new([])
        } else {
            kumo_topology::readiness::passthrough_devices(&topo).into()
        };
        let d = Derived { profile, unready };
        self.profiles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(profile_key(h), d.clone());
        Ok(d)
    }

    /// A host read anew: `rows` are the VMs placed on it or with their
    /// disk on it, `volumes_gib` what its volumes and snapshots hold.
    fn upsert(
        &self,
        h: &hosts::Model,
        rows: &[vms::Model],
        blocked: &[String],
        volumes_gib: u64,
    ) -> Result<(), ApiError> {
        let Derived { profile, unready } = self.profile(h)?;
        let disk_free_gib = index_disk_free(h, volumes_gib, rows, self.overcommit)?;
        let mut placed: Vec<(&vms::Model, Placement, bool, bool)> = Vec::new();
        for v in rows {
            if v.host_id != Some(h.id) {
                continue; // only its disk is here
            }
            let state = stored_state(v)?;
            if !holds(state) {
                continue;
            }
            if let Some(p) = stored_placement(v)? {
                let spot = stored_spec(v)?.service_level == kumo_api_types::ServiceLevel::Spot;
                let reclaiming = matches!(state, VmState::Preempting | VmState::Preempted);
                placed.push((v, p, spot, reclaiming));
            }
        }
        let inputs: Vec<VmInput> = placed
            .iter()
            .map(|(v, p, spot, reclaiming)| {
                Ok(VmInput {
                    vm: v.id,
                    tenant: v.tenant_id,
                    spot: *spot,
                    borrowed: v.borrowed_at.is_some(),
                    reclaiming: *reclaiming,
                    since: v.created_at.timestamp(),
                    placement: p,
                    disk_gib: root_disk_gib(v)?,
                })
            })
            .collect::<Result<_, ApiError>>()?;
        let taken = self.lock().upsert(
            HostInput {
                id: h.id,
                name: h.name.clone(),
                scalable_unit: h.scalable_unit.clone(),
                state: host_use(h)?,
                revision: h.revision,
                profile,
                networked: h.underlay_ip.is_some(),
                shares: crate::domain::shares::keeps(
                    crate::store::shares::stored_storage(h).as_ref(),
                ),
                blocked: blocked
                    .iter()
                    .filter_map(|b| b.parse().ok())
                    .chain(unready.iter().copied())
                    .collect(),
                disk_free_gib,
            },
            &inputs,
        );
        if !taken {
            // Older than a commit the index has settled: what else it
            // carried (its state, its storage) is read again at the next
            // catch-up, which would otherwise see no mark moved.
            if let Some(marks) = self
                .marks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_mut()
            {
                marks.remove(&h.id);
            }
        }
        Ok(())
    }

    /// Re-reads one host: its row first, so a commit landing in between
    /// shows its VM with the older revision and the next commit against
    /// it fails rather than double-books.
    /// Read without its topology when the profile its digest names is in
    /// hand (a host re-read after each change would otherwise read tens of
    /// KiB each time).
    pub async fn refresh_host(&self, db: &impl ConnectionTrait, id: Uuid) -> Result<(), ApiError> {
        let Some(h) = crate::store::hosts::by_id_without_topology(db, id).await? else {
            self.lock().remove(id);
            return Ok(());
        };
        let h = match self.cached_profile(&h) {
            Some(_) if h.topology_digest.is_some() => h,
            _ => match hosts::Entity::find_by_id(id).one(db).await? {
                Some(whole) => whole,
                None => {
                    self.lock().remove(id);
                    return Ok(());
                }
            },
        };
        let rows = vms_with_disks_on(db, id).await?;
        let blocked = crate::store::device_health::blocked(db, Some(id)).await?;
        let volumes = volume_gib(db, Some(id)).await?;
        self.upsert(
            &h,
            &rows,
            blocked.get(&id).map(Vec::as_slice).unwrap_or(&[]),
            volumes.get(&id).copied().unwrap_or(0),
        )
    }

    /// Re-reads every host, a page at a time: on SQLite the server has one
    /// connection, and one read of 10,000 hosts held it long enough to
    /// keep heartbeats waiting (p99 211 ms; 27 ms with pages of 100, as
    /// heartbeats go between pages).
    pub async fn refresh_all(&self, db: &impl ConnectionTrait) -> Result<(), ApiError> {
        self.refresh_all_paged(db, REFRESH_PAGE).await
    }

    /// [`Capacity::refresh_all`], `page` hosts per query.
    pub async fn refresh_all_paged(
        &self,
        db: &impl ConnectionTrait,
        page: u64,
    ) -> Result<(), ApiError> {
        use sea_orm::sea_query::Expr;
        use sea_orm::{Iterable, QueryOrder, QuerySelect};
        // Every host without its topology (the digest says whether the
        // profile in hand is still its); a host whose profile is not in
        // hand is read whole. Ids are UUIDv7, so a host registered during
        // the walk sorts after the pages already read and is still seen.
        let mut hosts = Vec::new();
        loop {
            let mut query = hosts::Entity::find()
                .select_only()
                .columns(hosts::Column::iter().filter(|c| !matches!(c, hosts::Column::Topology)))
                .column_as(Expr::value(""), "topology")
                .order_by_asc(hosts::Column::Id)
                .limit(page);
            if let Some(last) = hosts.last().map(|h: &hosts::Model| h.id) {
                query = query.filter(hosts::Column::Id.gt(last));
            }
            let rows = query.into_model::<hosts::Model>().all(db).await?;
            let full = rows.len() as u64 == page;
            hosts.extend(rows);
            if !full {
                break;
            }
        }
        // Each VM under the host it is placed on and, when its disk is
        // elsewhere (shelved, moving), under that host too.
        let mut by_host: HashMap<Uuid, Vec<vms::Model>> = HashMap::new();
        for v in vms::Entity::find()
            .filter(
                sea_orm::Condition::any()
                    .add(vms::Column::HostId.is_not_null())
                    .add(vms::Column::DiskHostId.is_not_null()),
            )
            .all(db)
            .await?
        {
            if let Some(d) = v.disk_host_id.filter(|d| Some(*d) != v.host_id) {
                by_host.entry(d).or_default().push(v.clone());
            }
            if let Some(h) = v.host_id {
                by_host.entry(h).or_default().push(v);
            }
        }
        let volumes = volume_gib(db, None).await?;
        let blocked = crate::store::device_health::blocked(db, None).await?;
        let mut known = std::collections::HashSet::with_capacity(hosts.len());
        for h in hosts {
            // Each upsert caches its profile, so of many hosts of one
            // design only the first is read whole.
            let h = match self.cached_profile(&h) {
                Some(_) if h.topology_digest.is_some() => h,
                _ => match hosts::Entity::find_by_id(h.id).one(db).await? {
                    Some(whole) => whole,
                    None => continue, // removed meanwhile
                },
            };
            known.insert(h.id);
            self.upsert(
                &h,
                by_host.get(&h.id).map(Vec::as_slice).unwrap_or(&[]),
                blocked.get(&h.id).map(Vec::as_slice).unwrap_or(&[]),
                volumes.get(&h.id).copied().unwrap_or(0),
            )?;
        }
        {
            let mut index = self.lock();
            let gone: Vec<Uuid> = index
                .hosts
                .iter()
                .map(|h| h.id)
                .filter(|id| !known.contains(id))
                .collect();
            for id in gone {
                index.remove(id);
            }
        }
        self.load_spares(db).await?;
        // The hosts reservations hold, from the first reading on: a server
        // just started must not place on them before the reaper's first
        // pass.
        let held = crate::store::reservations::held_hosts(db).await?;
        let mut index = self.lock();
        if *index.reserved() != held {
            index.set_reserved(held);
        }
        Ok(())
    }
}
