use sea_orm::entity::prelude::*;

/// A VNI that is, or recently was, a segment's. `segment_id` is set while
/// the segment lives; `released_at` starts its quarantine.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "vni_leases")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub vni: i32,
    pub segment_id: Option<Uuid>,
    pub released_at: Option<DateTimeUtc>,
    /// The released segment's RoCE VLAN, resting with the VNI.
    pub vlan: Option<i32>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
