use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "hosts")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    #[sea_orm(unique)]
    pub name: String,
    /// `ready`, `draining`, `unreachable`, `retired`.
    pub state: String,
    /// Hex SHA-256 of the host credential's secret.
    pub credential_hash: String,
    /// The agent's last `HostTopology`, as JSON.
    pub topology: String,
    pub scalable_unit: Option<String>,
    pub registered_at: DateTimeUtc,
    pub last_heartbeat_at: DateTimeUtc,
    /// Bumped whenever the host's desired state changes; agents long-poll on it.
    pub revision: i64,
    /// `kvm`, or `qemu` (TCG) where the host has no usable KVM.
    pub virt_type: String,
    /// Rails of the RDMA NICs (`{"mlx5_0": 0, …}`), as JSON, when the
    /// host's configuration names them.
    pub rails: Option<String>,
    /// An operator drained it: `draining` whenever it is reachable.
    pub drained: bool,
    /// The VXLAN tunnel endpoint, unique; without one the host takes no
    /// VMs with networks.
    pub underlay_ip: Option<String>,
    /// Bumped when the host's networks change because of VMs elsewhere;
    /// agents see `revision + network_revision`.
    pub network_revision: i64,
    /// The agent's last RoCE port report (`[PortReport]`) as JSON.
    pub fabric: Option<String>,
    /// SHA-256 of `topology`, written with it (`None` for rows from before).
    pub topology_digest: Option<String>,
    /// An administrator allowed the next join-token registration under
    /// this name (`kumo host rejoin`); its old credential is revoked.
    pub rejoin_allowed: bool,
    /// The segments the agent could not set up, by VNI, with why
    /// (`{vni: message}` JSON), as its last heartbeat said; `None` when
    /// every one converged.
    pub segment_faults: Option<String>,
    /// An edge host: the agent's interface towards the provider network,
    /// where segment edges put their public addresses.
    pub edge_uplink: Option<String>,
    /// Where the agent serves volumes being moved (`http://ADDR:PORT`).
    pub transfer_url: Option<String>,
    /// What the host's storage pool may hold, GiB (its agent's report).
    pub disk_capacity_gib: Option<i64>,
    pub disk_free_gib: Option<i64>,
    /// The root disks' filesystem when it is not the pool's.
    pub root_disk_capacity_gib: Option<i64>,
    /// The shared filesystem of project shares as the agent reports it
    /// (`SharesStorage`, JSON); `None` where it reports none.
    pub shares_storage: Option<String>,
    /// When the lost-host detector found it silent (the state's clock);
    /// its VMs are `lost` once that is `[hosts] lost_after_secs` ago.
    pub unreachable_since: Option<DateTimeUtc>,
    /// A scheduled maintenance window: from then on the host's VMs move
    /// off (or stop) and it is `maintenance` until an admin is done.
    pub maintenance_at: Option<DateTimeUtc>,
    pub maintenance_reason: Option<String>,
    /// When the window was announced (or last moved): a VM's own notice
    /// (`notice_seconds`) runs from then.
    pub maintenance_told_at: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
