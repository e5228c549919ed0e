//! `kumo-server dev`: the whole system on one machine for trying it out —
//! the server on SQLite, a fleet of simulated hosts (one `kumo-agent`
//! process each, over a fixture sysfs tree of a real machine design and
//! libvirt's `test:///default` driver), a demo tenant with quota and a
//! template. Seeding goes through the public API, like any client. Run as
//! root, each host also gets a network namespace of its own on a shared
//! underlay, so tenant networks (bridges, VXLAN devices, filters) are real
//! kernel state per host; the first host is an edge host whose uplink
//! reaches a provider network (`network`), with a public address pool
//! `dev`, and every running VM on a segment gets a stand-in guest
//! (`guests`) that answers through it. Not as root, the fleet takes no
//! VMs with networks.

mod guests;
pub mod network;
pub mod qemu;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use kumo_api_types::{
    ClassPrice, GrantCreate, JoinTokenCreate, PublicIpPool, PublicIpPoolCreate, Quota, RateCardPut,
    TemplateCreate, TenantCreate,
};
use kumo_cli::Client;

use crate::config::Config;
use crate::RunningServer;
use network::FleetNetwork;

/// The fleet cycles through these designs.
pub const FLEET: &[&str] = &[
    "hgx-h100",
    "dgx-a100",
    "hgx-h100-2nic",
    "l40s-pcie",
    "cpu-only",
];

mod owner;

pub struct Fleet {
    children: Vec<Child>,
    /// The prefix of every namespace the fleet made (when it made any):
    /// all are removed with it.
    prefix: Option<String>,
    /// The task keeping the stand-in guests, and the guests themselves.
    guest_keeper: Option<tokio::task::JoinHandle<()>>,
    guests: Arc<Mutex<guests::Guests>>,
    /// The fleet's network as it was made (`network.json` also lists the
    /// guests as they come and go).
    pub network: FleetNetwork,
    /// What the real (QEMU) host made on this machine, where there is one.
    qemu: Option<qemu::Leftovers>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Some(t) = self.guest_keeper.take() {
            t.abort();
        }
        self.guests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove_all();
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Its agent is gone: its domains and links go before the
        // namespaces their peers are in.
        if let Some(q) = &self.qemu {
            qemu::remove(q);
        }
        // The agents died without a word: their edges (and edge DNS) go too.
        if let Some(prefix) = &self.prefix {
            network::remove_all(prefix);
        }
    }
}

/// The prefix of this process's dev namespaces: two dev fleets never
/// share one.
fn prefix() -> String {
    format!("kumo-dev-{}", std::process::id())
}

/// A network namespace for dev host `i`, or `None` where namespaces cannot
/// be made (not root).
fn host_namespace(i: usize) -> Option<String> {
    let name = format!("{}-{i}", prefix());
    match vxlan_manager::netns::create(&name) {
        Ok(()) => Some(name),
        Err(e) => {
            if i == 0 {
                tracing::warn!(error = %e, "no network namespaces (run as root for tenant networks); the dev fleet takes no VMs with networks");
            }
            None
        }
    }
}

