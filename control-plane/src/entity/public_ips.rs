use sea_orm::entity::prelude::*;

/// An address of a pool in use: a tenant's (allocated; `attachment_id`
/// when it is a NIC's 1:1 floating address), or a segment edge's egress
/// address (`segment_id`, no tenant holds it).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "public_ips")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub pool_id: Uuid,
    #[sea_orm(unique)]
    pub address: String,
    pub tenant_id: Option<Uuid>,
    pub segment_id: Option<Uuid>,
    pub attachment_id: Option<Uuid>,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
