//! Public addressing use cases: pools (platform admins), a tenant's public
//! addresses within its `public_ips` quota (its segments' egress addresses
//! count too), a NIC's 1:1 floating address, and port forwards. Rules name
//! NICs (attachments), never bare addresses, so a VM's deletion takes its
//! mappings with it in the same transaction. A released address rests
//! (`[network] public_ip_quarantine_secs`) and then the least recently
//! used goes first, so what was aimed at its last holder fades before
//! anyone else gets it.

use std::net::Ipv4Addr;

use kumo_api_types::{
    NicRef, Page, PageParams, PortForward, PortForwardCreate, PublicIp, PublicIpAllocate,
    PublicIpAttach, PublicIpPool, PublicIpPoolCreate, Role, SegmentKind,
};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, NotSet,
    QueryFilter, Set, TransactionTrait,
};
use uuid::Uuid;

use crate::app::access::{require_admin, tenant_access};
use crate::app::audit;
use crate::context::{Actor, AppState};
use crate::domain::names;
use crate::domain::paging::Paging;
use crate::domain::public_net::Pool;
use crate::domain::states::StoredText;
use crate::entity::{
    attachments, port_forwards, public_ip_pools, public_ips, segments, tenants, vms,
};
use crate::error::{conflict_if_unique, ApiError};
use crate::store::public_net as store;

// ------------------------------------------------------------------ pools

fn pool_view(p: &public_ip_pools::Model, rules: &Pool, used: u64) -> PublicIpPool {
    PublicIpPool {
        id: p.id,
        name: p.name.clone(),
        cidr: p.cidr.clone(),
        gateway: p.gateway.clone(),
        first: p.first.clone(),
        last: p.last.clone(),
        size: rules.size(),
        used: u32::try_from(used).unwrap_or(u32::MAX),
        created_at: p.created_at,
    }
}

/// A platform admin adds a provider network's addresses. Pools never
/// overlap each other or the tenant ranges.
pub async fn create_pool(
    st: &AppState,
    actor: &Actor,
    body: &PublicIpPoolCreate,
) -> Result<PublicIpPool, ApiError> {
    require_admin(&actor.caller, "creating public IP pools")?;
    names::tenant_name("name", &body.name)?;
    let rules = Pool::check(
        &body.cidr,
        &body.gateway,
        body.range.as_deref(),
        &st.config.network.tenant_ranges,
    )?;
    let txn = st.db.begin().await?;
    for other in store::pools(&txn).await? {
        if store::stored_pool(&other)?.cidr.overlaps(&rules.cidr) {
            return Err(ApiError::field(
                "cidr",
                format!(
                    "{} overlaps pool {:?} ({})",
                    rules.cidr, other.name, other.cidr
                ),
            ));
        }
    }
    let p = public_ip_pools::ActiveModel {
        id: Set(Uuid::now_v7()),
        name: Set(body.name.clone()),
        cidr: Set(rules.cidr.to_string()),
        gateway: Set(rules.gateway.to_string()),
        first: Set(rules.first.to_string()),
        last: Set(rules.last.to_string()),
        created_at: Set(actor.at),
    }
    .insert(&txn)
    .await
    .map_err(|e| conflict_if_unique(e, || format!("a pool named {:?} exists", body.name)))?;
    audit::record(&txn, actor, "public-ip-pool.create", None, &p.name).await?;
    txn.commit().await?;
    Ok(pool_view(&p, &rules, 0))
}

pub async fn list_pools(
    st: &AppState,
    actor: &Actor,
    params: &PageParams,
) -> Result<Page<PublicIpPool>, ApiError> {
    require_admin(&actor.caller, "listing public IP pools")?;
    let paging = Paging::new(params.limit, params.page_token.as_deref())?;
    let rows = store::pool_page(&st.db, &paging).await?;
    let (rows, next) = paging.finish(rows, |p| p.name.clone());
    let mut items = Vec::with_capacity(rows.len());
    for p in &rows {
        let used = store::used_in(&st.db, p.id).await?;
        items.push(pool_view(p, &store::stored_pool(p)?, used));
    }
    Ok(Page {
        items,
        next_page_token: next,
    })
}

