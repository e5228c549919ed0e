//! Membership use cases: who belongs to a tenant, with which role. Owners
//! manage them; a tenant always keeps an owner.

use kumo_api_types::{Member, MemberPut, Page, PageParams, Role};
use sea_orm::{ActiveModelTrait, ConnectionTrait, EntityTrait, Set, TransactionTrait};
use uuid::Uuid;

use crate::app::access::{stored_role, tenant_access};
use crate::app::audit;
use crate::context::{Actor, AppState};
use crate::domain::paging::Paging;
use crate::entity::{memberships, tenants};
use crate::error::ApiError;

fn view(m: memberships::Model, user: String) -> Result<Member, ApiError> {
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
    if crate::store::tenancy::other_owners(db, tenant.id, leaving).await? == 0 {
        return Err(ApiError::Conflict(format!(
            "tenant {:?} would have no owner left; make someone else owner first",
            tenant.name
        )));
    }
    Ok(())
}

/// One page of a tenant's members, by user id (any member).
pub async fn list(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    params: &PageParams,
) -> Result<Page<Member>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let paging = Paging::new(params.limit, params.page_token.as_deref())?;
    let after =
        match &paging.after {
            Some(after) => Some(Uuid::try_parse(after).map_err(|_| {
                ApiError::field("page_token", "not a page token returned by this API")
            })?),
            None => None,
        };
    let rows = crate::store::tenancy::members_page(&st.db, tenant.id, after, &paging).await?;
    let (rows, next) = paging.finish(rows, |(m, _)| m.user_id.to_string());
    let items = rows
        .into_iter()
        .map(|(m, u)| {
            let name = u.map(|u| u.name).unwrap_or_default();
            view(m, name)
        })
        .collect::<Result<_, _>>()?;
    Ok(Page {
        items,
        next_page_token: next,
    })
}

/// An owner adds a member or changes their role. Answers whether the
/// membership is new, and the member.
pub async fn put(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    user: &str,
    body: &MemberPut,
) -> Result<(bool, Member), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Owner, "managing members")?;
    let user = crate::store::identity::find(&st.db, user)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("user {user:?}")))?;
    let txn = st.db.begin().await?;
    let existing = crate::store::tenancy::membership(&txn, tenant.id, user.id).await?;
    let (created, row) = match existing {
        Some(m) => {
            if m.role == Role::Owner.as_str() && body.role != Role::Owner {
                ensure_another_owner(&txn, &tenant, user.id).await?;
            }
            let mut active: memberships::ActiveModel = m.into();
            active.role = Set(body.role.as_str().to_owned());
            (false, active.update(&txn).await?)
        }
        None => {
            let row = memberships::ActiveModel {
                tenant_id: Set(tenant.id),
                user_id: Set(user.id),
                role: Set(body.role.as_str().to_owned()),
                created_at: Set(st.config.clock.now()),
            }
            .insert(&txn)
            .await?;
            (true, row)
        }
    };
    audit::record(
        &txn,
        actor,
        "member.put",
        Some(&tenant),
        &format!("{} as {}", user.name, body.role.as_str()),
    )
    .await?;
    txn.commit().await?;
    Ok((created, view(row, user.name)?))
}

/// An owner removes a member.
pub async fn remove(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    user: &str,
) -> Result<(), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Owner, "managing members")?;
    let not_member = || ApiError::not_found(format!("member {user:?}"));
    let user_row = crate::store::identity::find(&st.db, user)
        .await?
        .ok_or_else(not_member)?;
    let txn = st.db.begin().await?;
    let m = crate::store::tenancy::membership(&txn, tenant.id, user_row.id)
        .await?
        .ok_or_else(not_member)?;
    if m.role == Role::Owner.as_str() {
        ensure_another_owner(&txn, &tenant, user_row.id).await?;
    }
    memberships::Entity::delete_by_id((tenant.id, user_row.id))
        .exec(&txn)
        .await?;
    audit::record(&txn, actor, "member.remove", Some(&tenant), &user_row.name).await?;
    txn.commit().await?;
    Ok(())
}
