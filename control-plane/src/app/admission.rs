//! Admitting VMs and clusters: placement on the capacity index, the quota,
//! and the one transaction that makes it true: VM rows, allocation rows
//! (a device has one holder), and each host's revision checked and bumped
//! (the capacity the placement saw is still the host's). A lost race
//! re-reads the host and tries again. A guaranteed request that does not
//! fit reclaims spot VMs and waits as `pending`; the reaper
//! ([`crate::app::jobs::reclaimer`]) places it once they are gone.

use chrono::{DateTime, Utc};
use kumo_api_types::{HostState, Power, ServiceLevel, VmSpec, VmState};
use kumo_scheduler::place::Choice;
use kumo_scheduler::reclaim::{self, Lenders, Plan};
use kumo_scheduler::{place_cluster, ClusterRequest, Index, Request, Strategy};
use kumo_topology::guest_layout::Placement;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseTransaction, EntityTrait, QueryFilter, Set,
    TransactionTrait,
};
use uuid::Uuid;

use crate::app::audit;
use crate::context::Actor;
use crate::context::AppState;
use crate::domain::states::{ClusterState, StoredText};
use crate::entity::{allocations, clusters, hosts, tenants, vms};
use crate::error::{is_unique_violation, ApiError};
use crate::store::allocations as allocation_rows;
use crate::store::capacity::holds;
use crate::store::vms::{event, stored_state};

/// Rounds of place → commit before giving up under heavy contention.
const ROUNDS: usize = 4;

/// A VM to admit (new) or to place (pending, already a row).
#[derive(Debug, Clone)]
pub struct Member {
    pub id: Uuid,
    pub name: String,
    pub spec: VmSpec,
    /// NICs to attach when the VM row is created.
    pub nics: Vec<crate::store::segments::PlannedNic>,
    /// It has NICs on segments (new ones in `nics`, or attached already):
    /// only hosts with an underlay address take it.
    pub networked: bool,
    /// On a RoCE segment: its GPUs' NICs are passed through as VFs.
    pub roce: bool,
    /// Only this host takes it (where its volumes are).
    pub on_host: Option<Uuid>,
    /// Hosts it must not go to (those it was replaced off).
    pub avoid: Vec<Uuid>,
    /// Volumes to attach when the VM row is created.
    pub volumes: Vec<Uuid>,
    /// Project shares to mount when the VM row is created.
    pub shares: Vec<crate::app::shares::PlannedMount>,
    /// It mounts shares (new ones in `shares`, or mounted already): only
    /// hosts with the shared filesystem take it.
    pub shared: bool,
}

/// What admission did.
pub enum Admitted {
    /// Placed on hosts now.
    Placed,
    /// Waiting for these spot VMs to be reclaimed.
    Pending { reclaiming: usize },
    /// Waiting in the fair queue ([`crate::app::queue`]).
    Queued,
}

/// A reserved placement, applied to the index until committed or undone.
struct Reserved {
    host: Uuid,
    revision: i64,
    host_name: String,
    placement: Placement,
    model: Option<String>,
}

pub fn request(index: &Index, member: &Member) -> Result<Request, ApiError> {
    let spec = &member.spec;
    let model = match (&spec.gpu_model, spec.gpus) {
        (Some(m), g) if g > 0 => Some(
            index
                .model_id(m)
                .ok_or_else(|| ApiError::InsufficientCapacity(format!("no host has {m} GPUs")))?,
        ),
        _ => None,
    };
    Ok(Request {
        gpus: spec.gpus,
        model,
        vcpus: spec.vcpus,
        memory_mib: u64::from(spec.memory_gib) * 1024,
        unit: None,
        rails: None,
        networked: member.networked,
        shares: member.shared,
        roce: member.roce,
        host: member.on_host,
        avoid: member.avoid.clone(),
        disk_gib: u64::from(spec.disk_gib),
        spot: spec.service_level == ServiceLevel::Spot,
        cluster: None,
        reservation: spec.reservation,
    })
}

/// Where a placed sibling is (a cluster member replaced beside the
/// others): the new members go to its scalable unit and rails when they
/// have room, elsewhere when not.
#[derive(Debug, Clone)]
pub struct Near {
    pub host: Uuid,
    pub gpus: Vec<kumo_topology::Bdf>,
}

impl Near {
    /// The sibling's scalable unit and its GPUs' rails, as the index
    /// knows them; `None` when the index does not know its host.
    pub fn unit_and_rails(&self, index: &Index) -> Option<(Option<u32>, Vec<Option<u32>>)> {
        let h = &index.hosts[index.position(self.host)?];
        let rails = self
            .gpus
            .iter()
            .map(|g| {
                let i = h.profile.gpu_index(g)?;
                let nic = h.profile.gpus[i].nic?;
                h.profile.nics[nic].rail
            })
            .collect();
        Some((h.scalable_unit, rails))
    }
}

/// The members placed (all or none) and applied to the index.
fn choose(index: &mut Index, req: &Request, ids: &[Uuid], one_unit: bool) -> Option<Vec<Choice>> {
    if let [id] = ids {
        let mut c = kumo_scheduler::place::place(index, req, Strategy::BestFit)?;
        c.hold.vm = *id;
        index.apply(c.host, c.hold.clone());
        Some(vec![c])
    } else {
        let cluster = ClusterRequest {
            size: ids.len() as u32,
            member: req.clone(),
            one_unit,
        };
        place_cluster(index, &cluster, ids, Strategy::BestFit)
    }
}

/// Where the members may go when their sibling's unit has no room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// Anywhere.
    Anywhere,
    /// Only beside the sibling when the cluster keeps spares there (they
    /// are for this; spot VMs on them are reclaimed first), anywhere
    /// otherwise.
    SparesFirst,
}

/// Members placed beside a sibling of a cluster that keeps spares.
fn beside_spares(index: &Index, job: &Admission<'_>) -> bool {
    job.near.is_some()
        && job
            .cluster()
            .is_some_and(|c| index.spares.iter().any(|s| s.cluster == c))
}

/// The members' placements, and where a new cluster's spares are kept.
struct Reservation {
    members: Vec<Reserved>,
    spares: Option<SparesKept>,
}

/// The scalable unit and GPU model a new cluster's spares were kept in.
#[derive(Debug, Clone)]
struct SparesKept {
    unit: Option<String>,
    model: Option<String>,
    /// The hosts the spares were found on, at the revisions seen: claimed
    /// with the members' hosts, so that a placement another replica makes
    /// there meanwhile loses its commit (or this one does).
    hosts: Vec<(Uuid, i64)>,
}

/// The request for the admission's members (its cluster's own spares open
/// to them) and, beside a placed sibling, the request for its unit and
/// rails.
fn requests(
    index: &Index,
    job: &Admission<'_>,
    first: &Member,
) -> Result<(Request, Option<Request>), ApiError> {
    let mut req = request(index, first)?;
    req.cluster = job.cluster();
    let hinted = job
        .near
        .and_then(|n| n.unit_and_rails(index))
        .map(|(unit, rails)| Request {
            unit,
            rails: (req.gpus > 0 && rails.len() == req.gpus as usize).then_some(rails),
            ..req.clone()
        });
    Ok((req, hinted))
}

