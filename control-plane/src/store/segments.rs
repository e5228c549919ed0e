//! Queries over segments and VM attachments: stored kinds, CIDRs and
//! rules, attaching NICs, the networks of VMs, VNI leases.

use std::collections::{BTreeSet, HashMap};
use std::net::Ipv4Addr;

use chrono::{DateTime, Utc};
use kumo_api_types::{IngressRule, SegmentKind, VmNetwork};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait,
    PaginatorTrait, QueryFilter, QueryOrder, QuerySelect, Set,
};
use uuid::Uuid;

use crate::domain::ipam::{self, Cidr, Lease, NextVni};
use crate::domain::paging::Paging;
use crate::domain::states::{decode, StoredText};
use crate::entity::{attachments, segments, tenants, vni_leases};
use crate::error::{is_unique_violation, ApiError};

pub fn stored_kind(s: &segments::Model) -> Result<SegmentKind, ApiError> {
    decode("segments", s.id, &s.kind)
}

pub fn stored_cidr(s: &segments::Model) -> Result<Cidr, ApiError> {
    Cidr::parse("cidr", &s.cidr)
        .map_err(|_| ApiError::Internal(format!("segment {} has CIDR {:?}", s.id, s.cidr)))
}

pub fn stored_gateway(s: &segments::Model) -> Result<Ipv4Addr, ApiError> {
    s.gateway
        .parse()
        .map_err(|_| ApiError::Internal(format!("segment {} has gateway {:?}", s.id, s.gateway)))
}

/// A segment's stored ingress rules (checked when stored).
pub fn stored_rules(s: &segments::Model) -> Vec<IngressRule> {
    s.ingress_rules
        .as_deref()
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default()
}

/// A NIC a new VM asked for, its segment found and its address checked.
#[derive(Debug, Clone)]
pub struct PlannedNic {
    pub kind: SegmentKind,
    pub segment: segments::Model,
    pub ip: Option<Ipv4Addr>,
}

/// Attaches a VM inside its creating transaction: an address (the asked
/// one, else the lowest free) and a fresh MAC per NIC. A unique violation
/// means another transaction took the address or MAC: the caller retries.
/// A RoCE segment gets its first rail here, the rest once placed
/// ([`ensure_rails`]).
pub async fn attach(
    txn: &DatabaseTransaction,
    vm: Uuid,
    nics: &[PlannedNic],
    now: DateTime<Utc>,
) -> Result<Result<(), ApiError>, sea_orm::DbErr> {
    for nic in nics {
        if let Err(e) = attach_one(txn, vm, &nic.segment, nic.ip, now).await? {
            return Ok(Err(e));
        }
    }
    Ok(Ok(()))
}

async fn attach_one(
    txn: &DatabaseTransaction,
    vm: Uuid,
    segment: &segments::Model,
    asked: Option<Ipv4Addr>,
    now: DateTime<Utc>,
) -> Result<Result<(), ApiError>, sea_orm::DbErr> {
    use rand::Rng;
    let taken: BTreeSet<Ipv4Addr> = attachments::Entity::find()
        .filter(attachments::Column::SegmentId.eq(segment.id))
        .all(txn)
        .await?
        .iter()
        .filter_map(|a| a.ip.parse().ok())
        .collect();
    let pick = stored_cidr(segment)
        .and_then(|c| Ok((c, stored_gateway(segment)?)))
        .and_then(|(c, g)| ipam::pick_address(&c, g, &taken, asked));
    let ip = match pick {
        Ok(ip) => ip,
        Err(e) => return Ok(Err(e)),
    };
    // Drawn before the await: the thread's RNG stays on this thread.
    let random: u32 = rand::thread_rng().gen();
    attachments::ActiveModel {
        id: Set(Uuid::now_v7()),
        vm_id: Set(vm),
        segment_id: Set(segment.id),
        ip: Set(ip.to_string()),
        mac: Set(ipam::mac_from(random)),
        created_at: Set(now),
    }
    .insert(txn)
    .await?;
    Ok(Ok(()))
}

