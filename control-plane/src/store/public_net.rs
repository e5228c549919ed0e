//! Queries of public addressing: pools, the addresses in use, port
//! forwards, and what goes with a NIC when it goes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::OnConflict;
use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder,
    QuerySelect, Set,
};
use uuid::Uuid;

use crate::domain::paging::Paging;
use crate::domain::public_net::Pool;
use crate::entity::{
    attachments, port_forwards, public_ip_pools, public_ip_releases, public_ips, segments,
};
use crate::error::ApiError;

/// A forward's protocol, as stored.
pub fn stored_protocol(
    f: &port_forwards::Model,
) -> Result<kumo_api_types::ForwardProtocol, ApiError> {
    crate::domain::states::decode("port_forwards", f.id, &f.protocol)
}

/// A stored pool as the rules read it.
pub fn stored_pool(p: &public_ip_pools::Model) -> Result<Pool, ApiError> {
    let bad = |what: &str| ApiError::Internal(format!("pool {:?} has a bad {what}", p.name));
    Ok(Pool {
        cidr: crate::domain::ipam::Cidr::parse("cidr", &p.cidr).map_err(|_| bad("cidr"))?,
        gateway: p.gateway.parse().map_err(|_| bad("gateway"))?,
        first: p.first.parse().map_err(|_| bad("first address"))?,
        last: p.last.parse().map_err(|_| bad("last address"))?,
    })
}

pub async fn pools(db: &impl ConnectionTrait) -> Result<Vec<public_ip_pools::Model>, ApiError> {
    Ok(public_ip_pools::Entity::find()
        .order_by_asc(public_ip_pools::Column::Name)
        .all(db)
        .await?)
}

pub async fn pool_page(
    db: &impl ConnectionTrait,
    paging: &Paging,
) -> Result<Vec<public_ip_pools::Model>, ApiError> {
    let mut q = public_ip_pools::Entity::find().order_by_asc(public_ip_pools::Column::Name);
    if let Some(after) = &paging.after {
        q = q.filter(public_ip_pools::Column::Name.gt(after.as_str()));
    }
    Ok(q.limit(paging.fetch()).all(db).await?)
}

pub async fn pool_named(
    db: &impl ConnectionTrait,
    name: &str,
) -> Result<public_ip_pools::Model, ApiError> {
    crate::store::name_or_id(
        public_ip_pools::Entity::find(),
        public_ip_pools::Column::Id,
        public_ip_pools::Column::Name,
        name,
    )
    .one(db)
    .await?
    .ok_or_else(|| ApiError::not_found(format!("public IP pool {name:?}")))
}

pub async fn pool_by_id(
    db: &impl ConnectionTrait,
    id: Uuid,
) -> Result<Option<public_ip_pools::Model>, ApiError> {
    Ok(public_ip_pools::Entity::find_by_id(id).one(db).await?)
}

/// The addresses of a pool in use.
pub async fn taken(db: &impl ConnectionTrait, pool: Uuid) -> Result<BTreeSet<Ipv4Addr>, ApiError> {
    Ok(public_ips::Entity::find()
        .filter(public_ips::Column::PoolId.eq(pool))
        .all(db)
        .await?
        .iter()
        .filter_map(|a| a.address.parse().ok())
        .collect())
}

/// When each address was last given back (every pool's: addresses are
/// unique across pools).
pub async fn released(
    db: &impl ConnectionTrait,
) -> Result<BTreeMap<Ipv4Addr, DateTime<Utc>>, ApiError> {
    Ok(public_ip_releases::Entity::find()
        .all(db)
        .await?
        .into_iter()
        .filter_map(|r| Some((r.address.parse().ok()?, r.released_at)))
        .collect())
}

/// An address `tenant` held goes back to its pool at `at`, in the
/// caller's transaction: its row goes and the time is kept, so it rests
/// (`rest`) before anyone gets it again. A tenant keeps at most its
/// `public_ips` quota of addresses resting: past it, its longest-resting
/// ones are free at once — else allocating and releasing in a loop would
/// put a whole pool to rest, out of every other tenant's reach.
pub async fn give_back(
    db: &impl ConnectionTrait,
    ip: &public_ips::Model,
    tenant: Uuid,
    at: DateTime<Utc>,
    rest: chrono::Duration,
) -> Result<(), ApiError> {
    public_ips::Entity::delete_by_id(ip.id).exec(db).await?;
    public_ip_releases::Entity::insert(public_ip_releases::ActiveModel {
        address: Set(ip.address.clone()),
        released_at: Set(at),
        tenant_id: Set(Some(tenant)),
    })
    .on_conflict(
        OnConflict::column(public_ip_releases::Column::Address)
            .update_columns([
                public_ip_releases::Column::ReleasedAt,
                public_ip_releases::Column::TenantId,
            ])
            .to_owned(),
    )
    .exec(db)
    .await?;
    let Some(rested) = at.checked_sub_signed(rest) else {
        return Ok(());
    };
    let cap = crate::store::tenancy::load(db, tenant).await?.public_ips;
    let resting = public_ip_releases::Entity::find()
        .filter(public_ip_releases::Column::TenantId.eq(tenant))
        .filter(public_ip_releases::Column::ReleasedAt.gt(rested))
        .order_by_desc(public_ip_releases::Column::ReleasedAt)
        .order_by_desc(public_ip_releases::Column::Address)
        .all(db)
        .await?;
    let over: Vec<String> = resting
        .into_iter()
        .skip(cap.max(1) as usize)
        .map(|r| r.address)
        .collect();
    if !over.is_empty() {
        public_ip_releases::Entity::update_many()
            .col_expr(
                public_ip_releases::Column::ReleasedAt,
                sea_orm::sea_query::Expr::value(rested),
            )
            .filter(public_ip_releases::Column::Address.is_in(over))
            .exec(db)
            .await?;
    }
    Ok(())
}

