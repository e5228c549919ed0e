//! Users: created and listed by administrators, disabled and enabled,
//! their portal sessions ended; the caller's own memberships.

use kumo_api_types::{Me, Membership, Page, PageParams, User, UserCreate, UserKind};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect, Set,
    TransactionTrait,
};
use uuid::Uuid;

use crate::app::access::{require_admin, stored_role};
use crate::app::audit;
use crate::context::{Actor, AppState};
use crate::domain::names;
use crate::domain::paging::Paging;
use crate::entity::{memberships, sessions, tenants, users};
use crate::error::{conflict_if_unique, ApiError};

/// Disables (or enables) a user. Disabling ends their sessions in the
/// same transaction; their tokens fail from the next request on, since
/// authentication reads the flag.
pub async fn set_disabled(
    st: &AppState,
    actor: &Actor,
    user: &str,
    disabled: bool,
) -> Result<users::Model, ApiError> {
    require_admin(&actor.caller, "disabling and enabling users")?;
    let txn = st.db.begin().await?;
    let u = crate::store::identity::find(&txn, user)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("user {user:?}")))?;
    if disabled && u.id == actor.caller.user.id {
        return Err(ApiError::Conflict(
            "an administrator cannot disable themself".into(),
        ));
    }
    let mut a: users::ActiveModel = u.clone().into();
    a.disabled = Set(disabled);
    let u = a.update(&txn).await?;
    if disabled {
        sessions::Entity::delete_many()
            .filter(sessions::Column::UserId.eq(u.id))
            .exec(&txn)
            .await?;
    }
    let action = if disabled {
        "user.disable"
    } else {
        "user.enable"
    };
    audit::record(&txn, actor, action, None, &u.name).await?;
    txn.commit().await?;
    Ok(u)
}

/// Ends every portal session of a user (administrators, or the user).
pub async fn end_sessions(st: &AppState, actor: &Actor, user: &str) -> Result<u64, ApiError> {
    let txn = st.db.begin().await?;
    let u = crate::store::identity::find(&txn, user)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("user {user:?}")))?;
    if u.id != actor.caller.user.id {
        require_admin(&actor.caller, "ending another user's sessions")?;
    }
    let ended = sessions::Entity::delete_many()
        .filter(sessions::Column::UserId.eq(u.id))
        .exec(&txn)
        .await?
        .rows_affected;
    audit::record(&txn, actor, "user.sessions.end", None, &u.name).await?;
    txn.commit().await?;
    Ok(ended)
}

pub fn to_api(u: users::Model) -> Result<User, ApiError> {
    let kind = UserKind::parse(&u.kind)
        .ok_or_else(|| ApiError::Internal(format!("stored user kind {:?} is unknown", u.kind)))?;
    Ok(User {
        id: u.id,
        name: u.name,
        display_name: u.display_name,
        email: u.email,
        kind,
        is_admin: u.is_admin,
        created_at: u.created_at,
        disabled: u.disabled,
    })
}

/// Creates a local or service account (platform admins).
pub async fn create(st: &AppState, actor: &Actor, body: &UserCreate) -> Result<User, ApiError> {
    require_admin(&actor.caller, "creating users")?;
    names::user_name("name", &body.name)?;
    if let Some(d) = &body.display_name {
        names::text("display_name", d, 255)?;
    }
    if let Some(e) = &body.email {
        names::email("email", e)?;
    }
    let kind = body.kind.unwrap_or(UserKind::Local);
    if kind == UserKind::Service && body.is_admin {
        return Err(ApiError::field(
            "is_admin",
            "service accounts cannot be platform administrators",
        ));
    }
    let txn = st.db.begin().await?;
    let user = users::ActiveModel {
        id: Set(Uuid::now_v7()),
        name: Set(body.name.clone()),
        display_name: Set(body
            .display_name
            .clone()
            .unwrap_or_else(|| body.name.clone())),
        email: Set(body.email.clone()),
        kind: Set(kind.as_str().to_owned()),
        is_admin: Set(body.is_admin),
        disabled: Set(false),
        created_at: Set(actor.at),
    }
    .insert(&txn)
    .await
    .map_err(|e| {
        conflict_if_unique(e, || format!("a user named {:?} already exists", body.name))
    })?;
    audit::record(&txn, actor, "user.create", None, &user.name).await?;
    txn.commit().await?;
    to_api(user)
}

/// Users by name (platform admins).
pub async fn list(st: &AppState, actor: &Actor, q: &PageParams) -> Result<Page<User>, ApiError> {
    require_admin(&actor.caller, "listing users")?;
    let paging = Paging::new(q.limit, q.page_token.as_deref())?;
    let mut query = users::Entity::find().order_by_asc(users::Column::Name);
    if let Some(after) = &paging.after {
        query = query.filter(users::Column::Name.gt(after.as_str()));
    }
    let rows = query.limit(paging.fetch()).all(&st.db).await?;
    let (rows, next) = paging.finish(rows, |u| u.name.clone());
    Ok(Page {
        items: rows.into_iter().map(to_api).collect::<Result<_, _>>()?,
        next_page_token: next,
    })
}

/// The caller and the tenants they belong to.
pub async fn me(st: &AppState, actor: &Actor) -> Result<Me, ApiError> {
    let rows = memberships::Entity::find()
        .filter(memberships::Column::UserId.eq(actor.caller.user.id))
        .find_also_related(tenants::Entity)
        .all(&st.db)
        .await?;
    let mut memberships = Vec::with_capacity(rows.len());
    for (m, t) in rows {
        let Some(t) = t else { continue };
        memberships.push(Membership {
            tenant: t.name,
            tenant_id: t.id,
            role: stored_role(&m.role)?,
        });
    }
    memberships.sort_by(|a, b| a.tenant.cmp(&b.tenant));
    Ok(Me {
        user: to_api(actor.caller.user.clone())?,
        memberships,
    })
}
