use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "idle_policies")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub tenant_id: Uuid,
    /// Empty: the platform's.
    pub utilization_pct: Option<f64>,
    pub hours: Option<i32>,
    pub action: Option<String>,
    /// The webhook's address, sealed with the server's key (AES-256-GCM).
    pub webhook_sealed: Option<String>,
    /// Its scheme and host, shown to the project.
    pub webhook_target: Option<String>,
    pub webhook_last_at: Option<DateTimeUtc>,
    pub webhook_last_result: Option<String>,
    pub set_by: String,
    pub set_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
