use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "audit_log")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub at: DateTimeUtc,
    pub actor_id: Option<Uuid>,
    pub actor_name: String,
    pub action: String,
    pub tenant_id: Option<Uuid>,
    pub tenant_name: Option<String>,
    pub target: String,
    pub source_ip: String,
    pub request_id: String,
    pub client_request_id: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
