use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "tenant_quotas")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub tenant_id: Uuid,
    pub vcpus: i64,
    pub memory_gib: i64,
    pub vms: i64,
    pub segments: i64,
    pub disk_gib: i64,
    pub roce_segments: i64,
    pub public_ips: i64,
    pub volume_gib: i64,
    pub share_gib: i64,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
