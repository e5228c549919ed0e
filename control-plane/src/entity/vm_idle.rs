use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "vm_idle")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub vm_id: Uuid,
    pub tenant_id: Uuid,
    /// The current idle spell's start; none while busy or unknown.
    pub idle_since: Option<DateTimeUtc>,
    /// Notices sent in the spell (3: the action was taken).
    pub notices: i16,
    pub noticed_at: Option<DateTimeUtc>,
    pub exempt_until: Option<DateTimeUtc>,
    pub exempt_reason: Option<String>,
    pub exempt_by: Option<String>,
    /// Seconds of exemption the VM has used or holds, renewals included:
    /// capped by `[idle] max_exempt_days_total`.
    pub exempt_secs: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