/// A pool with no address in use (platform admins).
pub async fn delete_pool(st: &AppState, actor: &Actor, pool: &str) -> Result<(), ApiError> {
    require_admin(&actor.caller, "deleting public IP pools")?;
    let txn = st.db.begin().await?;
    let p = store::pool_named(&txn, pool).await?;
    let used = store::used_in(&txn, p.id).await?;
    if used > 0 {
        return Err(ApiError::Conflict(format!(
            "pool {:?} has {used} address(es) in use",
            p.name
        )));
    }
    public_ip_pools::Entity::delete_by_id(p.id)
        .exec(&txn)
        .await?;
    audit::record(&txn, actor, "public-ip-pool.delete", None, &p.name).await?;
    txn.commit().await?;
    Ok(())
}

// ------------------------------------------------------------- handing out

/// How long a released address rests before it is handed out again.
pub fn address_rest(st: &AppState) -> chrono::Duration {
    chrono::Duration::from_std(st.config.network.public_ip_quarantine)
        .unwrap_or_else(|_| chrono::Duration::days(1))
}

/// What the pools can hand out now.
pub enum Pick {
    /// The next address, and its pool.
    Free(public_ip_pools::Model, Ipv4Addr),
    /// Every pool is out of addresses: in words, naming them.
    Full(String),
    /// The platform has no pool.
    NoPool,
}

/// The next address of `pools` (in order: the first with one free), by
/// the domain's rule: never-used first, else the one released longest
/// ago and rested.
pub async fn pick(
    db: &impl ConnectionTrait,
    pools: Vec<public_ip_pools::Model>,
    now: chrono::DateTime<chrono::Utc>,
    rest: chrono::Duration,
) -> Result<Pick, ApiError> {
    if pools.is_empty() {
        return Ok(Pick::NoPool);
    }
    let released = store::released(db).await?;
    let mut full = Vec::with_capacity(pools.len());
    for p in pools {
        let rules = store::stored_pool(&p)?;
        let taken = store::taken(db, p.id).await?;
        if let Some(ip) = rules.next_free(&taken, &released, now, rest) {
            return Ok(Pick::Free(p, ip));
        }
        let resting = rules
            .size()
            .saturating_sub(u32::try_from(taken.len()).unwrap_or(u32::MAX));
        full.push(if resting > 0 {
            format!(
                "{:?} ({} in use, {resting} resting after release)",
                p.name,
                taken.len()
            )
        } else {
            format!("{:?} ({} in use)", p.name, taken.len())
        });
    }
    Ok(Pick::Full(match full.as_slice() {
        [one] => format!("public IP pool {one} is out of addresses"),
        all => format!(
            "public IP pools {} are all out of addresses",
            all.join(", ")
        ),
    }))
}

// ------------------------------------------------------------------ NICs

/// A tenant's VM's NIC: the VM's only Ethernet one, or the one on the
/// named segment.
async fn nic_of(
    db: &impl ConnectionTrait,
    tenant: &tenants::Model,
    vm: &str,
    segment: Option<&str>,
) -> Result<(attachments::Model, segments::Model, vms::Model), ApiError> {
    let v = crate::store::vms::find_vm(db, tenant, vm).await?;
    let nics = attachments::Entity::find()
        .filter(attachments::Column::VmId.eq(v.id))
        .all(db)
        .await?;
    let mut ethernet = Vec::new();
    for a in nics {
        let Some(s) = segments::Entity::find_by_id(a.segment_id).one(db).await? else {
            continue;
        };
        if crate::store::segments::stored_kind(&s)? == SegmentKind::Ethernet
            && segment.is_none_or(|want| want == s.name || want == s.id.to_string())
        {
            ethernet.push((a, s));
        }
    }
    match ethernet.len() {
        1 => {
            let (a, s) = ethernet.remove(0);
            Ok((a, s, v))
        }
        0 => Err(ApiError::field(
            "vm",
            format!(
                "VM {:?} has no Ethernet NIC{}",
                v.name,
                segment
                    .map(|s| format!(" on segment {s:?}"))
                    .unwrap_or_default()
            ),
        )),
        _ => Err(ApiError::field(
            "segment",
            format!(
                "VM {:?} has several Ethernet NICs: name the segment",
                v.name
            ),
        )),
    }
}

