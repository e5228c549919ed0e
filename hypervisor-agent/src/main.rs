//! `kumo-agent`: runs on each GPU host. `run` registers the host and
//! reconciles its VMs on libvirt; `topology` prints the host's topology;
//! `render` writes a guest's domain XML and NCCL file; `fixture` writes
//! sysfs trees of known machines.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use kumo_agent::run::{Agent, AgentConfig, StorageConfig};
use kumo_topology::domain_xml::DomainSpec;
use kumo_topology::{fixtures, matrix, render, sysfs, Bdf, TopologyReport};

#[derive(Parser)]
#[command(name = "kumo-agent", version, about = "Kumo's per-host agent")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Json,
    Matrix,
}

// Parsed once at start: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Print the host's topology: GPUs, NICs, NVLinks, relations, pairing.
    Topology {
        #[arg(long, default_value = "/sys")]
        sysfs_root: PathBuf,
        /// NVLink and CPU hints [default: <sysfs-root>/kumo-hints.json if present].
        #[arg(long)]
        hints: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "json")]
        format: Format,
    },
    /// Place a VM with these GPUs (and their paired NICs) and write its
    /// domain.xml, nccl-topo.xml and layout.json.
    Render {
        #[arg(long, default_value = "/sys")]
        sysfs_root: PathBuf,
        #[arg(long)]
        hints: Option<PathBuf>,
        /// Host GPU addresses, comma-separated; none for a CPU-only VM.
        #[arg(long, value_delimiter = ',')]
        gpus: Vec<Bdf>,
        /// [default: 8 per GPU, at least 2]
        #[arg(long)]
        vcpus: Option<u32>,
        /// [default: 48 per GPU, at least 4]
        #[arg(long)]
        memory_gib: Option<u32>,
        #[arg(long, default_value = "kumo-render")]
        name: String,
        /// `kvm`, or `qemu` for TCG where KVM is unavailable.
        #[arg(long, default_value = "kvm")]
        virt_type: String,
        #[arg(long)]
        out: PathBuf,
    },
    /// Register (first time) and reconcile this host's VMs until stopped.
    Run {
        #[arg(long, env = "KUMO_SERVER")]
        server: String,
        /// Needed only until the host has a credential in --state-dir.
        /// Prefer the environment or --join-token-file: a value on the
        /// command line is visible to every local user in /proc.
        #[arg(long, env = "KUMO_JOIN_TOKEN", hide_env_values = true)]
        join_token: Option<String>,
        /// A file holding the join token (e.g. 0600, root's).
        #[arg(long, conflicts_with = "join_token")]
        join_token_file: Option<PathBuf>,
        #[arg(long, default_value = "qemu:///system")]
        libvirt_uri: String,
        #[arg(long, default_value = "/sys")]
        sysfs_root: PathBuf,
        #[arg(long, default_value = "/var/lib/kumo-agent")]
        state_dir: PathBuf,
        /// Host name [default: this machine's hostname].
        #[arg(long)]
        name: Option<String>,
        /// `kvm`, or `qemu` (TCG) where KVM is unavailable.
        #[arg(long, default_value = "kvm")]
        virt_type: String,
        #[arg(long, default_value_t = 5)]
        heartbeat_secs: u64,
        /// The scalable unit (leaf-switch domain) this host is cabled into.
        #[arg(long)]
        scalable_unit: Option<String>,
        /// `RDMA_DEVICE=RAIL`, once per NIC (e.g. `--rail mlx5_0=0`).
        /// Default: the NICs paired with GPUs take rails 0, 1, … in bus order.
        #[arg(long = "rail", value_parser = parse_rail)]
        rails: Vec<(String, u32)>,
        /// This host's address on the underlay network: its VXLAN tunnel
        /// endpoint. Without it the host takes no VMs with networks.
        #[arg(long)]
        underlay_ip: Option<std::net::Ipv4Addr>,
        /// Program tenant networks in this network namespace (`ip netns`)
        /// instead of the agent's own: for simulated fleets on one machine.
        #[arg(long)]
        netns: Option<String>,
        /// Make this an edge host: the interface towards the provider
        /// network, where segment edges put their public addresses.
        #[arg(long)]
        edge_uplink: Option<String>,
        /// Milliseconds between passes that repair drift when nothing changed.
        #[arg(long, default_value_t = 3000)]
        resync_ms: u64,
        /// Keep volumes as qcow2 files in this directory [default:
        /// STATE_DIR/volumes].
        #[arg(long, conflicts_with = "storage_vg")]
        storage_dir: Option<PathBuf>,
        /// Keep volumes as thin LVs in this LVM volume group (with
        /// --thin-pool).
        #[arg(long, requires = "thin_pool")]
        storage_vg: Option<String>,
        /// The thin pool of --storage-vg.
        #[arg(long, requires = "storage_vg")]
        thin_pool: Option<String>,
        /// GiB of the storage pool (and of the root disks' filesystem)
        /// never offered to the server for volumes and disks.
        #[arg(long, default_value_t = kumo_agent::run::DEFAULT_RESERVE_GIB)]
        storage_reserve_gib: u64,
        /// Where the filesystem of project shares (Lustre, NFS, CephFS,
        /// ext4/XFS with project quotas) is mounted; the same place on
        /// every host. Without it the host keeps and mounts no shares.
        #[arg(long)]
        shares_root: Option<PathBuf>,
        /// The shares root is a plain directory, not a mount point (the dev
        /// fleet's simulated hosts share one).
        #[arg(long, requires = "shares_root")]
        shares_root_local: bool,
        /// Offer the server this many GiB of storage instead of the pool's
        /// measured size less the reserve: a pool on a filesystem shared
        /// with other things, or simulated hosts sharing one disk.
        #[arg(long)]
        storage_capacity_gib: Option<u64>,
        /// Long storage jobs (snapshot merges, copies, imports) one tenant
        /// runs at once on this host; the rest wait their turn.
        #[arg(long, default_value_t = 1)]
        storage_jobs_per_tenant: usize,
        /// Long storage jobs running at once on this host, every tenant
        /// together (and volume sends to other hosts at once).
        #[arg(long, default_value_t = 2)]
        storage_jobs_per_host: usize,
        /// Serve volumes being moved to other hosts here. The default
        /// reaches agents on this machine only (simulated fleets): on a
        /// real fleet give the host's storage-network address, e.g.
        /// `10.0.0.5:7702`, or `0.0.0.0:7702` with --underlay-ip (other
        /// agents then fetch from the underlay address).
        #[arg(long, default_value = "127.0.0.1:0")]
        transfer_listen: std::net::SocketAddr,
        /// The URL other agents fetch volumes from, when it is not
        /// `http://` and the --transfer-listen address (a proxy, a name).
        #[arg(long)]
        transfer_url: Option<String>,
        /// Seconds between readings of the passed-through devices' health
        /// (AER counters, PCIe links, RDMA ports) and of the GPU guests'
        /// `nvidia-smi` through their guest agents.
        #[arg(long, default_value_t = 15)]
        telemetry_secs: u64,
        /// Die with this process, our parent (simulated fleets: the agents
        /// of `kumo-server dev` end with it, even when it is killed).
        #[arg(long)]
        parent_pid: Option<u32>,
        /// On an NVSwitch host in shared NVSwitch mode: the Fabric Manager
        /// client and its arguments, e.g. `fmpm --hostname 10.0.0.5`. The
        /// agent lists the partitions with it, activates a multi-GPU VM's
        /// before the VM starts and deactivates it after.
        #[arg(long)]
        fabric_manager: Option<String>,
    },
    /// A stand-in for NVIDIA Fabric Manager and its `fmpm` client on hosts
    /// without NVSwitch hardware (tests, the dev fleet): answers fmpm's
    /// arguments from a state file, in fmpm's format.
    FabricManagerStandin {
        #[arg(long)]
        state: PathBuf,
        /// First write an 8-GPU HGX baseboard's default partition table,
        /// nothing active.
        #[arg(long)]
        init: bool,
        /// fmpm's arguments: `-l`, `-a ID`, `-d ID`, `--set-activated-list IDS`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Write the sysfs tree of a known machine design, for tests and simulated hosts.
    Fixture {
        /// One of: dgx-a100, hgx-h100, hgx-h100-2nic, l40s-pcie, cpu-only.
        name: String,
        #[arg(long)]
        out: PathBuf,
    },
}

