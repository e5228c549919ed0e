use sea_orm::entity::prelude::*;

/// When a public address was last given back (a tenant's released, a
/// segment's egress address dropped): it rests before it is handed out
/// again, and the least recently used goes first.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "public_ip_releases")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub address: String,
    pub released_at: DateTimeUtc,
    /// The tenant that gave it back; `None` for a segment's egress
    /// address (its tenant is the segment's).
    pub tenant_id: Option<Uuid>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
