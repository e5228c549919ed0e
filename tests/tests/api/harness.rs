//! Starts a real `kumo-server` in process, on SQLite in a temporary
//! directory or on the running PostgreSQL in a schema of its own, so that
//! tests never collide.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use kumo_api_types::{MemberPut, Role, TenantCreate, TokenCreate, UserCreate};
use kumo_cli::Client;
use kumo_server::config::Config;
use kumo_server::RunningServer;
use sea_orm::{ConnectionTrait, Database, Statement};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub const DEFAULT_PG_URL: &str = "postgres://root@127.0.0.1:5432/test";

pub fn pg_base_url() -> String {
    std::env::var("KUMO_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_PG_URL.into())
}

pub struct TestServer {
    pub server: RunningServer,
    pub url: String,
    pub admin_token: String,
    pub admin: Client,
    pub data_dir: PathBuf,
    pg_schema: Option<String>,
    _dir: tempfile::TempDir,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Creates a fresh schema, dropping leftovers of runs older than an hour
/// (a test that panicked does not get to clean up after itself).
async fn fresh_pg_schema() -> String {
    let base = pg_base_url();
    let db = Database::connect(&base).await.unwrap_or_else(|e| {
        panic!("PostgreSQL at {base} is required for these tests (the README's test command starts it): {e}")
    });
    let rows = db
        .query_all(Statement::from_string(
            db.get_database_backend(),
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'kumo_t_%'".to_owned(),
        ))
        .await
        .unwrap();
    let cutoff = now_secs().saturating_sub(3600);
    for row in rows {
        let name: String = row.try_get("", "nspname").unwrap();
        let ts = name.split('_').nth(2).and_then(|t| t.parse::<u64>().ok());
        if ts.is_some_and(|t| t < cutoff) {
            let _ = db
                .execute_unprepared(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
                .await;
        }
    }
    let schema = format!("kumo_t_{}_{}", now_secs(), uuid::Uuid::new_v4().simple());
    db.execute_unprepared(&format!("CREATE SCHEMA \"{schema}\""))
        .await
        .unwrap();
    db.close().await.unwrap();
    schema
}

/// A fresh schema and the database URL that works in it.
pub async fn fresh_pg_url() -> (String, String) {
    let schema = fresh_pg_schema().await;
    let sep = if pg_base_url().contains('?') {
        '&'
    } else {
        '?'
    };
    (
        format!("{}{sep}options[search_path]={schema}", pg_base_url()),
        schema,
    )
}

impl TestServer {
    pub async fn start(backend: Backend) -> TestServer {
        Self::start_with(backend, |_| {}).await
    }

    pub async fn start_with(backend: Backend, adjust: impl FnOnce(&mut Config)) -> TestServer {
        // The server's warnings and errors (an internal error's cause)
        // go to the test's output: shown when a test fails.
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("KUMO_TEST_LOG")
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("kumo_server=warn")),
            )
            .try_init();
        let dir = tempfile::tempdir().unwrap();
        let (url, pg_schema) = match backend {
            Backend::Sqlite => (None, None),
            Backend::Postgres => {
                let (url, schema) = fresh_pg_url().await;
                (Some(url), Some(schema))
            }
        };
        let mut config = Config::for_data_dir(dir.path(), url);
        // Real agents in tests keep their pools in scratch directories on
        // tmpfs (a few GiB) while their VMs ask for 10–50 GiB disks: the
        // disk is not what those tests are about. Tests of hosts' storage
        // (`host_storage`) set `[storage] overcommit` back to 1.0.
        config.storage.overcommit = 1000.0;
        adjust(&mut config);
        let server = RunningServer::start(config).await.unwrap();
        let token_file = server
            .admin_token_file
            .clone()
            .expect("a fresh database bootstraps the admin");
        let admin_token = std::fs::read_to_string(&token_file)
            .unwrap()
            .trim()
            .to_owned();
        let url = server.url();
        let admin = Client::new(&url, Some(admin_token.clone())).unwrap();
        TestServer {
            server,
            url,
            admin_token,
            admin,
            data_dir: dir.path().to_path_buf(),
            pg_schema,
            _dir: dir,
        }
    }

    pub async fn stop(self) {
        self.server.stop().await.unwrap();
        if let Some(schema) = self.pg_schema {
            let db = Database::connect(&pg_base_url()).await.unwrap();
            db.execute_unprepared(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                .await
                .unwrap();
            db.close().await.unwrap();
        }
    }

    /// Stops the server and starts it again on the same address, database
    /// and data directory, as a restart would.
    pub async fn restart(&mut self) {
        let mut config = self.server.state.config.as_ref().clone();
        config.listen = self.server.addr;
        self.server.halt().await.unwrap();
        self.server = RunningServer::start(config).await.unwrap();
    }

    pub fn client(&self, token: Option<&str>) -> Client {
        Client::new(&self.url, token.map(str::to_owned)).unwrap()
    }

    pub fn http(&self) -> reqwest::Client {
        reqwest::Client::new()
    }

    /// The scheduler's index re-read now (it follows the database every
    /// few seconds by itself), after an inventory changed.
    pub async fn refresh_capacity(&self) {
        self.server
            .state
            .capacity
            .refresh_all(&self.server.state.db)
            .await
            .unwrap();
    }

    /// A VM's NCCL topology file as the API serves it (the admin asking).
    pub async fn nccl_topology(&self, tenant: &str, vm: &str) -> String {
        self.http()
            .get(format!(
                "{}/api/v1/tenants/{tenant}/vms/{vm}/nccl-topology",
                self.url
            ))
            .bearer_auth(&self.admin_token)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// A browser signed in to the portal as the platform admin (the
    /// chooser's "sign in with an API token", its CSRF token
    /// double-submitted).
    pub async fn portal_admin(&self) -> reqwest::Client {
        self.portal_as(&self.admin_token).await
    }

    /// A browser signed in to the portal with `token`.
    pub async fn portal_as(&self, token: &str) -> reqwest::Client {
        let c = reqwest::Client::builder()
            .cookie_store(true)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let login = c
            .get(format!("{}/login", self.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let r = c
            .post(format!("{}/auth/token", self.url))
            .form(&[("token", token), ("csrf", &csrf_of(&login))])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 302, "token sign-in");
        c
    }

    /// A portal page as `c` sees it.
    pub async fn page(&self, c: &reqwest::Client, path: &str) -> String {
        let r = c.get(format!("{}{path}", self.url)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        r.text().await.unwrap()
    }

    pub fn db(&self) -> &sea_orm::DatabaseConnection {
        &self.server.state.db
    }

    /// Creates a user and returns a client holding a fresh token of theirs.
    pub async fn user(&self, name: &str) -> (Client, String) {
        self.admin
            .create_user(&UserCreate {
                name: name.into(),
                display_name: None,
                email: None,
                kind: None,
                is_admin: false,
            })
            .await
            .unwrap();
        let t = self
            .admin
            .create_token_for(name, &TokenCreate::default())
            .await
            .unwrap();
        (self.client(Some(&t.token)), t.token)
    }

    /// A tenant with a quota roomy enough that only tests about quotas
    /// meet it (`quota` sets a tight one).
    pub async fn tenant(&self, name: &str) {
        self.bare_tenant(name).await;
        let mut q = kumo_api_types::Quota {
            vcpus: 100_000,
            memory_gib: 1_000_000,
            vms: 1_000,
            disk_gib: 1_000_000,
            segments: 1_000,
            roce_segments: 1_000,
            public_ips: 1_000,
            volume_gib: 1_000_000,
            share_gib: 1_000_000,
            ..Default::default()
        };
        for m in ["H100-SXM5-80GB", "A100-SXM4-40GB", "L40S"] {
            q.gpus.insert(m.into(), 1_000);
        }
        self.quota(name, &q).await;
    }

    /// A tenant with the default (empty) quota.
    pub async fn bare_tenant(&self, name: &str) {
        self.admin
            .create_tenant(&TenantCreate {
                name: name.into(),
                display_name: None,
                description: None,
            })
            .await
            .unwrap();
    }

    pub async fn quota(&self, tenant: &str, q: &kumo_api_types::Quota) {
        self.admin.set_quota(tenant, q).await.unwrap();
    }

    pub async fn add(&self, tenant: &str, user: &str, role: Role) {
        self.admin
            .put_member(tenant, user, &MemberPut { role })
            .await
            .unwrap();
    }
}

/// Runs each scenario against SQLite and against PostgreSQL, on servers
/// whose configuration `config = f;` adjusts where a file needs it.
macro_rules! on_both_backends {
    (config = $config:expr; $($(#[$meta:meta])* async fn $name:ident($s:ident: &TestServer) $body:block)*) => {
        $(
            $(#[$meta])*
            mod $name {
                #[allow(unused_imports)]
                use super::*;

                async fn scenario($s: &$crate::harness::TestServer) $body

                #[tokio::test]
                async fn sqlite() {
                    let s = $crate::harness::TestServer::start_with($crate::harness::Backend::Sqlite, $config).await;
                    scenario(&s).await;
                    s.stop().await;
                }

                #[tokio::test]
                async fn postgres() {
                    let s = $crate::harness::TestServer::start_with($crate::harness::Backend::Postgres, $config).await;
                    scenario(&s).await;
                    s.stop().await;
                }
            }
        )*
    };
    ($($(#[$meta:meta])* async fn $name:ident($s:ident: &TestServer) $body:block)*) => {
        on_both_backends! { config = |_| {}; $($(#[$meta])* async fn $name($s: &TestServer) $body)* }
    };
}
pub(crate) use on_both_backends;

/// A fixture machine's topology, as its agent would report it.
pub fn fixture_topology(name: &str) -> kumo_topology::HostTopology {
    let dir = scratch();
    kumo_topology::fixtures::write(&kumo_topology::fixtures::machine(name).unwrap(), dir.path())
        .unwrap();
    kumo_topology::sysfs::discover(dir.path(), None).unwrap()
}

/// An agent that speaks the real protocol over HTTP and pretends that
/// whatever should run, runs: the simulated host of the fast tests.
#[derive(Clone)]
pub struct SimAgent {
    pub url: String,
    pub host_id: uuid::Uuid,
    pub credential: String,
    http: reqwest::Client,
    known: std::collections::BTreeSet<uuid::Uuid>,
}

impl TestServer {
    /// A join token for a test's fleet (16 registrations).
    pub async fn join_token(&self) -> String {
        let r: kumo_api_types::JoinTokenCreated = self
            .admin
            .post(
                "/api/v1/hosts/join-tokens",
                &serde_json::json!({"uses": 16}),
            )
            .await
            .unwrap();
        r.token
    }

    pub async fn sim_agent(&self, name: &str, machine: &str) -> SimAgent {
        self.sim_agent_in(name, machine, None).await
    }

    /// A simulated host in a scalable unit.
    pub async fn sim_agent_in(&self, name: &str, machine: &str, su: Option<&str>) -> SimAgent {
        let join = self.join_token().await;
        SimAgent::register_in(&self.url, &join, name, fixture_topology(machine), su).await
    }

    /// A simulated host with a VXLAN tunnel endpoint.
    pub async fn sim_agent_at(&self, name: &str, machine: &str, underlay: &str) -> SimAgent {
        let join = self.join_token().await;
        SimAgent::register_with(
            &self.url,
            kumo_api_types::AgentRegister {
                join_token: join,
                name: name.into(),
                topology: fixture_topology(machine),
                virt_type: "qemu".into(),
                scalable_unit: None,
                rails: Default::default(),
                underlay_ip: Some(underlay.parse().unwrap()),
                edge_uplink: None,
                transfer_url: Some(SIM_TRANSFER_URL.into()),
            },
        )
        .await
    }
}

/// Where simulated hosts say they serve volume moves (nothing listens:
/// a simulated destination reports an import whole at once).
pub const SIM_TRANSFER_URL: &str = "http://127.0.0.1:9";

/// Heartbeats sent for hosts until dropped ([`SimAgent::keep_beating`]).
pub struct Heartbeats(tokio::task::JoinHandle<()>);

impl Drop for Heartbeats {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl SimAgent {
    pub async fn register(
        url: &str,
        join_token: &str,
        name: &str,
        topology: kumo_topology::HostTopology,
    ) -> SimAgent {
        Self::register_in(url, join_token, name, topology, None).await
    }

    pub async fn register_in(
        url: &str,
        join_token: &str,
        name: &str,
        topology: kumo_topology::HostTopology,
        scalable_unit: Option<&str>,
    ) -> SimAgent {
        Self::register_with(
            url,
            kumo_api_types::AgentRegister {
                join_token: join_token.into(),
                name: name.into(),
                topology,
                virt_type: "qemu".into(),
                scalable_unit: scalable_unit.map(str::to_owned),
                rails: Default::default(),
                underlay_ip: None,
                edge_uplink: None,
                transfer_url: Some(SIM_TRANSFER_URL.into()),
            },
        )
        .await
    }

    pub async fn register_with(url: &str, body: kumo_api_types::AgentRegister) -> SimAgent {
        let http = reqwest::Client::new();
        let resp = http
            .post(format!("{url}/agent/v1/register"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.status(),
            201,
            "{}",
            resp.text().await.unwrap_or_default()
        );
        let r: kumo_api_types::AgentRegistered = resp.json().await.unwrap();
        SimAgent {
            url: url.into(),
            host_id: r.host_id,
            credential: r.credential,
            http,
            known: Default::default(),
        }
    }

    pub async fn desired(&self, after: Option<i64>) -> kumo_api_types::DesiredState {
        let mut url = format!("{}/agent/v1/desired", self.url);
        if let Some(a) = after {
            url.push_str(&format!("?after={a}"));
        }
        let resp = self
            .http
            .get(url)
            .bearer_auth(&self.credential)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.json().await.unwrap()
    }

    pub async fn report(&self, vms: Vec<kumo_api_types::VmStatus>) -> reqwest::Response {
        self.http
            .post(format!("{}/agent/v1/status", self.url))
            .bearer_auth(&self.credential)
            .json(&kumo_api_types::StatusReport {
                vms,
                ..Default::default()
            })
            .send()
            .await
            .unwrap()
    }

    pub async fn heartbeat(&self) -> reqwest::StatusCode {
        self.http
            .post(format!("{}/agent/v1/heartbeat", self.url))
            .bearer_auth(&self.credential)
            .json(&serde_json::json!({}))
            .send()
            .await
            .unwrap()
            .status()
    }

    /// A heartbeat saying the host has the shared filesystem of project
    /// shares (so it may keep them).
    pub async fn heartbeat_with_shares(&self) -> reqwest::StatusCode {
        self.http
            .post(format!("{}/agent/v1/heartbeat", self.url))
            .bearer_auth(&self.credential)
            .json(&serde_json::json!({"shares": {
                "root": "/srv/kumo-shares", "capacity_gib": 1000, "free_gib": 900,
                "limit": "measured"
            }}))
            .send()
            .await
            .unwrap()
            .status()
    }

    /// Keeps `agents`' hosts reachable while a long test runs (slower on a
    /// loaded machine than the lost-host detector's 30 s): each heartbeats
    /// every 5 s, and nothing else, until the handle is dropped.
    pub fn keep_beating(agents: Vec<SimAgent>) -> Heartbeats {
        Heartbeats(tokio::spawn(async move {
            loop {
                for a in &agents {
                    a.heartbeat().await;
                }
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            }
        }))
    }

    /// One reconcile pass: everything desired is made so, everything no
    /// longer desired is reported gone.
    pub async fn converge(&mut self) {
        if let Err(e) = self.try_converge().await {
            panic!("{e}");
        }
    }

    /// [`SimAgent::converge`] that reports a server it cannot reach (or
    /// that refuses) instead of panicking: for tests that kill servers.
    pub async fn try_converge(&mut self) -> Result<(), String> {
        use kumo_api_types::{ActualState, Power, VmStatus};
        let resp = self
            .http
            .get(format!("{}/agent/v1/desired", self.url))
            .bearer_auth(&self.credential)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if resp.status() != 200 {
            return Err(format!("desired: {}", resp.status()));
        }
        let d: kumo_api_types::DesiredState = resp.json().await.map_err(|e| e.to_string())?;
        let mut report = Vec::new();
        let desired: std::collections::BTreeSet<uuid::Uuid> = d.vms.iter().map(|v| v.id).collect();
        for v in &d.vms {
            let state = match v.power {
                Power::Running => ActualState::Running,
                Power::Stopped => ActualState::Stopped,
                Power::Suspended => ActualState::Suspended,
            };
            report.push(VmStatus {
                id: v.id,
                state,
                reason: None,
                guest: None,
                notice: None,
                mounts: vec![],
            });
        }
        for gone in self
            .known
            .difference(&desired)
            .chain(d.remove.iter())
            .chain(d.shelve.iter())
        {
            report.push(VmStatus {
                id: *gone,
                state: ActualState::Absent,
                reason: None,
                guest: None,
                notice: None,
                mounts: vec![],
            });
        }
        let r = self
            .http
            .post(format!("{}/agent/v1/status", self.url))
            .bearer_auth(&self.credential)
            .json(&kumo_api_types::StatusReport {
                vms: report,
                // Volumes and their snapshots are made at once and
                // deleted at once; a volume moving here arrives at once.
                volumes: d
                    .volumes
                    .iter()
                    .map(|v| {
                        let s = (v.id, kumo_api_types::VolumeActual::Ready);
                        (s, v.snapshots.clone())
                    })
                    .chain(d.imports.iter().filter(|i| i.kind.is_volume()).map(|i| {
                        let s = (i.volume, kumo_api_types::VolumeActual::Ready);
                        (s, Vec::new())
                    }))
                    .chain(d.delete_volumes.iter().map(|id| {
                        let s = (*id, kumo_api_types::VolumeActual::Absent);
                        (s, Vec::new())
                    }))
                    .map(|((id, state), snapshots)| kumo_api_types::VolumeStatus {
                        id,
                        state,
                        size_gib: None,
                        reason: None,
                        snapshots,
                        token_sha256: None,
                    })
                    .collect(),
                // Root disks too arrive at once, and go at once.
                root_disks: d
                    .imports
                    .iter()
                    .filter(|i| !i.kind.is_volume())
                    .map(|i| (i.volume, kumo_api_types::VolumeActual::Ready))
                    .chain(
                        d.drop_disks
                            .iter()
                            .map(|id| (*id, kumo_api_types::VolumeActual::Absent)),
                    )
                    .map(|(id, state)| kumo_api_types::VolumeStatus {
                        id,
                        state,
                        size_gib: None,
                        reason: None,
                        snapshots: Vec::new(),
                        token_sha256: None,
                    })
                    .collect(),
                // Simulated devices always come back.
                unfit: Vec::new(),
                // Shares' directories too are made and deleted at once.
                shares: d
                    .shares
                    .iter()
                    .map(|s| (s.id, kumo_api_types::VolumeActual::Ready))
                    .chain(
                        d.delete_shares
                            .iter()
                            .map(|id| (*id, kumo_api_types::VolumeActual::Absent)),
                    )
                    .map(|(id, state)| kumo_api_types::ShareStatus {
                        id,
                        state,
                        reason: None,
                        used_bytes: Some(0),
                        limit: Some(kumo_api_types::ShareLimit::Measured),
                        uncounted: false,
                    })
                    .collect(),
            })
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if r.status() != 204 {
            return Err(format!(
                "status: {} {}",
                r.status(),
                r.text().await.unwrap_or_default()
            ));
        }
        // Only a report the server took moves what this host knows it has.
        self.known = desired;
        Ok(())
    }
}

/// A binary of the workspace, built next to this test binary.
pub fn bin(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace (`cargo build --workspace --bins`) first",
        path.display()
    );
    path
}

/// A scratch directory on tmpfs when there is one (fixtures are many small files).
pub fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .tempdir_in(if std::path::Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        })
        .unwrap()
}

/// The kinds of a VM's lifecycle events, oldest first.
pub async fn events_of(s: &TestServer, tenant: &str, vm: &kumo_api_types::Vm) -> Vec<String> {
    let page: kumo_api_types::Page<kumo_api_types::VmEvent> = s
        .admin
        .get(&format!("/api/v1/tenants/{tenant}/events?limit=500"))
        .await
        .unwrap();
    page.items
        .into_iter()
        .filter(|e| e.vm_id == vm.id)
        .map(|e| e.kind)
        .rev()
        .collect()
}

/// A real agent's configuration for `s` on libvirt's test driver: host
/// `name`, its sysfs at `sysfs`, its state in `state`, heartbeats and
/// telemetry every second.
pub fn agent_config(
    s: &TestServer,
    join: Option<String>,
    sysfs: &std::path::Path,
    state: &std::path::Path,
    name: &str,
) -> kumo_agent::run::AgentConfig {
    kumo_agent::run::AgentConfig {
        server: s.url.clone(),
        join_token: join,
        libvirt_uri: "test:///default".into(),
        sysfs_root: sysfs.to_path_buf(),
        state_dir: state.to_path_buf(),
        name: name.into(),
        virt_type: "qemu".into(),
        heartbeat: std::time::Duration::from_secs(1),
        scalable_unit: None,
        rails: Default::default(),
        underlay_ip: None,
        netns: None,
        edge_uplink: None,
        storage: None,
        resync: kumo_agent::run::RESYNC,
        transfer_listen: ([127, 0, 0, 1], 0).into(),
        transfer_url: None,
        telemetry: std::time::Duration::from_secs(1),
        fabric_manager: None,
        storage_policy: Default::default(),
        shares: None,
    }
}

/// The first form's CSRF token on a portal page.
pub fn csrf_of(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|v| v.split('"').next())
        .unwrap_or_else(|| panic!("no CSRF token in {page}"))
        .to_owned()
}

/// The address a `kumo-server` announces on stdout ("Kumo API listening
/// on URL …"), and the lines it printed up to it; `None` if it ended
/// first.
pub fn announced_url(out: &mut impl std::io::BufRead) -> (Option<String>, Vec<String>) {
    let mut lines = Vec::new();
    let mut line = String::new();
    while out.read_line(&mut line).is_ok_and(|n| n > 0) {
        let l = line.trim_end().to_owned();
        line.clear();
        if let Some(rest) = l.strip_prefix("Kumo API listening on ") {
            let url = rest.split_whitespace().next().map(str::to_owned);
            lines.push(l);
            return (url, lines);
        }
        lines.push(l);
    }
    (None, lines)
}

/// A child process killed (and reaped) however the test ends.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `kumo-server dev` process, stopped the way a person stops it (SIGTERM,
/// so it takes its fleet down: agents, network namespaces, edges and their
/// `dnsmasq`) however the test ends; killed only if it has not stopped
/// within 30 s. SIGKILL (as [`KillOnDrop`] does) would leave the fleet's
/// namespaces and `dnsmasq` behind until the next fleet on the same data
/// directory.
pub struct DevServer(pub std::process::Child);

impl DevServer {
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// SIGTERM, then the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        if let Ok(Some(status)) = self.0.try_wait() {
            return status;
        }
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            match self.0.try_wait() {
                Ok(Some(status)) => return status,
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                _ => {
                    let _ = self.0.kill();
                    return self.0.wait().unwrap_or_else(|e| panic!("dev server: {e}"));
                }
            }
        }
    }
}

impl Drop for DevServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The host addresses of a VM's GPUs, in its placement's order.
pub fn gpus_of(vm: &kumo_api_types::Vm) -> Vec<String> {
    vm.placement
        .iter()
        .flat_map(|p| p.gpus.iter().map(|g| g.host_bdf.clone()))
        .collect()
}

/// A webhook receiver on loopback: every body posted to it, in order;
/// each post must carry the `Kumo-Event` header `event`.
pub async fn webhook_receiver(
    event: &'static str,
) -> (
    String,
    std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/hooks/secret-path-abc123",
        listener.local_addr().unwrap()
    );
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = got.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut c, _)) = listener.accept().await else {
                return;
            };
            let keep = keep.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let n = c.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    let Some(head_end) = text.find("\r\n\r\n") else {
                        continue;
                    };
                    let len: usize = text[..head_end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    if buf.len() < head_end + 4 + len {
                        continue;
                    }
                    assert!(
                        text.to_ascii_lowercase()
                            .contains(&format!("kumo-event: {event}")),
                        "{text}"
                    );
                    let body: serde_json::Value =
                        serde_json::from_slice(&buf[head_end + 4..head_end + 4 + len]).unwrap();
                    keep.lock().unwrap().push(body);
                    let _ = c
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                    return;
                }
            });
        }
    });
    (url, got)
}

/// Waits (briefly: delivery is in the background) for `n` webhook posts.
pub async fn webhook_posts(
    got: &std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
    n: usize,
) -> Vec<serde_json::Value> {
    for _ in 0..100 {
        if got.lock().unwrap().len() >= n {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let v = got.lock().unwrap().clone();
    assert_eq!(v.len(), n, "{v:#?}");
    v
}