/// A new request does not take (or reclaim) the room the fair queue's
/// waiting requests are planned on: that would delay them. The queue
/// admits its own with the hosts to keep off named.
fn keep_off_queue(
    st: &AppState,
    job: &Admission<'_>,
    req: &mut Request,
    hinted: Option<&mut Request>,
) {
    if matches!(job.rows, Rows::New { .. }) {
        let held = st.capacity.held_for_queue();
        for r in std::iter::once(req).chain(hinted) {
            r.avoid.extend(held.iter().copied());
        }
    }
}

/// Places every member (all or nothing) and applies them to the index,
/// with a new cluster's spares kept beside them (one scalable unit for
/// all, or no room). `disk_gib`: the disk the (one) member takes on its
/// host where that is not its root disk (see [`disk_needed`]); the
/// sibling's unit and rails are tried first.
fn reserve(
    st: &AppState,
    job: &Admission<'_>,
    disk_gib: Option<u64>,
    reach: Reach,
) -> Result<Option<Reservation>, ApiError> {
    let members = job.members;
    let Some(first) = members.first() else {
        return Ok(Some(Reservation {
            members: Vec::new(),
            spares: None,
        }));
    };
    let mut index = st.capacity.lock();
    let (mut req, mut hinted) = requests(&index, job, first)?;
    if let Some(gib) = disk_gib {
        req.disk_gib = gib;
    }
    keep_off_queue(st, job, &mut req, hinted.as_mut());
    let spot = first.spec.service_level == ServiceLevel::Spot;
    let mut ids: Vec<Uuid> = members.iter().map(|m| m.id).collect();
    let spares = job.new_cluster().map(|c| c.spares).unwrap_or(0);
    // Spares are placed as members would be, then given back to the
    // index as kept room.
    ids.extend((0..spares).map(|_| Uuid::now_v7()));
    let one_unit = job.one_unit;
    let choices = match hinted.and_then(|h| choose(&mut index, &h, &ids, one_unit)) {
        Some(c) => c,
        // Replacements of a cluster that keeps to its unit stay there.
        None if one_unit && job.near.is_some() => return Ok(None),
        None if reach == Reach::SparesFirst && beside_spares(&index, job) => return Ok(None),
        None => match choose(&mut index, &req, &ids, one_unit) {
            Some(c) => c,
            None => return Ok(None),
        },
    };
    let (choices, spare_choices) = choices.split_at(members.len());
    let kept = match (job.new_cluster(), spare_choices.first()) {
        (Some(c), Some(first_spare)) => {
            let unit = index.hosts[first_spare.host].scalable_unit;
            let one_unit = choices
                .iter()
                .chain(spare_choices)
                .all(|x| index.hosts[x.host].scalable_unit == unit);
            for x in choices.iter().chain(spare_choices) {
                index.release(x.host, x.hold.vm);
            }
            if !one_unit {
                return Ok(None);
            }
            let model = kumo_scheduler::profile::bits(first_spare.hold.gpus)
                .next()
                .map(|i| index.hosts[first_spare.host].profile.gpus[i].model);
            let shape = Request {
                model,
                ..req.clone()
            };
            index
                .spares
                .push(kumo_scheduler::Spare::of(c.id, unit, &shape, spares));
            // The members again, now beside their spares.
            for x in choices {
                index.apply(x.host, x.hold.clone());
            }
            let mut hosts: Vec<(Uuid, i64)> = spare_choices
                .iter()
                .map(|x| (index.hosts[x.host].id, index.hosts[x.host].revision))
                .collect();
            hosts.sort();
            hosts.dedup();
            Some(SparesKept {
                unit: unit.and_then(|u| index.unit_name(u)).map(str::to_owned),
                model: model.and_then(|m| index.model_name(m)).map(str::to_owned),
                hosts,
            })
        }
        _ => None,
    };
    let now = st.config.clock.now().timestamp();
    let mut out = Vec::with_capacity(choices.len());
    for c in choices {
        let h = &mut index.hosts[c.host];
        if let Some(x) = h.holds.iter_mut().find(|x| x.vm == c.hold.vm) {
            x.tenant = job.tenant.id;
            x.spot = spot;
            x.since = now;
        }
        let model = kumo_scheduler::profile::bits(c.hold.gpus)
            .next()
            .map(|i| h.profile.gpus[i].model);
        out.push(Reserved {
            host: h.id,
            revision: h.revision,
            host_name: h.name.clone(),
            placement: h.placement(&c.hold),
            model: model.and_then(|m| index.model_name(m)).map(str::to_owned),
        });
        index.in_flight(c.host, c.hold.vm);
    }
    Ok(Some(Reservation {
        members: out,
        spares: kept,
    }))
}

fn unreserve(st: &AppState, job: &Admission<'_>, reserved: &[Reserved]) {
    let mut index = st.capacity.lock();
    for (m, r) in job.members.iter().zip(reserved) {
        if let Some(h) = index.position(r.host) {
            index.release(h, m.id);
        }
    }
    if let Some(c) = job.new_cluster() {
        index.spares.retain(|s| s.cluster != c.id);
    }
}

enum CommitError {
    /// A device, a name or a host's revision was taken by someone else.
    Lost,
    Api(ApiError),
}

impl From<sea_orm::DbErr> for CommitError {
    fn from(e: sea_orm::DbErr) -> Self {
        if is_unique_violation(&e) {
            tracing::debug!(error = %e, "placement lost a race");
            CommitError::Lost
        } else {
            CommitError::Api(e.into())
        }
    }
}

impl From<ApiError> for CommitError {
    fn from(e: ApiError) -> Self {
        CommitError::Api(e)
    }
}

/// Holds the tenant's row for the rest of the transaction (PostgreSQL
/// `FOR UPDATE`; SQLite's single writer serialises anyway) and checks
/// that the tenant's VMs plus `adding` stay within its quota.
pub async fn check_quota(
    txn: &DatabaseTransaction,
    tenant: &tenants::Model,
    adding: &[&VmSpec],
    spares: Option<(&VmSpec, u32)>,
) -> Result<(), ApiError> {
    crate::store::tenancy::lock_for_quota(txn, tenant.id).await?;
    let quota = crate::store::tenancy::load(txn, tenant.id).await?;
    let mut usage = crate::store::vms::usage(txn, tenant.id).await?;
    for s in adding {
        usage.add(s);
    }
    // A new cluster's spares keep its members' compute.
    if let Some((spec, n)) = spares {
        for _ in 0..n {
            usage.keep(spec);
        }
    }
    usage.check(&quota, &tenant.name)
}

