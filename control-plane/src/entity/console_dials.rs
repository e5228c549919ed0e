use sea_orm::entity::prelude::*;

/// A dial a host's agent is asked to make, and the replica where the
/// person waits for it (the link's home).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "console_dials")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub session: Uuid,
    pub tenant_id: Uuid,
    pub vm_id: Uuid,
    pub host_id: Uuid,
    pub replica_id: Uuid,
    pub expires_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
