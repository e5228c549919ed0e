use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "cluster_events")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub cluster_id: Uuid,
    pub tenant_id: Uuid,
    pub at: DateTimeUtc,
    pub kind: String,
    pub message: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
