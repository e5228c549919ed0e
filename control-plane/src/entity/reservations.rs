use sea_orm::entity::prelude::*;

/// GPUs of one model held for a tenant from `starts_at` to `ends_at`
/// ([`crate::app::reservations`]). `revision` moves with every change of
/// its hosts, so two replicas' passes change them once.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "reservations")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub name: String,
    pub gpu_model: String,
    pub gpus: i64,
    pub starts_at: DateTimeUtc,
    pub ends_at: DateTimeUtc,
    pub end_policy: String,
    pub state: String,
    pub revision: i64,
    /// GPUs its hosts gave it at the last pass.
    pub held_gpus: i64,
    /// Why it holds fewer than reserved, at the last pass.
    pub short: Option<String>,
    pub created_at: DateTimeUtc,
    pub ended_at: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