/// The host's revision moves from what the placement saw, or the commit
/// is lost. Also refuses hosts that stopped taking VMs meanwhile.
pub async fn claim_host(
    txn: &DatabaseTransaction,
    host: Uuid,
    seen: i64,
) -> Result<bool, sea_orm::DbErr> {
    let r = hosts::Entity::update_many()
        .col_expr(
            hosts::Column::Revision,
            Expr::col(hosts::Column::Revision).add(1),
        )
        .filter(hosts::Column::Id.eq(host))
        .filter(hosts::Column::Revision.eq(seen))
        .filter(hosts::Column::State.eq(HostState::Ready.to_text()))
        .exec(txn)
        .await?;
    Ok(r.rows_affected == 1)
}

pub struct NewCluster<'a> {
    pub id: Uuid,
    pub name: &'a str,
    pub auto_repair: bool,
    pub repair_delay_seconds: u32,
    pub spec: &'a VmSpec,
    /// Members' worth of spare room kept beside them.
    pub spares: u32,
    pub single_su: kumo_api_types::SingleSu,
}

/// Where the members' rows come from.
#[derive(Clone, Copy)]
pub enum Rows<'a> {
    /// A caller's request: the VMs (and their cluster) are created by the
    /// admission, counted against the quota and audited as the actor's.
    New {
        actor: &'a Actor,
        cluster: Option<&'a NewCluster<'a>>,
    },
    /// VMs waiting as `pending` rows (of this cluster), placed now.
    Pending { cluster: Option<Uuid> },
}

/// One admission: whose, which VMs, and where their rows come from.
#[derive(Clone, Copy)]
pub struct Admission<'a> {
    pub tenant: &'a tenants::Model,
    pub members: &'a [Member],
    pub rows: Rows<'a>,
    /// A placed sibling to go near (a repaired cluster's members).
    pub near: Option<&'a Near>,
    /// The cluster's members all in one scalable unit (new members and
    /// replacements alike), or nowhere.
    pub one_unit: bool,
    /// A new request that waits in the fair queue rather than be refused.
    pub queue: bool,
}

impl Admission<'_> {
    /// The cluster the members are of.
    fn cluster(&self) -> Option<Uuid> {
        match self.rows {
            Rows::New { cluster, .. } => cluster.map(|c| c.id),
            Rows::Pending { cluster } => cluster,
        }
    }

    fn new_cluster(&self) -> Option<&NewCluster<'_>> {
        match self.rows {
            Rows::New { cluster, .. } => cluster,
            Rows::Pending { .. } => None,
        }
    }
}

/// What a commit makes true: the members placed as reserved, or waiting
/// while the plan's spot VMs are reclaimed.
#[derive(Clone, Copy)]
enum Outcome<'a> {
    Placed(&'a [Reserved], Option<&'a SparesKept>),
    Waiting(&'a Plan),
    /// In the fair queue: nothing held, nothing reclaimed, nothing charged.
    Queued,
}

impl Outcome<'_> {
    fn reserved(&self, i: usize) -> Option<&Reserved> {
        match self {
            Outcome::Placed(r, _) => r.get(i),
            Outcome::Waiting(_) | Outcome::Queued => None,
        }
    }

    /// The state of a member the outcome does not place.
    fn waiting(&self) -> VmState {
        match self {
            Outcome::Queued => VmState::Queued,
            _ => VmState::Pending,
        }
    }
}

fn internal(e: serde_json::Error) -> ApiError {
    ApiError::Internal(e.to_string())
}

/// The members' specs as stored: the GPU model is the one they got.
fn placed_specs(members: &[Member], outcome: Outcome<'_>) -> Vec<VmSpec> {
    members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let mut s = m.spec.clone();
            if let Some(model) = outcome.reserved(i).and_then(|r| r.model.clone()) {
                s.gpu_model = Some(model);
            }
            s
        })
        .collect()
}

/// The cluster row of a new cluster, `placed` or `pending`.
async fn insert_cluster(
    txn: &DatabaseTransaction,
    actor: &Actor,
    tenant: &tenants::Model,
    c: &NewCluster<'_>,
    size: usize,
    state: ClusterState,
    spares: Option<&SparesKept>,
) -> Result<(), CommitError> {
    let row = clusters::ActiveModel {
        id: Set(c.id),
        tenant_id: Set(tenant.id),
        name: Set(c.name.to_owned()),
        size: Set(size as i32),
        spec: Set(serde_json::to_string(c.spec).map_err(internal)?),
        state: Set(state.to_text().into()),
        created_at: Set(actor.at),
        health: Set(kumo_api_types::ClusterHealth::Healthy.as_str().into()),
        problems: Set("[]".into()),
        health_since: Set(Some(actor.at)),
        auto_repair: Set(c.auto_repair),
        repair_delay_seconds: Set(i32::try_from(c.repair_delay_seconds).unwrap_or(i32::MAX)),
        repairing: Set(false),
        spares: Set(spares
            .map(|_| i32::try_from(c.spares).unwrap_or(0))
            .unwrap_or(0)),
        spare_unit: Set(spares.and_then(|s| s.unit.clone())),
        spare_model: Set(spares.and_then(|s| s.model.clone())),
        single_su: Set(c.single_su.as_str().to_owned()),
    }
    .insert(txn)
    .await?;
    crate::app::metering::spares_held(txn, tenant, &row, c.spec.gpus, actor.at).await?;
    audit::record(txn, actor, "cluster.create", Some(tenant), c.name).await?;
    Ok(())
}

/// How a new VM's row starts: on its reservation, or waiting (`pending`
/// or `queued`).
enum Start<'a> {
    Placed(&'a Reserved),
    Waiting(VmState),
}

/// A new VM's row with its NICs, its first charge and its `created`
/// event.
async fn insert_vm(
    txn: &DatabaseTransaction,
    actor: &Actor,
    tenant: &tenants::Model,
    m: &Member,
    spec: &VmSpec,
    start: Start<'_>,
    cluster: Option<Uuid>,
) -> Result<vms::Model, CommitError> {
    let now = actor.at;
    let (state, r) = match start {
        Start::Placed(r) => (VmState::Scheduled, Some(r)),
        Start::Waiting(state) => (state, None),
    };
    let vm = vms::ActiveModel {
        id: Set(m.id),
        tenant_id: Set(tenant.id),
        name: Set(m.name.clone()),
        state: Set(state.as_str().to_owned()),
        reason: Set(None),
        host_id: Set(r.map(|r| r.host)),
        spec: Set(serde_json::to_string(spec).map_err(internal)?),
        placement: Set(placement_json(r)?),
        desired_power: Set(Power::Running.to_text().into()),
        power_generation: Set(0),
        guest_condition: Set(None),
        preempt_deadline: Set(None),
        cluster_id: Set(cluster),
        disk_host_id: Set(None),
        unshelve_anywhere: Set(false),
        disk_move_token_sha256: Set(None),
        evacuating: Set(None),
        borrowed_at: Set(None),
        reservation_id: Set(spec.reservation),
        created_at: Set(now),
        updated_at: Set(now),
    }
    .insert(txn)
    .await?;
    // Queued requests are free: charges open when it leaves the queue.
    if state != VmState::Queued {
        crate::app::metering::created(txn, &vm, now).await?;
    }
    crate::store::segments::attach(txn, vm.id, &m.nics, now).await??;
    if !crate::store::volumes::attach_new(txn, vm.id, &m.volumes).await? {
        return Err(CommitError::Api(ApiError::Conflict(
            "a volume of the request was attached or changed meanwhile".into(),
        )));
    }
    if !crate::store::shares::mount_new(txn, vm.id, &m.shares, now).await? {
        return Err(CommitError::Api(ApiError::Conflict(
            "a share of the request is being deleted".into(),
        )));
    }
    let what = format!(
        "{} GPU(s), {} vCPUs, {} GiB",
        spec.gpus, spec.vcpus, spec.memory_gib
    );
    event(txn, &vm, now, "created", what).await?;
    audit::record(txn, actor, "vm.create", Some(tenant), &m.name).await?;
    Ok(vm)
}

