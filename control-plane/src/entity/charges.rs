use sea_orm::entity::prelude::*;

/// A posted charge: one piece of a run. Immutable; (run, period_from) unique.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "charges")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub run_id: Uuid,
    pub tenant_id: Uuid,
    pub vm_id: Uuid,
    pub vm_name: String,
    pub class: String,
    pub level: String,
    pub period_from: DateTimeUtc,
    pub period_to: DateTimeUtc,
    pub seconds: i64,
    pub per_hour: String,
    pub amount: String,
    /// `amount` in millionths of a point.
    pub amount_micro: i64,
    pub posted_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
