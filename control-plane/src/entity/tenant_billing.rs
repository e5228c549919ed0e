use sea_orm::entity::prelude::*;

/// A tenant's standing with its points.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "tenant_billing")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub tenant_id: Uuid,
    /// When its balance reached zero (cleared by a grant that covers it).
    pub exhausted_since: Option<DateTimeUtc>,
    /// An admin's extension of the guaranteed VMs' grace.
    pub grace_until: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
