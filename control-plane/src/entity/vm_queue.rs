use sea_orm::entity::prelude::*;

/// A queued VM's standing in the fair queue (`app::queue`).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "vm_queue")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub vm_id: Uuid,
    pub tenant_id: Uuid,
    /// Members of a cluster wait, and are admitted, together.
    pub cluster_id: Option<Uuid>,
    pub queued_at: DateTimeUtc,
    pub expires_at: DateTimeUtc,
    /// As of the queue's last pass (1: next).
    pub position: i32,
    pub reason: String,
    pub estimate: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
