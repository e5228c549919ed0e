//! `kumo-agent`: runs on each GPU host. Today it reads the host's topology
//! (`topology`), renders a guest's domain XML and NCCL file (`render`), and
//! writes fixture sysfs trees of known machines (`fixture`); the reconciler
//! arrives with the lifecycle issue.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
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
        /// [default: 64 per GPU, at least 4]
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
    /// Write the sysfs tree of a known machine design, for tests and simulated hosts.
    Fixture {
        /// One of: dgx-a100, hgx-h100, hgx-h100-2nic, l40s-pcie, cpu-only.
        name: String,
        #[arg(long)]
        out: PathBuf,
    },
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
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
            let vcpus = vcpus.unwrap_or((8 * n).max(2));
            let memory_gib = memory_gib.unwrap_or((64 * n).max(4));
            let dir = format!("/var/lib/kumo/vms/{name}");
            let spec = DomainSpec {
                name: name.clone(),
                uuid: "00000000-0000-4000-8000-000000000000".into(),
                virt_type,
                disk_path: format!("{dir}/disk.qcow2"),
                seed_path: Some(format!("{dir}/seed.iso")),
                hugepages: true,
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
