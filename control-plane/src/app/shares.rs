//! Project share use cases: a tenant's directories on the filesystem every
//! host mounts, within its `share_gib` quota, charged per GiB-hour of their
//! size, mounted into its VMs with virtiofs. Rows are the desired state:
//! the share's keeper host makes, limits, measures and deletes its
//! directory; each VM's host passes it into the VM; both report back.

use kumo_api_types::{
    MountReport, Page, PageParams, Role, Share, ShareCreate, ShareGrow, ShareMount,
    ShareMountRequest, ShareState, ShareStatus, VolumeActual,
};
use kumo_billing::rates::SHARE_GIB;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, QueryFilter,
    Set, TransactionTrait,
};
use uuid::Uuid;

use crate::app::access::tenant_access;
use crate::app::audit;
use crate::context::{Actor, AppState};
use crate::domain::names;
use crate::domain::paging::Paging;
use crate::domain::shares as rules;
use crate::domain::states::StoredText;
use crate::entity::{share_mounts, shares, tenants};
use crate::error::{conflict_if_unique, ApiError};
use crate::store::hosts::bump_revision;
use crate::store::shares as store;
pub use crate::store::shares::PlannedMount;

fn mount_view(m: &share_mounts::Model, share: &str, vm: &str) -> ShareMount {
    ShareMount {
        share: share.to_owned(),
        vm: vm.to_owned(),
        path: m.path.clone(),
        read_only: m.read_only,
        tag: m.tag.clone(),
        condition: m.condition.clone(),
    }
}

async fn view(
    db: &impl ConnectionTrait,
    s: &shares::Model,
    tenant: &str,
) -> Result<Share, ApiError> {
    let mounts = store::mounts_of_share(db, s.id)
        .await?
        .iter()
        .map(|(m, vm)| {
            let vm = vm.as_ref().map_or("", |v| v.name.as_str());
            mount_view(m, &s.name, vm)
        })
        .collect();
    Ok(Share {
        id: s.id,
        name: s.name.clone(),
        tenant: tenant.to_owned(),
        size_gib: u32::try_from(s.size_gib).unwrap_or(u32::MAX),
        state: store::stored_state(s)?,
        reason: s.reason.clone(),
        used_bytes: s.used_bytes.and_then(|b| u64::try_from(b).ok()),
        limit: store::stored_limit(s)?,
        read_only: s.read_only,
        mounts,
        created_at: s.created_at,
        updated_at: s.updated_at,
    })
}

/// The mounts of these VMs as the API shows them, by VM.
pub async fn mounts_shown(
    db: &impl ConnectionTrait,
    vms: &[(Uuid, &str)],
) -> Result<std::collections::HashMap<Uuid, Vec<ShareMount>>, ApiError> {
    let ids: Vec<Uuid> = vms.iter().map(|(id, _)| *id).collect();
    let mut rows = store::mounts_of(db, &ids).await?;
    Ok(vms
        .iter()
        .filter_map(|(id, name)| {
            let ms = rows.remove(id)?;
            Some((
                *id,
                ms.iter()
                    .map(|(m, s)| mount_view(m, &s.name, name))
                    .collect(),
            ))
        })
        .collect())
}

/// The tenant would hold `more` GiB of shares beyond what it holds now.
async fn check_quota(
    txn: &DatabaseTransaction,
    tenant: &tenants::Model,
    more: u64,
) -> Result<(), ApiError> {
    crate::store::tenancy::lock_for_quota(txn, tenant.id).await?;
    let limit = crate::store::tenancy::load(txn, tenant.id).await?.share_gib;
    let used = store::gib_of_tenant(txn, tenant.id).await? + more;
    if used > u64::from(limit) {
        return Err(ApiError::QuotaExceeded {
            resource: "share_gib".into(),
            detail: format!(
                "tenant {:?} would hold {used} GiB of shares with this request; its quota is {limit}",
                tenant.name
            ),
        });
    }
    Ok(())
}

/// The host whose agent keeps a share's directory (see
/// [`rules::keeper`]), read once per change.
async fn keeper(
    txn: &DatabaseTransaction,
    current: Option<Uuid>,
) -> Result<Option<Uuid>, ApiError> {
    Ok(rules::keeper(
        &store::keeper_candidates(txn).await?,
        current,
    ))
}

fn no_keeper() -> ApiError {
    ApiError::InsufficientCapacity(
        "no ready host has the shared filesystem mounted (`--shares-root`): a share has nowhere to be made".into(),
    )
}

