//! The agent's main loop: register (or load the credential), heartbeat,
//! and reconcile every time the desired state changes — or every long-poll
//! timeout, which also repairs drift nobody announced.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kumo_topology::sysfs;
use virt::connect::Connect;

use crate::client::{self, AgentClient, ClientError};
use crate::credential::{self, Credential};
use crate::reconcile::{Reconciler, Unconverged};
use kumo_api_types::AgentHeartbeat;
use vxlan_manager::roce::{Outcome, PortReport, RoceFabric, VfConfig, LOSSLESS};

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub server: String,
    pub join_token: Option<String>,
    pub libvirt_uri: String,
    pub sysfs_root: PathBuf,
    pub state_dir: PathBuf,
    pub name: String,
    pub virt_type: String,
    pub heartbeat: Duration,
    /// The host's scalable unit (leaf-switch domain), from its configuration.
    pub scalable_unit: Option<String>,
    /// The rail each RDMA NIC is cabled to.
    pub rails: std::collections::BTreeMap<String, u32>,
    /// The host's VXLAN tunnel endpoint, reported to the server.
    pub underlay_ip: Option<std::net::Ipv4Addr>,
    /// The network namespace tenant networks are programmed in (simulated
    /// fleets); the agent's own when `None`.
    pub netns: Option<String>,
    /// An edge host's interface towards the provider network.
    pub edge_uplink: Option<String>,
    /// How often a pass repairs drift between changes ([`RESYNC`]).
    pub resync: Duration,
    /// Where volumes live; `None`: qcow2 files under `state_dir/volumes`.
    pub storage: Option<StorageConfig>,
    /// Where the agent serves volumes being moved to other hosts (port 0:
    /// any free one).
    pub transfer_listen: std::net::SocketAddr,
    /// The address other agents fetch from; by default `http://` and the
    /// bound address (the underlay address for an unspecified one).
    pub transfer_url: Option<String>,
    /// How often the agent reads its devices' health and asks its GPU
    /// guests for their GPUs' figures.
    pub telemetry: Duration,
    /// The Fabric Manager client and its arguments (`fmpm --hostname
    /// ADDR`) of an NVSwitch host in shared NVSwitch mode.
    pub fabric_manager: Option<String>,
    /// How much long storage work runs at once, and the space kept back.
    pub storage_policy: StoragePolicy,
    /// The shared filesystem of project shares, where the host has one.
    pub shares: Option<crate::shares::SharesConfig>,
}

/// The host's storage limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoragePolicy {
    /// Long storage work (snapshot merges, copies, imports) running at
    /// once, per tenant and per host ([`crate::storage::jobs`]).
    pub jobs: crate::storage::jobs::Limits,
    /// GiB of the pool (and of the root disks' filesystem) never offered
    /// to the server: the host's own headroom.
    pub reserve_gib: u64,
    /// What to offer instead of the measured size less the reserve (a
    /// pool sharing its filesystem with other things; simulated hosts
    /// sharing one disk). Root disks then share it too.
    pub capacity_gib: Option<u64>,
}

/// The space kept back on a host's storage by default.
pub const DEFAULT_RESERVE_GIB: u64 = 10;

impl Default for StoragePolicy {
    fn default() -> Self {
        StoragePolicy {
            jobs: Default::default(),
            reserve_gib: DEFAULT_RESERVE_GIB,
            capacity_gib: None,
        }
    }
}

/// The host's storage as the server counts it: the pool's size less the
/// reserve, what is free in it, and the root disks' filesystem when it
/// is another. `None` (and logged) when the pool cannot be read.
pub fn measure_storage(
    storage: &dyn crate::storage::Backend,
    root_disks: &std::path::Path,
    policy: &StoragePolicy,
) -> Option<kumo_api_types::StorageCapacity> {
    use crate::storage::GIB;
    let pool = match storage.capacity() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "the storage pool's size is unknown");
            return None;
        }
    };
    if let Some(gib) = policy.capacity_gib {
        return Some(kumo_api_types::StorageCapacity {
            capacity_gib: gib,
            free_gib: (pool.free_bytes / GIB).min(gib),
            root_disks_gib: None,
        });
    }
    let offered = |total: u64| (total / GIB).saturating_sub(policy.reserve_gib);
    let root = crate::storage::filesystem_space(root_disks).ok();
    let root_disks_gib = match (pool.device, root) {
        (Some(d), Some(r)) if r.device == Some(d) => None,
        (_, Some(r)) => Some(offered(r.total_bytes)),
        (_, None) => None,
    };
    Some(kumo_api_types::StorageCapacity {
        capacity_gib: offered(pool.total_bytes),
        free_gib: pool.free_bytes / GIB,
        root_disks_gib,
    })
}

