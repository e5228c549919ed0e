//! `kumo-server dev`: the whole system on one machine for trying it out —
//! the server on SQLite, a fleet of simulated hosts (one `kumo-agent`
//! process each, over a fixture sysfs tree of a real machine design and
//! libvirt's `test:///default` driver), a demo tenant with quota and a
//! template. Seeding goes through the public API, like any client. Run as
//! root, each host also gets a network namespace of its own and an
//! underlay address, so tenant networks (bridges, VXLAN devices, filters)
//! are real kernel state per host; otherwise the fleet takes no VMs with
//! networks.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use anyhow::Context;
use kumo_api_types::{
    ClassPrice, GrantCreate, JoinTokenCreate, Quota, RateCardPut, TemplateCreate, TenantCreate,
};
use kumo_cli::Client;

use crate::config::Config;
use crate::RunningServer;

/// The fleet cycles through these designs.
pub const FLEET: &[&str] = &[
    "hgx-h100",
    "dgx-a100",
    "hgx-h100-2nic",
    "l40s-pcie",
    "cpu-only",
];

pub struct Fleet {
    children: Vec<Child>,
    /// The hosts' network namespaces, removed with the fleet.
    namespaces: Vec<String>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in &self.namespaces {
            if let Err(e) = vxlan_manager::netns::delete(ns) {
                tracing::warn!(netns = %ns, error = %e, "could not remove a dev host's namespace");
            }
        }
    }
}

/// A network namespace for dev host `i` (named by this process, so two
/// dev fleets never share one), or `None` where namespaces cannot be made
/// (not root).
fn host_namespace(i: usize) -> Option<String> {
    let name = format!("kumo-dev-{}-{i}", std::process::id());
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

async fn seed(client: &Client, data_dir: &Path) -> anyhow::Result<()> {
    let ok_or_exists = |r: Result<(), kumo_cli::ClientError>| match r {
        Err(e) if e.status() == Some(409) => Ok(()),
        other => other,
    };
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
        public_ips: 4,
        ..Quota::default()
    };
    for m in ["H100-SXM5-80GB", "A100-SXM4-40GB", "L40S"] {
        quota.gpus.insert(m.into(), 64);
    }
    client.set_quota("demo", &quota).await?;
    // Prices and points, so the demo's usage and statements fill up.
    if client.rates().await?.cards.is_empty() {
        let price = |g: &str, s: &str| ClassPrice {
            guaranteed: g.into(),
            spot: s.into(),
        };
        let mut prices: std::collections::BTreeMap<String, ClassPrice> = [
            ("vcpu", price("2", "0.6")),
            ("memory_gib", price("0.2", "0.06")),
            ("disk_gib", price("0.01", "0.01")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        for (model, g, s) in [
            ("H100-SXM5-80GB", "400", "120"),
            ("A100-SXM4-40GB", "250", "75"),
            ("L40S", "150", "45"),
        ] {
            prices.insert(format!("gpu:{model}"), price(g, s));
        }
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
    if !base.exists() {
        let out = Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&base)
            .arg("2G")
            .output()
            .context("running qemu-img (Debian: qemu-utils)")?;
        anyhow::ensure!(
            out.status.success(),
            "qemu-img: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
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
) -> anyhow::Result<Fleet> {
    let client = Client::new(server, Some(admin_token.to_owned()))?;
    seed(&client, data_dir).await?;
    let join = client
        .create_join_token(&JoinTokenCreate {
            description: Some("kumo-server dev fleet".into()),
            ttl_seconds: Some(3600),
            uses: Some(u32::try_from(hosts).unwrap_or(u32::MAX)),
        })
        .await?;
    let bin = agent_binary()?;
    let mut fleet = Fleet {
        children: Vec::new(),
        namespaces: Vec::new(),
    };
    for i in 0..hosts {
        let design = FLEET[i % FLEET.len()];
        let name = format!("host-{:03}", i + 1);
        let dir = data_dir.join("fleet").join(&name);
        let sysfs = dir.join("sysfs");
        if !sysfs.exists() {
            let m = kumo_topology::fixtures::machine(design).context("fixture")?;
            kumo_topology::fixtures::write(&m, &sysfs)
                .with_context(|| format!("writing {}", sysfs.display()))?;
        }
        let mut cmd = Command::new(&bin);
        cmd.args([
            "run",
            "--server",
            server,
            "--libvirt-uri",
            "test:///default",
            "--virt-type",
            "qemu",
            "--heartbeat-secs",
            "5",
        ])
        .arg("--name")
        .arg(&name)
        .arg("--sysfs-root")
        .arg(&sysfs)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .env("KUMO_JOIN_TOKEN", &join.token);
        if let Some(ns) = host_namespace(i) {
            // Test addresses (RFC 2544): the namespaces share no underlay,
            // so nothing is ever sent.
            cmd.arg("--netns")
                .arg(&ns)
                .arg("--underlay-ip")
                .arg(format!("198.18.{}.{}", i / 250, i % 250 + 1));
            fleet.namespaces.push(ns);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        fleet.children.push(child);
    }
    // Wait for every host to register, so the first request finds them.
    for _ in 0..200 {
        if client.list_hosts().await?.len() >= hosts {
            return Ok(fleet);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("the simulated hosts did not register within 10 s")
}

pub async fn dev(config: Config, hosts: usize) -> anyhow::Result<(RunningServer, Fleet)> {
    let data_dir = config.data_dir.clone();
    let server = RunningServer::start(config).await?;
    let token_path = data_dir.join(crate::app::bootstrap::ADMIN_TOKEN_FILE);
    let token = std::fs::read_to_string(&token_path)
        .with_context(|| format!("reading {}", token_path.display()))?
        .trim()
        .to_owned();
    let fleet = start_fleet(&server.url(), &token, hosts, &data_dir).await?;
    Ok((server, fleet))
}