fn agent_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let bin = exe.with_file_name("kumo-agent");
    anyhow::ensure!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p kumo-agent` (./x start does)",
        bin.display()
    );
    Ok(bin)
}

/// The simulated hosts' designs: with a real (QEMU) host, which is a
/// CPU-only machine, no simulated one is, so CPU-only VMs go to it first
/// (placement prefers hosts without GPUs for them).
fn designs(real_host: bool) -> Vec<&'static str> {
    FLEET
        .iter()
        .copied()
        .filter(|d| !(real_host && *d == "cpu-only"))
        .collect()
}

/// The dev fleet's projects' default segment (the README's walks use
/// 10.1–10.3).
const DEV_DEFAULT_SEGMENT: &str = "10.0.0.0/24";

/// A create that finds its object made by an earlier start is fine.
fn ok_or_exists(r: Result<(), kumo_cli::ClientError>) -> Result<(), kumo_cli::ClientError> {
    match r {
        Err(e) if e.status() == Some(409) => Ok(()),
        other => other,
    }
}

async fn seed(client: &Client, data_dir: &Path) -> anyhow::Result<()> {
    ok_or_exists(
        client
            .create_tenant(&TenantCreate {
                name: "demo".into(),
                display_name: Some("Demo project".into()),
                description: Some("Created by kumo-server dev".into()),
            })
            .await
            .map(|_| ()),
    )?;
    let mut quota = Quota {
        vcpus: 2048,
        memory_gib: 16_384,
        vms: 64,
        disk_gib: 12_800,
        segments: 8,
        roce_segments: 4,
        public_ips: 12,
        // Volumes too, so the README's volume walk runs without a quota
        // line first (issue 43).
        volume_gib: 2_000,
        share_gib: 10_000,
        ..Quota::default()
    };
    for m in ["H100-SXM5-80GB", "A100-SXM4-40GB", "L40S"] {
        quota.gpus.insert(m.into(), 64);
    }
    client.set_quota("demo", &quota).await?;
    // A demo made before projects got a default segment gets one now.
    ok_or_exists(
        client
            .create_segment(
                "demo",
                &kumo_api_types::SegmentCreate {
                    name: kumo_api_types::DEFAULT_SEGMENT.into(),
                    kind: kumo_api_types::SegmentKind::Ethernet,
                    cidr: DEV_DEFAULT_SEGMENT.into(),
                    gateway: None,
                    mtu: None,
                    ingress: Vec::new(),
                    egress: None,
                },
            )
            .await
            .map(|_| ()),
    )?;
    // Prices and points, so the demo's usage and statements fill up.
    if client.rates().await?.cards.is_empty() {
        let prices = demo_prices();
        client
            .set_rates(&RateCardPut {
                effective_from: None,
                prices,
            })
            .await?;
    }
    if client.points("demo").await?.grants.is_empty() {
        client
            .grant_points(
                "demo",
                &GrantCreate {
                    amount: "1000000".into(),
                    expires_at: chrono::Utc::now() + chrono::Duration::days(365),
                    note: Some("kumo-server dev".into()),
                },
            )
            .await?;
    }
    // A real (empty) base image, so VM disks are real qcow2 overlays.
    let images = data_dir.join("images");
    std::fs::create_dir_all(&images)?;
    let base = images.join("debian-12.qcow2");
    network::empty_image(&base, "2G")?;
    let base = std::fs::canonicalize(&base)?;
    ok_or_exists(
        client
            .create_template(&TemplateCreate {
                name: "debian-12".into(),
                image_path: base.display().to_string(),
                os: "Debian 12".into(),
                default_user: "debian".into(),
                kernel_path: None,
                initrd_path: None,
                kernel_cmdline: None,
            })
            .await
            .map(|_| ()),
    )?;
    Ok(())
}

/// Starts the fleet against a running server.
pub async fn start_fleet(
    server: &str,
    admin_token: &str,
    hosts: usize,
    data_dir: &Path,
    log: LogLevel,
    qemu_guest: Option<&Path>,
) -> anyhow::Result<Fleet> {
    let client = Client::new(server, Some(admin_token.to_owned()))?;
    if let Some(guest) = qemu_guest {
        qemu::preflight(guest)?;
    }
    seed(&client, data_dir).await?;
    let all = hosts + usize::from(qemu_guest.is_some());
    let join = client
        .create_join_token(&JoinTokenCreate {
            description: Some("kumo-server dev fleet".into()),
            ttl_seconds: Some(3600),
            uses: Some(u32::try_from(all).unwrap_or(u32::MAX)),
        })
        .await?;
    let bin = agent_binary()?;
    let mut fleet = Fleet {
        children: Vec::new(),
        prefix: None,
        guest_keeper: None,
        guests: Arc::new(Mutex::new(guests::Guests::new(&prefix()))),
        network: FleetNetwork::default(),
        qemu: None,
    };
    let mut net = FleetNetwork {
        hosts: (0..hosts)
            .map(|i| network::HostNet {
                name: format!("host-{:03}", i + 1),
                namespace: None,
                underlay_ip: None,
                edge_uplink: None,
            })
            .collect(),
        underlay: None,
        wan: None,
        pool: None,
        guests: Vec::new(),
    };
    let designs = designs(qemu_guest.is_some());
    for (i, h) in net.hosts.iter_mut().enumerate() {
        if let Some(ns) = host_namespace(i) {
            fleet.prefix = Some(prefix());
            h.namespace = Some(ns);
            h.underlay_ip = Some(network::underlay_ip(i));
        }
    }
    // As root: the underlay between the hosts, and the provider network
    // behind the first host, an edge host, with the pool `dev`.
    if let Some(edge_ns) = net.hosts.first().and_then(|h| h.namespace.clone()) {
        net.underlay = Some(network::underlay(&prefix(), &net.hosts)?);
        net.wan = Some(network::provider(&prefix(), &edge_ns)?);
        net.hosts[0].edge_uplink = Some(network::UPLINK.into());
        let p = network::pool();
        // A data directory used before has the pool already.
        let pools: Vec<PublicIpPool> = client.list_all("/api/v1/public-ip-pools").await?;
        if !pools.iter().any(|x| x.name == p.name) {
            let _: PublicIpPool = client
                .post(
                    "/api/v1/public-ip-pools",
                    &PublicIpPoolCreate {
                        name: p.name.clone(),
                        cidr: p.cidr.clone(),
                        gateway: p.gateway.to_string(),
                        range: Some(p.range.clone()),
                    },
                )
                .await
                .context("creating the public address pool `dev`")?;
        }
        net.pool = Some(p);
    }
    // The real host: in this namespace (libvirtd's taps are made here),
    // joined to the underlay and the provider network. It needs both.
    if let Some(guest) = qemu_guest {
        let (Some(underlay), Some(wan)) = (&net.underlay, &net.wan) else {
            anyhow::bail!("a QEMU host needs the fleet's networks: run as root");
        };
        let address = qemu::UNDERLAY_IP;
        let work = qemu::work_dir(data_dir);
        // Recorded before anything is made, so a failure half way (or a
        // kill) leaves nothing the next start does not remove.
        let mut left = qemu::Leftovers {
            work: work.clone(),
            links: Vec::new(),
            underlay_ip: address,
            table: None,
        };
        let record = |left: &qemu::Leftovers| {
            owner::record(
                data_dir,
                &owner::Owner {
                    server_pid: std::process::id(),
                    prefix: prefix(),
                    agents: Vec::new(),
                    qemu: Some(left.clone()),
                },
            )
        };
        record(&left)?;
        let joined = qemu::join_networks(underlay, wan, &mut left);
        fleet.qemu = Some(left.clone());
        joined?;
        record(&left)?;
        let template = qemu::prepare(&work, guest)?;
        ok_or_exists(client.create_template(&template).await.map(|_| ()))?;
        net.hosts.push(network::HostNet {
            name: qemu::HOST.into(),
            namespace: None,
            underlay_ip: Some(address),
            edge_uplink: None,
        });
    }
    std::fs::create_dir_all(data_dir.join("fleet").join("shared-fs"))?;
    for (i, h) in net.hosts.iter().enumerate() {
        let real = fleet.qemu.as_ref().filter(|_| h.name == qemu::HOST);
        let design = match real {
            Some(_) => "cpu-only",
            None => designs[i % designs.len()],
        };
        let dir = data_dir.join("fleet").join(&h.name);
        let sysfs = dir.join("sysfs");
        let m = kumo_topology::fixtures::machine(design).context("fixture")?;
        // A tree from before hugepages, reset methods and ports' ACS were
        // written: made again, or every device would fail its checks.
        if sysfs.exists() && !sysfs.join("kernel/mm/hugepages").exists() {
            std::fs::remove_dir_all(&sysfs)
                .with_context(|| format!("removing {}", sysfs.display()))?;
        }
        if !sysfs.exists() {
            kumo_topology::fixtures::write(&m, &sysfs)
                .with_context(|| format!("writing {}", sysfs.display()))?;
        }
        // NVSwitch baseboards run Fabric Manager in shared NVSwitch mode;
        // here its stand-in (kumo-agent's), with the baseboard's default
        // partitions, so multi-GPU VMs are placed and activated as on a
        // real one.
        let fabric_manager = (!m.nvlinks.is_empty())
            .then(|| -> anyhow::Result<String> {
                std::fs::create_dir_all(&dir)?;
                let state = dir.join("fabric-manager-standin.json");
                if !state.exists() {
                    let made = Command::new(&bin)
                        .arg("fabric-manager-standin")
                        .arg("--state")
                        .arg(&state)
                        .arg("--init")
                        .status()
                        .context("starting the Fabric Manager stand-in")?;
                    anyhow::ensure!(made.success(), "the Fabric Manager stand-in failed");
                }
                Ok(format!(
                    "{} fabric-manager-standin --state {}",
                    bin.display(),
                    state.display()
                ))
            })
            .transpose()?;
        let mut cmd = Command::new(&bin);
        cmd.args(["run", "--server", server, "--heartbeat-secs", "5"])
            .arg("--name")
            .arg(&h.name)
            .arg("--sysfs-root")
            .arg(&sysfs);
        match real {
            // Its disks, seeds and firmware where QEMU's user reaches
            // them; its pool is this machine's real free space.
            Some(left) => cmd
                .args(qemu::agent_args(left))
                .arg("--state-dir")
                .arg(left.work.join("state")),
            // Simulated hosts share this machine's one disk: each says it
            // has its own 4 TiB, as a real host's NVMe pool would.
            None => cmd
                .args(["--libvirt-uri", "test:///default", "--virt-type", "qemu"])
                .arg("--state-dir")
                .arg(dir.join("state"))
                .args(["--storage-capacity-gib", "4096"]),
        };
        // Every host sees one directory as the shared filesystem of
        // project shares (a real fleet mounts Lustre, NFS or CephFS).
        cmd.arg("--shares-root")
            .arg(data_dir.join("fleet").join("shared-fs"))
            .arg("--shares-root-local")
            .env("KUMO_JOIN_TOKEN", &join.token);
        if let Some(fm) = &fabric_manager {
            cmd.arg("--fabric-manager").arg(fm);
        }
        if let (Some(ns), Some(addr)) = (&h.namespace, h.underlay_ip) {
            cmd.arg("--netns")
                .arg(ns)
                .arg("--underlay-ip")
                .arg(addr.to_string());
        }
        if let Some(up) = &h.edge_uplink {
            cmd.arg("--edge-uplink").arg(up);
        }
        if std::env::var_os("KUMO_LOG").is_none() {
            cmd.env("KUMO_LOG", log.agent_filter());
        }
        // The agents end with this process, even when it is killed.
        cmd.arg("--parent-pid").arg(std::process::id().to_string());
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        fleet.children.push(child);
    }
    owner::record(
        data_dir,
        &owner::Owner {
            server_pid: std::process::id(),
            prefix: prefix(),
            agents: fleet.children.iter().map(Child::id).collect(),
            qemu: fleet.qemu.clone(),
        },
    )?;
    net.write(data_dir)?;
    fleet.network = net.clone();
    if fleet.prefix.is_some() {
        fleet.guest_keeper = Some(tokio::spawn(keep_guests(
            client.clone(),
            net.clone(),
            fleet.guests.clone(),
            data_dir.to_owned(),
        )));
    }
    // Wait for every host to register, so the first request finds them
    // (libvirtd may probe QEMU first on the real host's first connection).
    let limit = if fleet.qemu.is_some() { 60 } else { 10 };
    for _ in 0..limit * 20 {
        if client.list_hosts().await?.len() >= all {
            return Ok(fleet);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("the fleet's hosts did not register within {limit} s")
}

/// Every second: the stand-in guests the VMs call for, and
/// `network.json` again when they changed. A pass that cannot read the
/// API is skipped (the server may be busy or stopping).
async fn keep_guests(
    client: Client,
    mut net: FleetNetwork,
    made: Arc<Mutex<guests::Guests>>,
    data_dir: PathBuf,
) {
    let host_ns: BTreeMap<String, String> = net
        .hosts
        .iter()
        .filter_map(|h| Some((h.name.clone(), h.namespace.clone()?)))
        .collect();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (vms, segments) = match running_vms(&client).await {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, "stand-in guests: cannot read the VMs");
                continue;
            }
        };
        let want = guests::plan(&vms, &segments, &host_ns);
        let made = made.clone();
        let listing = tokio::task::spawn_blocking(move || {
            let mut g = made.lock().unwrap_or_else(|e| e.into_inner());
            g.converge(&want).then(|| g.listing())
        })
        .await
        .ok()
        .flatten();
        if let Some(guests) = listing {
            net.guests = guests;
            if let Err(e) = net.write(&data_dir) {
                tracing::warn!(error = %e, "cannot write network.json");
            }
        }
    }
}

/// Every tenant's VMs and segments.
async fn running_vms(
    client: &Client,
) -> Result<(Vec<kumo_api_types::Vm>, Vec<kumo_api_types::Segment>), kumo_cli::ClientError> {
    let (mut vms, mut segments) = (Vec::new(), Vec::new());
    for t in client.list_tenants().await? {
        vms.extend(client.list_vms(&t.name).await?);
        segments.extend(client.list_segments(&t.name).await?);
    }
    Ok((vms, segments))
}

/// How much `kumo-server dev` logs (`-v`, `-vv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// Warnings, errors and one line per user action (the audit log's).
    Quiet,
    /// Every request, heartbeats and long polls too; the agents' lines.
    Requests,
    Debug,
}

