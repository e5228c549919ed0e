use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "device_health")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub host_id: Uuid,
    #[sea_orm(primary_key, auto_increment = false)]
    pub bdf: String,
    /// `gpu` or `nic`.
    pub kind: String,
    pub state: String,
    pub reason: Option<String>,
    pub since: DateTimeUtc,
    pub last_finding_at: Option<DateTimeUtc>,
    pub aer_correctable: Option<i64>,
    pub aer_nonfatal: Option<i64>,
    pub aer_fatal: Option<i64>,
    pub carrier_changes: Option<i64>,
    pub read_at: Option<DateTimeUtc>,
    /// The last reading (JSON), as reported.
    pub signals: Option<String>,
    /// The project whose guest's XID quarantined it (bounded per project).
    pub reported_by: Option<Uuid>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
