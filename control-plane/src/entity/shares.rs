use sea_orm::entity::prelude::*;

/// A tenant's project share: a directory on the filesystem every host
/// mounts; `keeper_host_id` is the host whose agent makes and measures it.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "shares")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub name: String,
    pub size_gib: i64,
    pub state: String,
    pub reason: Option<String>,
    pub keeper_host_id: Option<Uuid>,
    #[sea_orm(unique)]
    pub project: i64,
    pub used_bytes: Option<i64>,
    pub limit_kind: Option<String>,
    pub read_only: bool,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
