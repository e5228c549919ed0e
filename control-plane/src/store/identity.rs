//! Queries over users.

use sea_orm::{ConnectionTrait, EntityTrait};

use crate::entity::users;
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
