//! Segment use cases (Ethernet or RoCE over VXLAN): a VNI leased
//! atomically from the configured ranges, a CIDR with its gateway and MTU,
//! ingress rules; the VMs' attachments are made in the VM's own
//! transaction.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use kumo_api_types::{
    Page, PageParams, Role, Segment, SegmentCreate, SegmentEdge, SegmentFault, SegmentIngress,
    SegmentKind, SegmentUpdate,
};
use sea_orm::{
    ActiveModelTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, Set, TransactionTrait,
};
use uuid::Uuid;

use crate::app::access::tenant_access;
use crate::app::audit;
use crate::context::{Actor, AppState};
use crate::domain::ipam::{self, Cidr};
use crate::domain::names;
use crate::domain::paging::Paging;
use crate::domain::states::StoredText;
use crate::entity::{segments, tenants};
use crate::error::{is_unique_violation, ApiError};
use crate::store::segments::{count_attached, stored_kind, stored_rules};

/// Tries at leasing a VNI when other servers lease at the same time. Each
/// round has a winner, so this bounds the concurrent creations that all
/// succeed; a jittered pause between rounds keeps losers from meeting again.
const VNI_ROUNDS: u32 = 64;

/// A segment as the API shows it, with how many NICs are attached to it.
pub fn view(
    s: &segments::Model,
    tenant: &str,
    attached: u64,
    faults: &Faults,
    edge: Edge,
) -> Result<Segment, ApiError> {
    let kind = stored_kind(s)?;
    let mtu = u32::try_from(s.mtu).unwrap_or(0);
    let mut faults = faults.of(s.vni);
    faults.extend(edge.fault);
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
        faults,
        egress: s.egress,
        edge: edge.edge,
        created_at: s.created_at,
    })
}

/// A segment's edge as the API shows it, and the fault of an egress
/// without an address.
#[derive(Default)]
pub struct Edge {
    edge: Option<SegmentEdge>,
    fault: Option<SegmentFault>,
}

/// Where the segment's edge is, and, where its egress is on but it holds
/// no address, why (a fault, named by its edge host if it has one).
pub async fn edge_of(
    st: &AppState,
    db: &impl ConnectionTrait,
    s: &segments::Model,
) -> Result<Edge, ApiError> {
    let host = match s.edge_host_id {
        Some(h) => crate::store::hosts::by_id(db, h).await?.map(|h| h.name),
        None => None,
    };
    let snat = crate::store::public_net::snat_of(db, s.id).await?;
    let fault = if s.egress && snat.is_none() && stored_kind(s)? == SegmentKind::Ethernet {
        let rest = crate::app::public_net::address_rest(st);
        crate::app::edges::why_no_egress(db, s, st.config.clock.now(), rest)
            .await?
            .and_then(|why| why.fault())
            .map(|message| SegmentFault {
                host: host.clone().unwrap_or_default(),
                message,
            })
    } else {
        None
    };
    Ok(Edge {
        edge: host.map(|host| SegmentEdge {
            host,
            snat_address: snat.map(|a| a.address),
        }),
        fault,
    })
}

/// The segment's gateway: the one asked for, a host address of its CIDR,
/// or its first host address.
fn gateway_of(cidr: &Cidr, asked: Option<&str>) -> Result<Ipv4Addr, ApiError> {
    let Some(g) = asked else {
        return Ok(cidr.first_host());
    };
    let g: Ipv4Addr = g
        .parse()
        .map_err(|_| ApiError::field("gateway", format!("{g:?} is not an IPv4 address")))?;
    if !cidr.is_host(g) {
        return Err(ApiError::field(
            "gateway",
            format!("{g} is not a host address of {cidr}"),
        ));
    }
    Ok(g)
}

