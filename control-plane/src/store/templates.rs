//! Queries over VM templates.

use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::domain::paging::Paging;
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

/// One page of the templates, by name.
pub async fn page(
    db: &impl ConnectionTrait,
    paging: &Paging,
) -> Result<Vec<templates::Model>, ApiError> {
    let mut query = templates::Entity::find().order_by_asc(templates::Column::Name);
    if let Some(after) = &paging.after {
        query = query.filter(templates::Column::Name.gt(after.as_str()));
    }
    Ok(query.limit(paging.fetch()).all(db).await?)
}
