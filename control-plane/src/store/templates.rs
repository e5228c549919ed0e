//! Queries over VM templates.

use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};

use crate::entity::templates;
use crate::error::ApiError;

pub async fn find(
    db: &impl ConnectionTrait,
    name: &str,
) -> Result<Option<templates::Model>, ApiError> {
    Ok(templates::Entity::find()
        .filter(templates::Column::Name.eq(name))
        .one(db)
        .await?)
}
