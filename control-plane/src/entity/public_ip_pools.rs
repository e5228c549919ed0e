use sea_orm::entity::prelude::*;

/// Addresses of a provider network that edges may carry: `cidr` is the
/// network, `gateway` its router, `first..=last` what Kumo hands out.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "public_ip_pools")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    #[sea_orm(unique)]
    pub name: String,
    pub cidr: String,
    pub gateway: String,
    pub first: String,
    pub last: String,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