/// A fresh filesystem project id (unique: the database checks).
fn new_project() -> i64 {
    let span = u64::from(rules::PROJECT_MAX - rules::PROJECT_MIN);
    let r = u64::from_le_bytes(
        Uuid::new_v4().as_bytes()[..8]
            .try_into()
            .unwrap_or_default(),
    );
    i64::from(rules::PROJECT_MIN) + i64::try_from(r % span).unwrap_or(0)
}

/// A member makes a share: within the quota and the budget, kept by a
/// host that has the shared filesystem.
pub async fn create(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    body: &ShareCreate,
) -> Result<Share, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "creating shares")?;
    names::tenant_name("name", &body.name)?;
    let gib = rules::size("size_gib", body.size_gib)?;
    let txn = st.db.begin().await?;
    check_quota(&txn, &tenant, u64::try_from(gib).unwrap_or(0)).await?;
    crate::app::budget::check_held(&txn, &tenant, SHARE_GIB, actor.at).await?;
    let host = keeper(&txn, None).await?.ok_or_else(no_keeper)?;
    let row = shares::ActiveModel {
        id: Set(Uuid::now_v7()),
        tenant_id: Set(tenant.id),
        name: Set(body.name.clone()),
        size_gib: Set(gib),
        state: Set(ShareState::Creating.to_text().to_owned()),
        reason: Set(None),
        keeper_host_id: Set(Some(host)),
        project: Set(new_project()),
        used_bytes: Set(None),
        limit_kind: Set(None),
        read_only: Set(false),
        created_at: Set(actor.at),
        updated_at: Set(actor.at),
    }
    .insert(&txn)
    .await
    .map_err(|e| conflict_if_unique(e, || format!("share {:?} already exists", body.name)))?;
    crate::app::metering::share_held(&txn, &tenant, &row, actor.at).await?;
    bump_revision(&txn, host).await?;
    audit::record(&txn, actor, "share.create", Some(&tenant), &row.name).await?;
    txn.commit().await?;
    st.signals.notify(host);
    view(&st.db, &row, &tenant.name).await
}

pub async fn list(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    params: &PageParams,
) -> Result<Page<Share>, ApiError> {
    let (tenant, _) = tenant_access(&st.reads, &actor.caller, tenant).await?;
    let paging = Paging::new(params.limit, params.page_token.as_deref())?;
    let rows = store::page(&st.reads, tenant.id, &paging).await?;
    let (rows, next) = paging.finish(rows, |s| s.name.clone());
    let mut items = Vec::with_capacity(rows.len());
    for r in &rows {
        items.push(view(&st.reads, r, &tenant.name).await?);
    }
    Ok(Page {
        items,
        next_page_token: next,
    })
}

pub async fn show(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    share: &str,
) -> Result<Share, ApiError> {
    let (tenant, _) = tenant_access(&st.reads, &actor.caller, tenant).await?;
    let s = store::find(&st.reads, &tenant, share).await?;
    view(&st.reads, &s, &tenant.name).await
}

/// A member grows a share (never shrinks it): its keeper raises the limit.
pub async fn grow(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    share: &str,
    body: &ShareGrow,
) -> Result<Share, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "growing shares")?;
    let gib = rules::size("size_gib", body.size_gib)?;
    let txn = st.db.begin().await?;
    let s = store::find_to_change(&txn, &tenant, share).await?;
    if store::stored_state(&s)? != ShareState::Available {
        return Err(ApiError::Conflict(format!(
            "share {:?} is {}: it grows once it is available",
            s.name, s.state
        )));
    }
    if gib <= s.size_gib {
        return Err(ApiError::field(
            "size_gib",
            format!("a share only grows: {:?} has {} GiB", s.name, s.size_gib),
        ));
    }
    check_quota(&txn, &tenant, u64::try_from(gib - s.size_gib).unwrap_or(0)).await?;
    crate::app::budget::check_held(&txn, &tenant, SHARE_GIB, actor.at).await?;
    let host = keeper(&txn, s.keeper_host_id)
        .await?
        .ok_or_else(no_keeper)?;
    let mut grown = s.clone();
    grown.size_gib = gib;
    crate::app::metering::share_released(&txn, s.id, actor.at).await?;
    crate::app::metering::share_held(&txn, &tenant, &grown, actor.at).await?;
    let mut a: shares::ActiveModel = s.into();
    a.size_gib = Set(gib);
    a.keeper_host_id = Set(Some(host));
    a.updated_at = Set(actor.at);
    let row = a.update(&txn).await?;
    bump_revision(&txn, host).await?;
    audit::record(&txn, actor, "share.grow", Some(&tenant), &row.name).await?;
    txn.commit().await?;
    st.signals.notify(host);
    view(&st.db, &row, &tenant.name).await
}

