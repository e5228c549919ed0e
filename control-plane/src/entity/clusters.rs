use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "clusters")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub name: String,
    pub size: i32,
    /// Every member's `VmSpec`, as JSON.
    pub spec: String,
    /// `pending` (waiting for spot VMs to be reclaimed) or `placed`.
    pub state: String,
    pub created_at: DateTimeUtc,
    /// `healthy`, `degraded` or `repairing`, as last assessed.
    pub health: String,
    /// What is wrong, per member (JSON `[ClusterProblem]`).
    pub problems: String,
    /// When `health` last changed.
    pub health_since: Option<DateTimeUtc>,
    /// Replaces failed members by itself, `repair_delay_seconds` after the
    /// cluster became degraded.
    pub auto_repair: bool,
    pub repair_delay_seconds: i32,
    /// A repair placed new members that are not all running yet.
    pub repairing: bool,
    /// Members' worth of its shape kept free in its scalable unit for
    /// repairs (0 once the cluster is being deleted).
    pub spares: i32,
    /// The scalable unit the spares are kept in, by name (`None`: hosts
    /// without one).
    pub spare_unit: Option<String>,
    /// The GPU model the members got (the spares' model).
    pub spare_model: Option<String>,
    /// `preferred` or `required`: whether members (and their
    /// replacements) may leave the cluster's scalable unit.
    pub single_su: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
