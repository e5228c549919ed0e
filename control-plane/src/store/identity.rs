//! Queries over users and their API tokens.

use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use uuid::Uuid;

use crate::entity::{api_tokens, users};
use crate::error::ApiError;

/// Finds a user by name or id.
pub async fn find(
    db: &impl ConnectionTrait,
    user_ref: &str,
) -> Result<Option<users::Model>, ApiError> {
    Ok(crate::store::name_or_id(
        users::Entity::find(),
        users::Column::Id,
        users::Column::Name,
        user_ref,
    )
    .one(db)
    .await?)
}

/// Up to `limit` of a user's tokens that are not revoked, oldest first,
/// after the token `after`.
pub async fn live_tokens(
    db: &impl ConnectionTrait,
    user: Uuid,
    after: Option<Uuid>,
    limit: u64,
) -> Result<Vec<api_tokens::Model>, ApiError> {
    let mut query = api_tokens::Entity::find()
        .filter(api_tokens::Column::UserId.eq(user))
        .filter(api_tokens::Column::RevokedAt.is_null())
        .order_by_asc(api_tokens::Column::Id);
    if let Some(after) = after {
        query = query.filter(api_tokens::Column::Id.gt(after));
    }
    Ok(query.limit(limit).all(db).await?)
}