/// A member deletes a share no VM mounts (409 otherwise): its keeper
/// removes the directory and its data; its charge ends now.
pub async fn delete(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    share: &str,
) -> Result<(), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "deleting shares")?;
    let txn = st.db.begin().await?;
    let s = store::find_to_change(&txn, &tenant, share).await?;
    let mounted = store::mount_count(&txn, s.id).await?;
    if mounted > 0 {
        return Err(ApiError::Conflict(format!(
            "share {:?} is mounted in {mounted} VM(s): unmount it (or delete them) first",
            s.name
        )));
    }
    let again = store::stored_state(&s)? == ShareState::Deleting;
    if !again {
        crate::app::metering::share_released(&txn, s.id, actor.at).await?;
    }
    let name = s.name.clone();
    // A lost keeper's work moves on (asking again moves a deletion that
    // waits on one); with no host to keep it, the old keeper keeps it.
    let host = keeper(&txn, s.keeper_host_id).await?.or(s.keeper_host_id);
    let mut a: shares::ActiveModel = s.into();
    a.state = Set(ShareState::Deleting.to_text().to_owned());
    a.keeper_host_id = Set(host);
    a.updated_at = Set(actor.at);
    a.update(&txn).await?;
    if let Some(h) = host {
        bump_revision(&txn, h).await?;
    }
    if !again {
        audit::record(&txn, actor, "share.delete", Some(&tenant), &name).await?;
    }
    txn.commit().await?;
    if let Some(h) = host {
        st.signals.notify(h);
    }
    Ok(())
}

/// The mounts a new VM asks for: the tenant's available shares, each at
/// a plain path, their tags distinct.
pub async fn plan_mounts(
    db: &impl ConnectionTrait,
    tenant: &tenants::Model,
    requests: &[ShareMountRequest],
) -> Result<Vec<PlannedMount>, ApiError> {
    let names: Vec<String> = requests.iter().map(|r| r.share.clone()).collect();
    rules::distinct_tags("shares", &names)?;
    let mut out: Vec<PlannedMount> = Vec::with_capacity(requests.len());
    for r in requests {
        let s = store::find(db, tenant, &r.share).await?;
        if store::stored_state(&s)? != ShareState::Available {
            return Err(ApiError::Conflict(format!(
                "share {:?} is {}: a VM mounts an available share",
                s.name, s.state
            )));
        }
        if out.iter().any(|m| m.share == s.id) {
            return Err(ApiError::field(
                "shares",
                format!("{:?} is named twice", s.name),
            ));
        }
        let path = match &r.path {
            Some(p) => rules::guest_path("shares.path", p)?,
            None => rules::default_path(&s.name),
        };
        if out.iter().any(|m| m.path == path) {
            return Err(ApiError::field(
                "shares.path",
                format!("two shares at {path:?}"),
            ));
        }
        out.push(PlannedMount {
            share: s.id,
            tag: rules::tag(&s.name),
            name: s.name,
            path,
            read_only: r.read_only,
        });
    }
    Ok(out)
}

/// A member mounts a share in one of the tenant's VMs. libvirt cannot add
/// a virtiofs filesystem to a running guest, so a running VM gets it at its
/// next start (its mount says so).
pub async fn mount(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    vm: &str,
    body: &ShareMountRequest,
) -> Result<Share, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "mounting shares")?;
    let txn = st.db.begin().await?;
    let vm = crate::store::vms::find_vm_to_change(&txn, &tenant, vm).await?;
    let planned = plan_mounts(&txn, &tenant, std::slice::from_ref(body)).await?;
    let existing = store::mounts_of(&txn, &[vm.id]).await?;
    let existing = existing.get(&vm.id).map(Vec::as_slice).unwrap_or_default();
    if existing.iter().any(|(m, _)| m.share_id == planned[0].share) {
        return Err(ApiError::Conflict(format!(
            "VM {:?} mounts {:?} already",
            vm.name, planned[0].name
        )));
    }
    let mut names: Vec<String> = existing.iter().map(|(_, s)| s.name.clone()).collect();
    names.push(planned[0].name.clone());
    rules::distinct_tags("share", &names)?;
    if existing.iter().any(|(m, _)| m.path == planned[0].path) {
        return Err(ApiError::field(
            "path",
            format!(
                "VM {:?} mounts a share at {:?} already",
                vm.name, planned[0].path
            ),
        ));
    }
    if !store::mount_new(&txn, vm.id, &planned, actor.at).await? {
        return Err(ApiError::Conflict(format!(
            "share {:?} changed meanwhile",
            planned[0].name
        )));
    }
    if let Some(h) = vm.host_id {
        bump_revision(&txn, h).await?;
    }
    audit::record(
        &txn,
        actor,
        "share.mount",
        Some(&tenant),
        &format!("{} in {}", planned[0].name, vm.name),
    )
    .await?;
    let s = store::find(&txn, &tenant, &planned[0].name).await?;
    txn.commit().await?;
    if let Some(h) = vm.host_id {
        st.signals.notify(h);
    }
    view(&st.db, &s, &tenant.name).await
}

