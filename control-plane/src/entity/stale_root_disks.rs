use sea_orm::entity::prelude::*;

/// A root disk a host still keeps of a VM that runs elsewhere now (its
/// disk moved) or is gone: listed to that host until its agent reports
/// it removed.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "stale_root_disks")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub vm_id: Uuid,
    #[sea_orm(primary_key, auto_increment = false)]
    pub host_id: Uuid,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