/// A tenant's share of the shared VNI and RoCE VLAN pools is its segment
/// quota: one member cannot drain them for everyone. Holds the tenant's
/// row to the end of the transaction.
async fn check_quota(
    txn: &DatabaseTransaction,
    tenant: &tenants::Model,
    kind: SegmentKind,
) -> Result<(), ApiError> {
    crate::store::tenancy::lock_for_quota(txn, tenant.id).await?;
    let quota = crate::store::tenancy::load(txn, tenant.id).await?;
    let over = |resource: &str, have: u64, limit: u32| {
        (have >= u64::from(limit)).then(|| ApiError::QuotaExceeded {
            resource: resource.into(),
            detail: format!(
                "tenant {:?} would use {} {resource} with this request; its quota is {limit}",
                tenant.name,
                have + 1
            ),
        })
    };
    let have = crate::store::segments::count_of(txn, tenant.id, None).await?;
    if let Some(e) = over("segments", have, quota.segments) {
        return Err(e);
    }
    if kind == SegmentKind::Roce {
        let roce = crate::store::segments::count_of(txn, tenant.id, Some(kind)).await?;
        if let Some(e) = over("roce_segments", roce, quota.roce_segments) {
            return Err(e);
        }
    }
    Ok(())
}

/// A RoCE VLAN no live segment holds and none freed recently rests on.
async fn free_vlan(
    st: &AppState,
    txn: &DatabaseTransaction,
    quarantine: chrono::Duration,
) -> Result<i32, ApiError> {
    let taken = crate::store::segments::taken_vlans(txn, st.config.clock.now(), quarantine).await?;
    st.config
        .network
        .roce_vlans
        .clone()
        .map(i32::from)
        .find(|v| !taken.contains(v))
        .ok_or_else(|| ApiError::InsufficientCapacity("every RoCE VLAN is in use".into()))
}

/// What hosts said they could not set up, by VNI.
#[derive(Default)]
pub struct Faults(BTreeMap<i32, Vec<SegmentFault>>);

impl Faults {
    /// Every host's reported faults, read once for a page of segments.
    pub async fn load(db: &impl ConnectionTrait) -> Result<Faults, ApiError> {
        let mut by_vni: BTreeMap<i32, Vec<SegmentFault>> = BTreeMap::new();
        for h in crate::store::hosts::with_segment_faults(db).await? {
            for (vni, message) in crate::domain::faults::read(h.segment_faults.as_deref()) {
                let Ok(vni) = i32::try_from(vni) else {
                    continue;
                };
                by_vni.entry(vni).or_default().push(SegmentFault {
                    host: h.name.clone(),
                    message,
                });
            }
        }
        Ok(Faults(by_vni))
    }

    fn of(&self, vni: i32) -> Vec<SegmentFault> {
        self.0.get(&vni).cloned().unwrap_or_default()
    }
}

