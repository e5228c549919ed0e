//! The real agent (library and binary) against a real server, driving
//! libvirt's `test:///default` driver.

use std::path::Path;
use std::time::{Duration, Instant};

use kumo_agent::run::{Agent, AgentConfig};
use kumo_api_types::{Vm, VmCreate, VmState};

use crate::harness::{bin, events_of, on_both_backends, scratch, Backend, TestServer};

fn fixture(dir: &Path, machine: &str) -> std::path::PathBuf {
    let root = dir.join(machine);
    kumo_topology::fixtures::write(&kumo_topology::fixtures::machine(machine).unwrap(), &root)
        .unwrap();
    root
}

fn config(s: &TestServer, join: Option<String>, sysfs: &Path, state: &Path) -> AgentConfig {
    crate::harness::agent_config(s, join, sysfs, state, "gpu-001")
}

fn vm(name: &str, gpus: u32) -> VmCreate {
    VmCreate {
        name: name.into(),
        gpus,
        gpu_model: None,
        vcpus: Some(8),
        memory_gib: Some(16),
        disk_gib: Some(10),
        template: None,
        service_level: Default::default(),
        ssh_keys: vec!["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEfKZKAnUydzsiZEOKuPIAY7Nck1wiFzauveaJjZfhrF user@lab".into()],
        networks: Vec::new(),
        volumes: Vec::new(),
        on_reclaim: None,
        on_host_loss: None,
        notice_seconds: None,
        shares: Vec::new(),
        public_ip: false,
        queue: false,
        reservation: None,
    }
}

/// The domain of a VM as libvirt has it: (exists, active).
fn domain(id: uuid::Uuid) -> (bool, bool) {
    domain_in(
        &virt::connect::Connect::open(Some("test:///default")).unwrap(),
        id,
    )
}

/// Destroys and undefines these VMs' domains: libvirtd's test driver is
/// shared by every client of the daemon, so a test leaves nothing behind.
fn forget(conn: &virt::connect::Connect, ids: &[uuid::Uuid]) {
    for id in ids {
        if let Ok(d) = conn.lookup_domain_by_uuid_string(&id.to_string()) {
            let _ = d.destroy();
            if d.undefine_flags(virt::sys::VIR_DOMAIN_UNDEFINE_NVRAM)
                .is_err()
            {
                let _ = d.undefine();
            }
        }
    }
}

fn domain_in(conn: &virt::connect::Connect, id: uuid::Uuid) -> (bool, bool) {
    match conn.lookup_domain_by_uuid_string(&id.to_string()) {
        Ok(d) => (true, d.is_active().unwrap()),
        Err(_) => (false, false),
    }
}

async fn state(s: &TestServer, name: &str) -> Option<VmState> {
    s.admin
        .get::<Vm>(&format!("/api/v1/tenants/lab/vms/{name}"))
        .await
        .ok()
        .map(|v| v.state)
}

async fn act(s: &TestServer, name: &str, action: &str) {
    let r = s
        .http()
        .post(format!("{}/api/v1/tenants/lab/vms/{name}/{action}", s.url))
        .bearer_auth(&s.admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202, "{action}");
}

fn changes(a: &Agent) -> u64 {
    a.reconciler.lock().unwrap().changes
}