/// A member takes a share out of a VM (from its next start; the data
/// stays).
pub async fn unmount(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    vm: &str,
    share: &str,
) -> Result<(), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "unmounting shares")?;
    let txn = st.db.begin().await?;
    let vm = crate::store::vms::find_vm_to_change(&txn, &tenant, vm).await?;
    let s = store::find(&txn, &tenant, share).await?;
    if !store::unmount(&txn, s.id, vm.id).await? {
        return Err(ApiError::not_found(format!(
            "share {:?} in VM {:?}",
            s.name, vm.name
        )));
    }
    if let Some(h) = vm.host_id {
        bump_revision(&txn, h).await?;
    }
    audit::record(
        &txn,
        actor,
        "share.unmount",
        Some(&tenant),
        &format!("{} from {}", s.name, vm.name),
    )
    .await?;
    txn.commit().await?;
    if let Some(h) = vm.host_id {
        st.signals.notify(h);
    }
    Ok(())
}

/// What a host keeps and deletes of shares, and its VMs' mounts.
pub struct HostShares {
    pub kept: Vec<kumo_api_types::DesiredShare>,
    pub delete: Vec<Uuid>,
    pub mounts: std::collections::HashMap<Uuid, Vec<kumo_api_types::DesiredMount>>,
}

pub async fn of_host(
    db: &impl ConnectionTrait,
    host: Uuid,
    vm_ids: &[Uuid],
) -> Result<HostShares, ApiError> {
    let (mut kept, mut delete) = (Vec::new(), Vec::new());
    for s in store::kept_by(db, host).await? {
        let state = store::stored_state(&s)?;
        match state {
            ShareState::Deleting => delete.push(s.id),
            _ => kept.push(kumo_api_types::DesiredShare {
                id: s.id,
                size_gib: u32::try_from(s.size_gib).unwrap_or(u32::MAX),
                project: u32::try_from(s.project).unwrap_or(0),
                made: state == ShareState::Available,
            }),
        }
    }
    let mounts = store::mounts_of(db, vm_ids)
        .await?
        .into_iter()
        .map(|(vm, ms)| {
            let ms = ms
                .into_iter()
                .map(|(m, s)| kumo_api_types::DesiredMount {
                    share: s.id,
                    tag: m.tag,
                    path: m.path,
                    // Past its size where only measuring holds it.
                    read_only: m.read_only || s.read_only,
                })
                .collect();
            (vm, ms)
        })
        .collect();
    Ok(HostShares {
        kept,
        delete,
        mounts,
    })
}

