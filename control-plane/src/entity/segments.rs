use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "segments")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub name: String,
    /// `ethernet` or `roce`.
    pub kind: String,
    pub cidr: String,
    pub gateway: String,
    pub mtu: i32,
    pub vni: i32,
    pub created_at: DateTimeUtc,
    /// Ingress rules (`[SegmentRule]`) as JSON; none: only the segment itself.
    pub ingress_rules: Option<String>,
    /// RoCE segments: the VLAN their VFs carry, which the leaf maps to the VNI.
    pub vlan: Option<i32>,
    /// VMs reach outside through the edge (SNAT to its `public_ips` address).
    pub egress: bool,
    /// The edge host that carries the segment's gateway, egress and
    /// public addresses, once placed.
    pub edge_host_id: Option<Uuid>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