pub async fn used_in(db: &impl ConnectionTrait, pool: Uuid) -> Result<u64, ApiError> {
    Ok(public_ips::Entity::find()
        .filter(public_ips::Column::PoolId.eq(pool))
        .count(db)
        .await?)
}

/// The public addresses a tenant holds, against its `public_ips` quota:
/// those it allocated and its segments' egress addresses.
pub async fn count_of_tenant(db: &impl ConnectionTrait, tenant: Uuid) -> Result<u64, ApiError> {
    let own = public_ips::Entity::find()
        .filter(public_ips::Column::TenantId.eq(tenant))
        .count(db)
        .await?;
    let segments: Vec<Uuid> = segments::Entity::find()
        .select_only()
        .column(segments::Column::Id)
        .filter(segments::Column::TenantId.eq(tenant))
        .into_tuple()
        .all(db)
        .await?;
    let egress = if segments.is_empty() {
        0
    } else {
        public_ips::Entity::find()
            .filter(public_ips::Column::SegmentId.is_in(segments))
            .count(db)
            .await?
    };
    Ok(own + egress)
}

pub async fn tenant_page(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    paging: &Paging,
) -> Result<Vec<public_ips::Model>, ApiError> {
    let mut q = public_ips::Entity::find()
        .filter(public_ips::Column::TenantId.eq(tenant))
        .order_by_asc(public_ips::Column::Address);
    if let Some(after) = &paging.after {
        q = q.filter(public_ips::Column::Address.gt(after.as_str()));
    }
    Ok(q.limit(paging.fetch()).all(db).await?)
}

/// One of the tenant's addresses; another tenant's is "not found".
pub async fn tenant_address(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    address: &str,
) -> Result<public_ips::Model, ApiError> {
    public_ips::Entity::find()
        .filter(public_ips::Column::TenantId.eq(tenant))
        .filter(public_ips::Column::Address.eq(address.trim()))
        .one(db)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("public IP {address:?}")))
}

/// A segment edge's egress address.
pub async fn snat_of(
    db: &impl ConnectionTrait,
    segment: Uuid,
) -> Result<Option<public_ips::Model>, ApiError> {
    Ok(public_ips::Entity::find()
        .filter(public_ips::Column::SegmentId.eq(segment))
        .one(db)
        .await?)
}

pub async fn forwards_page(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    paging: &Paging,
) -> Result<Vec<port_forwards::Model>, ApiError> {
    let mut q = port_forwards::Entity::find()
        .filter(port_forwards::Column::TenantId.eq(tenant))
        .order_by_asc(port_forwards::Column::Id);
    if let Some(after) = &paging.after {
        let after: Uuid = after
            .parse()
            .map_err(|_| ApiError::field("page_token", "not a page token returned by this API"))?;
        q = q.filter(port_forwards::Column::Id.gt(after));
    }
    Ok(q.limit(paging.fetch()).all(db).await?)
}

pub async fn forwards_of_address(
    db: &impl ConnectionTrait,
    public_ip: Uuid,
) -> Result<Vec<port_forwards::Model>, ApiError> {
    Ok(port_forwards::Entity::find()
        .filter(port_forwards::Column::PublicIpId.eq(public_ip))
        .all(db)
        .await?)
}

/// The floating addresses and forwards that lead to NICs of these
/// segments: what their edges carry.
pub struct EdgeRules {
    pub floating: Vec<public_ips::Model>,
    pub forwards: Vec<port_forwards::Model>,
    /// The NICs they lead to.
    pub nics: Vec<attachments::Model>,
    /// The addresses forwards use.
    pub forwarded: Vec<public_ips::Model>,
}

