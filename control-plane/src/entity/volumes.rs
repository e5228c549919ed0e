use sea_orm::entity::prelude::*;

/// A tenant's volume on one host's storage; `vm_id` when it is a disk of
/// a VM (on the same host).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "volumes")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub name: String,
    pub size_gib: i64,
    pub state: String,
    pub reason: Option<String>,
    pub host_id: Uuid,
    pub vm_id: Option<Uuid>,
    #[sea_orm(unique)]
    pub serial: String,
    /// The snapshot it was made from (which stays while it does).
    pub source_snapshot_id: Option<Uuid>,
    /// While moving: the host it is being copied to.
    pub move_to_host_id: Option<Uuid>,
    /// While moving: the SHA-256 of the destination agent's token.
    pub move_token_sha256: Option<String>,
    /// After a move: the host whose old copy is still to be removed.
    pub moved_from_host_id: Option<Uuid>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
