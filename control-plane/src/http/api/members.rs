use axum::extract::State;
use axum::http::StatusCode;
use chrono::Utc;
use kumo_api_types::{Member, MemberPut, Page, PageParams, Role};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, PaginatorTrait, QueryFilter,
    QueryOrder, QuerySelect, Set, TransactionTrait,
};
use uuid::Uuid;

use super::Problems;
use crate::app::access::{stored_role, tenant_access};
use crate::app::audit;
use crate::context::Actor;
use crate::context::AppState;
use crate::domain::paging::Paging;
use crate::entity::{memberships, tenants};
use crate::error::ApiError;
use crate::http::extract::{Json, Path, Query};

fn to_api(m: memberships::Model, user: String) -> Result<Member, ApiError> {
    Ok(Member {
        user,
        user_id: m.user_id,
        role: stored_role(&m.role)?,
        since: m.created_at,
    })
}

/// A tenant must keep an owner: someone has to be able to manage it.
async fn ensure_another_owner(
    db: &impl ConnectionTrait,
    tenant: &tenants::Model,
    leaving: Uuid,
) -> Result<(), ApiError> {
    let others = memberships::Entity::find()
        .filter(memberships::Column::TenantId.eq(tenant.id))
        .filter(memberships::Column::Role.eq(Role::Owner.as_str()))
        .filter(memberships::Column::UserId.ne(leaving))
        .count(db)
        .await?;
    if others == 0 {
        return Err(ApiError::Conflict(format!(
            "tenant {:?} would have no owner left; make someone else owner first",
            tenant.name
        )));
    }
    Ok(())
}

/// List a tenant's members (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/members", tag = "members",
    params(("tenant" = String, Path, description = "Tenant name or id"), PageParams),
    responses((status = 200, description = "One page", body = inline(Page<Member>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<Member>>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    let paging = Paging::new(q.limit, q.page_token.as_deref())?;
    let mut query = memberships::Entity::find()
        .filter(memberships::Column::TenantId.eq(tenant.id))
        .order_by_asc(memberships::Column::UserId);
    if let Some(after) = &paging.after {
        let after = Uuid::try_parse(after)
            .map_err(|_| ApiError::field("page_token", "not a page token returned by this API"))?;
        query = query.filter(memberships::Column::UserId.gt(after));
    }
    let rows = query
        .find_also_related(crate::entity::users::Entity)
        .limit(paging.fetch())
        .all(&st.db)
        .await?;
    let (rows, next) = paging.finish(rows, |(m, _)| m.user_id.to_string());
    let items = rows
        .into_iter()
        .map(|(m, u)| {
            let name = u.map(|u| u.name).unwrap_or_default();
            to_api(m, name)
        })
        .collect::<Result<_, _>>()?;
    Ok(axum::Json(Page {
        items,
        next_page_token: next,
    }))
}

/// Add a member or change their role (owners).
#[utoipa::path(
    put, path = "/api/v1/tenants/{tenant}/members/{user}", tag = "members",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("user" = String, Path, description = "User name or id"),
    ),
    request_body = MemberPut,
    responses(
        (status = 201, description = "Added", body = Member),
        (status = 200, description = "Role changed", body = Member),
        Problems
    )
)]
pub async fn put(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, user)): Path<(String, String)>,
    Json(body): Json<MemberPut>,
) -> Result<(StatusCode, axum::Json<Member>), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    access.require(Role::Owner, "managing members")?;
    let user = crate::store::identity::find(&st.db, &user)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("user {user:?}")))?;
    let txn = st.db.begin().await?;
    let existing = memberships::Entity::find_by_id((tenant.id, user.id))
        .one(&txn)
        .await?;
    let (status, row) = match existing {
        Some(m) => {
            if m.role == Role::Owner.as_str() && body.role != Role::Owner {
                ensure_another_owner(&txn, &tenant, user.id).await?;
            }
            let mut active: memberships::ActiveModel = m.into();
            active.role = Set(body.role.as_str().to_owned());
            (StatusCode::OK, active.update(&txn).await?)
        }
        None => {
            let row = memberships::ActiveModel {
                tenant_id: Set(tenant.id),
                user_id: Set(user.id),
                role: Set(body.role.as_str().to_owned()),
                created_at: Set(Utc::now()),
            }
            .insert(&txn)
            .await?;
            (StatusCode::CREATED, row)
        }
    };
    audit::record(
        &txn,
        &ctx,
        "member.put",
        Some(&tenant),
        &format!("{} as {}", user.name, body.role.as_str()),
    )
    .await?;
    txn.commit().await?;
    Ok((status, axum::Json(to_api(row, user.name)?)))
}

/// Remove a member (owners).
#[utoipa::path(
    delete, path = "/api/v1/tenants/{tenant}/members/{user}", tag = "members",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("user" = String, Path, description = "User name or id"),
    ),
    responses((status = 204, description = "Removed"), Problems)
)]
pub async fn remove(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, user)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    access.require(Role::Owner, "managing members")?;
    let not_member = || ApiError::not_found(format!("member {user:?}"));
    let user_row = crate::store::identity::find(&st.db, &user)
        .await?
        .ok_or_else(not_member)?;
    let txn = st.db.begin().await?;
    let m = memberships::Entity::find_by_id((tenant.id, user_row.id))
        .one(&txn)
        .await?
        .ok_or_else(not_member)?;
    if m.role == Role::Owner.as_str() {
        ensure_another_owner(&txn, &tenant, user_row.id).await?;
    }
    memberships::Entity::delete_by_id((tenant.id, user_row.id))
        .exec(&txn)
        .await?;
    audit::record(&txn, &ctx, "member.remove", Some(&tenant), &user_row.name).await?;
    txn.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}
