use sea_orm::entity::prelude::*;

/// A console ticket, authorised and not yet opened: under its secret's
/// SHA-256 (the secret itself is never kept).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "console_tickets")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub digest: String,
    pub tenant_id: Uuid,
    pub vm_id: Uuid,
    pub host_id: Uuid,
    pub user_name: String,
    /// The API token it was minted with, or
    pub token_id: Option<Uuid>,
    /// the portal session (its id).
    pub session_id: Option<String>,
    pub write: bool,
    pub expires_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