fn parse_rail(s: &str) -> Result<(String, u32), String> {
    let (dev, rail) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected RDMA_DEVICE=RAIL"))?;
    let rail = rail
        .parse()
        .map_err(|_| format!("{s:?}: the rail is not a number"))?;
    Ok((dev.to_owned(), rail))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_lowercase())
        .unwrap_or_else(|_| "host".into())
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run {
            server,
            join_token,
            join_token_file,
            libvirt_uri,
            sysfs_root,
            state_dir,
            name,
            virt_type,
            heartbeat_secs,
            scalable_unit,
            rails,
            underlay_ip,
            netns,
            edge_uplink,
            resync_ms,
            storage_dir,
            storage_vg,
            transfer_listen,
            transfer_url,
            telemetry_secs,
            thin_pool,
            storage_reserve_gib,
            shares_root,
            shares_root_local,
            storage_capacity_gib,
            storage_jobs_per_tenant,
            storage_jobs_per_host,
            parent_pid,
            fabric_manager,
        } => {
            if let Some(parent) = parent_pid {
                die_with_parent(parent);
            }
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env("KUMO_LOG")
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .with_writer(std::io::stderr)
                .init();
            let join_token = match join_token_file {
                Some(f) => Some(
                    std::fs::read_to_string(&f)
                        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", f.display()))?
                        .trim()
                        .to_owned(),
                ),
                None => join_token,
            };
            let config = AgentConfig {
                server,
                join_token,
                libvirt_uri,
                sysfs_root,
                state_dir,
                name: name.unwrap_or_else(hostname),
                virt_type,
                heartbeat: std::time::Duration::from_secs(heartbeat_secs.max(1)),
                scalable_unit,
                rails: rails.into_iter().collect(),
                underlay_ip,
                netns,
                edge_uplink,
                resync: std::time::Duration::from_millis(resync_ms.max(1)),
                storage: match (storage_vg, thin_pool) {
                    (Some(vg), Some(thin_pool)) => Some(StorageConfig::LvmThin { vg, thin_pool }),
                    _ => storage_dir.map(StorageConfig::Qcow2Dir),
                },
                transfer_listen,
                transfer_url,
                telemetry: std::time::Duration::from_secs(telemetry_secs.max(1)),
                fabric_manager,
                storage_policy: kumo_agent::run::StoragePolicy {
                    jobs: kumo_agent::storage::jobs::Limits {
                        per_tenant: storage_jobs_per_tenant,
                        per_host: storage_jobs_per_host,
                    },
                    reserve_gib: storage_reserve_gib,
                    capacity_gib: storage_capacity_gib,
                },
                shares: shares_root.map(|root| kumo_agent::shares::SharesConfig {
                    root,
                    require_mount: !shares_root_local,
                }),
            };
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(async { Agent::start(config).await?.run().await })?;
        }
        Command::Topology {
            sysfs_root,
            hints,
            format,
        } => {
            let topo = sysfs::discover(&sysfs_root, hints.as_deref())?;
            for w in &topo.warnings {
                eprintln!("kumo-agent: warning: {w}");
            }
            match format {
                Format::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&TopologyReport::new(&topo))?
                ),
                Format::Matrix => print!("{}", matrix::render(&topo)),
            }
        }
        Command::Render {
            sysfs_root,
            hints,
            gpus,
            vcpus,
            memory_gib,
            name,
            virt_type,
            out,
        } => {
            let topo = sysfs::discover(&sysfs_root, hints.as_deref())?;
            let n = gpus.len() as u32;
            let vcpus = vcpus.unwrap_or((kumo_api_types::DEFAULT_VCPUS_PER_GPU * n).max(2));
            let memory_gib =
                memory_gib.unwrap_or((kumo_api_types::DEFAULT_MEMORY_GIB_PER_GPU * n).max(4));
            let dir = format!("/var/lib/kumo/vms/{name}");
            let spec = DomainSpec {
                name: name.clone(),
                uuid: "00000000-0000-4000-8000-000000000000".into(),
                virt_type,
                disk_path: format!("{dir}/disk.qcow2"),
                seed_path: Some(format!("{dir}/seed.iso")),
                hugepages: true,
                host_id: None,
                kernel: None,
                interfaces: Vec::new(),
                volumes: Vec::new(),
                filesystems: Vec::new(),
                console_log: Some(format!("{dir}/console.log")),
                nvram_path: Some(format!("{dir}/nvram.fd")),
            };
            let r = render::render(&topo, &gpus, vcpus, memory_gib, &spec)?;
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            std::fs::write(out.join("domain.xml"), &r.domain_xml)?;
            std::fs::write(out.join("nccl-topo.xml"), &r.nccl_xml)?;
            std::fs::write(
                out.join("layout.json"),
                serde_json::to_string_pretty(&r.report)? + "\n",
            )?;
        }
        Command::FabricManagerStandin { state, init, args } => {
            use kumo_agent::fabric_manager::standin;
            if init {
                standin::State::hgx()
                    .save(&state)
                    .map_err(anyhow::Error::msg)?;
            }
            if !args.is_empty() {
                let (out, code) = standin::run(&state, &args);
                print!("{out}");
                std::process::exit(code);
            }
        }
        Command::Fixture { name, out } => {
            let m = fixtures::machine(&name).with_context(|| {
                format!(
                    "unknown machine {name:?}; known: {}",
                    fixtures::MACHINES.join(", ")
                )
            })?;
            if out.exists()
                && out
                    .read_dir()
                    .map(|mut d| d.next().is_some())
                    .unwrap_or(true)
            {
                anyhow::bail!("{} exists and is not empty", out.display());
            }
            fixtures::write(&m, &out).with_context(|| format!("writing {}", out.display()))?;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kumo-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Asks the kernel for SIGKILL when the parent ends, then checks that the
/// parent is still the one named (it may have died before the request).
fn die_with_parent(parent: u32) {
    use nix::sys::signal::Signal;
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        eprintln!("kumo-agent: cannot tie itself to its parent: {e}");
        std::process::exit(1);
    }
    if u32::try_from(nix::unistd::getppid().as_raw()).ok() != Some(parent) {
        eprintln!("kumo-agent: its parent {parent} is gone");
        std::process::exit(1);
    }
}
