use sea_orm::entity::prelude::*;

/// One resource of one VM while it is charged for: compute while it runs,
/// its disk while it exists. `posted_until`: charged up to there.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "meter_runs")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub vm_id: Uuid,
    pub vm_name: String,
    pub tenant_id: Uuid,
    pub class: String,
    /// A decimal string.
    pub quantity: String,
    /// `guaranteed` or `spot`.
    pub level: String,
    pub started_at: DateTimeUtc,
    pub ended_at: Option<DateTimeUtc>,
    pub posted_until: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
