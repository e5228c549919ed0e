//! Queries of the console relay's rows: replicas, tickets, dials, links
//! and seats (`crate::app::consoles` owns when each is written).

use chrono::{DateTime, Utc};
use sea_orm::sea_query::OnConflict;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, PaginatorTrait,
    QueryFilter, QueryOrder, QuerySelect,
};
use uuid::Uuid;

use crate::entity::{console_dials, console_links, console_seats, console_tickets, replicas};

/// Records that replica `id`, reached at `url`, is alive at `now`.
pub async fn beat(
    db: &impl ConnectionTrait,
    id: Uuid,
    url: &str,
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    replicas::Entity::insert(replicas::ActiveModel {
        id: Set(id),
        url: Set(url.to_owned()),
        seen_at: Set(now),
    })
    .on_conflict(
        OnConflict::column(replicas::Column::Id)
            .update_columns([replicas::Column::Url, replicas::Column::SeenAt])
            .to_owned(),
    )
    .exec(db)
    .await?;
    Ok(())
}

/// A replica seen since `since`.
pub async fn live_replica(
    db: &impl ConnectionTrait,
    id: Uuid,
    since: DateTime<Utc>,
) -> Result<Option<replicas::Model>, DbErr> {
    replicas::Entity::find_by_id(id)
        .filter(replicas::Column::SeenAt.gte(since))
        .one(db)
        .await
}

/// The replicas seen since `since`.
pub async fn live_replicas(
    db: &impl ConnectionTrait,
    since: DateTime<Utc>,
) -> Result<Vec<Uuid>, DbErr> {
    replicas::Entity::find()
        .select_only()
        .column(replicas::Column::Id)
        .filter(replicas::Column::SeenAt.gte(since))
        .into_tuple()
        .all(db)
        .await
}

/// A tenant's tickets and dials that have not expired.
pub async fn waiting(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    now: DateTime<Utc>,
) -> Result<u64, DbErr> {
    let tickets = console_tickets::Entity::find()
        .filter(console_tickets::Column::TenantId.eq(tenant))
        .filter(console_tickets::Column::ExpiresAt.gt(now))
        .count(db)
        .await?;
    let dials = console_dials::Entity::find()
        .filter(console_dials::Column::TenantId.eq(tenant))
        .filter(console_dials::Column::ExpiresAt.gt(now))
        .count(db)
        .await?;
    Ok(tickets + dials)
}

pub async fn insert_ticket(
    db: &impl ConnectionTrait,
    t: console_tickets::ActiveModel,
) -> Result<(), DbErr> {
    console_tickets::Entity::insert(t).exec(db).await?;
    Ok(())
}

/// Takes the ticket under `digest`: whoever deletes the row has it, so a
/// ticket opens once whichever replicas its holder tries.
pub async fn take_ticket(
    db: &impl ConnectionTrait,
    digest: &str,
    now: DateTime<Utc>,
) -> Result<Option<console_tickets::Model>, DbErr> {
    let Some(t) = console_tickets::Entity::find_by_id(digest.to_owned())
        .one(db)
        .await?
    else {
        return Ok(None);
    };
    let gone = console_tickets::Entity::delete_by_id(digest.to_owned())
        .exec(db)
        .await?;
    Ok((gone.rows_affected == 1 && t.expires_at > now).then_some(t))
}

pub async fn insert_dial(
    db: &impl ConnectionTrait,
    d: console_dials::ActiveModel,
) -> Result<(), DbErr> {
    console_dials::Entity::insert(d).exec(db).await?;
    Ok(())
}

/// A dial not expired.
pub async fn dial(
    db: &impl ConnectionTrait,
    session: Uuid,
    now: DateTime<Utc>,
) -> Result<Option<console_dials::Model>, DbErr> {
    console_dials::Entity::find_by_id(session)
        .filter(console_dials::Column::ExpiresAt.gt(now))
        .one(db)
        .await
}

/// The dials a host's agent should make, `(session, vm)`, oldest first.
pub async fn dials_for(
    db: &impl ConnectionTrait,
    host: Uuid,
    now: DateTime<Utc>,
) -> Result<Vec<(Uuid, Uuid)>, DbErr> {
    console_dials::Entity::find()
        .select_only()
        .column(console_dials::Column::Session)
        .column(console_dials::Column::VmId)
        .filter(console_dials::Column::HostId.eq(host))
        .filter(console_dials::Column::ExpiresAt.gt(now))
        .order_by_asc(console_dials::Column::ExpiresAt)
        .order_by_asc(console_dials::Column::Session)
        .into_tuple()
        .all(db)
        .await
}

pub async fn delete_dial(db: &impl ConnectionTrait, session: Uuid) -> Result<(), DbErr> {
    console_dials::Entity::delete_by_id(session)
        .exec(db)
        .await?;
    Ok(())
}

/// The replica holding a VM's link, if any is recorded.
pub async fn link(
    db: &impl ConnectionTrait,
    vm: Uuid,
) -> Result<Option<console_links::Model>, DbErr> {
    console_links::Entity::find_by_id(vm).one(db).await
}

