use sea_orm::entity::prelude::*;

/// A budget event: a threshold of a grant reached, points exhausted, VMs
/// stopped for want of points. `(tenant, kind, subject)` fires once.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "billing_alerts")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub kind: String,
    /// The grant (thresholds) or exhaustion episode the alert is about.
    pub grant_id: Uuid,
    pub message: String,
    pub at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
