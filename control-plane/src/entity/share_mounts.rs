use sea_orm::entity::prelude::*;

/// A share mounted in a VM (virtiofs).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "share_mounts")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub share_id: Uuid,
    #[sea_orm(primary_key, auto_increment = false)]
    pub vm_id: Uuid,
    pub path: String,
    pub read_only: bool,
    pub tag: String,
    pub condition: Option<String>,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