fn placement_json(r: Option<&Reserved>) -> Result<Option<String>, ApiError> {
    r.map(|r| serde_json::to_string(&r.placement))
        .transpose()
        .map_err(internal)
}

/// A pending (or queued) VM's row, moved to its placement; lost when
/// another replica placed or deleted it meanwhile.
async fn place_pending(
    txn: &DatabaseTransaction,
    m: &Member,
    spec: &VmSpec,
    r: Option<&Reserved>,
    now: DateTime<Utc>,
) -> Result<vms::Model, CommitError> {
    let was = vms::Entity::find_by_id(m.id)
        .one(txn)
        .await?
        .ok_or(CommitError::Lost)?;
    let from = stored_state(&was)?;
    if !matches!(from, VmState::Pending | VmState::Queued) {
        return Err(CommitError::Lost);
    }
    let state = if r.is_some() {
        VmState::Scheduled
    } else {
        VmState::Pending
    };
    let mut update = vms::Entity::update_many();
    if r.is_some() {
        // Placed: an `--anywhere` unshelve has its host.
        update = update.col_expr(vms::Column::UnshelveAnywhere, Expr::value(false));
    }
    let res = update
        .col_expr(vms::Column::State, Expr::value(state.as_str()))
        .col_expr(vms::Column::HostId, Expr::value(r.map(|r| r.host)))
        .col_expr(vms::Column::Placement, Expr::value(placement_json(r)?))
        .col_expr(
            vms::Column::Spec,
            Expr::value(serde_json::to_string(spec).map_err(internal)?),
        )
        .col_expr(vms::Column::UpdatedAt, Expr::value(now))
        .filter(vms::Column::Id.eq(m.id))
        .filter(vms::Column::State.eq(from.as_str()))
        .exec(txn)
        .await?;
    if res.rows_affected != 1 {
        return Err(CommitError::Lost);
    }
    let vm = vms::Entity::find_by_id(m.id)
        .one(txn)
        .await?
        .ok_or(CommitError::Lost)?;
    if from == VmState::Queued {
        // Out of the queue: its charges open now, as a new VM's do.
        crate::store::queue::remove(txn, &[vm.id]).await?;
        crate::app::metering::created(txn, &vm, now).await?;
    }
    Ok(vm)
}

/// The devices of a placement held by the VM, its host claimed at the
/// revision the placement saw (once per host), RoCE rails made, and the
/// hosts of its segment peers woken (returned).
async fn hold(
    txn: &DatabaseTransaction,
    m: &Member,
    vm: &vms::Model,
    r: &Reserved,
    claimed: &mut Vec<Uuid>,
    now: DateTime<Utc>,
) -> Result<Vec<Uuid>, CommitError> {
    let rows = allocation_rows::rows(r.host, vm.id, &r.placement);
    if !rows.is_empty() {
        allocations::Entity::insert_many(rows).exec(txn).await?;
    }
    if !claimed.contains(&r.host) {
        if !claim_host(txn, r.host, r.revision).await? {
            return Err(CommitError::Lost);
        }
        claimed.push(r.host);
    }
    if m.roce {
        crate::store::segments::ensure_rails(txn, vm.id, r.placement.nics.len(), now).await??;
    }
    let peers = if m.networked {
        crate::app::host_network::touch_peers(txn, vm.id).await?
    } else {
        Vec::new()
    };
    let why = format!("placed on {}", r.host_name);
    event(txn, vm, now, "scheduled", why).await?;
    Ok(peers)
}

