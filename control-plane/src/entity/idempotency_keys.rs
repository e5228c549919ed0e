use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "idempotency_keys")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub user_id: Uuid,
    #[sea_orm(primary_key, auto_increment = false)]
    pub key: String,
    /// Hex SHA-256 over method, path and body: a key reused for a different
    /// request is an error, not a replay.
    pub request_hash: String,
    /// `None` while the first request is still being processed.
    pub status: Option<i32>,
    pub content_type: Option<String>,
    pub body: Option<String>,
    pub created_at: DateTimeUtc,
    pub completed_at: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
