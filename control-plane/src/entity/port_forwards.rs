use sea_orm::entity::prelude::*;

/// `public_ip:public_port/protocol` → the NIC `attachment_id`'s
/// `private_port`. Named by the attachment, so it goes with the NIC.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "port_forwards")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub public_ip_id: Uuid,
    /// `tcp` or `udp`.
    pub protocol: String,
    pub public_port: i32,
    pub attachment_id: Uuid,
    pub private_port: i32,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