on_both_backends! {
    async fn agent_reconciles_libvirt_idempotently_and_adopts_after_restart(s: &TestServer) {
        s.tenant("lab").await;
        // libvirtd outlives agents; the test driver keeps its domains only
        // while a connection is open, so hold one for the whole test.
        let _libvirtd = virt::connect::Connect::open(Some("test:///default")).unwrap();
        let dir = scratch();
        let sysfs = fixture(dir.path(), "hgx-h100");
        let state_dir = dir.path().join("state");
        let agent = Agent::start(config(s, Some(s.join_token().await), &sysfs, &state_dir)).await.unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(state_dir.join("credential")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let v: Vm = s.admin.post("/api/v1/tenants/lab/vms", &vm("train", 2)).await.unwrap();
        agent.sync_once(None).await.unwrap();
        let now: Vm = s.admin.get("/api/v1/tenants/lab/vms/train").await.unwrap();
        assert_eq!(now.state, VmState::Running, "{:?}", now.reason);
        assert_eq!(domain(v.id), (true, true));
        assert!(state_dir.join(format!("vms/{}/disk.qcow2", v.id)).exists(), "qemu-img made the disk");
        // The cloud-init seed: a `cidata` ISO with the hostname and the key.
        let seed = state_dir.join(format!("vms/{}/seed.iso", v.id));
        let info = std::process::Command::new("isoinfo").arg("-d").arg("-i").arg(&seed).output().unwrap();
        assert!(String::from_utf8_lossy(&info.stdout).contains("Volume id: cidata"));
        let user = std::process::Command::new("isoinfo").args(["-J", "-x", "/user-data", "-i"]).arg(&seed).output().unwrap();
        let user = String::from_utf8_lossy(&user.stdout);
        assert!(user.starts_with("#cloud-config") && user.contains("ssh-ed25519 AAAAC3Nz"), "{user}");
        // No other local user reads a tenant's disk or keys: the files are
        // 0600, the sources of the seed 0700, the VM's directory unlistable.
        let vm_dir = state_dir.join(format!("vms/{}", v.id));
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&vm_dir.join("disk.qcow2")), 0o600);
        assert_eq!(mode(&seed), 0o600);
        assert_eq!(mode(&vm_dir.join("cidata")), 0o700);
        assert_eq!(mode(&vm_dir), 0o711);

        // A second pass changes nothing.
        let before = changes(&agent);
        agent.sync_once(None).await.unwrap();
        assert_eq!(changes(&agent), before);

        // Restart: the credential is reused and the domain adopted, untouched.
        drop(agent);
        let agent = Agent::start(config(s, None, &sysfs, &state_dir)).await.unwrap();
        agent.sync_once(None).await.unwrap();
        assert_eq!(changes(&agent), 0, "nothing redefined or restarted");
        assert_eq!(state(s, "train").await, Some(VmState::Running));

        act(s, "train", "stop").await;
        agent.sync_once(None).await.unwrap();
        assert_eq!(domain(v.id), (true, false));
        assert_eq!(state(s, "train").await, Some(VmState::Stopped));
        act(s, "train", "start").await;
        agent.sync_once(None).await.unwrap();
        assert_eq!(domain(v.id), (true, true));
        assert_eq!(state(s, "train").await, Some(VmState::Running));
        let before = changes(&agent);
        act(s, "train", "reboot").await;
        agent.sync_once(None).await.unwrap();
        assert_eq!(changes(&agent), before + 1, "one reboot per request");
        agent.sync_once(None).await.unwrap();
        assert_eq!(changes(&agent), before + 1);

        let r = s.http().delete(format!("{}/api/v1/tenants/lab/vms/train", s.url)).bearer_auth(&s.admin_token).send().await.unwrap();
        assert_eq!(r.status(), 202);
        agent.sync_once(None).await.unwrap();
        assert_eq!(domain(v.id), (false, false));
        assert_eq!(state(s, "train").await, None, "deleted");
        assert!(!state_dir.join(format!("vms/{}", v.id)).exists());

        // The driver's own domain is not ours and was never touched.
        let conn = virt::connect::Connect::open(Some("test:///default")).unwrap();
        let foreign = conn.lookup_domain_by_name("test").unwrap();
        assert!(foreign.is_active().unwrap());
    }
}

/// A `kumo-agent run` process, killed however the test ends.
struct AgentProcess(std::process::Child);