/// A placed VM on a RoCE segment has one NIC there per rail (per VF it
/// was given), each with its own address and MAC: adds the missing ones,
/// removes the surplus (a VM placed again on a host with fewer NICs).
pub async fn ensure_rails(
    txn: &DatabaseTransaction,
    vm: Uuid,
    rails: usize,
    now: DateTime<Utc>,
) -> Result<Result<(), ApiError>, sea_orm::DbErr> {
    let rows = attachments::Entity::find()
        .filter(attachments::Column::VmId.eq(vm))
        .order_by_asc(attachments::Column::Id)
        .all(txn)
        .await?;
    let roce = segments::Entity::find()
        .filter(segments::Column::Id.is_in(rows.iter().map(|a| a.segment_id)))
        .filter(segments::Column::Kind.eq(SegmentKind::Roce.to_text()))
        .all(txn)
        .await?;
    for s in &roce {
        let mine: Vec<&attachments::Model> = rows.iter().filter(|a| a.segment_id == s.id).collect();
        for _ in mine.len()..rails {
            if let Err(e) = attach_one(txn, vm, s, None, now).await? {
                return Ok(Err(e));
            }
        }
        for extra in mine.iter().skip(rails.max(1)) {
            attachments::Entity::delete_by_id(extra.id)
                .exec(txn)
                .await?;
        }
    }
    Ok(Ok(()))
}

/// The segments a VM has NICs on.
pub async fn segments_of(db: &impl ConnectionTrait, vm: Uuid) -> Result<Vec<Uuid>, ApiError> {
    let segs: BTreeSet<Uuid> = attachments::Entity::find()
        .filter(attachments::Column::VmId.eq(vm))
        .all(db)
        .await?
        .into_iter()
        .map(|a| a.segment_id)
        .collect();
    Ok(segs.into_iter().collect())
}

/// `(any segment, a RoCE segment)` among the VM's NICs.
pub async fn kinds_of(db: &impl ConnectionTrait, vm: Uuid) -> Result<(bool, bool), ApiError> {
    let segs = segments_of(db, vm).await?;
    if segs.is_empty() {
        return Ok((false, false));
    }
    let roce = segments::Entity::find()
        .filter(segments::Column::Id.is_in(segs))
        .filter(segments::Column::Kind.eq(SegmentKind::Roce.to_text()))
        .count(db)
        .await?
        > 0;
    Ok((true, roce))
}

/// The NICs of the given VMs, in creation order.
pub async fn networks_of(
    db: &impl ConnectionTrait,
    vms: &[Uuid],
) -> Result<HashMap<Uuid, Vec<VmNetwork>>, ApiError> {
    let rows = attachments::Entity::find()
        .filter(attachments::Column::VmId.is_in(vms.iter().copied()))
        .order_by_asc(attachments::Column::Id)
        .all(db)
        .await?;
    let seg_ids: Vec<Uuid> = rows.iter().map(|a| a.segment_id).collect();
    let names: HashMap<Uuid, String> = segments::Entity::find()
        .filter(segments::Column::Id.is_in(seg_ids))
        .all(db)
        .await?
        .into_iter()
        .map(|s| (s.id, s.name))
        .collect();
    let published = crate::store::public_net::published_to(db, &rows).await?;
    let mut out: HashMap<Uuid, Vec<VmNetwork>> = HashMap::new();
    for a in rows {
        let (public_ip, forwards) = published.get(&a.id).cloned().unwrap_or_default();
        out.entry(a.vm_id).or_default().push(VmNetwork {
            segment: names.get(&a.segment_id).cloned().unwrap_or_default(),
            ip: a.ip,
            mac: a.mac,
            public_ip,
            forwards,
        });
    }
    Ok(out)
}

/// A VM row is gone: so are its attachments (same transaction).
pub async fn detach_all(txn: &DatabaseTransaction, vm: Uuid) -> Result<(), ApiError> {
    attachments::Entity::delete_many()
        .filter(attachments::Column::VmId.eq(vm))
        .exec(txn)
        .await?;
    Ok(())
}

pub async fn count_attached(db: &impl ConnectionTrait, segment: Uuid) -> Result<u64, ApiError> {
    Ok(attachments::Entity::find()
        .filter(attachments::Column::SegmentId.eq(segment))
        .count(db)
        .await?)
}

pub async fn find(
    db: &impl ConnectionTrait,
    tenant: &tenants::Model,
    segment: &str,
) -> Result<segments::Model, ApiError> {
    crate::store::name_or_id(
        segments::Entity::find().filter(segments::Column::TenantId.eq(tenant.id)),
        segments::Column::Id,
        segments::Column::Name,
        segment,
    )
    .one(db)
    .await?
    .ok_or_else(|| ApiError::not_found(format!("segment {segment:?}")))
}