/// The NIC an attachment is, as the API names it.
async fn nic_ref(db: &impl ConnectionTrait, attachment: Uuid) -> Result<Option<NicRef>, ApiError> {
    let Some(a) = attachments::Entity::find_by_id(attachment).one(db).await? else {
        return Ok(None);
    };
    let vm = vms::Entity::find_by_id(a.vm_id).one(db).await?;
    let seg = segments::Entity::find_by_id(a.segment_id).one(db).await?;
    Ok(vm.zip(seg).map(|(v, s)| NicRef {
        vm: v.name,
        segment: s.name,
        ip: a.ip,
    }))
}

/// The hosts to wake, once committed, for a change of a segment's edge
/// rules: the edge is placed (or kept) first.
async fn edge_changed(
    txn: &DatabaseTransaction,
    segment: Uuid,
    now: chrono::DateTime<chrono::Utc>,
    rest: chrono::Duration,
) -> Result<Vec<Uuid>, ApiError> {
    let Some(s) = segments::Entity::find_by_id(segment).one(txn).await? else {
        return Ok(Vec::new());
    };
    // A placement change already bumped every host of the segment; else
    // only the rules changed, and those hosts are told here.
    let woken = crate::app::edges::ensure(txn, &s, now, rest).await?.woken;
    if !woken.is_empty() {
        return Ok(woken);
    }
    crate::app::host_network::touch_segments(txn, vec![segment]).await
}

fn wake(st: &AppState, hosts: Vec<Uuid>) {
    for h in hosts {
        st.signals.notify(h);
    }
}

// ------------------------------------------------------------ public IPs

async fn ip_view(
    db: &impl ConnectionTrait,
    ip: &public_ips::Model,
    tenant: &str,
) -> Result<PublicIp, ApiError> {
    let pool = store::pool_by_id(db, ip.pool_id)
        .await?
        .map(|p| p.name)
        .unwrap_or_default();
    let attached = match ip.attachment_id {
        Some(a) => nic_ref(db, a).await?,
        None => None,
    };
    Ok(PublicIp {
        id: ip.id,
        address: ip.address.clone(),
        pool,
        tenant: tenant.to_owned(),
        attached,
        created_at: ip.created_at,
    })
}

/// The refusal of one more public address to a tenant holding `have`
/// (its own and its segments' egress addresses) of `limit`.
pub fn over_quota(tenant: &tenants::Model, have: u64, limit: u32) -> ApiError {
    ApiError::QuotaExceeded {
        resource: "public_ips".into(),
        detail: format!(
            "tenant {:?} would hold {} public IPs with this request (its segments' egress addresses count); its quota is {limit}",
            tenant.name,
            have + 1
        ),
    }
}