/// A member creates a segment. Its VNI is leased atomically: no two live
/// segments share one, and a freed VNI rests before reuse.
pub async fn create(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    body: &SegmentCreate,
) -> Result<Segment, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "creating segments")?;
    crate::app::churn::take(st, &tenant, "creating segments")?;
    let net = &st.config.network;
    names::tenant_name("name", &body.name)?;
    let cidr = Cidr::for_tenant("cidr", &body.cidr, &net.tenant_ranges)?;
    let gateway = gateway_of(&cidr, body.gateway.as_deref())?;
    let mtu = ipam::segment_mtu(net.underlay_mtu, body.mtu)?;
    let ingress = crate::domain::ingress::rules_json("ingress", &body.ingress)?;
    let egress = match (body.kind, body.egress) {
        (SegmentKind::Ethernet, e) => e.unwrap_or(true),
        (SegmentKind::Roce, Some(true)) => {
            return Err(ApiError::field(
                "egress",
                "RoCE segments carry only the GPUs' traffic among themselves",
            ))
        }
        (SegmentKind::Roce, _) => false,
    };
    let quarantine = chrono::Duration::from_std(net.vni_quarantine)
        .unwrap_or_else(|_| chrono::Duration::seconds(600));
    let id = Uuid::now_v7();
    for round in 0..VNI_ROUNDS {
        if round > 0 {
            let pause = rand::random::<u64>() % 10 + 1;
            tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
        }
        let txn = st.db.begin().await?;
        check_quota(&txn, &tenant, body.kind).await?;
        if egress {
            // Egress holds a public address (the segment's source address).
            let now = st.config.clock.now();
            crate::app::budget::check_held(&txn, &tenant, kumo_billing::rates::PUBLIC_IP, now)
                .await?;
        }
        let leased = crate::store::segments::lease_vni(
            &txn,
            &net.vni_ranges,
            quarantine,
            st.config.clock.now(),
            id,
        )
        .await?;
        let Some(vni) = leased else {
            continue;
        };
        let vlan = match body.kind {
            SegmentKind::Ethernet => None,
            SegmentKind::Roce => Some(free_vlan(st, &txn, quarantine).await?),
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
            created_at: Set(st.config.clock.now()),
            ingress_rules: Set(ingress.clone()),
            vlan: Set(vlan),
            egress: Set(egress),
            edge_host_id: Set(None),
        }
        .insert(&txn)
        .await;
        let row = match row {
            Ok(r) => r,
            Err(e) if is_unique_violation(&e) => {
                // Done with it first: on SQLite it holds the one writer
                // connection the lookup below would wait for.
                txn.rollback().await?;
                let exists = crate::store::segments::named(&st.db, tenant.id, &body.name).await?;
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
        let rest = crate::app::public_net::address_rest(st);
        let done = crate::app::edges::ensure(&txn, &row, st.config.clock.now(), rest).await?;
        // Egress without an address is refused, with the reason (the
        // pools are out of addresses, or the quota is used up): the
        // transaction goes, VNI lease included.
        if let Some(e) = done.no_egress.and_then(|why| why.refusal(&tenant)) {
            return Err(e);
        }
        let woken = done.woken;
        audit::record(&txn, actor, "segment.create", Some(&tenant), &body.name).await?;
        txn.commit().await?;
        for h in woken {
            st.signals.notify(h);
        }
        let row = crate::store::segments::find(&st.db, &tenant, &row.id.to_string()).await?;
        let edge = edge_of(st, &st.db, &row).await?;
        return view(&row, &tenant.name, 0, &Faults::default(), edge);
    }
    Err(ApiError::Conflict(
        "could not lease a VNI under contention; retry".into(),
    ))
}

/// One page of a tenant's segments, by name (any member).
pub async fn list(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    params: &PageParams,
) -> Result<Page<Segment>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let paging = Paging::new(params.limit, params.page_token.as_deref())?;
    let rows = crate::store::segments::page(&st.db, tenant.id, &paging).await?;
    let (rows, next) = paging.finish(rows, |s| s.name.clone());
    let faults = Faults::load(&st.db).await?;
    let mut items = Vec::with_capacity(rows.len());
    for s in &rows {
        let n = count_attached(&st.db, s.id).await?;
        items.push(view(
            s,
            &tenant.name,
            n,
            &faults,
            edge_of(st, &st.db, s).await?,
        )?);
    }
    Ok(Page {
        items,
        next_page_token: next,
    })
}

/// A tenant's segment (any member).
pub async fn show(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    segment: &str,
) -> Result<Segment, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let s = crate::store::segments::find(&st.db, &tenant, segment).await?;
    let n = count_attached(&st.db, s.id).await?;
    let edge = edge_of(st, &st.db, &s).await?;
    view(&s, &tenant.name, n, &Faults::load(&st.db).await?, edge)
}

/// A member switches a segment's egress; its edge follows (placed, or
/// given up when nothing else needs it).
pub async fn update(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    segment: &str,
    body: &SegmentUpdate,
) -> Result<Segment, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "changing segments")?;
    crate::app::churn::take(st, &tenant, "changing segments")?;
    let txn = st.db.begin().await?;
    let mut s = crate::store::segments::find(&txn, &tenant, segment).await?;
    let mut woken = Vec::new();
    if let Some(egress) = body.egress.filter(|e| *e != s.egress) {
        if egress && stored_kind(&s)? != SegmentKind::Ethernet {
            return Err(ApiError::field(
                "egress",
                "RoCE segments carry only the GPUs' traffic among themselves",
            ));
        }
        if egress {
            let class = kumo_billing::rates::PUBLIC_IP;
            crate::app::budget::check_held(&txn, &tenant, class, actor.at).await?;
        }
        let mut a: segments::ActiveModel = s.into();
        a.egress = Set(egress);
        s = a.update(&txn).await?;
        let rest = crate::app::public_net::address_rest(st);
        let done = crate::app::edges::ensure(&txn, &s, actor.at, rest).await?;
        // Egress switched on without an address is refused with the
        // reason, and nothing changes.
        if let Some(e) = done.no_egress.and_then(|why| why.refusal(&tenant)) {
            return Err(e);
        }
        woken = done.woken;
        audit::record(&txn, actor, "segment.update", Some(&tenant), &s.name).await?;
    }
    let s = segments::Entity::find_by_id(s.id)
        .one(&txn)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("segment {segment:?}")))?;
    let n = count_attached(&txn, s.id).await?;
    let edge = edge_of(st, &txn, &s).await?;
    txn.commit().await?;
    for h in woken {
        st.signals.notify(h);
    }
    view(&s, &tenant.name, n, &Faults::load(&st.db).await?, edge)
}