impl LogLevel {
    pub fn from_verbosity(v: u8) -> LogLevel {
        match v {
            0 => LogLevel::Quiet,
            1 => LogLevel::Requests,
            _ => LogLevel::Debug,
        }
    }

    /// The server's filter (`KUMO_LOG` overrides it).
    pub fn server_filter(self) -> &'static str {
        match self {
            LogLevel::Quiet => "warn,kumo_server::app::audit=info",
            LogLevel::Requests => "info,sqlx=warn,sea_orm=warn",
            LogLevel::Debug => "debug,sqlx=warn,sea_orm=warn,hyper=info,h2=info",
        }
    }

    /// The simulated agents' filter (they share the terminal).
    fn agent_filter(self) -> &'static str {
        match self {
            LogLevel::Quiet => "warn",
            LogLevel::Requests => "info",
            LogLevel::Debug => "debug,hyper=info,h2=info",
        }
    }
}

/// What the banner of `kumo-server dev` says.
pub struct BannerFacts<'a> {
    pub url: &'a str,
    pub hosts: usize,
    pub data_dir: &'a Path,
    pub network: &'a FleetNetwork,
    pub verbose: bool,
}

/// The banner `./x start` shows: where the portal is and how to sign in,
/// the CLI's first commands, the provider network; made to fit an 80×24
/// terminal (long paths aside) above the log lines. The first line is read
/// by scripts and tests.
pub fn banner(f: &BannerFacts<'_>) -> String {
    let url = f.url;
    let token = f.data_dir.join(crate::app::bootstrap::ADMIN_TOKEN_FILE);
    let token = token.display();
    let mut lines = vec![
        format!("Kumo API listening on {url}  (API docs: /api/docs)"),
        format!(
            "Dev fleet: {} simulated GPU hosts, demo project `demo`, template `debian-12`.",
            f.hosts
        ),
        String::new(),
        format!("  Portal  {url}/ → \"sign in with an API token\","),
        format!("          and paste the admin's: cat {token}"),
        format!("  CLI     kumo login --server {url} \\"),
        format!("            --token \"$(cat {token})\""),
        // On the demo's default segment, with an address where there is a
        // pool (as root): the SSH line it prints reaches the stand-in
        // guest from the outside.
        format!(
            "          kumo vm create demo --tenant demo --gpus 8{} --wait",
            if f.network.pool.is_some() {
                " --public-ip"
            } else {
                ""
            }
        ),
    ];
    if let (Some(wan), Some(pool)) = (&f.network.wan, &f.network.pool) {
        lines.push(format!(
            "  Public  addresses from pool `{}` ({});",
            pool.name, pool.range
        ));
        lines.push(format!(
            "          the outside ({}): ip netns exec {} …",
            wan.client_address, wan.namespace
        ));
    }
    if f.network.hosts.iter().any(|h| h.name == qemu::HOST) {
        lines.push(format!(
            "  Real VM kumo vm create shell --tenant demo --template {} --public-ip \\",
            qemu::TEMPLATE
        ));
        lines.push(
            "            --vcpus 1 --memory 1 --disk 2 --ssh-key ~/.ssh/id_ed25519.pub --wait"
                .into(),
        );
        lines.push(format!(
            "          kumo vm ssh shell --tenant demo     (on {}, under QEMU)",
            qemu::HOST
        ));
    }
    lines.push(String::new());
    lines.push(if f.verbose {
        "Logging every request. Ctrl-C stops the server and its fleet.".into()
    } else {
        "Below: warnings, errors, one line per action (-v: every request). Ctrl-C stops.".into()
    });
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

pub async fn dev(
    mut config: Config,
    hosts: usize,
    log: LogLevel,
    qemu_guest: Option<&Path>,
) -> anyhow::Result<(RunningServer, Fleet)> {
    // Every project the dev fleet makes, the demo first, gets a segment
    // to be reached on (unless the configuration says otherwise).
    config
        .network
        .default_segment
        .get_or_insert_with(|| crate::config::DefaultSegment {
            cidr: DEV_DEFAULT_SEGMENT.into(),
            egress: true,
        });
    let data_dir = config.data_dir.clone();
    owner::take_over(&data_dir)?;
    let server = RunningServer::start(config).await?;
    let token_path = data_dir.join(crate::app::bootstrap::ADMIN_TOKEN_FILE);
    let token = std::fs::read_to_string(&token_path)
        .with_context(|| format!("reading {}", token_path.display()))?
        .trim()
        .to_owned();
    let fleet = start_fleet(&server.url(), &token, hosts, &data_dir, log, qemu_guest).await?;
    Ok((server, fleet))
}

/// A log line's words as a person at an 80-column terminal reads them: a
/// UUID by its last 8 hex digits (`join-token:20c2c1f4`: ids are UUIDv7,
/// whose first digits are the time and alike for ids minted together), a
/// timestamp to the second. Every human (text) log line is written so;
/// JSON logs keep them whole.
pub fn human_words(line: &str) -> String {
    line.split(' ')
        .map(|word| {
            let (prefix, rest) = match word.rsplit_once(':') {
                Some((p, r)) if uuid::Uuid::parse_str(r).is_ok() => (Some(p), r),
                _ => (None, word),
            };
            if uuid::Uuid::parse_str(rest).is_ok() {
                let short = rest.get(rest.len().saturating_sub(8)..).unwrap_or(rest);
                return match prefix {
                    Some(p) => format!("{p}:{short}"),
                    None => short.to_owned(),
                };
            }
            match chrono::DateTime::parse_from_rfc3339(word) {
                Ok(t) => t
                    .with_timezone(&chrono::Utc)
                    .format("%Y-%m-%dT%H:%M:%SZ")
                    .to_string(),
                Err(_) => word.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The demo's rate card: a price for every rate class (each GPU model the
/// dev fleet has among them), so that whatever the demo runs or holds is
/// charged and budgeted.
fn demo_prices() -> std::collections::BTreeMap<String, ClassPrice> {
    use kumo_billing::rates::{
        DISK_GIB, MEMORY_GIB, PUBLIC_IP, SHARE_GIB, SNAPSHOT_GIB, VCPU, VOLUME_GIB,
    };
    let price = |g: &str, s: &str| ClassPrice {
        guaranteed: g.into(),
        spot: s.into(),
    };
    let mut prices: std::collections::BTreeMap<String, ClassPrice> = [
        (VCPU, price("2", "0.6")),
        (MEMORY_GIB, price("0.2", "0.06")),
        (DISK_GIB, price("0.01", "0.01")),
        (PUBLIC_IP, price("0.7", "0.7")),
        (VOLUME_GIB, price("0.01", "0.01")),
        (SNAPSHOT_GIB, price("0.005", "0.005")),
        (SHARE_GIB, price("0.01", "0.01")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for (model, g, s) in [
        ("H100-SXM5-80GB", "400", "120"),
        ("A100-SXM4-40GB", "250", "75"),
        ("L40S", "150", "45"),
    ] {
        prices.insert(kumo_billing::rates::gpu_class(model), price(g, s));
    }
    prices
}

#[cfg(test)]
mod banner_tests {
    use super::*;

    #[test]
    fn the_demo_prices_every_rate_class() {
        let prices = demo_prices();
        for class in kumo_billing::rates::FLAT_CLASSES {
            let p = prices
                .get(class)
                .unwrap_or_else(|| panic!("{class} has no price"));
            assert!(p.guaranteed.parse::<f64>().unwrap() > 0.0, "{class}");
        }
        for m in ["H100-SXM5-80GB", "A100-SXM4-40GB", "L40S"] {
            assert!(
                prices.contains_key(&kumo_billing::rates::gpu_class(m)),
                "{m}"
            );
        }
    }

    /// `./x start`'s banner fits an 80×24 terminal with room for log lines
    /// below it, says where the portal is and how to sign in, and starts
    /// with the line scripts read.
    #[test]
    fn the_banner_fits_80_by_24_and_says_how_to_sign_in() {
        let network = FleetNetwork {
            wan: Some(network::Wan {
                namespace: "kumo-dev-12345-wan".into(),
                client_address: std::net::Ipv4Addr::new(203, 0, 113, 200),
                router: std::net::Ipv4Addr::new(203, 0, 113, 1),
                cidr: "203.0.113.0/24".into(),
            }),
            pool: Some(network::Pool {
                name: "dev".into(),
                cidr: "203.0.113.0/24".into(),
                gateway: std::net::Ipv4Addr::new(203, 0, 113, 1),
                range: "203.0.113.10-203.0.113.99".into(),
            }),
            ..FleetNetwork::default()
        };
        for verbose in [false, true] {
            let b = banner(&BannerFacts {
                url: "http://127.0.0.1:8080",
                hosts: 4,
                data_dir: Path::new("./.kumo"),
                network: &network,
                verbose,
            });
            let lines: Vec<&str> = b.lines().collect();
            assert!(lines.len() <= 14, "{} lines:\n{b}", lines.len());
            for l in &lines {
                assert!(
                    l.chars().count() <= 80,
                    "{} columns: {l}",
                    l.chars().count()
                );
            }
            assert!(lines[0].starts_with("Kumo API listening on http://127.0.0.1:8080 "));
            assert!(
                b.contains("http://127.0.0.1:8080/ → \"sign in with an API token\""),
                "{b}"
            );
            assert!(b.contains("cat ./.kumo/admin-token"), "{b}");
            assert!(
                b.contains("kumo login --server http://127.0.0.1:8080"),
                "{b}"
            );
            assert!(b.contains("ip netns exec kumo-dev-12345-wan"), "{b}");
            assert!(b.contains("--gpus 8 --public-ip --wait"), "{b}");
            assert_eq!(b.contains("-v: every request"), !verbose);
        }
        // With the real host: how to reach a real guest, still on 80×24
        // with log lines below.
        let mut with_real = network.clone();
        with_real.hosts.push(network::HostNet {
            name: qemu::HOST.into(),
            namespace: None,
            underlay_ip: None,
            edge_uplink: None,
        });
        let b = banner(&BannerFacts {
            url: "http://127.0.0.1:8080",
            hosts: 4,
            data_dir: Path::new("./.kumo"),
            network: &with_real,
            verbose: false,
        });
        assert!(b.lines().count() <= 15, "{b}");
        assert!(b.lines().all(|l| l.chars().count() <= 80), "{b}");
        assert!(
            b.contains("--template tiny") && b.contains("kumo vm ssh shell"),
            "{b}"
        );
        // Without a pool (not root): no address to ask for.
        let b = banner(&BannerFacts {
            url: "http://127.0.0.1:8080",
            hosts: 4,
            data_dir: Path::new("./.kumo"),
            network: &FleetNetwork::default(),
            verbose: false,
        });
        assert!(
            b.contains("--gpus 8 --wait") && !b.contains("--public-ip"),
            "{b}"
        );
    }

    #[test]
    fn log_lines_shorten_ids_and_times_for_a_terminal() {
        assert_eq!(
            human_words("join-token:01a21454-149a-70dd-9fee-d7e520c2c1f4 host.register host-001"),
            "join-token:20c2c1f4 host.register host-001"
        );
        assert_eq!(
            human_words("admin host.join_token.create 01a21454-149a-70dd-9fee-d7e520c2c1f4"),
            "admin host.join_token.create 20c2c1f4"
        );
        assert_eq!(
            human_words("admin rates.set 2026-11-25T20:09:44.286575481+00:00"),
            "admin rates.set 2026-11-25T20:09:44Z"
        );
        assert_eq!(
            human_words("aiko vm.create a:b demo"),
            "aiko vm.create a:b demo"
        );
    }
}