/// One page of a tenant's segments, by name.
pub async fn page(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    paging: &Paging,
) -> Result<Vec<segments::Model>, ApiError> {
    let mut query = segments::Entity::find()
        .filter(segments::Column::TenantId.eq(tenant))
        .order_by_asc(segments::Column::Name);
    if let Some(after) = &paging.after {
        query = query.filter(segments::Column::Name.gt(after.as_str()));
    }
    Ok(query.limit(paging.fetch()).all(db).await?)
}

/// How many segments a tenant has (of one kind, or all).
pub async fn count_of(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    kind: Option<SegmentKind>,
) -> Result<u64, ApiError> {
    let mut q = segments::Entity::find().filter(segments::Column::TenantId.eq(tenant));
    if let Some(k) = kind {
        q = q.filter(segments::Column::Kind.eq(k.to_text()));
    }
    Ok(q.count(db).await?)
}

/// A tenant's segment by exact name.
pub async fn named(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    name: &str,
) -> Result<Option<segments::Model>, ApiError> {
    Ok(segments::Entity::find()
        .filter(segments::Column::TenantId.eq(tenant))
        .filter(segments::Column::Name.eq(name))
        .one(db)
        .await?)
}

/// The RoCE VLANs segments hold.
pub async fn taken_vlans(
    db: &impl ConnectionTrait,
    now: DateTime<Utc>,
    quarantine: chrono::Duration,
) -> Result<BTreeSet<i32>, ApiError> {
    let mut taken: BTreeSet<i32> = segments::Entity::find()
        .filter(segments::Column::Vlan.is_not_null())
        .all(db)
        .await?
        .into_iter()
        .filter_map(|s| s.vlan)
        .collect();
    // A deleted RoCE segment's VLAN rests as its VNI does.
    taken.extend(
        vni_leases::Entity::find()
            .filter(vni_leases::Column::Vlan.is_not_null())
            .filter(vni_leases::Column::ReleasedAt.gt(now - quarantine))
            .all(db)
            .await?
            .into_iter()
            .filter_map(|l| l.vlan),
    );
    Ok(taken)
}

/// Leases the lowest free VNI of `ranges` for `segment` inside `txn`
/// (a released VNI rests for `quarantine` first). `Ok(None)` when another
/// server took it first (try again in a new transaction).
pub async fn lease_vni(
    txn: &DatabaseTransaction,
    ranges: &[std::ops::RangeInclusive<u32>],
    quarantine: chrono::Duration,
    now: DateTime<Utc>,
    segment: Uuid,
) -> Result<Option<u32>, ApiError> {
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
    let next = ipam::next_vni(ranges, &leases, now, quarantine).ok_or_else(|| {
        ApiError::InsufficientCapacity("every VNI of the configured ranges is in use".into())
    })?;
    match next {
        NextVni::Fresh(vni) => {
            let r = vni_leases::ActiveModel {
                vni: Set(vni as i32),
                segment_id: Set(Some(segment)),
                released_at: Set(None),
                vlan: Set(None),
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
                    Expr::value(None::<DateTime<Utc>>),
                )
                .col_expr(vni_leases::Column::Vlan, Expr::value(None::<i32>))
                .filter(vni_leases::Column::Vni.eq(vni as i32))
                .filter(vni_leases::Column::SegmentId.is_null())
                .filter(vni_leases::Column::ReleasedAt.lte(now - quarantine))
                .exec(txn)
                .await?;
            Ok((r.rows_affected == 1).then_some(vni))
        }
    }
}

/// A segment's VNI is free again from `at` (it rests before reuse).
pub async fn release_vni(
    txn: &DatabaseTransaction,
    vni: i32,
    vlan: Option<i32>,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    vni_leases::Entity::update_many()
        .col_expr(vni_leases::Column::SegmentId, Expr::value(None::<Uuid>))
        .col_expr(vni_leases::Column::ReleasedAt, Expr::value(Some(at)))
        .col_expr(vni_leases::Column::Vlan, Expr::value(vlan))
        .filter(vni_leases::Column::Vni.eq(vni))
        .exec(txn)
        .await?;
    Ok(())
}
