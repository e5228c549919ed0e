use sea_orm::entity::prelude::*;

/// A VM's NIC on a segment: its address (unique in the segment) and MAC
/// (unique everywhere).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "attachments")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub vm_id: Uuid,
    pub segment_id: Uuid,
    pub ip: String,
    pub mac: String,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