impl AgentProcess {
    fn spawn(s: &TestServer, join: &str, sysfs: &Path, state: &Path, libvirt: &str) -> Self {
        let child = std::process::Command::new(bin("kumo-agent"))
            .args(["run", "--server", &s.url, "--libvirt-uri", libvirt])
            .args(["--virt-type", "qemu", "--name", "gpu-001"])
            .args(["--heartbeat-secs", "1", "--join-token", join])
            .arg("--sysfs-root")
            .arg(sysfs)
            .arg("--state-dir")
            .arg(state)
            .env("KUMO_LOG", "warn")
            .spawn()
            .unwrap();
        AgentProcess(child)
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        // SIGKILL: no chance to finish what it was doing.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn wait_for_a_host(s: &TestServer) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let hosts: kumo_api_types::Page<kumo_api_types::Host> =
            s.admin.get("/api/v1/hosts").await.unwrap();
        if !hosts.items.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "agent never registered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `kumo-agent run` binary as its own process: request → running.
#[tokio::test]
async fn agent_process_brings_a_vm_to_running() {
    let s = TestServer::start(Backend::Sqlite).await;
    s.tenant("lab").await;
    let dir = scratch();
    let sysfs = fixture(dir.path(), "hgx-h100");
    let join = s.join_token().await;
    let _agent = AgentProcess::spawn(
        &s,
        &join,
        &sysfs,
        &dir.path().join("state"),
        "test:///default",
    );
    wait_for_a_host(&s).await;
    let mut times = Vec::new();
    for i in 0..20 {
        let started = Instant::now();
        let name = format!("vm-{i}");
        let _: Vm = s
            .admin
            // CPU-only, so that 20 fit on the host next to each other.
            .post("/api/v1/tenants/lab/vms", &vm(&name, 0))
            .await
            .unwrap();
        loop {
            if state(&s, &name).await == Some(VmState::Running) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{name} never ran"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        times.push(started.elapsed());
    }
    times.sort();
    let median = times[times.len() / 2];
    let p95 = times[(times.len() * 95).div_ceil(100) - 1];
    println!(
        "request→running over {} VMs: median {median:?}, p95 {p95:?}, max {:?}",
        times.len(),
        times[times.len() - 1]
    );
    assert!(p95 < Duration::from_secs(2), "p95 {p95:?}");
    s.stop().await;
}

/// Passes of the real agent until `name` is `want` (the reaper moves
/// things along in the background meanwhile).
async fn converge_until(s: &TestServer, agent: &Agent, name: &str, want: VmState) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        agent.sync_once(None).await.unwrap();
        let now: Option<Vm> = s
            .admin
            .get(&format!("/api/v1/tenants/lab/vms/{name}"))
            .await
            .ok();
        let now_state = now.as_ref().map(|v| v.state);
        if now_state == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline && now_state != Some(VmState::Error),
            "{name} is {now_state:?} ({:?}), not {want:?}",
            now.and_then(|v| v.reason)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A CPU-only spot VM reclaimed for a guaranteed one is saved with
/// libvirt's managed save (not destroyed), and resumed from that saved
/// state once its CPUs are free again.
#[tokio::test]
async fn a_reclaimed_cpu_only_spot_vm_is_saved_and_resumed() {
    let s = TestServer::start_with(Backend::Sqlite, |c| {
        c.preemption_grace = Duration::from_secs(2)
    })
    .await;
    s.tenant("lab").await;
    let conn = virt::connect::Connect::open(Some("test:///default")).unwrap();
    let dir = scratch();
    let sysfs = fixture(dir.path(), "cpu-only");
    let mut cfg = config(
        &s,
        Some(s.join_token().await),
        &sysfs,
        &dir.path().join("state"),
    );
    cfg.name = "cpu-007".into();
    let agent = Agent::start(cfg).await.unwrap();
    // 96 of the host's 128 CPUs, then a guaranteed VM wanting 64.
    let mut spot = vm("saver", 0);
    spot.vcpus = Some(96);
    spot.service_level = kumo_api_types::ServiceLevel::Spot;
    let spot: Vm = s
        .admin
        .post("/api/v1/tenants/lab/vms", &spot)
        .await
        .unwrap();
    converge_until(&s, &agent, "saver", VmState::Running).await;
    let mut keeper = vm("keeper", 0);
    keeper.vcpus = Some(64);
    let keeper: Vm = s
        .admin
        .post("/api/v1/tenants/lab/vms", &keeper)
        .await
        .unwrap();
    assert_eq!(keeper.state, VmState::Pending);
    assert_eq!(state(&s, "saver").await, Some(VmState::Preempting));

    // Before the deadline the host tells the guest (test:/// has no guest
    // agent, which the event says) and keeps the VM running.
    agent.sync_once(None).await.unwrap();
    assert_eq!(state(&s, "saver").await, Some(VmState::Preempting));
    assert!(conn
        .lookup_domain_by_uuid_string(&spot.id.to_string())
        .unwrap()
        .is_active()
        .unwrap());
    converge_until(&s, &agent, "keeper", VmState::Running).await;
    assert_eq!(state(&s, "saver").await, Some(VmState::Suspended));
    let saved = conn
        .lookup_domain_by_uuid_string(&spot.id.to_string())
        .unwrap();
    assert!(!saved.is_active().unwrap());
    assert!(saved.has_managed_save(0).unwrap(), "saved, not destroyed");
    let kinds = events_of(&s, "lab", &spot).await;
    for k in ["preempting", "preemption-notice", "suspending", "suspended"] {
        assert!(kinds.iter().any(|x| x == k), "{k} missing from {kinds:?}");
    }

    // Room returns: the spot VM resumes from its saved state.
    let r = s
        .http()
        .delete(format!("{}/api/v1/tenants/lab/vms/keeper", s.url))
        .bearer_auth(&s.admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    converge_until(&s, &agent, "saver", VmState::Running).await;
    let back = conn
        .lookup_domain_by_uuid_string(&spot.id.to_string())
        .unwrap();
    assert!(back.is_active().unwrap());
    assert!(!back.has_managed_save(0).unwrap(), "restored from the save");
    assert!(events_of(&s, "lab", &spot)
        .await
        .iter()
        .any(|k| k == "resuming"));
    let v: Vm = s.admin.get("/api/v1/tenants/lab/vms/saver").await.unwrap();
    assert!(v.placement.is_some() && v.host.as_deref() == Some("cpu-007"));
    s.stop().await;
}

/// A relay between an agent and what it talks to (the server over TCP,
/// libvirtd over its Unix socket) that the test can cut: while cut it ends
/// the connections it carries and refuses new ones, as a network partition
/// or a restarting daemon would.
struct Relay {
    /// `http://…` for TCP, the socket's path for Unix.
    addr: String,
    cut: tokio::sync::watch::Sender<bool>,
    _dir: Option<tempfile::TempDir>,
}

trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for T {}

enum Listener {
    Tcp(tokio::net::TcpListener, String),
    Unix(tokio::net::UnixListener, std::path::PathBuf),
}

impl Listener {
    async fn accept(&self) -> std::io::Result<Box<dyn Stream>> {
        Ok(match self {
            Listener::Tcp(l, _) => Box::new(l.accept().await?.0),
            Listener::Unix(l, _) => Box::new(l.accept().await?.0),
        })
    }

    async fn connect(&self) -> std::io::Result<Box<dyn Stream>> {
        Ok(match self {
            Listener::Tcp(_, to) => Box::new(tokio::net::TcpStream::connect(to).await?),
            Listener::Unix(_, to) => Box::new(tokio::net::UnixStream::connect(to).await?),
        })
    }
}

impl Relay {
    async fn to(server: &str) -> Relay {
        let backend = server.trim_start_matches("http://").to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        Relay::start(Listener::Tcp(listener, backend), addr, None)
    }

    async fn to_socket(path: &Path) -> Relay {
        let dir = scratch();
        let addr = dir.path().join("relay.sock");
        let listener = tokio::net::UnixListener::bind(&addr).unwrap();
        let addr = addr.display().to_string();
        Relay::start(
            Listener::Unix(listener, path.to_path_buf()),
            addr,
            Some(dir),
        )
    }

    fn start(listener: Listener, addr: String, dir: Option<tempfile::TempDir>) -> Relay {
        let (cut, watch) = tokio::sync::watch::channel(false);
        let listener = std::sync::Arc::new(listener);
        tokio::spawn(async move {
            loop {
                let Ok(mut inbound) = listener.accept().await else {
                    continue;
                };
                if *watch.borrow() {
                    continue; // dropped: refused
                }
                let (listener, mut watch) = (listener.clone(), watch.clone());
                tokio::spawn(async move {
                    let Ok(mut out) = listener.connect().await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut out) => {}
                        _ = watch.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Relay {
            addr,
            cut,
            _dir: dir,
        }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

async fn wait_for<F: std::future::Future<Output = bool>>(what: &str, mut f: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A 2-GPU VM, created and then waited for until it runs.
async fn create_and_run(s: &TestServer, name: &str) -> Vm {
    let v: Vm = s
        .admin
        .post("/api/v1/tenants/lab/vms", &vm(name, 2))
        .await
        .unwrap();
    wait_for(&format!("{name} to run"), || async {
        state(s, name).await == Some(VmState::Running)
    })
    .await;
    v
}

/// An agent cut off from the server (its own loop running, as
/// `kumo-agent run` does): its VM keeps running, the host turns
/// `unreachable` and its VM `unknown`; an action taken meanwhile waits;
/// once the network is back the host is ready again, the action is
/// carried out, and no domain was made twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cut_off_keeps_its_vms_and_catches_up() {
    let s = TestServer::start_with(Backend::Sqlite, |c| {
        c.heartbeat_timeout = Duration::from_secs(2);
    })
    .await;
    s.tenant("lab").await;
    let libvirtd = virt::connect::Connect::open(Some("test:///default")).unwrap();
    let domains = || libvirtd.list_all_domains(0).unwrap().len();
    let dir = scratch();
    let sysfs = fixture(dir.path(), "hgx-h100");
    let relay = Relay::to(&s.url).await;
    let mut cfg = config(
        &s,
        Some(s.join_token().await),
        &sysfs,
        &dir.path().join("state"),
    );
    cfg.server = relay.addr.clone();
    cfg.resync = Duration::from_millis(200);
    let agent = Agent::start(cfg).await.unwrap();
    let running = tokio::spawn(agent.run());
    let before = domains();

    let v = create_and_run(&s, "train").await;
    assert_eq!(domain(v.id), (true, true));

    relay.set_cut(true);
    let host = || async { s.admin.host("gpu-001").await.map(|h| h.host.state).ok() };
    wait_for("the host to turn unreachable", || async {
        host().await == Some(kumo_api_types::HostState::Unreachable)
    })
    .await;
    assert_eq!(state(&s, "train").await, Some(VmState::Unknown));
    assert_eq!(
        domain(v.id),
        (true, true),
        "the VM runs on while its agent is away"
    );
    act(&s, "train", "stop").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        domain(v.id),
        (true, true),
        "nothing reaches the host while cut"
    );

    relay.set_cut(false);
    wait_for("the host to be ready again", || async {
        host().await == Some(kumo_api_types::HostState::Ready)
    })
    .await;
    wait_for("the stop to be carried out", || async {
        state(&s, "train").await == Some(VmState::Stopped)
    })
    .await;
    assert_eq!(domain(v.id), (true, false));
    assert_eq!(domains(), before + 1, "one domain, never made twice");
    let events = events_of(&s, "lab", &v).await;
    assert_eq!(
        events.iter().filter(|e| e.as_str() == "running").count(),
        1,
        "{events:?}"
    );
    running.abort();
}

/// libvirtd's read-write socket (started by `scripts/ensure-libvirtd.sh`).
const LIBVIRT_SOCK: &str = "/run/libvirt/libvirt-sock";

/// libvirt failing under a running agent. First libvirtd goes away (its
/// connections end and new ones are refused, as in a restart): the running
/// VM keeps running, a VM created meanwhile waits, and once libvirtd is
/// back the agent opens a new connection and starts it. Then a libvirt
/// call fails (defining the domain: its name is taken): the VM turns
/// `error` with libvirt's reason, and runs once the cause is gone. No
/// domain is made twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_rides_out_libvirt_failures() {
    let s = TestServer::start(Backend::Sqlite).await;
    s.tenant("lab").await;
    // The daemon's test driver, seen directly; holding it open also keeps
    // the driver's domains while the agent's connection is gone.
    virt::error::clear_error_callback();
    let libvirtd = virt::connect::Connect::open(Some("test+unix:///default")).unwrap();
    let domain = |id| domain_in(&libvirtd, id);
    let relay = Relay::to_socket(Path::new(LIBVIRT_SOCK)).await;
    let dir = scratch();
    let sysfs = fixture(dir.path(), "hgx-h100");
    let mut cfg = config(
        &s,
        Some(s.join_token().await),
        &sysfs,
        &dir.path().join("state"),
    );
    cfg.libvirt_uri = format!("test+unix:///default?socket={}", relay.addr);
    cfg.resync = Duration::from_millis(200);
    let agent = Agent::start(cfg).await.unwrap();
    let reconciler = agent.reconciler.clone();
    let running = tokio::spawn(agent.run());

    let a = create_and_run(&s, "first").await;
    assert_eq!(domain(a.id), (true, true));

    relay.set_cut(true);
    let b: Vm = s
        .admin
        .post("/api/v1/tenants/lab/vms", &vm("second", 2))
        .await
        .unwrap();
    // Passes run every 200 ms and fail while libvirtd is away.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(state(&s, "second").await, Some(VmState::Scheduled));
    assert_eq!(domain(b.id), (false, false));
    assert_eq!(domain(a.id), (true, true), "the first VM runs on");
    assert_eq!(state(&s, "first").await, Some(VmState::Running));

    // A foreign domain with the name the agent will give the second VM.
    let name = format!("kumo-second-{}", &b.id.simple().to_string()[..8]);
    let squatter = libvirtd
        .define_domain_xml(&format!(
            "<domain type='test'><name>{name}</name><memory>1024</memory>\
             <os><type>hvm</type></os></domain>"
        ))
        .unwrap();

    relay.set_cut(false);
    wait_for("the second VM to fail on the taken name", || async {
        state(&s, "second").await == Some(VmState::Error)
    })
    .await;
    let v: Vm = s.admin.get("/api/v1/tenants/lab/vms/second").await.unwrap();
    let reason = v.reason.unwrap_or_default();
    assert!(reason.contains(&name), "libvirt's reason: {reason}");
    assert!(
        reconciler.lock().unwrap().reconnects >= 1,
        "the agent opened libvirt again"
    );
    assert_eq!(domain(a.id), (true, true));

    squatter.undefine().unwrap();
    wait_for("the second VM to run", || async {
        state(&s, "second").await == Some(VmState::Running)
    })
    .await;
    assert_eq!(domain(b.id), (true, true));
    assert_eq!(domain(a.id), (true, true));
    let ours = libvirtd
        .list_all_domains(0)
        .unwrap()
        .iter()
        .filter(|d| {
            let u = d.uuid_string().unwrap();
            u == a.id.to_string() || u == b.id.to_string()
        })
        .count();
    assert_eq!(ours, 2, "one domain each, never made twice");
    for v in [&a, &b] {
        let events = events_of(&s, "lab", v).await;
        assert_eq!(
            events.iter().filter(|e| e.as_str() == "running").count(),
            1,
            "{events:?}"
        );
    }
    running.abort();
    forget(&libvirtd, &[a.id, b.id]);
}

/// `kumo-agent run` killed with SIGKILL at random moments, a dozen times,
/// while it brings eight VMs up, deletes two and stops one; its domains
/// live on in libvirtd (the daemon's test driver). Restarted each time
/// over the same state directory, it ends with every VM as asked: one
/// domain each, running or not as wanted, none left of the deleted ones,
/// every disk and seed whole, and one `running` event per VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_reconcile_makes_nothing_twice() {
    use rand::Rng;
    let s = TestServer::start(Backend::Sqlite).await;
    s.tenant("lab").await;
    virt::error::clear_error_callback();
    let libvirtd = virt::connect::Connect::open(Some("test+unix:///default")).unwrap();
    let made = || {
        libvirtd
            .list_all_domains(0)
            .unwrap()
            .iter()
            .filter(|d| d.name().is_ok_and(|n| n.starts_with("kumo-kill-")))
            .count()
    };
    let dir = scratch();
    let sysfs = fixture(dir.path(), "hgx-h100");
    let state_dir = dir.path().join("state");
    let join = s.join_token().await;
    let spawn = || AgentProcess::spawn(&s, &join, &sysfs, &state_dir, "test+unix:///default");
    let mut agent = spawn();
    wait_for_a_host(&s).await;

    // A VM asked for just before most kills, the deletions and the stop
    // before a later one: kills land while domains are being made, started,
    // destroyed and removed.
    let mut vms = Vec::new();
    let kills = 12;
    let mut at_kill = Vec::new();
    for round in 0..kills {
        if round < 8 {
            let v: Vm = s
                .admin
                .post("/api/v1/tenants/lab/vms", &vm(&format!("kill-{round}"), 1))
                .await
                .unwrap();
            vms.push(v);
        }
        if round == 9 {
            for name in ["kill-0", "kill-1"] {
                let r = s
                    .http()
                    .delete(format!("{}/api/v1/tenants/lab/vms/{name}", s.url))
                    .bearer_auth(&s.admin_token)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 202, "delete {name}");
            }
            act(&s, "kill-2", "stop").await;
        }
        let pause = rand::thread_rng().gen_range(10..250);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        at_kill.push(made());
        drop(agent);
        agent = spawn();
    }

    let want = |name: &str| match name {
        "kill-0" | "kill-1" => None,
        "kill-2" => Some(VmState::Stopped),
        _ => Some(VmState::Running),
    };
    wait_for("every VM as asked", || async {
        for v in &vms {
            let now = state(&s, &v.name)
                .await
                .filter(|st| *st != VmState::Deleted);
            if now != want(&v.name) {
                return false;
            }
        }
        true
    })
    .await;
    drop(agent);

    for v in &vms {
        let vm_dir = state_dir.join("vms").join(v.id.to_string());
        let Some(st) = want(&v.name) else {
            assert_eq!(
                domain_in(&libvirtd, v.id),
                (false, false),
                "{}: deleted, yet its domain is there",
                v.name
            );
            assert!(!vm_dir.exists(), "{}: its files are left", v.name);
            continue;
        };
        assert_eq!(
            domain_in(&libvirtd, v.id),
            (true, st == VmState::Running),
            "{}",
            v.name
        );
        let disk = std::process::Command::new("qemu-img")
            .arg("check")
            .arg(vm_dir.join("disk.qcow2"))
            .output()
            .unwrap();
        assert!(
            disk.status.success(),
            "{}: disk: {}",
            v.name,
            String::from_utf8_lossy(&disk.stderr)
        );
        let seed = std::process::Command::new("isoinfo")
            .args(["-f", "-R", "-i"])
            .arg(vm_dir.join("seed.iso"))
            .output()
            .unwrap();
        let files = String::from_utf8_lossy(&seed.stdout);
        assert!(files.contains("/user-data"), "{}: seed: {files}", v.name);
        // kill-2 may have been stopped before it first ran.
        let events = events_of(&s, "lab", v).await;
        let runs = events.iter().filter(|e| e.as_str() == "running").count();
        let expected = if v.name == "kill-2" { 0..=1 } else { 1..=1 };
        assert!(expected.contains(&runs), "{}: {events:?}", v.name);
    }
    // No other domain of these VMs' names was made.
    assert_eq!(made(), 6, "one domain per VM left");
    println!("agent killed {kills} times (domains at each kill: {at_kill:?}); 8 VMs converged");
    forget(&libvirtd, &vms.iter().map(|v| v.id).collect::<Vec<_>>());
}

/// A `kumo-agent run` process for one host of a scalable unit, on its own
/// `test:///default` libvirt (one per process), killed with SIGKILL when
/// dropped.
fn unit_agent(s: &TestServer, join: &str, dir: &Path, name: &str, unit: &str) -> AgentProcess {
    let root = dir.join(name);
    let sysfs = fixture(&root, "hgx-h100");
    let child = std::process::Command::new(bin("kumo-agent"))
        .args([
            "run",
            "--server",
            &s.url,
            "--libvirt-uri",
            "test:///default",
        ])
        .args([
            "--virt-type",
            "qemu",
            "--name",
            name,
            "--scalable-unit",
            unit,
        ])
        .args(["--heartbeat-secs", "1", "--join-token", join])
        .arg("--sysfs-root")
        .arg(&sysfs)
        .arg("--state-dir")
        .arg(root.join("state"))
        .env("KUMO_LOG", "warn")
        .spawn()
        .unwrap();
    AgentProcess(child)
}

fn fault_config(c: &mut kumo_server::config::Config) {
    c.heartbeat_timeout = Duration::from_secs(3);
    c.preemption_grace = Duration::from_secs(1);
}

async fn cluster_now(s: &TestServer) -> kumo_api_types::Cluster {
    s.admin
        .get("/api/v1/tenants/lab/clusters/train")
        .await
        .unwrap()
}

on_both_backends! {
    config = fault_config;

    /// Issue 41's proof with real agents: a 3-member cluster with
    /// `--auto-repair --spares 1` in one scalable unit, another tenant's
    /// spot VM on the spare; the agent of one member's host is killed
    /// with SIGKILL. The cluster is `degraded` within the heartbeat
    /// timeout, then `healthy` with the member on the spare host, on the
    /// same rails, under the same name; the spot VM was reclaimed with
    /// notice.
    async fn a_cluster_outlives_a_killed_agent_on_its_spare(s: &TestServer) {
        s.tenant("lab").await;
        s.tenant("other").await;
        let dir = scratch();
        let join = s.join_token().await;
        let mut agents: Vec<Option<AgentProcess>> = (0..4)
            .map(|i| Some(unit_agent(s, &join, dir.path(), &format!("gpu-a{i}"), "su-a")))
            .collect();
        wait_for("four hosts", || async {
            let hosts: kumo_api_types::Page<kumo_api_types::Host> =
                s.admin.get("/api/v1/hosts").await.unwrap();
            hosts.items.len() == 4
        })
        .await;
        let body = serde_json::json!({
            "name": "train", "size": 3, "gpus": 8, "vcpus": 16, "memory_gib": 32, "disk_gib": 10,
            "auto_repair": true, "repair_delay_seconds": 1, "spares": 1,
        });
        let made: kumo_api_types::Cluster = s.admin.post("/api/v1/tenants/lab/clusters", &body).await.unwrap();
        assert_eq!((made.spares, made.spare_unit.as_deref()), (1, Some("su-a")));
        let used: Vec<String> = made.members.iter().filter_map(|m| m.host.clone()).collect();
        let spare = (0..4).map(|i| format!("gpu-a{i}")).find(|h| !used.contains(h)).unwrap();
        let spot = serde_json::json!({"name": "lent", "gpus": 8, "vcpus": 16, "memory_gib": 32, "disk_gib": 10, "service_level": "spot"});
        let lent: Vm = s.admin.post("/api/v1/tenants/other/vms", &spot).await.unwrap();
        assert_eq!(lent.host.as_ref(), Some(&spare));
        let lent_state = || async {
            let v: Vm = s.admin.get("/api/v1/tenants/other/vms/lent").await.unwrap();
            v.state
        };
        wait_for("members and the spot VM running", || async {
            let c = cluster_now(s).await;
            c.health == kumo_api_types::ClusterHealth::Healthy
                && c.members.iter().all(|m| m.state == VmState::Running)
                && lent_state().await == VmState::Running
        })
        .await;
        let before = cluster_now(s).await;
        let victim = before.members[1].clone();
        let lost: usize = victim.host.as_deref().and_then(|h| h.strip_prefix("gpu-a")).unwrap().parse().unwrap();

        // SIGKILL the member's agent.
        let cut = Instant::now();
        drop(agents[lost].take());
        wait_for("degraded", || async { cluster_now(s).await.health == kumo_api_types::ClusterHealth::Degraded }).await;
        let to_degraded = cut.elapsed();
        assert!(to_degraded < Duration::from_secs(3) + Duration::from_secs(3), "degraded after {to_degraded:?}");
        let degraded = cluster_now(s).await;
        assert_eq!(degraded.problems[0].member, victim.name);
        assert_eq!(degraded.problems[0].fault, kumo_api_types::MemberFault::HostLost);
        wait_for("healthy again", || async {
            let c = cluster_now(s).await;
            c.health == kumo_api_types::ClusterHealth::Healthy
                && c.members.iter().all(|m| m.state == VmState::Running)
        })
        .await;
        let to_healthy = cut.elapsed();
        println!("real agents: member's agent SIGKILLed → degraded in {to_degraded:?}, healthy on the spare in {to_healthy:?} (heartbeat timeout 3 s, repair delay 1 s, spot grace 1 s)");
        let after = cluster_now(s).await;
        let now = after.members.iter().find(|m| m.name == victim.name).unwrap();
        assert_eq!(now.host.as_ref(), Some(&spare), "{after:#?}");
        assert_eq!((now.scalable_unit.as_deref(), &now.rails), (Some("su-a"), &victim.rails));
        assert!(!victim.rails.is_empty() && victim.rails.iter().all(|r| r.is_some()), "{victim:#?}");
        assert_eq!(after.hostfile, before.hostfile);
        // The spot VM had its notice, then was reclaimed.
        let v: Vm = s.admin.get("/api/v1/tenants/other/vms/lent").await.unwrap();
        assert_ne!(v.state, VmState::Running);
        let ev = events_of(s, "other", &v).await;
        assert!(ev.iter().any(|e| e.starts_with("preempting")), "{ev:?}");
        drop(agents);
    }
}
