use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "vm_telemetry")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub vm_id: Uuid,
    pub tenant_id: Uuid,
    /// `ok` or `unknown`.
    pub state: String,
    pub reason: Option<String>,
    pub read_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