/// A member takes a public address for the tenant, within its
/// `public_ips` quota (checked with the tenant row held).
pub async fn allocate(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    body: &PublicIpAllocate,
) -> Result<PublicIp, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "allocating public IPs")?;
    let txn = st.db.begin().await?;
    crate::store::tenancy::lock_for_quota(&txn, tenant.id).await?;
    crate::app::budget::check_held(&txn, &tenant, kumo_billing::rates::PUBLIC_IP, actor.at).await?;
    let limit = crate::store::tenancy::load(&txn, tenant.id)
        .await?
        .public_ips;
    let have = store::count_of_tenant(&txn, tenant.id).await?;
    if have >= u64::from(limit) {
        return Err(over_quota(&tenant, have, limit));
    }
    let pools = match &body.pool {
        Some(p) => vec![store::pool_named(&txn, p).await?],
        None => store::pools(&txn).await?,
    };
    let (pool, ip) = match pick(&txn, pools, actor.at, address_rest(st)).await? {
        Pick::Free(pool, ip) => (pool, ip),
        Pick::Full(why) => return Err(ApiError::InsufficientCapacity(why)),
        Pick::NoPool => {
            return Err(ApiError::InsufficientCapacity(
                "there is no public IP pool".into(),
            ))
        }
    };
    let row = public_ips::ActiveModel {
        id: Set(Uuid::now_v7()),
        pool_id: Set(pool.id),
        address: Set(ip.to_string()),
        tenant_id: Set(Some(tenant.id)),
        segment_id: Set(None),
        attachment_id: NotSet,
        created_at: Set(actor.at),
    }
    .insert(&txn)
    .await
    // Another allocation took the same address at once: the caller retries.
    .map_err(|e| conflict_if_unique(e, || format!("{ip} was just taken; try again")))?;
    crate::app::metering::public_ip_allocated(&txn, &tenant, &row, actor.at).await?;
    audit::record(
        &txn,
        actor,
        "public-ip.allocate",
        Some(&tenant),
        &row.address,
    )
    .await?;
    txn.commit().await?;
    ip_view(&st.db, &row, &tenant.name).await
}

pub async fn list(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    params: &PageParams,
) -> Result<Page<PublicIp>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let paging = Paging::new(params.limit, params.page_token.as_deref())?;
    let rows = store::tenant_page(&st.db, tenant.id, &paging).await?;
    let (rows, next) = paging.finish(rows, |p| p.address.clone());
    let mut items = Vec::with_capacity(rows.len());
    for r in &rows {
        items.push(ip_view(&st.db, r, &tenant.name).await?);
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
    address: &str,
) -> Result<PublicIp, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let ip = store::tenant_address(&st.db, tenant.id, address).await?;
    ip_view(&st.db, &ip, &tenant.name).await
}

/// A member makes the address a NIC's 1:1 floating address: inbound to it
/// reaches the NIC (as the segment's ingress rules allow), and the VM's
/// outbound leaves from it.
pub async fn attach(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    address: &str,
    body: &PublicIpAttach,
) -> Result<PublicIp, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "attaching public IPs")?;
    crate::app::churn::take(st, &tenant, "attaching public IPs")?;
    let txn = st.db.begin().await?;
    let ip = store::tenant_address(&txn, tenant.id, address).await?;
    if let Some(a) = ip.attachment_id {
        let to = nic_ref(&txn, a).await?.map(|n| n.vm).unwrap_or_default();
        return Err(ApiError::Conflict(format!(
            "{} is attached to VM {to:?}; detach it first",
            ip.address
        )));
    }
    if !store::forwards_of_address(&txn, ip.id).await?.is_empty() {
        return Err(ApiError::Conflict(format!(
            "{} carries port forwards; a floating address is the whole address",
            ip.address
        )));
    }
    let (nic, seg, vm) = nic_of(&txn, &tenant, &body.vm, body.segment.as_deref()).await?;
    let mut a: public_ips::ActiveModel = ip.into();
    a.attachment_id = Set(Some(nic.id));
    let ip = a.update(&txn).await.map_err(|e| {
        conflict_if_unique(e, || {
            format!(
                "VM {:?} already has a floating address on {:?}",
                vm.name, seg.name
            )
        })
    })?;
    let woken = edge_changed(&txn, seg.id, actor.at, address_rest(st)).await?;
    audit::record(&txn, actor, "public-ip.attach", Some(&tenant), &ip.address).await?;
    txn.commit().await?;
    wake(st, woken);
    ip_view(&st.db, &ip, &tenant.name).await
}