/// One transaction for the whole admission: the quota, the cluster and
/// VM rows, the held devices and claimed hosts, or the reclaim plan.
/// Returns the hosts whose VMs' borrowed marks moved (the new VMs' own
/// among them): the index re-reads them.
async fn commit(
    st: &AppState,
    job: Admission<'_>,
    outcome: Outcome<'_>,
) -> Result<Vec<Uuid>, CommitError> {
    let now = st.config.clock.now();
    let txn = st.db.begin().await?;
    let specs = placed_specs(job.members, outcome);
    let (placed, spares) = match outcome {
        Outcome::Placed(_, spares) => (true, spares),
        Outcome::Waiting(_) | Outcome::Queued => (false, None),
    };
    let cluster_id = match job.rows {
        Rows::New { actor, cluster } => {
            let kept = match (cluster, spares, specs.first()) {
                (Some(c), Some(_), Some(spec)) => Some((spec, c.spares)),
                _ => None,
            };
            check_quota(&txn, job.tenant, &specs.iter().collect::<Vec<_>>(), kept).await?;
            if let Some(r) = specs.first().and_then(|s| s.reservation) {
                let adding = specs.iter().map(|s| u64::from(s.gpus)).sum();
                crate::app::reservations::check_room(&txn, r, adding).await?;
            }
            if let Outcome::Queued = outcome {
                // Under the tenant's row lock check_quota took: two
                // requests at once cannot both be the last allowed.
                let max = st.config.queue.max_per_project;
                if crate::store::queue::requests(&txn, Some(job.tenant.id)).await? >= max as usize {
                    return Err(ApiError::QuotaExceeded {
                        resource: "queued requests".into(),
                        detail: format!(
                            "project {:?} has {max} queued, the most the platform allows ([queue] max_per_project): cancel one (delete it) or wait",
                            job.tenant.name
                        ),
                    }
                    .into());
                }
            }
            if let Some(c) = cluster {
                let state = match outcome {
                    Outcome::Placed(..) => ClusterState::Placed,
                    Outcome::Waiting(_) => ClusterState::Pending,
                    Outcome::Queued => ClusterState::Queued,
                };
                let size = job.members.len();
                insert_cluster(&txn, actor, job.tenant, c, size, state, spares).await?;
            }
            cluster.map(|c| c.id)
        }
        Rows::Pending { cluster } => {
            if let (Some(c), true) = (cluster, placed) {
                crate::store::clusters::set_state(&txn, c, ClusterState::Placed).await?;
            }
            cluster
        }
    };
    let mut claimed: Vec<Uuid> = Vec::new();
    let mut peers: Vec<Uuid> = Vec::new();
    for (i, (m, spec)) in job.members.iter().zip(&specs).enumerate() {
        let r = outcome.reserved(i);
        let vm = match job.rows {
            Rows::New { actor, .. } => {
                let start = match r {
                    Some(r) => Start::Placed(r),
                    None => Start::Waiting(outcome.waiting()),
                };
                insert_vm(&txn, actor, job.tenant, m, spec, start, cluster_id).await?
            }
            Rows::Pending { .. } => {
                let vm = place_pending(&txn, m, spec, r, now).await?;
                if let Some(r) = r {
                    // Placed away from its disks (`--anywhere`): they move.
                    crate::app::disk_moves::begin(&txn, &vm, r.host, &r.host_name, now).await?;
                }
                vm
            }
        };
        match (r, outcome) {
            (Some(r), _) => peers.extend(hold(&txn, m, &vm, r, &mut claimed, now).await?),
            (None, Outcome::Waiting(p)) => {
                let n = p.victims.len() + p.waiting_on.len();
                let why = format!("waiting for {n} spot VM(s) to be reclaimed");
                event(&txn, &vm, now, "pending", why).await?;
            }
            (None, Outcome::Queued) => {
                let why = "no host has room: waiting in the fair queue";
                event(&txn, &vm, now, "queued", why).await?;
            }
            (None, Outcome::Placed(..)) => {
                return Err(ApiError::Internal("a member without its reservation".into()).into())
            }
        }
    }
    if let Outcome::Placed(reserved, _) = outcome {
        // The index's marks of reserved hosts come from the last pass; the
        // table is the truth (a host held a moment ago on another replica).
        let hosts: Vec<Uuid> = reserved.iter().map(|r| r.host).collect();
        let held = crate::store::reservations::holding(&txn, &hosts).await?;
        let wrong = reserved
            .iter()
            .zip(&specs)
            .any(|(r, spec)| held.get(&r.host).copied() != spec.reservation);
        if wrong {
            let all = crate::store::reservations::held_hosts(&txn).await?;
            st.capacity.lock().set_reserved(all);
            return Err(CommitError::Lost);
        }
    }
    if let Outcome::Queued = outcome {
        let ids: Vec<Uuid> = job.members.iter().map(|m| m.id).collect();
        let expires = now
            + chrono::Duration::from_std(st.config.queue.expire_after)
                .unwrap_or_else(|_| chrono::Duration::days(7));
        let behind = crate::store::queue::requests(&txn, None).await?;
        let position = u32::try_from(behind).unwrap_or(u32::MAX).saturating_add(1);
        crate::store::queue::insert(
            &txn,
            job.tenant.id,
            cluster_id,
            &ids,
            now,
            expires,
            position,
        )
        .await?;
    }
    for (h, seen) in spares.map(|s| s.hosts.as_slice()).unwrap_or_default() {
        if !claimed.contains(h) {
            if !claim_host(&txn, *h, *seen).await? {
                return Err(CommitError::Lost);
            }
            claimed.push(*h);
        }
    }
    if let Outcome::Waiting(p) = outcome {
        let victims: Vec<Uuid> = p.victims.iter().map(|(_, v)| *v).collect();
        let why = "reclaimed for a guaranteed request";
        preempt(&txn, &victims, st.config.preemption_grace, why, now).await?;
    }
    // The new VMs within the tenant's guaranteed share or borrowed.
    let remarked = match outcome {
        Outcome::Placed(..) => {
            crate::app::guarantees::remark(&txn, Some(job.tenant.id), now).await?
        }
        Outcome::Waiting(_) | Outcome::Queued => Vec::new(),
    };
    txn.commit().await?;
    for h in peers.into_iter().chain(remarked.iter().copied()) {
        st.signals.notify(h);
    }
    Ok(remarked)
}

/// Marks spot VMs `preempting` with a deadline and tells their hosts.
/// Already preempting (or gone) VMs are left as they are, and so are VMs
/// being shelved: their devices are on their way back already, and a
/// second reclaim plan must not turn a shelving VM back into a preempting
/// one (it did: a reclaimed VM kept to be shelved read `preempting` again).
pub async fn preempt(
    txn: &DatabaseTransaction,
    victims: &[Uuid],
    grace: std::time::Duration,
    why: &str,
    now: DateTime<Utc>,
) -> Result<Vec<Uuid>, ApiError> {
    let mut hosts_touched = Vec::new();
    for id in victims {
        let Some(vm) = vms::Entity::find_by_id(*id).one(txn).await? else {
            continue;
        };
        let spec = crate::store::vms::stored_spec(&vm)?;
        // Its own notice when it asked for one (bounded when it was made),
        // else the platform's.
        let grace = match spec.notice_seconds {
            Some(s) => std::time::Duration::from_secs(u64::from(s)),
            None => grace,
        };
        let deadline: DateTime<Utc> = now
            + chrono::Duration::from_std(grace).unwrap_or_else(|_| chrono::Duration::seconds(30));
        let state = stored_state(&vm)?;
        // A guaranteed VM only while borrowed (its mark read with the row:
        // the index's may be a moment old).
        let borrowed = spec.service_level == ServiceLevel::Guaranteed;
        if borrowed && vm.borrowed_at.is_none() {
            continue;
        }
        let why = if borrowed {
            "borrowed (above its project's guaranteed share), reclaimed for a project within its own share"
        } else {
            why
        };
        if !holds(state)
            || matches!(
                state,
                VmState::Preempting
                    | VmState::Preempted
                    | VmState::Deleting
                    | VmState::Shelving
                    | VmState::Shelved
            )
        {
            continue;
        }
        // Only over the state read: the row was read unlocked, and a
        // deletion committed since (another replica's, on PostgreSQL) must
        // stand. An unconditional write turned a deleting VM preempting,
        // then preempted: "deleted (2xx) and still here" in the crash
        // harness with two replicas.
        let moved = vms::Entity::update_many()
            .col_expr(
                vms::Column::State,
                Expr::value(VmState::Preempting.as_str()),
            )
            .col_expr(vms::Column::PreemptDeadline, Expr::value(Some(deadline)))
            .col_expr(vms::Column::UpdatedAt, Expr::value(now))
            .filter(vms::Column::Id.eq(vm.id))
            .filter(vms::Column::State.eq(vm.state.clone()))
            .exec(txn)
            .await?;
        if moved.rows_affected != 1 {
            continue;
        }
        event(
            txn,
            &vm,
            now,
            "preempting",
            format!(
                "{why}; notice sent to the guest, deadline {}",
                deadline.to_rfc3339()
            ),
        )
        .await?;
        if let Some(h) = vm.host_id {
            crate::store::hosts::bump_revision(txn, h).await?;
            hosts_touched.push(h);
        }
    }
    Ok(hosts_touched)
}