/// A host's storage pool for volumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageConfig {
    /// qcow2 files in a directory.
    Qcow2Dir(PathBuf),
    /// Thin LVs in an LVM thin pool.
    LvmThin { vg: String, thin_pool: String },
}

impl AgentConfig {
    /// VMs' root disks under the state directory.
    pub fn root_disks(&self) -> crate::storage::root_disks::RootDisks {
        crate::storage::root_disks::RootDisks::new(&self.state_dir)
    }

    /// The storage backend this configuration names.
    pub fn storage_backend(&self) -> Arc<dyn crate::storage::Backend> {
        match &self.storage {
            Some(StorageConfig::LvmThin { vg, thin_pool }) => {
                Arc::new(crate::storage::lvm::LvmThin::new(vg, thin_pool))
            }
            Some(StorageConfig::Qcow2Dir(dir)) => {
                Arc::new(crate::storage::qcow2::Qcow2Dir::new(dir))
            }
            None => Arc::new(crate::storage::qcow2::Qcow2Dir::new(
                self.state_dir.join("volumes"),
            )),
        }
    }
}

/// A registered agent with its reconciler.
pub struct Agent {
    pub config: AgentConfig,
    pub client: AgentClient,
    pub reconciler: Arc<Mutex<Reconciler>>,
    /// The last desired state fetched, for resync passes between changes.
    last: Arc<Mutex<Option<kumo_api_types::DesiredState>>>,
    /// The netlink connection for tenant networks, opened on first use.
    kernel: tokio::sync::Mutex<Option<vxlan_manager::Kernel>>,
    /// Netlink changes made to tenant networks, for tests and logs.
    pub network_changes: std::sync::atomic::AtomicU64,
    topology: kumo_topology::HostTopology,
    /// Fabric Manager's partitions as the reconciler last read them: the
    /// inventory goes to the server again when they change.
    fabric_view: Arc<Mutex<Option<kumo_topology::FabricManager>>>,
    fabric: Arc<Mutex<FabricState>>,
    /// The segments the last pass could not set up, for the heartbeat.
    faults: Arc<Mutex<BTreeMap<u32, String>>>,
    /// The host's volumes.
    storage: Arc<dyn crate::storage::Backend>,
    /// Long storage work, off the pass.
    pub jobs: Arc<crate::storage::jobs::Jobs>,
    /// Volumes moving to and from this host.
    pub transfers: Arc<crate::transfer::Transfers>,
    /// Serial consoles dialled out to the server.
    consoles: Arc<crate::console::Consoles>,
    /// GPU figures read from the guests.
    telemetry: Arc<crate::telemetry::Telemetry>,
    /// Project shares, where the host has the shared filesystem.
    shares: Option<Arc<Mutex<crate::shares::Shares>>>,
}

/// The RoCE ports as last configured, and whether the server has heard.
#[derive(Default)]
struct FabricState {
    applied: Option<(Vec<String>, Vec<VfConfig>)>,
    at: Option<std::time::Instant>,
    report: Vec<PortReport>,
    unsent: bool,
}

/// A RoCE configuration that stayed the same is re-applied this often (a
/// NIC reset loses it; a failure is retried).
const FABRIC_REFRESH: Duration = Duration::from_secs(60);

/// How long the heartbeat waits for the shared filesystem's figures: a
/// hung NFS or Lustre mount must not stop the host's heartbeat.
const SURVEY_WITHIN: Duration = Duration::from_secs(5);

/// How long a pass waits for the shares it keeps.
const SHARES_WITHIN: Duration = Duration::from_secs(10);

/// Between changes, a pass this often repairs drift (a guest that rebooted
/// and lost its NCCL file, a domain someone stopped by hand).
pub const RESYNC: Duration = Duration::from_secs(3);

async fn obtain(
    config: &AgentConfig,
    topo: &kumo_topology::HostTopology,
    force: bool,
) -> anyhow::Result<Credential> {
    if !force {
        if let Some(c) = credential::load(&config.state_dir)? {
            if c.server == config.server {
                return Ok(c);
            }
        }
    }
    let join = config.join_token.as_deref().ok_or_else(|| {
        anyhow::anyhow!(
            "no credential in {} and no --join-token to register with",
            config.state_dir.display()
        )
    })?;
    // A credential we hold for this server goes along: it is what lets a
    // registered name be taken again.
    let current = credential::load(&config.state_dir)
        .ok()
        .flatten()
        .filter(|c| c.server == config.server)
        .map(|c| c.credential);
    let r = client::register(config, join, current.as_deref(), topo).await?;
    let c = Credential {
        host_id: r.host_id,
        server: config.server.clone(),
        credential: r.credential,
    };
    credential::save(&config.state_dir, &c)?;
    tracing::info!(host = %config.name, id = %c.host_id, "registered");
    Ok(c)
}

