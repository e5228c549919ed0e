//! Idempotency keys: how long answers are kept, and purging older ones.

use chrono::{DateTime, Duration, Utc};
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};

use crate::entity::idempotency_keys;
use crate::error::ApiError;

/// Stored answers are replayed for this long after their request.
pub const RETENTION: Duration = Duration::hours(24);

/// Deletes the keys whose answers are past [`RETENTION`] at `now`: they
/// would only be taken over anyway, and rows must not pile up.
pub async fn purge(db: &impl ConnectionTrait, now: DateTime<Utc>) -> Result<u64, ApiError> {
    Ok(idempotency_keys::Entity::delete_many()
        .filter(idempotency_keys::Column::CreatedAt.lt(now - RETENTION))
        .exec(db)
        .await?
        .rows_affected)
}