pub async fn edge_rules(
    db: &impl ConnectionTrait,
    segments: &[Uuid],
) -> Result<EdgeRules, ApiError> {
    let nics = attachments::Entity::find()
        .filter(attachments::Column::SegmentId.is_in(segments.iter().copied()))
        .all(db)
        .await?;
    let ids: Vec<Uuid> = nics.iter().map(|a| a.id).collect();
    let floating = public_ips::Entity::find()
        .filter(public_ips::Column::AttachmentId.is_in(ids.iter().copied()))
        .all(db)
        .await?;
    let forwards = port_forwards::Entity::find()
        .filter(port_forwards::Column::AttachmentId.is_in(ids.iter().copied()))
        .all(db)
        .await?;
    let forwarded = public_ips::Entity::find()
        .filter(public_ips::Column::Id.is_in(forwards.iter().map(|f| f.public_ip_id)))
        .all(db)
        .await?;
    Ok(EdgeRules {
        floating,
        forwards,
        nics,
        forwarded,
    })
}

/// The segments whose edge a host carries.
pub async fn edges_on(
    db: &impl ConnectionTrait,
    host: Uuid,
) -> Result<Vec<segments::Model>, ApiError> {
    Ok(segments::Entity::find()
        .filter(segments::Column::EdgeHostId.eq(host))
        .order_by_asc(segments::Column::Vni)
        .all(db)
        .await?)
}

/// Segments with a floating address or forward to one of their NICs.
pub async fn published_segments(db: &impl ConnectionTrait) -> Result<BTreeSet<Uuid>, ApiError> {
    let floating: Vec<Uuid> = public_ips::Entity::find()
        .filter(public_ips::Column::AttachmentId.is_not_null())
        .all(db)
        .await?
        .into_iter()
        .filter_map(|p| p.attachment_id)
        .collect();
    let forwarded: Vec<Uuid> = port_forwards::Entity::find()
        .all(db)
        .await?
        .into_iter()
        .map(|f| f.attachment_id)
        .collect();
    Ok(attachments::Entity::find()
        .filter(attachments::Column::Id.is_in(floating.into_iter().chain(forwarded)))
        .all(db)
        .await?
        .into_iter()
        .map(|a| a.segment_id)
        .collect())
}

/// Per NIC, its floating address and the forwards to it.
pub async fn published_to(
    db: &impl ConnectionTrait,
    nics: &[attachments::Model],
) -> Result<
    std::collections::HashMap<Uuid, (Option<String>, Vec<kumo_api_types::NicForward>)>,
    ApiError,
> {
    let ids: Vec<Uuid> = nics.iter().map(|a| a.id).collect();
    let mut out: std::collections::HashMap<Uuid, (Option<String>, Vec<_>)> = Default::default();
    if ids.is_empty() {
        return Ok(out);
    }
    for ip in public_ips::Entity::find()
        .filter(public_ips::Column::AttachmentId.is_in(ids.iter().copied()))
        .all(db)
        .await?
    {
        if let Some(a) = ip.attachment_id {
            out.entry(a).or_default().0 = Some(ip.address);
        }
    }
    let forwards = port_forwards::Entity::find()
        .filter(port_forwards::Column::AttachmentId.is_in(ids))
        .all(db)
        .await?;
    let addresses: std::collections::HashMap<Uuid, String> = public_ips::Entity::find()
        .filter(public_ips::Column::Id.is_in(forwards.iter().map(|f| f.public_ip_id)))
        .all(db)
        .await?
        .into_iter()
        .map(|p| (p.id, p.address))
        .collect();
    for f in forwards {
        out.entry(f.attachment_id)
            .or_default()
            .1
            .push(kumo_api_types::NicForward {
                public_ip: addresses.get(&f.public_ip_id).cloned().unwrap_or_default(),
                public_port: u16::try_from(f.public_port).unwrap_or(0),
                protocol: stored_protocol(&f)?,
                private_port: u16::try_from(f.private_port).unwrap_or(0),
            });
    }
    Ok(out)
}

/// A VM's NICs are going: their floating addresses return to the tenant
/// unattached and their forwards are deleted, in the caller's transaction.
pub async fn release_nics_of(db: &impl ConnectionTrait, vm: Uuid) -> Result<(), ApiError> {
    let nics: Vec<Uuid> = attachments::Entity::find()
        .filter(attachments::Column::VmId.eq(vm))
        .all(db)
        .await?
        .into_iter()
        .map(|a| a.id)
        .collect();
    if nics.is_empty() {
        return Ok(());
    }
    public_ips::Entity::update_many()
        .col_expr(
            public_ips::Column::AttachmentId,
            sea_orm::sea_query::Expr::value(Option::<Uuid>::None),
        )
        .filter(public_ips::Column::AttachmentId.is_in(nics.iter().copied()))
        .exec(db)
        .await?;
    port_forwards::Entity::delete_many()
        .filter(port_forwards::Column::AttachmentId.is_in(nics))
        .exec(db)
        .await?;
    Ok(())
}