/// A keeper's report of its shares' directories, entry by entry: made
/// (usage, how the size holds; a measured share past its size turns
/// read-only, so its mounting hosts are woken), gone (a deleted share's
/// row goes), failed (the reason). Entries for shares the host does not
/// keep are ignored. Answers the hosts to wake after the commit.
pub async fn apply_status(
    txn: &DatabaseTransaction,
    host: Uuid,
    report: &[ShareStatus],
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<Uuid>, ApiError> {
    let mut wake = Vec::new();
    if report.is_empty() {
        return Ok(wake);
    }
    let kept: std::collections::HashMap<Uuid, shares::Model> = store::kept_by(txn, host)
        .await?
        .into_iter()
        .map(|s| (s.id, s))
        .collect();
    for r in report {
        let Some(s) = kept.get(&r.id) else { continue };
        let state = store::stored_state(s)?;
        let mut a: shares::ActiveModel = s.clone().into();
        match (r.state, state) {
            (VolumeActual::Absent, ShareState::Deleting) => {
                shares::Entity::delete_many()
                    .filter(shares::Column::Id.eq(s.id))
                    .filter(shares::Column::State.eq(s.state.clone()))
                    .exec(txn)
                    .await?;
                continue;
            }
            (VolumeActual::Ready, ShareState::Deleting) | (_, ShareState::Deleting) => continue,
            (VolumeActual::Ready, _) => {
                if state != ShareState::Available {
                    a.state = Set(ShareState::Available.to_text().to_owned());
                }
                let used = r.used_bytes.map(|b| i64::try_from(b).unwrap_or(i64::MAX));
                if used.is_some() && used != s.used_bytes {
                    a.used_bytes = Set(used);
                }
                if let Some(l) = r.limit {
                    if store::stored_limit(s)? != Some(l) {
                        a.limit_kind = Set(Some(l.to_text().to_owned()));
                    }
                }
                // Judged on a measurement only (none yet: as it was). A
                // walk that stopped at its file limit counts as past the
                // size: a tenant's many small files must not hide its
                // large ones.
                let over = match (r.limit, r.used_bytes) {
                    (Some(l), Some(used)) => rules::over_size(l, used, s.size_gib) || r.uncounted,
                    _ => s.read_only,
                };
                if over != s.read_only {
                    a.read_only = Set(over);
                    wake.extend(store::hosts_mounting(txn, s.id).await?);
                }
                // Said on every report while it holds, cleared once not.
                let reason = over.then(|| rules::read_only_reason(s.size_gib, r.uncounted));
                if reason != s.reason {
                    a.reason = Set(reason);
                }
            }
            (VolumeActual::Failed, _) => {
                let why = rules::bounded(r.reason.as_deref().unwrap_or("failed"));
                if state == ShareState::Creating {
                    a.state = Set(ShareState::Error.to_text().to_owned());
                }
                if s.reason.as_deref() != Some(why.as_str()) {
                    a.reason = Set(Some(why));
                }
            }
            (VolumeActual::Absent | VolumeActual::Importing, _) => continue,
        }
        if a.is_changed() {
            a.updated_at = Set(now);
            // Only over the state read: a deletion committed meanwhile
            // (PostgreSQL reads the report's rows unlocked) stands.
            let r = shares::Entity::update(a)
                .filter(shares::Column::State.eq(s.state.clone()))
                .exec(txn)
                .await;
            match r {
                Ok(_) | Err(sea_orm::DbErr::RecordNotUpdated) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    for h in &wake {
        bump_revision(txn, *h).await?;
    }
    Ok(wake)
}

/// Shares whose keeper can no longer keep them (lost, gone, its shared
/// filesystem in trouble, or none at all) move to hosts that can, the
/// fewest-keeping first; their work (making, measuring, deleting) goes on
/// there. Each move is conditional on the keeper it read, so replicas
/// running this at once move a share once. Answers how many moved.
pub async fn rekeep(st: &AppState) -> Result<usize, ApiError> {
    let candidates = store::keeper_candidates(&st.db).await?;
    if candidates.is_empty() {
        return Ok(0);
    }
    let keep: std::collections::HashSet<Uuid> = candidates.iter().copied().collect();
    let stranded: Vec<(Uuid, Option<Uuid>)> = store::keepers(&st.db)
        .await?
        .into_iter()
        .filter(|(_, k)| k.is_none_or(|k| !keep.contains(&k)))
        .collect();
    let mut moved = 0;
    for (i, (share, from)) in stranded.iter().enumerate() {
        let to = candidates[i % candidates.len()];
        let txn = st.db.begin().await?;
        if store::move_keeper(&txn, *share, *from, to).await? {
            bump_revision(&txn, to).await?;
            txn.commit().await?;
            st.signals.notify(to);
            moved += 1;
        }
    }
    if moved > 0 {
        tracing::info!(shares = moved, "shares moved to keepers that can keep them");
    }
    Ok(moved)
}

/// A VM's host's word on its mounts, written where it differs.
pub async fn apply_mounts(
    txn: &DatabaseTransaction,
    vm: Uuid,
    report: &[MountReport],
) -> Result<(), ApiError> {
    if report.is_empty() {
        return Ok(());
    }
    let pairs: Vec<(Uuid, String)> = report
        .iter()
        .map(|m| (m.share, m.condition.clone()))
        .collect();
    store::set_conditions(txn, vm, &pairs).await
}
