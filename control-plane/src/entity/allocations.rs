use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "allocations")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub host_id: Uuid,
    /// `gpu`, `nic` or `cpu`.
    #[sea_orm(primary_key, auto_increment = false)]
    pub kind: String,
    /// A PCI address or a CPU number.
    #[sea_orm(primary_key, auto_increment = false)]
    pub key: String,
    pub vm_id: Uuid,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
