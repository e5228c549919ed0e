use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "vms")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub name: String,
    pub state: String,
    pub reason: Option<String>,
    pub host_id: Option<Uuid>,
    /// The request (`VmSpec`), as JSON.
    pub spec: String,
    /// The `Placement` on its host, as JSON, once scheduled.
    pub placement: Option<String>,
    /// `running` or `stopped`: what the user last asked for.
    pub desired_power: String,
    /// Bumped by each reboot request, so the agent reboots exactly once per request.
    pub power_generation: i64,
    /// The host agent's last word on the guest: NCCL file written, or why not.
    pub guest_condition: Option<String>,
    /// A spot VM being reclaimed is destroyed (or suspended) at this time.
    pub preempt_deadline: Option<DateTimeUtc>,
    /// The training cluster the VM belongs to.
    pub cluster_id: Option<Uuid>,
    /// The host holding a shelved VM's root disk (where it is unshelved).
    pub disk_host_id: Option<Uuid>,
    /// Unshelved with `--anywhere`: placed where there is room, its disks
    /// then moved there.
    pub unshelve_anywhere: bool,
    /// SHA-256 of the token its new host's agent fetches its root disk
    /// with, while the disk moves.
    pub disk_move_token_sha256: Option<String>,
    /// Shelving to move off a host under maintenance: once shelved it is
    /// placed on another host, its disks moving with it, with this desired
    /// power (what it had).
    pub evacuating: Option<String>,
    /// Since when it runs above its tenant's guaranteed share of its GPU
    /// model: it may be reclaimed for a tenant within its share
    /// (`domain::guarantees`).
    pub borrowed_at: Option<DateTimeUtc>,
    /// The reservation it runs on (also in its spec), while that lasts.
    pub reservation_id: Option<Uuid>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
