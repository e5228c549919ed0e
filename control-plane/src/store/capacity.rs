//! The server's copy of the scheduler's capacity index, kept in step with
//! the database: a host is re-read after every change this server makes
//! to it and after every commit it loses, and the whole fleet every few
//! seconds (changes made by other replicas, devices freed by agents). The
//! index may lag; it is never trusted over the database, whose commit
//! checks the host's revision and the allocation rows.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kumo_api_types::{HostState, VmState};
use kumo_scheduler::index::VmInput;
use kumo_scheduler::{HostInput, HostProfile, HostUse, Index};
use kumo_topology::guest_layout::Placement;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};
use uuid::Uuid;

use crate::entity::{hosts, vms};
use crate::error::ApiError;
use crate::store::hosts::{host_state, passthrough_problems, stored_topology};
use crate::store::vms::{stored_placement, stored_spec, stored_state};

/// How often the whole index is re-read.
pub const REFRESH: Duration = Duration::from_secs(5);
/// Hosts read per query by [`Capacity::refresh_all`].
const REFRESH_PAGE: u64 = 100;

#[derive(Default)]
pub struct Capacity {
    index: Mutex<Index>,
    /// Profiles by topology and rails, so an unchanged host is not
    /// re-derived on every refresh; with them the devices a host that is
    /// not ready for passthrough keeps out of placements.
    profiles: Mutex<HashMap<u64, Derived>>,
}

#[derive(Clone)]
struct Derived {
    profile: Arc<HostProfile>,
    unready: Arc<[kumo_topology::Bdf]>,
}

pub fn host_use(h: &hosts::Model) -> Result<HostUse, ApiError> {
    Ok(match host_state(h)? {
        HostState::Ready => HostUse::Ready,
        HostState::Draining => HostUse::Draining,
        HostState::Unreachable | HostState::Retired => HostUse::Unavailable,
    })
}

/// Whether a VM in this state holds its share of its host.
pub fn holds(state: VmState) -> bool {
    !matches!(
        state,
        VmState::Pending | VmState::Suspended | VmState::Deleted | VmState::Shelved
    )
}

pub fn stored_rails(h: &hosts::Model) -> BTreeMap<String, u32> {
    h.rails
        .as_deref()
        .and_then(|r| serde_json::from_str(r).ok())
        .unwrap_or_default()
}

impl Capacity {
    pub fn lock(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }
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

    fn upsert(
        &self,
        h: &hosts::Model,
        rows: &[vms::Model],
        blocked: &[String],
    ) -> Result<(), ApiError> {
        let Derived { profile, unready } = self.profile(h)?;
        let mut placed: Vec<(&vms::Model, Placement, bool, bool)> = Vec::new();
        for v in rows {
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
            .map(|(v, p, spot, reclaiming)| VmInput {
                vm: v.id,
                tenant: v.tenant_id,
                spot: *spot,
                reclaiming: *reclaiming,
                since: v.created_at.timestamp(),
                placement: p,
            })
            .collect();
        self.lock().upsert(
            HostInput {
                id: h.id,
                name: h.name.clone(),
                scalable_unit: h.scalable_unit.clone(),
                state: host_use(h)?,
                revision: h.revision,
                profile,
                networked: h.underlay_ip.is_some(),
                blocked: blocked
                    .iter()
                    .filter_map(|b| b.parse().ok())
                    .chain(unready.iter().copied())
                    .collect(),
            },
            &inputs,
        );
        Ok(())
    }

    /// Re-reads one host: its row first, so a commit landing in between
    /// shows its VM with the older revision and the next commit against
    /// it fails rather than double-books.
    pub async fn refresh_host(&self, db: &impl ConnectionTrait, id: Uuid) -> Result<(), ApiError> {
        let Some(h) = hosts::Entity::find_by_id(id).one(db).await? else {
            self.lock().remove(id);
            return Ok(());
        };
        let rows = vms::Entity::find()
            .filter(vms::Column::HostId.eq(id))
            .all(db)
            .await?;
        let blocked = crate::store::device_health::blocked(db, Some(id)).await?;
        self.upsert(
            &h,
            &rows,
            blocked.get(&id).map(Vec::as_slice).unwrap_or(&[]),
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
        let mut by_host: HashMap<Uuid, Vec<vms::Model>> = HashMap::new();
        for v in vms::Entity::find()
            .filter(vms::Column::HostId.is_not_null())
            .all(db)
            .await?
        {
            if let Some(h) = v.host_id {
                by_host.entry(h).or_default().push(v);
            }
        }
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
            )?;
        }
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
        Ok(())
    }
}