pub async fn detach(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    address: &str,
) -> Result<PublicIp, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "detaching public IPs")?;
    let txn = st.db.begin().await?;
    let ip = store::tenant_address(&txn, tenant.id, address).await?;
    let Some(nic) = ip.attachment_id else {
        return ip_view(&txn, &ip, &tenant.name).await;
    };
    let segment = attachments::Entity::find_by_id(nic)
        .one(&txn)
        .await?
        .map(|a| a.segment_id);
    let mut a: public_ips::ActiveModel = ip.into();
    a.attachment_id = Set(None);
    let ip = a.update(&txn).await?;
    let woken = match segment {
        Some(s) => edge_changed(&txn, s, actor.at, address_rest(st)).await?,
        None => Vec::new(),
    };
    audit::record(&txn, actor, "public-ip.detach", Some(&tenant), &ip.address).await?;
    txn.commit().await?;
    wake(st, woken);
    ip_view(&st.db, &ip, &tenant.name).await
}

/// A member gives the address back: its floating mapping and forwards go
/// with it, in one transaction.
pub async fn release(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    address: &str,
) -> Result<(), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "releasing public IPs")?;
    let txn = st.db.begin().await?;
    let ip = store::tenant_address(&txn, tenant.id, address).await?;
    let forwards = store::forwards_of_address(&txn, ip.id).await?;
    let mut nics: Vec<Uuid> = forwards.iter().map(|f| f.attachment_id).collect();
    nics.extend(ip.attachment_id);
    port_forwards::Entity::delete_many()
        .filter(port_forwards::Column::PublicIpId.eq(ip.id))
        .exec(&txn)
        .await?;
    store::give_back(&txn, &ip, tenant.id, actor.at, address_rest(st)).await?;
    crate::app::metering::public_ip_released(&txn, &ip, actor.at).await?;
    let segs: std::collections::BTreeSet<Uuid> = attachments::Entity::find()
        .filter(attachments::Column::Id.is_in(nics))
        .all(&txn)
        .await?
        .into_iter()
        .map(|a| a.segment_id)
        .collect();
    let mut woken = Vec::new();
    for s in segs {
        woken.extend(edge_changed(&txn, s, actor.at, address_rest(st)).await?);
    }
    audit::record(&txn, actor, "public-ip.release", Some(&tenant), &ip.address).await?;
    txn.commit().await?;
    wake(st, woken);
    Ok(())
}

// --------------------------------------------------------- port forwards

/// Forwards one public address may carry: the edge's table stays small
/// whatever one tenant asks (its addresses are bounded by `public_ips`).
pub const MAX_FORWARDS_PER_ADDRESS: usize = 64;

async fn forward_view(
    db: &impl ConnectionTrait,
    f: &port_forwards::Model,
    tenant: &str,
) -> Result<PortForward, ApiError> {
    let ip = public_ips::Entity::find_by_id(f.public_ip_id)
        .one(db)
        .await?
        .map(|p| p.address)
        .unwrap_or_default();
    let to = nic_ref(db, f.attachment_id).await?.unwrap_or(NicRef {
        vm: String::new(),
        segment: String::new(),
        ip: String::new(),
    });
    Ok(PortForward {
        id: f.id,
        tenant: tenant.to_owned(),
        public_ip: ip,
        protocol: store::stored_protocol(f)?,
        public_port: u16::try_from(f.public_port).unwrap_or(0),
        to,
        private_port: u16::try_from(f.private_port).unwrap_or(0),
        created_at: f.created_at,
    })
}