/// After a commit: the reservation is now the truth, and the commit moved
/// each host's revision exactly one past what the index saw.
fn settle(st: &AppState, reserved: &[Reserved], spares: Option<&SparesKept>) {
    let mut hosts: Vec<(Uuid, i64)> = reserved.iter().map(|r| (r.host, r.revision)).collect();
    hosts.extend(spares.map(|s| s.hosts.clone()).unwrap_or_default());
    hosts.sort();
    hosts.dedup_by_key(|(h, _)| *h);
    {
        let mut index = st.capacity.lock();
        for (h, seen) in &hosts {
            if let Some(pos) = index.position(*h) {
                // A reading may have brought it further already.
                let held = index.hosts[pos].revision;
                index.set_revision(pos, held.max(seen + 1));
            }
        }
    }
    for (h, _) in hosts {
        st.signals.notify(h);
    }
}

/// A refused create catches up on other replicas' changes unless a
/// catch-up began this recently.
const CAUGHT_UP_LATELY: std::time::Duration = std::time::Duration::from_millis(250);

/// Rounds of reserve → commit; a lost race re-reads the hosts it touched
/// and tries again. `Ok(false)` when the members fit nowhere.
async fn place(st: &AppState, job: Admission<'_>, reach: Reach) -> Result<bool, ApiError> {
    let disk_gib = disk_needed(st, job).await?;
    for round in 0..ROUNDS {
        // Holds a new cluster's spares in the index until its commit (and
        // takes them out again if the commit fails or is abandoned).
        let pending = job.new_cluster().map(|c| st.capacity.spares_pending(c.id));
        let Some(Reservation {
            members: reserved,
            spares,
        }) = reserve(st, &job, disk_gib, reach)?
        else {
            if round == 0 {
                // The index may lag other replicas' frees (by a second):
                // catch up and look again, unless a catch-up began a
                // moment ago (its view is as fresh).
                st.capacity
                    .catch_up_unless(&st.db, &st.signals, CAUGHT_UP_LATELY)
                    .await?;
                continue;
            }
            return Ok(false);
        };
        // Until it lands, the reservation outlives readings older than it.
        let flying = st
            .capacity
            .in_flight(job.members.iter().map(|m| m.id).collect());
        let committed = commit(st, job, Outcome::Placed(&reserved, spares.as_ref())).await;
        match committed {
            Ok(remarked) => {
                if let Some(p) = pending {
                    p.committed();
                }
                settle(st, &reserved, spares.as_ref());
                drop(flying);
                // Their holds' marks, now: a request within its share a
                // moment later must see these VMs borrowed.
                for h in remarked {
                    st.capacity.refresh_host(&st.db, h).await?;
                }
                return Ok(true);
            }
            Err(e) => {
                unreserve(st, &job, &reserved);
                drop(flying);
                drop(pending);
                for r in &reserved {
                    st.capacity.refresh_host(&st.db, r.host).await?;
                }
                for (h, _) in spares
                    .as_ref()
                    .map(|s| s.hosts.as_slice())
                    .unwrap_or_default()
                {
                    st.capacity.refresh_host(&st.db, *h).await?;
                }
                // Spares another replica kept meanwhile, before trying again.
                st.capacity.load_spares(&st.db).await?;
                match e {
                    CommitError::Lost => continue,
                    CommitError::Api(e) => return Err(e),
                }
            }
        }
    }
    Ok(false)
}

/// Whether a pending VM goes back to the host that keeps its root disk
/// (unshelved in place): its disk is counted there already.
/// The disk a pending VM takes on the host it goes to, where that is not
/// its root disk's size: none where its disk is already (unshelved where
/// it was shelved); its root disk and its volumes where it is unshelved
/// anywhere, since its volumes travel with it.
async fn disk_needed(st: &AppState, job: Admission<'_>) -> Result<Option<u64>, ApiError> {
    let ([m], Rows::Pending { .. }) = (job.members, job.rows) else {
        return Ok(None);
    };
    let Some(vm) = vms::Entity::find_by_id(m.id).one(&st.db).await? else {
        return Ok(None);
    };
    if m.on_host.is_some() && vm.disk_host_id == m.on_host {
        return Ok(Some(0));
    }
    if !vm.unshelve_anywhere {
        return Ok(None);
    }
    let volumes = crate::store::volumes::of_vm(&st.db, vm.id).await?;
    let travelling: u64 = volumes
        .iter()
        .map(|v| u64::try_from(v.size_gib).unwrap_or(0))
        .sum();
    Ok(Some(u64::from(m.spec.disk_gib) + travelling))
}

fn no_room(members: &[Member]) -> ApiError {
    let Some(first) = members.first() else {
        return ApiError::InsufficientCapacity("nothing to place".into());
    };
    let spec = &first.spec;
    let what = format!(
        "{} VM(s) of {} {}GPU(s), {} vCPUs, {} GiB of memory and a {} GiB disk",
        members.len(),
        spec.gpus,
        spec.gpu_model
            .as_deref()
            .map(|m| format!("{m} "))
            .unwrap_or_default(),
        spec.vcpus,
        spec.memory_gib,
        spec.disk_gib
    );
    if first.on_host.is_some() {
        return ApiError::InsufficientCapacity(format!(
            "the host holding the VM's volumes is not ready or has no room for {what}; a VM goes where its volumes are (create it without them, or make room on that host)"
        ));
    }
    let mut with = Vec::new();
    if first.networked {
        with.push("an underlay address (the VM has networks)");
    }
    if first.shared {
        with.push("the shared filesystem mounted (the VM has shares)");
    }
    ApiError::InsufficientCapacity(format!(
        "no ready host{} has room for {what} near them",
        if with.is_empty() {
            String::new()
        } else {
            format!(" with {}", with.join(" and "))
        },
    ))
}

/// The spot VMs whose reclaim would make room for the members, and the GPU
/// model the members wait for: the one they name, or else that of the host
/// the plan makes room on (read under the lock that made the plan).
fn reclaim_plan(
    st: &AppState,
    job: &Admission<'_>,
    beside: bool,
    lenders: &Lenders,
) -> Result<Option<(Plan, Option<String>)>, ApiError> {
    let members = job.members;
    let Some(first) = members.first() else {
        return Ok(None);
    };
    let index = st.capacity.lock();
    let (mut req, mut hinted) = requests(&index, job, first)?;
    keep_off_queue(st, job, &mut req, hinted.as_mut());
    let req = match (beside || (job.one_unit && job.near.is_some()), hinted) {
        (false, _) => req,
        (true, Some(h)) => h,
        (true, None) => return Ok(None),
    };
    let now = st.config.clock.now().timestamp();
    let plan = if members.len() == 1 {
        reclaim::plan_lending(&index, &req, now, lenders)
    } else {
        let cluster = ClusterRequest {
            size: members.len() as u32,
            member: req,
            one_unit: job.one_unit,
        };
        reclaim::plan_cluster_lending(&index, &cluster, now, lenders)
    };
    Ok(plan.map(|p| {
        let model = planned_model(&index, &first.spec, &p);
        (p, model)
    }))
}