/// A member replaces a segment's ingress rules; the hosts with its VMs
/// are woken to apply them.
pub async fn set_ingress(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    segment: &str,
    body: &SegmentIngress,
) -> Result<Segment, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "changing segment rules")?;
    crate::app::churn::take(st, &tenant, "changing segment rules")?;
    let rules = crate::domain::ingress::rules_json("rules", &body.rules)?;
    let txn = st.db.begin().await?;
    let s = crate::store::segments::find(&txn, &tenant, segment).await?;
    let mut a: segments::ActiveModel = s.clone().into();
    a.ingress_rules = Set(rules);
    let s = a.update(&txn).await?;
    let hosts = crate::app::host_network::touch_segments(&txn, vec![s.id]).await?;
    audit::record(&txn, actor, "segment.ingress", Some(&tenant), &s.name).await?;
    let n = count_attached(&txn, s.id).await?;
    let edge = edge_of(st, &txn, &s).await?;
    txn.commit().await?;
    for h in hosts {
        st.signals.notify(h);
    }
    view(&s, &tenant.name, n, &Faults::load(&st.db).await?, edge)
}

/// A member deletes a segment without attachments; its VNI rests for the
/// configured quarantine before another segment gets it.
pub async fn delete(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    segment: &str,
) -> Result<(), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "deleting segments")?;
    let txn = st.db.begin().await?;
    let s = crate::store::segments::find(&txn, &tenant, segment).await?;
    let edge = remove(st, &txn, actor, &tenant, s).await?;
    txn.commit().await?;
    if let Some(h) = edge {
        st.signals.notify(h);
    }
    Ok(())
}

/// Deletes segment `s` in `txn` (refused while VMs are attached): its
/// egress address back to the pool, its VNI (and VLAN) to rest. Answers
/// its edge's host, to be woken once `txn` commits.
pub(crate) async fn remove(
    st: &AppState,
    txn: &DatabaseTransaction,
    actor: &Actor,
    tenant: &tenants::Model,
    s: segments::Model,
) -> Result<Option<Uuid>, ApiError> {
    let n = count_attached(txn, s.id).await?;
    if n > 0 {
        return Err(ApiError::Conflict(format!(
            "segment {:?} has {n} VM attachment(s); delete or detach them first",
            s.name
        )));
    }
    // The attachment FK (RESTRICT) makes a concurrent attach fail rather
    // than dangle. Its egress address goes back to the pool (to rest
    // there) and its edge host drops the edge.
    if let Some(snat) = crate::store::public_net::snat_of(txn, s.id).await? {
        let rest = crate::app::public_net::address_rest(st);
        crate::store::public_net::give_back(txn, &snat, s.tenant_id, actor.at, rest).await?;
        crate::app::metering::public_ip_released(txn, &snat, actor.at).await?;
    }
    if let Some(h) = s.edge_host_id {
        crate::app::host_network::touch_hosts(txn, &[h]).await?;
    }
    segments::Entity::delete_by_id(s.id).exec(txn).await?;
    crate::store::segments::release_vni(txn, s.vni, s.vlan, st.config.clock.now()).await?;
    audit::record(txn, actor, "segment.delete", Some(tenant), &s.name).await?;
    Ok(s.edge_host_id)
}
