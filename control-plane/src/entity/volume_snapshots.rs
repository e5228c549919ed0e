use sea_orm::entity::prelude::*;

/// A point-in-time copy of a volume, on the volume's host; new volumes
/// are made from it there.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "volume_snapshots")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub volume_id: Uuid,
    pub tenant_id: Uuid,
    pub name: String,
    pub size_gib: i64,
    /// `creating`, `available` or `deleting`.
    pub state: String,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
