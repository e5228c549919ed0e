//! API tokens: minted (bounded by the token that asks and by the
//! platform's longest lifetime) and revoked (with every token they minted).

use chrono::{DateTime, Utc};
use kumo_api_types::{Page, PageParams, TokenCreate, TokenCreated, TokenInfo};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, Set, TransactionTrait,
};
use uuid::Uuid;

use crate::app::access::require_admin;
use crate::app::{audit, auth};
use crate::context::{Actor, AppState};
use crate::domain::names;
use crate::domain::paging::Paging;
use crate::entity::{api_tokens, users};
use crate::error::ApiError;

/// When a new token ends: what was asked, but never after the token that
/// mints it (`parent`) nor past the platform's longest lifetime.
pub fn bounded_expiry(
    asked: Option<DateTime<Utc>>,
    parent: Option<DateTime<Utc>>,
    max_lifetime: Option<chrono::Duration>,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let caps = [parent, max_lifetime.map(|m| now + m)];
    caps.into_iter()
        .flatten()
        .fold(asked, |e, cap| Some(e.map_or(cap, |e| e.min(cap))))
}

/// The caller's tokens that are not revoked, oldest first; never secrets.
pub async fn list(
    st: &AppState,
    actor: &Actor,
    q: &PageParams,
) -> Result<Page<TokenInfo>, ApiError> {
    let paging = Paging::new(q.limit, q.page_token.as_deref())?;
    let after = paging
        .after
        .as_deref()
        .map(|a| {
            Uuid::try_parse(a)
                .map_err(|_| ApiError::field("page_token", "not a page token returned by this API"))
        })
        .transpose()?;
    let user = &actor.caller.user;
    let rows = crate::store::identity::live_tokens(&st.db, user.id, after, paging.fetch()).await?;
    let (rows, next) = paging.finish(rows, |t| t.id.to_string());
    Ok(Page {
        items: rows
            .into_iter()
            .map(|t| TokenInfo {
                id: t.id,
                user: user.name.clone(),
                description: t.description,
                created_at: t.created_at,
                expires_at: t.expires_at,
                last_used_at: t.last_used_at,
            })
            .collect(),
        next_page_token: next,
    })
}

/// Mints a token for another user named by name or id, e.g. a service
/// account (platform admins).
pub async fn mint_for_named(
    st: &AppState,
    actor: &Actor,
    user_ref: &str,
    body: TokenCreate,
) -> Result<TokenCreated, ApiError> {
    require_admin(&actor.caller, "minting tokens for other users")?;
    let user = crate::store::identity::find(&st.db, user_ref)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("user {user_ref:?}")))?;
    mint_for(st, actor, &user, body).await
}

/// Mints a token for `user`, asked for by `actor`. The secret is in the
/// answer only.
pub async fn mint_for(
    st: &AppState,
    actor: &Actor,
    user: &users::Model,
    body: TokenCreate,
) -> Result<TokenCreated, ApiError> {
    let description = body.description.unwrap_or_default();
    names::text("description", &description, 255)?;
    let now = actor.at;
    if body.expires_at.is_some_and(|e| e <= now) {
        return Err(ApiError::field("expires_at", "must be in the future"));
    }
    let txn = st.db.begin().await?;
    // Sessions and the portal act with no token of their own (nil).
    let parent = if actor.caller.token_id.is_nil() {
        None
    } else {
        api_tokens::Entity::find_by_id(actor.caller.token_id)
            .one(&txn)
            .await?
    };
    let expires_at = bounded_expiry(
        body.expires_at,
        parent.as_ref().and_then(|p| p.expires_at),
        st.config.auth.max_token_lifetime,
        now,
    );
    let minted = auth::mint();
    api_tokens::ActiveModel {
        id: Set(minted.id),
        user_id: Set(user.id),
        secret_hash: Set(minted.secret_hash),
        description: Set(description),
        created_at: Set(now),
        expires_at: Set(expires_at),
        last_used_at: Set(None),
        revoked_at: Set(None),
        minted_by: Set(parent.map(|p| p.id)),
    }
    .insert(&txn)
    .await?;
    audit::record(
        &txn,
        actor,
        "token.create",
        None,
        &format!("{} for {}", minted.id, user.name),
    )
    .await?;
    txn.commit().await?;
    Ok(TokenCreated {
        id: minted.id,
        token: minted.token,
        expires_at,
    })
}

/// Revokes a token (the caller's own, or any for administrators) and
/// every token minted from it, at any depth.
pub async fn revoke(st: &AppState, actor: &Actor, id: &str) -> Result<(), ApiError> {
    let not_found = || ApiError::not_found(format!("token {id:?}"));
    let token_id = Uuid::try_parse(id).map_err(|_| not_found())?;
    let txn = st.db.begin().await?;
    let token = api_tokens::Entity::find_by_id(token_id)
        .one(&txn)
        .await?
        .filter(|t| t.revoked_at.is_none())
        .filter(|t| t.user_id == actor.caller.user.id || actor.caller.is_admin())
        .ok_or_else(not_found)?;
    let n = revoke_with_children(&txn, token.id, actor.at).await?;
    audit::record(&txn, actor, "token.revoke", None, &token_id.to_string()).await?;
    txn.commit().await?;
    tracing::info!(token = %token_id, revoked = n, "token revoked with what it minted");
    Ok(())
}

/// Revokes `root` and its descendants; answers how many.
async fn revoke_with_children(
    db: &impl ConnectionTrait,
    root: Uuid,
    at: DateTime<Utc>,
) -> Result<usize, ApiError> {
    let mut todo = vec![root];
    let mut n = 0;
    while let Some(id) = todo.pop() {
        api_tokens::Entity::update_many()
            .col_expr(
                api_tokens::Column::RevokedAt,
                sea_orm::sea_query::Expr::value(Some(at)),
            )
            .filter(api_tokens::Column::Id.eq(id))
            .filter(api_tokens::Column::RevokedAt.is_null())
            .exec(db)
            .await?;
        n += 1;
        let children = api_tokens::Entity::find()
            .filter(api_tokens::Column::MintedBy.eq(id))
            .filter(api_tokens::Column::RevokedAt.is_null())
            .all(db)
            .await?;
        todo.extend(children.into_iter().map(|c| c.id));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_never_outlives_its_parent_or_the_platform_limit() {
        let now = Utc::now();
        let h = chrono::Duration::hours;
        // A 60-second parent bounds a token asked to live forever.
        assert_eq!(
            bounded_expiry(None, Some(now + chrono::Duration::seconds(60)), None, now),
            Some(now + chrono::Duration::seconds(60))
        );
        assert_eq!(
            bounded_expiry(Some(now + h(1)), Some(now + h(2)), None, now),
            Some(now + h(1))
        );
        assert_eq!(bounded_expiry(None, None, None, now), None);
        assert_eq!(
            bounded_expiry(None, None, Some(h(24)), now),
            Some(now + h(24))
        );
        assert_eq!(
            bounded_expiry(Some(now + h(48)), Some(now + h(30)), Some(h(24)), now),
            Some(now + h(24))
        );
    }
}