/// A waiting request's GPU model: the one it names, or that of the host
/// its plan frees GPUs on. Quotas are per model: a GPU VM waiting without
/// one would be counted under no model, which no quota allows.
fn planned_model(index: &Index, spec: &VmSpec, plan: &Plan) -> Option<String> {
    if spec.gpus == 0 || spec.gpu_model.is_some() {
        return spec.gpu_model.clone();
    }
    let (h, _) = plan.victims.first().or(plan.waiting_on.first())?;
    let (m, _) = index
        .hosts
        .get(*h)?
        .profile
        .model_masks
        .iter()
        .find(|(_, mask)| mask.count_ones() >= spec.gpus)?;
    index.model_name(*m).map(str::to_owned)
}

/// Admits a new request: placed now, pending while spot VMs are reclaimed
/// for it, or, asked to queue, queued when neither is possible or others
/// wait already (they go first, in fair order). `Err(InsufficientCapacity)`
/// when none of these is.
pub async fn admit(st: &AppState, job: Admission<'_>) -> Result<Admitted, ApiError> {
    if job.queue {
        if let Some(c) = job.new_cluster().filter(|c| c.spares > 0) {
            return Err(ApiError::field(
                "queue",
                format!(
                    "a cluster with spares is placed on free room only ({} spare(s) asked)",
                    c.spares
                ),
            ));
        }
        if crate::store::queue::any(&st.db).await? {
            return enqueue(st, job).await;
        }
    }
    match admit_now(st, job).await {
        Err(ApiError::InsufficientCapacity(_)) if job.queue => enqueue(st, job).await,
        other => other,
    }
}

/// The request's rows as `queued`, and every standing ordered again so its
/// answer shows where it stands. Waiting is for room that will free: a
/// request no host of the fleet could ever take is refused, and a GPU
/// request naming no model waits for (and is counted against) the model
/// with the most hosts that could take it.
async fn enqueue(st: &AppState, job: Admission<'_>) -> Result<Admitted, ApiError> {
    let Some(first) = job.members.first() else {
        return Ok(Admitted::Placed);
    };
    let model = {
        let index = st.capacity.lock();
        ever_fits(&index, job.members.len(), &first.spec, job.one_unit)
    };
    let Some(model) = model else {
        return Err(ApiError::InsufficientCapacity(format!(
            "no host of the fleet, even empty, could take {}: not queued",
            shape(job.members)
        )));
    };
    let pinned: Vec<Member>;
    let job = match model {
        Some(m) if first.spec.gpu_model.is_none() => {
            pinned = held_to(job.members, &m);
            Admission {
                members: &pinned,
                ..job
            }
        }
        _ => job,
    };
    match commit(st, job, Outcome::Queued).await {
        Ok(_) => {}
        Err(CommitError::Lost) => {
            return Err(ApiError::Conflict(
                "a VM or cluster of that name was created concurrently".into(),
            ))
        }
        Err(CommitError::Api(e)) => return Err(e),
    }
    // Queued is committed: a failure to order it now is the next pass's.
    if let Err(e) = crate::app::queue::order(st).await {
        tracing::warn!(error = %e, "ordering the queue after a request joined it failed");
    }
    Ok(Admitted::Queued)
}

/// Whether `members` VMs of `spec` could ever be placed, were the fleet
/// empty (by GPU counts: hosts in service with that many GPUs of a model,
/// one member per host, in one scalable unit if asked): `Some` with the
/// model that could take them (the named one, or the one with the most
/// such hosts), `None` when nothing could.
fn ever_fits(
    index: &Index,
    members: usize,
    spec: &VmSpec,
    one_unit: bool,
) -> Option<Option<String>> {
    if spec.gpus == 0 {
        return Some(None);
    }
    let mut best: Option<(usize, u16)> = None;
    for m in index.model_ids() {
        let name = index.model_name(m)?;
        if spec.gpu_model.as_deref().is_some_and(|want| want != name) {
            continue;
        }
        let mut per_unit: std::collections::HashMap<Option<u32>, usize> = Default::default();
        for h in index
            .hosts
            .iter()
            .filter(|h| h.state != kumo_scheduler::HostUse::Unavailable)
        {
            let takes =
                h.profile.model_masks.iter().any(|(id, mask)| {
                    *id == m && (mask & !h.gpu_blocked).count_ones() >= spec.gpus
                });
            if takes {
                *per_unit
                    .entry(if one_unit { h.scalable_unit } else { None })
                    .or_default() += 1;
            }
        }
        let hosts = per_unit.values().copied().max().unwrap_or(0);
        if hosts >= members && best.is_none_or(|(n, _)| hosts > n) {
            best = Some((hosts, m));
        }
    }
    best.map(|(_, m)| index.model_name(m).map(str::to_owned))
}

/// What the members are, for a refusal.
fn shape(members: &[Member]) -> String {
    let spec = members.first().map(|m| &m.spec);
    format!(
        "{} VM(s) of {} {}GPU(s)",
        members.len(),
        spec.map(|s| s.gpus).unwrap_or(0),
        spec.and_then(|s| s.gpu_model.as_deref())
            .map(|m| format!("{m} "))
            .unwrap_or_default()
    )
}

/// Places the admission's members now, or for a guaranteed request that
/// does not fit, reclaims spot VMs and records the members as pending.
/// `Err(InsufficientCapacity)` when neither is possible.
async fn admit_now(st: &AppState, job: Admission<'_>) -> Result<Admitted, ApiError> {
    let Some(first) = job.members.first() else {
        return Ok(Admitted::Placed);
    };
    if place(st, job, Reach::SparesFirst).await? {
        return Ok(Admitted::Placed);
    }
    // Spot requests reclaim nothing; new clusters with spares are placed
    // on free room only (their spares could not be kept otherwise).
    if let Some(c) = job.new_cluster().filter(|c| c.spares > 0) {
        return Err(ApiError::InsufficientCapacity(format!(
            "no scalable unit has free room for the {} members and {} spare(s) together",
            job.members.len(),
            c.spares
        )));
    }
    if first.spec.service_level == ServiceLevel::Spot {
        return Err(no_room(job.members));
    }
    // Beside a placed sibling: spot VMs in its unit (on the cluster's
    // spares) are reclaimed first; elsewhere only when that cannot work.
    let spot_only = Lenders::default();
    let mut plan = reclaim_plan(st, &job, true, &spot_only)?;
    if plan.is_none() {
        let restricted = beside_spares(&st.capacity.lock(), &job);
        if restricted && place(st, job, Reach::Anywhere).await? {
            return Ok(Admitted::Placed);
        }
        plan = reclaim_plan(st, &job, false, &spot_only)?;
    }
    // Within the tenant's guaranteed share: other tenants' borrowed VMs
    // too (held to the model the share is of).
    let for_share: Vec<Member>;
    let mut job = job;
    if plan.is_none() && first.spec.gpus > 0 {
        let named = first.spec.gpu_model.as_deref();
        let gpus = u64::from(first.spec.gpus) * job.members.len() as u64;
        let lent = crate::app::guarantees::lenders(&st.db, job.tenant.id, named, gpus).await?;
        if let Some((model, lenders)) = lent {
            for_share = held_to(job.members, &model);
            job = Admission {
                members: &for_share,
                ..job
            };
            plan = reclaim_plan(st, &job, false, &lenders)?;
        }
    }
    let Some((plan, model)) = plan else {
        return Err(no_room(job.members));
    };
    // Waiting, a GPU request naming no model is held to (and counted
    // against) the model its plan makes room for; the pending row keeps it,
    // so the reaper places it on that model.
    let pinned: Vec<Member>;
    let unnamed = job
        .members
        .first()
        .is_some_and(|m| m.spec.gpu_model.is_none());
    let job = if first.spec.gpus > 0 && unnamed {
        let Some(model) = model else {
            return Err(no_room(job.members));
        };
        pinned = held_to(job.members, &model);
        Admission {
            members: &pinned,
            ..job
        }
    } else {
        job
    };
    let reclaiming = plan.victims.len();
    if matches!(job.rows, Rows::Pending { .. }) && reclaiming == 0 {
        return Ok(Admitted::Pending { reclaiming });
    }
    match commit(st, job, Outcome::Waiting(&plan)).await {
        Ok(_) => {}
        Err(CommitError::Lost) => {
            return Err(ApiError::Conflict(
                "a VM or cluster of that name was created concurrently".into(),
            ))
        }
        Err(CommitError::Api(e)) => return Err(e),
    }
    let mut hosts: Vec<Uuid> = Vec::new();
    {
        let mut index = st.capacity.lock();
        for (h, vm) in &plan.victims {
            index.mark_reclaiming(*h, *vm);
            hosts.push(index.hosts[*h].id);
        }
    }
    for h in hosts {
        st.signals.notify(h);
    }
    Ok(Admitted::Pending { reclaiming })
}