/// The URL other agents fetch volumes from: the bound address, or the
/// underlay address with the bound port when bound to all addresses.
fn transfer_url(
    bound: std::net::SocketAddr,
    underlay: Option<std::net::Ipv4Addr>,
) -> anyhow::Result<String> {
    if !bound.ip().is_unspecified() {
        return Ok(format!("http://{bound}"));
    }
    match underlay {
        Some(ip) => Ok(format!("http://{ip}:{}", bound.port())),
        None => anyhow::bail!(
            "--transfer-listen {bound} is every address: name the one other hosts reach with --transfer-url"
        ),
    }
}

impl Agent {
    /// Reads the host, opens libvirt, and registers unless the state
    /// directory already holds this host's credential.
    pub async fn start(mut config: AgentConfig) -> anyhow::Result<Agent> {
        // Paths handed to libvirt and to tools run elsewhere must not
        // depend on this process's working directory.
        config.state_dir = std::path::absolute(&config.state_dir)?;
        let mut topo = sysfs::discover(&config.sysfs_root, None)?;
        for w in &topo.warnings {
            tracing::warn!(warning = %w, "topology");
        }
        // The partitions go into the inventory the server places by.
        let fabric = match (&config.fabric_manager, topo.nvswitches.is_empty()) {
            (Some(cmd), false) => {
                let fm = crate::fabric_manager::Fmpm::new(
                    crate::fabric_manager::argv(cmd),
                    kumo_topology::partitions::module_order(&topo),
                );
                let probe = fm.clone();
                let listed = tokio::task::spawn_blocking(move || probe.list()).await?;
                topo.fabric_manager = Some(match listed {
                    Ok(list) => kumo_topology::FabricManager::Partitions(
                        list.into_iter().map(|(p, _)| p).collect(),
                    ),
                    Err(e) => {
                        tracing::warn!(error = %e, "Fabric Manager does not answer: 1-GPU VMs only");
                        kumo_topology::FabricManager::Unreachable(format!(
                            "Fabric Manager does not answer: {e}"
                        ))
                    }
                });
                Some(fm)
            }
            (Some(_), true) => {
                tracing::warn!("--fabric-manager given, but this host has no NVSwitch: ignored");
                None
            }
            (None, false) => {
                tracing::warn!("an NVSwitch host without --fabric-manager: multi-GPU VMs get NVLink only if the host activates partitions itself");
                None
            }
            (None, true) => None,
        };
        let storage = config.storage_backend();
        let slots = crate::storage::jobs::Slots::new(config.storage_policy.jobs);
        let jobs =
            crate::storage::jobs::Jobs::new(slots.clone(), tokio::runtime::Handle::current());
        let transfers =
            crate::transfer::Transfers::with_slots(storage.clone(), config.root_disks(), slots);
        let listener = tokio::net::TcpListener::bind(config.transfer_listen)
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot listen for volume transfers on {}: {e}",
                    config.transfer_listen
                )
            })?;
        let bound = listener.local_addr()?;
        if config.transfer_url.is_none() {
            config.transfer_url = Some(transfer_url(bound, config.underlay_ip)?);
        }
        crate::transfer::serve(listener, transfers.clone());
        tracing::info!(listen = %bound, url = ?config.transfer_url, "serving volume transfers");
        let cred = obtain(&config, &topo, false).await?;
        let uri = config.libvirt_uri.clone();
        // Errors come back as values; libvirt's default handler would also
        // print each one (e.g. every foreign domain without our metadata).
        virt::error::clear_error_callback();
        let conn = tokio::task::spawn_blocking(move || Connect::open(Some(&uri)))
            .await?
            .map_err(|e| anyhow::anyhow!("cannot open libvirt at {}: {e}", config.libvirt_uri))?;
        let reconciler = Reconciler::new(
            conn,
            &config.libvirt_uri,
            cred.host_id,
            topo.clone(),
            &config.virt_type,
            &config.state_dir,
            &config.sysfs_root,
        );
        let reconciler = match fabric {
            Some(fm) => reconciler.with_fabric_manager(fm),
            None => reconciler,
        };
        let shares = config
            .shares
            .clone()
            .map(|c| Arc::new(Mutex::new(crate::shares::Shares::new(c, &config.state_dir))));
        let reconciler = reconciler.with_shares(shares.clone());
        let fabric_view = reconciler.fabric_view.clone();
        let consoles = crate::console::Consoles::new(
            &config.server,
            &cred.credential,
            &config.libvirt_uri,
            &config.state_dir.join("vms"),
        );
        let telemetry = Arc::new(crate::telemetry::Telemetry::new(
            &config.libvirt_uri,
            topo.clone(),
        ));
        Ok(Agent {
            client: AgentClient::new(&config.server, &cred.credential),
            consoles,
            storage,
            jobs,
            transfers,
            config,
            reconciler: Arc::new(Mutex::new(reconciler)),
            last: Arc::default(),
            kernel: tokio::sync::Mutex::new(None),
            network_changes: Default::default(),
            telemetry,
            topology: topo,
            fabric_view,
            fabric: Arc::default(),
            faults: Arc::default(),
            shares,
        })
    }

    /// One pass: fetch (waiting for a change after `after`), reconcile, report.
    pub async fn sync_once(&self, after: Option<i64>) -> Result<i64, ClientError> {
        let desired = self.client.desired(after).await?;
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(desired.clone());
        self.apply(desired.clone()).await?;
        Ok(desired.revision)
    }

    /// Sends the host's inventory (and its storage and shared filesystem)
    /// now (the run loop's first heartbeat carries it).
    pub async fn report_inventory(&self) -> Result<(), ClientError> {
        let mut inventory = self.topology.clone();
        inventory.fabric_manager = self
            .fabric_view
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let storage = self.storage.clone();
        let (root, policy) = (
            self.config.root_disks().dir_path().to_path_buf(),
            self.config.storage_policy,
        );
        let storage =
            tokio::task::spawn_blocking(move || measure_storage(&*storage, &root, &policy))
                .await
                .unwrap_or_default();
        let shares = match self.config.shares.clone() {
            Some(c) => Some(crate::shares::survey_within(c, SURVEY_WITHIN, &Arc::default()).await),
            None => None,
        };
        self.client
            .heartbeat(&AgentHeartbeat {
                topology: Some(inventory),
                underlay_ip: self.config.underlay_ip,
                storage,
                shares,
                ..Default::default()
            })
            .await
    }

    /// Reads the passed-through devices' health now and reports it (the
    /// run loop does so every telemetry interval).
    pub async fn report_health(&self) -> Result<(), ClientError> {
        let health = kumo_topology::health::read(&self.config.sysfs_root, &self.topology);
        self.client
            .heartbeat(&AgentHeartbeat {
                topology: None,
                underlay_ip: self.config.underlay_ip,
                fabric: None,
                segment_faults: None,
                transfer_url: None,
                health: Some(health),
                storage: None,
                shares: None,
            })
            .await
    }

    /// Reads the running GPU VMs' guests now and reports what they said
    /// (the run loop does so every telemetry interval).
    pub async fn report_telemetry(&self) -> Result<(), ClientError> {
        report_telemetry(&self.telemetry, &self.last, &self.client).await
    }

    /// A pass over the last desired state, without asking the server.
    pub async fn resync(&self) -> Result<(), ClientError> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match last {
            Some(d) => self.apply(d).await,
            None => Ok(()),
        }
    }

    /// Converges the host's tenant networks (VXLAN devices, bridges, flood
    /// lists, static entries, ingress filters) before any VM needs its
    /// bridge; a VM never runs unfiltered.
    async fn kernel(
        &self,
    ) -> Result<tokio::sync::MappedMutexGuard<'_, vxlan_manager::Kernel>, String> {
        let mut kernel = self.kernel.lock().await;
        if kernel.is_none() {
            *kernel = Some(
                vxlan_manager::Kernel::connect(self.config.netns.as_deref())
                    .map_err(|e| e.to_string())?,
            );
        }
        tokio::sync::MutexGuard::try_map(kernel, Option::as_mut)
            .map_err(|_| "no netlink connection".to_owned())
    }

    /// Configures the RoCE ports (QoS) and the VFs of VMs on RoCE segments
    /// when that changed, or every [`FABRIC_REFRESH`]; the outcome goes to
    /// the server with the next heartbeat.
    async fn converge_fabric(&self, desired: &kumo_api_types::DesiredState) {
        let want = crate::roce_ports::wanted(&self.topology, desired);
        if want.0.is_empty() {
            return;
        }
        {
            let f = self.fabric.lock().unwrap_or_else(|e| e.into_inner());
            let fresh = f.at.is_some_and(|t| t.elapsed() < FABRIC_REFRESH);
            let failed = f.report.iter().any(|p| {
                matches!(p.qos, Outcome::Failed(_))
                    || p.vfs.iter().any(|v| matches!(v.1, Outcome::Failed(_)))
            });
            if f.applied.as_ref() == Some(&want) && fresh && !failed {
                return;
            }
        }
        let report = match self.kernel().await {
            Ok(k) => {
                let fabric = vxlan_manager::fabric::LeafVlan {
                    kernel: &k,
                    netns: self.config.netns.as_deref(),
                };
                fabric.configure(&want.0, &want.1, &LOSSLESS).await
            }
            Err(e) => {
                tracing::warn!(error = %e, "RoCE ports not configured");
                return;
            }
        };
        for p in &report {
            tracing::info!(port = %p.netdev, qos = ?p.qos, vfs = ?p.vfs, "RoCE port");
        }
        let mut f = self.fabric.lock().unwrap_or_else(|e| e.into_inner());
        f.unsent |= f.report != report;
        f.report = report;
        f.applied = Some(want);
        f.at = Some(std::time::Instant::now());
    }

    /// Converges the host's tenant networks segment by segment; answers
    /// the segments left unconverged, by VNI. `Err` is the host's own
    /// failure (no netlink, no nftables): then no segment is trusted.
    async fn converge_network(
        &self,
        want: &vxlan_manager::DesiredState,
    ) -> Result<BTreeMap<u32, String>, String> {
        let k = self.kernel().await?;
        let done = vxlan_manager::converge_each(&k, want)
            .await
            .map_err(|e| e.to_string())?;
        let changes = done.changes;
        // The filters of the segments that converged (a failed one's VMs
        // do not start, so nothing of it runs unfiltered).
        let state = vxlan_manager::DesiredState {
            underlay_ip: want.underlay_ip,
            segments: want
                .segments
                .iter()
                .filter(|s| !done.failed.contains_key(&s.vni))
                .cloned()
                .collect(),
            edges: want
                .edges
                .iter()
                .filter(|e| !done.failed.contains_key(&e.vni))
                .cloned()
                .collect(),
        };
        let edges = state.edges.clone();
        // nft runs as a child process: off the async threads.
        let netns = self.config.netns.clone();
        let rules = tokio::task::spawn_blocking(move || {
            vxlan_manager::nft::converge_filters(netns.as_deref(), &state)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("ingress filters: {e}"))?;
        // An edge host's segment edges, each on its own (an edge that
        // fails is its segment's fault, reported like one). Not an edge
        // host: any edge left from when it was one is removed.
        let netns = self.config.netns.clone();
        let uplink = self.config.edge_uplink.clone();
        let edged = tokio::task::spawn_blocking(move || match uplink {
            Some(up) => vxlan_manager::edge::converge(netns.as_deref(), &up, &edges),
            None => vxlan_manager::edge::converge(netns.as_deref(), "", &[]),
        })
        .await
        .map_err(|e| e.to_string())?;
        let mut failed = done.failed;
        failed.extend(edged.failed);
        let n = changes.len() + rules + edged.changes;
        if n > 0 {
            self.network_changes
                .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(
                changes = changes.len(),
                filter_rules = rules,
                edge_changes = edged.changes,
                "tenant networks converged"
            );
        }
        for (vni, why) in &failed {
            tracing::warn!(vni, error = %why, "segment not converged; its VMs wait, the others go on");
        }
        Ok(failed)
    }

    /// The volumes brought to what the desired state says (made, grown,
    /// deleted); answers those ready to attach and what to report of
    /// volumes and of root disks. One volume's failure is its own; the
    /// pool's failure fails them all.
    async fn converge_storage(
        &self,
        desired: &kumo_api_types::DesiredState,
    ) -> (
        crate::reconcile::ReadyVolumes,
        Vec<kumo_api_types::VolumeStatus>,
        Vec<kumo_api_types::VolumeStatus>,
    ) {
        use crate::storage::{DiskSource, WantedVolume, GIB};
        use kumo_api_types::{TransferKind, VolumeActual, VolumeStatus};
        let want: Vec<WantedVolume> = desired
            .volumes
            .iter()
            .map(|v| WantedVolume {
                id: v.id,
                size_gib: u64::from(v.size_gib),
                tenant: v.tenant,
                source: v.source,
                snapshots: v.snapshots.clone(),
            })
            .collect();
        let delete = desired.delete_volumes.clone();
        self.transfers.set_exports(&desired.exports);
        let disks = self.config.root_disks();
        let root_disks = {
            // Root disks moving here, and those left of VMs gone elsewhere
            // (never one of a VM that runs here).
            let mut report =
                self.transfers
                    .converge_imports(TransferKind::RootDisk, &desired.imports, &|vm| {
                        disks.present(vm).then_some(None)
                    });
            let here = |vm: &uuid::Uuid| desired.vms.iter().any(|v| v.id == *vm);
            let drop: Vec<uuid::Uuid> = desired
                .drop_disks
                .iter()
                .filter(|vm| !here(vm))
                .copied()
                .collect();
            if !drop.is_empty() {
                // Removing a disk's directory blocks: not on the runtime.
                let disks = disks.clone();
                let dropped = tokio::task::spawn_blocking(move || {
                    drop.into_iter()
                        .map(|vm| {
                            let (state, reason) = match disks.remove(vm) {
                                Ok(_) => (VolumeActual::Absent, None),
                                Err(e) => (VolumeActual::Failed, Some(e.to_string())),
                            };
                            VolumeStatus {
                                id: vm,
                                state,
                                size_gib: None,
                                reason,
                                snapshots: Vec::new(),
                                token_sha256: None,
                            }
                        })
                        .collect::<Vec<_>>()
                })
                .await
                .unwrap_or_default();
                report.extend(dropped);
            }
            report
        };
        let moving_volumes = desired.imports.iter().any(|i| i.kind.is_volume());
        if !moving_volumes {
            // Moves called off (or over): their imports stop, their
            // partials go.
            self.transfers
                .converge_imports(TransferKind::Volume, &[], &|_| None);
        }
        if want.is_empty() && delete.is_empty() && !moving_volumes {
            // Jobs of volumes no longer wanted are called off.
            self.jobs.begin_pass();
            self.jobs.end_pass();
            return (Default::default(), Vec::new(), root_disks);
        }
        let backend = self.storage.clone();
        let transfers = self.transfers.clone();
        let jobs = self.jobs.clone();
        let imports = desired.imports.clone();
        let runtime = tokio::runtime::Handle::current();
        let done = tokio::task::spawn_blocking(move || {
            // Long work (merging snapshots, copies) is started here and
            // goes on after the pass, on the host's storage slots.
            let done = {
                let _guard = runtime.enter();
                crate::storage::converge_in_background(&backend, &want, &delete, &jobs)
            };
            let mut ready = crate::reconcile::ReadyVolumes::new();
            let mut report = Vec::new();
            let status = |id, state, reason: Option<String>| VolumeStatus {
                id,
                state,
                size_gib: None,
                reason,
                snapshots: Vec::new(),
                token_sha256: None,
            };
            for w in &want {
                if let Some(why) = done.failed.get(&w.id) {
                    report.push(status(w.id, VolumeActual::Failed, Some(why.clone())));
                    continue;
                }
                let Some(o) = done.volumes.iter().find(|o| o.id == w.id) else {
                    continue;
                };
                // Busy (a snapshot being merged into it): not reported, so
                // the server keeps it as it is until the work is done; a
                // VM keeps it as a disk meanwhile (it is the same file).
                let busy = done.busy.contains(&w.id);
                if !busy {
                    if let Err(e) = backend.prepare(w.id) {
                        report.push(status(w.id, VolumeActual::Failed, Some(e.to_string())));
                        continue;
                    }
                }
                let source = match backend.disk(w.id) {
                    DiskSource::File { path, format } => {
                        kumo_topology::domain_xml::DiskSource::File {
                            path: path.display().to_string(),
                            format,
                        }
                    }
                    DiskSource::Block { path } => kumo_topology::domain_xml::DiskSource::Block {
                        path: path.display().to_string(),
                    },
                };
                ready.insert(w.id, source);
                if busy {
                    continue;
                }
                report.push(VolumeStatus {
                    size_gib: Some(u32::try_from(o.size_bytes / GIB).unwrap_or(u32::MAX)),
                    snapshots: o.snapshots.clone(),
                    ..status(w.id, VolumeActual::Ready, None)
                });
            }
            for id in &delete {
                if let Some(why) = done.failed.get(id) {
                    report.push(status(*id, VolumeActual::Failed, Some(why.clone())));
                } else if !done.volumes.iter().any(|o| o.id == *id) {
                    report.push(status(*id, VolumeActual::Absent, None));
                }
            }
            if moving_volumes {
                // Imports start tasks on the runtime; the pool as this
                // pass left it says which are whole.
                let _guard = runtime.enter();
                let present = |id| {
                    let o = done.volumes.iter().find(|o| o.id == id)?;
                    Some(Some(u32::try_from(o.size_bytes / GIB).unwrap_or(u32::MAX)))
                };
                report.extend(transfers.converge_imports(TransferKind::Volume, &imports, &present));
            }
            if done.changes > 0 {
                tracing::info!(changes = done.changes, "volumes converged");
            }
            (ready, report)
        })
        .await;
        let (ready, volumes) = done.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "storage pass failed");
            Default::default()
        });
        (ready, volumes, root_disks)
    }

    /// The shares this host keeps brought in line (off the runtime: the
    /// shared filesystem may be slow), and the read-only binds no VM here
    /// needs any more let go.
    async fn converge_shares(
        &self,
        desired: &kumo_api_types::DesiredState,
    ) -> Vec<kumo_api_types::ShareStatus> {
        let Some(shares) = self.shares.clone() else {
            return Vec::new();
        };
        let kept = desired.shares.clone();
        let delete = desired.delete_shares.clone();
        let read_only: std::collections::BTreeSet<uuid::Uuid> = desired
            .vms
            .iter()
            .flat_map(|v| v.shares.iter().filter(|m| m.read_only).map(|m| m.share))
            .collect();
        // A shared filesystem that hangs (a hard NFS or Lustre mount)
        // holds up only this part: the pass goes on after SHARES_WITHIN,
        // and later passes skip it while the hung one still holds it.
        let task = tokio::task::spawn_blocking(move || {
            let Ok(mut s) = shares.try_lock() else {
                tracing::warn!(
                    "shares pass skipped: the last one is still waiting on the shared filesystem"
                );
                return Vec::new();
            };
            s.release_binds(&read_only);
            s.converge(&kept, &delete)
        });
        match tokio::time::timeout(SHARES_WITHIN, task).await {
            Ok(Ok(report)) => report,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "shares pass failed");
                Vec::new()
            }
            Err(_) => {
                tracing::warn!("the shared filesystem did not answer within {SHARES_WITHIN:?}; the pass goes on");
                Vec::new()
            }
        }
    }

    async fn apply(&self, desired: kumo_api_types::DesiredState) -> Result<(), ClientError> {
        // Consoles first: a person is waiting on the other end.
        self.consoles.converge(&desired.consoles);
        tracing::debug!(revision = desired.revision, "pass: networks");
        // A segment that does not converge holds back its own VMs only
        // (they would start without their bridge); the rest go on.
        let unconverged = match &desired.network {
            Some(net) => match self.converge_network(net).await {
                Ok(failed) => Unconverged::segments(failed),
                Err(e) => {
                    tracing::warn!(error = %e, "tenant networks not converged; retrying");
                    Unconverged::all(e)
                }
            },
            None => Unconverged::default(),
        };
        *self.faults.lock().unwrap_or_else(|e| e.into_inner()) = unconverged.faults();
        tracing::debug!("pass: fabric");
        self.converge_fabric(&desired).await;
        tracing::debug!("pass: storage");
        let (ready, volumes, root_disks) = self.converge_storage(&desired).await;
        tracing::debug!("pass: shares");
        let shares = self.converge_shares(&desired).await;
        tracing::debug!("pass: libvirt");
        let r = self.reconciler.clone();
        let d = desired.clone();
        let report = tokio::task::spawn_blocking(move || {
            let mut r = r.lock().unwrap_or_else(|e| e.into_inner());
            r.reconcile(&d, &unconverged, &ready)
                .map(|vms| (vms, std::mem::take(&mut r.unfit)))
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
        tracing::debug!("pass: status");
        match report {
            Ok((vms, unfit)) => {
                let sent = self
                    .client
                    .status(&kumo_api_types::StatusReport {
                        vms,
                        volumes,
                        root_disks,
                        unfit: unfit.clone(),
                        shares,
                    })
                    .await;
                if sent.is_err() {
                    // Said again with the next report: the devices stay out
                    // of the pool only once the server has heard of them.
                    // Once each, and no more than a report may carry.
                    let mut r = self.reconciler.lock().unwrap_or_else(|e| e.into_inner());
                    for u in unfit {
                        if !r.unfit.iter().any(|x| x.vm == u.vm && x.bdf == u.bdf) {
                            r.unfit.push(u);
                        }
                    }
                    let keep = r.unfit.len().saturating_sub(kumo_api_types::UNFIT_MAX);
                    r.unfit.drain(..keep);
                }
                sent?
            }
            Err(e) => tracing::warn!(error = %e, "reconcile pass failed; retrying"),
        }
        Ok(())
    }

    /// Runs until the process ends.
    pub async fn run(self) -> anyhow::Result<()> {
        let hb_client = self.client.clone();
        let every = self.config.heartbeat;
        let underlay = self.config.underlay_ip;
        let transfer_url = self.config.transfer_url.clone();
        let fabric = self.fabric.clone();
        let faults = self.faults.clone();
        let health_every = self.config.telemetry;
        let sysfs = self.config.sysfs_root.clone();
        let topo = self.topology.clone();
        let fabric_view = self.fabric_view.clone();
        let storage = self.storage.clone();
        let shares_config = self.config.shares.clone();
        let surveying = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (root_disks, policy) = (
            self.config.root_disks().dir_path().to_path_buf(),
            self.config.storage_policy,
        );
        let jobs_done = self.jobs.finished();
        let telemetry = {
            let (t, last, client, every) = (
                self.telemetry.clone(),
                self.last.clone(),
                self.client.clone(),
                self.config.telemetry,
            );
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    if let Err(e) = report_telemetry(&t, &last, &client).await {
                        tracing::warn!(error = %e, "GPU telemetry not reported");
                    }
                }
            })
        };
        let heartbeat = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            let mut health_at: Option<tokio::time::Instant> = None;
            // The inventory goes along until the server has it once per
            // start: a host fixed and restarted (its IOMMU turned on,
            // hugepages reserved, a card changed) is then judged anew
            // without registering again.
            let mut inventory_sent: Option<kumo_topology::HostTopology> = None;
            loop {
                tick.tick().await;
                let mut inventory = topo.clone();
                inventory.fabric_manager = fabric_view
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                let inventory = (inventory_sent.as_ref() != Some(&inventory)).then_some(inventory);
                let report = {
                    let f = fabric.lock().unwrap_or_else(|e| e.into_inner());
                    f.unsent.then(|| f.report.clone())
                };
                let segment_faults = faults.lock().unwrap_or_else(|e| e.into_inner()).clone();
                // Device health rides on the heartbeat, every telemetry
                // interval: the server judges it (rates need the time
                // between readings, which heartbeats give).
                let health = health_at
                    .is_none_or(|t| t.elapsed() >= health_every)
                    .then(|| {
                        health_at = Some(tokio::time::Instant::now());
                        kumo_topology::health::read(&sysfs, &topo)
                    });
                // The pool's size and free space, every heartbeat: what
                // the server places disks by.
                let space = {
                    let (storage, root) = (storage.clone(), root_disks.clone());
                    tokio::task::spawn_blocking(move || measure_storage(&*storage, &root, &policy))
                        .await
                        .unwrap_or_default()
                };
                let shares = match shares_config.clone() {
                    Some(c) => {
                        Some(crate::shares::survey_within(c, SURVEY_WITHIN, &surveying).await)
                    }
                    None => None,
                };
                let body = AgentHeartbeat {
                    topology: inventory.clone(),
                    underlay_ip: underlay,
                    fabric: report.clone(),
                    segment_faults: Some(segment_faults),
                    transfer_url: transfer_url.clone(),
                    health,
                    storage: space,
                    shares,
                };
                match hb_client.heartbeat(&body).await {
                    Ok(()) => {
                        if inventory.is_some() {
                            inventory_sent = inventory;
                        }
                        let mut f = fabric.lock().unwrap_or_else(|e| e.into_inner());
                        if report.as_ref() == Some(&f.report) {
                            f.unsent = false;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
                }
            }
        });
        let mut after = None;
        let mut backoff = Duration::from_millis(250);
        let mut resync = tokio::time::interval(self.config.resync);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // The long poll only fetches; every pass runs here, one at a
            // time. A pass holds the netlink connection across awaits, so a
            // resync pass started while another was suspended inside the
            // poll would wait for it forever (it did, under load).
            tracing::debug!(?after, "long poll");
            let fetched = {
                let mut poll = std::pin::pin!(self.client.desired(after));
                loop {
                    tokio::select! {
                        r = &mut poll => break r,
                        _ = resync.tick() => {
                            if let Err(e) = self.resync().await {
                                tracing::warn!(error = %e, "resync failed");
                            }
                        }
                        // Long storage work done: reported at once.
                        _ = jobs_done.notified() => {
                            if let Err(e) = self.resync().await {
                                tracing::warn!(error = %e, "resync failed");
                            }
                        }
                    }
                }
            };
            let synced = match fetched {
                Ok(desired) => {
                    after = Some(desired.revision);
                    *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(desired.clone());
                    self.apply(desired).await
                }
                Err(e) => Err(e),
            };
            match synced {
                Ok(()) => backoff = Duration::from_millis(250),
                Err(ClientError::Unauthorized(msg)) => {
                    tracing::warn!(%msg, "credential refused; registering again");
                    let topo = self
                        .reconciler
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .topology()
                        .clone();
                    match obtain(&self.config, &topo, true).await {
                        Ok(c) => self.client.renew(&c.credential),
                        Err(e) => {
                            heartbeat.abort();
                            telemetry.abort();
                            telemetry.abort();
                            return Err(e);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "cannot sync");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
    }
}

/// Reads the GPU guests of the last desired state (on a blocking thread:
/// guest-exec waits) and reports them, when there are any.
async fn report_telemetry(
    t: &Arc<crate::telemetry::Telemetry>,
    last: &Arc<Mutex<Option<kumo_api_types::DesiredState>>>,
    client: &AgentClient,
) -> Result<(), ClientError> {
    let vms = last
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|d| d.vms.clone())
        .unwrap_or_default();
    if vms.iter().all(|v| v.placement.gpus.is_empty()) {
        return Ok(());
    }
    let t = t.clone();
    let report = tokio::task::spawn_blocking(move || t.read(&vms))
        .await
        .unwrap_or_default();
    if report.vms.is_empty() {
        return Ok(());
    }
    client.telemetry(&report).await
}