/// Records `replica` as the home of a VM's link where none is, or where
/// it is `instead_of` (a replica gone): answers whether it now is. Two
/// replicas claiming at once: one row wins, the other relays to it.
pub async fn claim_link(
    db: &impl ConnectionTrait,
    vm: Uuid,
    replica: Uuid,
    instead_of: Option<Uuid>,
    now: DateTime<Utc>,
) -> Result<bool, DbErr> {
    match instead_of {
        None => {
            let r = console_links::Entity::insert(console_links::ActiveModel {
                vm_id: Set(vm),
                replica_id: Set(replica),
                since: Set(now),
            })
            .on_conflict(
                OnConflict::column(console_links::Column::VmId)
                    .do_nothing()
                    .to_owned(),
            )
            .exec_without_returning(db)
            .await?;
            Ok(r == 1)
        }
        Some(old) => {
            let r = console_links::Entity::update_many()
                .col_expr(console_links::Column::ReplicaId, replica.into())
                .col_expr(console_links::Column::Since, now.into())
                .filter(console_links::Column::VmId.eq(vm))
                .filter(console_links::Column::ReplicaId.eq(old))
                .exec(db)
                .await?;
            Ok(r.rows_affected == 1)
        }
    }
}

/// The VM's link at `replica` ended.
pub async fn release_link(db: &impl ConnectionTrait, vm: Uuid, replica: Uuid) -> Result<(), DbErr> {
    console_links::Entity::delete_many()
        .filter(console_links::Column::VmId.eq(vm))
        .filter(console_links::Column::ReplicaId.eq(replica))
        .exec(db)
        .await?;
    Ok(())
}

/// A tenant's open consoles on the replicas `live`.
pub async fn seats(db: &impl ConnectionTrait, tenant: Uuid, live: &[Uuid]) -> Result<u64, DbErr> {
    console_seats::Entity::find()
        .filter(console_seats::Column::TenantId.eq(tenant))
        .filter(console_seats::Column::ReplicaId.is_in(live.iter().copied()))
        .count(db)
        .await
}

pub async fn insert_seat(
    db: &impl ConnectionTrait,
    id: Uuid,
    tenant: Uuid,
    replica: Uuid,
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    console_seats::Entity::insert(console_seats::ActiveModel {
        id: Set(id),
        tenant_id: Set(tenant),
        replica_id: Set(replica),
        opened_at: Set(now),
    })
    .exec(db)
    .await?;
    Ok(())
}

pub async fn delete_seat(db: &impl ConnectionTrait, id: Uuid) -> Result<(), DbErr> {
    console_seats::Entity::delete_by_id(id).exec(db).await?;
    Ok(())
}

/// Drops what expired, and what replicas not seen since `gone_before`
/// left behind (their links and seats; the replicas themselves). Reads
/// first and writes only what there is: on SQLite shared by replicas, a
/// write (even of nothing) gets in the way of the other's transactions.
pub async fn sweep(
    db: &impl ConnectionTrait,
    now: DateTime<Utc>,
    gone_before: DateTime<Utc>,
) -> Result<(), DbErr> {
    let expired = console_tickets::Entity::find()
        .filter(console_tickets::Column::ExpiresAt.lte(now))
        .count(db)
        .await?;
    if expired > 0 {
        console_tickets::Entity::delete_many()
            .filter(console_tickets::Column::ExpiresAt.lte(now))
            .exec(db)
            .await?;
    }
    let expired = console_dials::Entity::find()
        .filter(console_dials::Column::ExpiresAt.lte(now))
        .count(db)
        .await?;
    if expired > 0 {
        console_dials::Entity::delete_many()
            .filter(console_dials::Column::ExpiresAt.lte(now))
            .exec(db)
            .await?;
    }
    let gone: Vec<Uuid> = replicas::Entity::find()
        .select_only()
        .column(replicas::Column::Id)
        .filter(replicas::Column::SeenAt.lt(gone_before))
        .into_tuple()
        .all(db)
        .await?;
    if gone.is_empty() {
        return Ok(());
    }
    forget(db, &gone).await
}

/// Removes replicas and what they held (at shutdown, a replica's own).
pub async fn forget(db: &impl ConnectionTrait, ids: &[Uuid]) -> Result<(), DbErr> {
    console_links::Entity::delete_many()
        .filter(console_links::Column::ReplicaId.is_in(ids.iter().copied()))
        .exec(db)
        .await?;
    console_seats::Entity::delete_many()
        .filter(console_seats::Column::ReplicaId.is_in(ids.iter().copied()))
        .exec(db)
        .await?;
    console_dials::Entity::delete_many()
        .filter(console_dials::Column::ReplicaId.is_in(ids.iter().copied()))
        .exec(db)
        .await?;
    replicas::Entity::delete_many()
        .filter(replicas::Column::Id.is_in(ids.iter().copied()))
        .exec(db)
        .await?;
    Ok(())
}