/// The members asking for GPUs of `model`.
fn held_to(members: &[Member], model: &str) -> Vec<Member> {
    members
        .iter()
        .cloned()
        .map(|mut m| {
            m.spec.gpu_model = Some(model.to_owned());
            m
        })
        .collect()
}

/// Places waiting VMs (one, or members of one cluster, placed together):
/// their rows say what they need (segments, shares, volumes, the host
/// that keeps their disks). Members of a cluster with placed members go
/// beside one of those (its scalable unit and rails) when there is room.
/// No room is not an error: they wait for the next pass.
pub async fn admit_pending(
    st: &AppState,
    cluster_id: Option<Uuid>,
    rows: &[vms::Model],
) -> Result<(), ApiError> {
    let Some(Waiting {
        tenant,
        members,
        near,
        one_unit,
    }) = waiting(st, cluster_id, rows).await?
    else {
        return Ok(());
    };
    let job = Admission {
        tenant: &tenant,
        members: &members,
        rows: Rows::Pending {
            cluster: cluster_id,
        },
        near: near.as_ref(),
        one_unit,
        queue: false,
    };
    match admit_now(st, job).await {
        Ok(Admitted::Placed) => {
            if let (Some(c), Some(near)) = (cluster_id, &near) {
                let ids: Vec<Uuid> = members.iter().map(|m| m.id).collect();
                crate::app::cluster_repair::placed_near(st, c, &ids, near).await?;
            }
            Ok(())
        }
        Ok(Admitted::Pending { .. } | Admitted::Queued)
        | Err(ApiError::InsufficientCapacity(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Places a queued request (one VM, or a cluster's members together) on
/// free room only, off `keep_off` (hosts those ahead of it wait for).
/// `Ok(false)`: no room for it now.
pub async fn admit_queued(
    st: &AppState,
    cluster_id: Option<Uuid>,
    rows: &[vms::Model],
    keep_off: &[Uuid],
) -> Result<bool, ApiError> {
    let Some(Waiting {
        tenant,
        mut members,
        one_unit,
        ..
    }) = waiting(st, cluster_id, rows).await?
    else {
        return Ok(false);
    };
    for m in &mut members {
        m.avoid.extend(keep_off.iter().copied());
    }
    let job = Admission {
        tenant: &tenant,
        members: &members,
        rows: Rows::Pending {
            cluster: cluster_id,
        },
        near: None,
        one_unit,
        queue: false,
    };
    match place(st, job, Reach::Anywhere).await {
        // Its model left the fleet meanwhile: it waits (and expires).
        Err(ApiError::InsufficientCapacity(_)) => Ok(false),
        other => other,
    }
}

/// A waiting request's rows as members to place.
struct Waiting {
    tenant: tenants::Model,
    members: Vec<Member>,
    /// A placed sibling of its cluster, to go beside.
    near: Option<Near>,
    one_unit: bool,
}

/// What waiting rows (pending or queued) ask for: their rows say what they
/// need (segments, shares, volumes, the host that keeps their disks).
async fn waiting(
    st: &AppState,
    cluster_id: Option<Uuid>,
    rows: &[vms::Model],
) -> Result<Option<Waiting>, ApiError> {
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let Some(tenant) = tenants::Entity::find_by_id(first.tenant_id)
        .one(&st.db)
        .await?
    else {
        return Ok(None);
    };
    let mut members = Vec::with_capacity(rows.len());
    for v in rows {
        let (networked, roce) = crate::store::segments::kinds_of(&st.db, v.id).await?;
        let shared = !crate::store::shares::mounts_of(&st.db, &[v.id])
            .await?
            .is_empty();
        // Its volumes (attached when it was made) say where it goes.
        // Unshelved `--anywhere`: wherever there is room; its disks
        // then move there.
        let on_host = match v.disk_host_id {
            _ if v.unshelve_anywhere => None,
            Some(h) => Some(h),
            None => crate::store::volumes::of_vm(&st.db, v.id)
                .await?
                .first()
                .map(|vol| vol.host_id),
        };
        // A VM replaced off a host (repair, recreate, maintenance) does not
        // go back there: the old domain stays until that host learns the
        // VM is no longer its own, and its devices may be why.
        let avoid = crate::store::vms::stale_disk_hosts(&st.db, v.id).await?;
        members.push(Member {
            id: v.id,
            name: v.name.clone(),
            spec: crate::store::vms::stored_spec(v)?,
            nics: Vec::new(),
            networked,
            roce,
            on_host,
            avoid,
            volumes: Vec::new(),
            // A pending VM's mounts are rows already.
            shares: Vec::new(),
            shared,
        });
    }
    let near = match cluster_id {
        Some(c) => placed_sibling(st, c).await?,
        None => None,
    };
    let one_unit = crate::store::clusters::keeps_to_one_unit(&st.db, cluster_id).await?;
    Ok(Some(Waiting {
        tenant,
        members,
        near,
        one_unit,
    }))
}

/// A running member of the cluster, to place the others beside.
async fn placed_sibling(st: &AppState, cluster: Uuid) -> Result<Option<Near>, ApiError> {
    let rows = vms::Entity::find()
        .filter(vms::Column::ClusterId.eq(cluster))
        .filter(vms::Column::State.eq(VmState::Running.as_str()))
        .all(&st.db)
        .await?;
    for v in rows {
        if let (Some(host), Some(p)) = (v.host_id, crate::store::vms::stored_placement(&v)?) {
            return Ok(Some(Near { host, gpus: p.gpus }));
        }
    }
    Ok(None)
}