/// A member forwards a port of one of the tenant's public addresses (not a
/// floating one) to a NIC's port.
pub async fn create_forward(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    body: &PortForwardCreate,
) -> Result<PortForward, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "creating port forwards")?;
    crate::app::churn::take(st, &tenant, "creating port forwards")?;
    for (field, port) in [
        ("public_port", body.public_port),
        ("private_port", body.private_port),
    ] {
        if port == 0 {
            return Err(ApiError::field(field, "a port from 1 to 65535"));
        }
    }
    body.public_ip
        .trim()
        .parse::<Ipv4Addr>()
        .map_err(|_| ApiError::field("public_ip", "an IPv4 address"))?;
    let txn = st.db.begin().await?;
    // Counted with the tenant's row held: concurrent creations cannot
    // both take the last place.
    crate::store::tenancy::lock_for_quota(&txn, tenant.id).await?;
    let ip = store::tenant_address(&txn, tenant.id, &body.public_ip).await?;
    if ip.attachment_id.is_some() {
        return Err(ApiError::Conflict(format!(
            "{} is a floating address (every port goes to its VM); detach it to forward ports",
            ip.address
        )));
    }
    let have = store::forwards_of_address(&txn, ip.id).await?.len();
    if have >= MAX_FORWARDS_PER_ADDRESS {
        return Err(ApiError::QuotaExceeded {
            resource: "port_forwards".into(),
            detail: format!(
                "{} already carries {have} forwards, the most one address may",
                ip.address
            ),
        });
    }
    let (nic, seg, _) = nic_of(&txn, &tenant, &body.vm, body.segment.as_deref()).await?;
    let f = port_forwards::ActiveModel {
        id: Set(Uuid::now_v7()),
        tenant_id: Set(tenant.id),
        public_ip_id: Set(ip.id),
        protocol: Set(body.protocol.to_text().into()),
        public_port: Set(i32::from(body.public_port)),
        attachment_id: Set(nic.id),
        private_port: Set(i32::from(body.private_port)),
        created_at: Set(actor.at),
    }
    .insert(&txn)
    .await
    .map_err(|e| {
        conflict_if_unique(e, || {
            format!(
                "{}:{}/{} is already forwarded",
                ip.address,
                body.public_port,
                body.protocol.as_str()
            )
        })
    })?;
    let woken = edge_changed(&txn, seg.id, actor.at, address_rest(st)).await?;
    let target = format!(
        "{}:{}/{}",
        ip.address,
        body.public_port,
        body.protocol.as_str()
    );
    audit::record(&txn, actor, "port-forward.create", Some(&tenant), &target).await?;
    txn.commit().await?;
    wake(st, woken);
    forward_view(&st.db, &f, &tenant.name).await
}

pub async fn list_forwards(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    params: &PageParams,
) -> Result<Page<PortForward>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let paging = Paging::new(params.limit, params.page_token.as_deref())?;
    let rows = store::forwards_page(&st.db, tenant.id, &paging).await?;
    let (rows, next) = paging.finish(rows, |f| f.id.to_string());
    let mut items = Vec::with_capacity(rows.len());
    for f in &rows {
        items.push(forward_view(&st.db, f, &tenant.name).await?);
    }
    Ok(Page {
        items,
        next_page_token: next,
    })
}

pub async fn delete_forward(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    id: &str,
) -> Result<(), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "deleting port forwards")?;
    let not_found = || ApiError::not_found(format!("port forward {id:?}"));
    let id: Uuid = id.parse().map_err(|_| not_found())?;
    let txn = st.db.begin().await?;
    let f = port_forwards::Entity::find_by_id(id)
        .filter(port_forwards::Column::TenantId.eq(tenant.id))
        .one(&txn)
        .await?
        .ok_or_else(not_found)?;
    port_forwards::Entity::delete_by_id(f.id).exec(&txn).await?;
    let segment = attachments::Entity::find_by_id(f.attachment_id)
        .one(&txn)
        .await?
        .map(|a| a.segment_id);
    let woken = match segment {
        Some(s) => edge_changed(&txn, s, actor.at, address_rest(st)).await?,
        None => Vec::new(),
    };
    audit::record(
        &txn,
        actor,
        "port-forward.delete",
        Some(&tenant),
        &f.id.to_string(),
    )
    .await?;
    txn.commit().await?;
    wake(st, woken);
    Ok(())
}
