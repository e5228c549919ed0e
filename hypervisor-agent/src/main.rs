//! `kumo-agent`: runs on each GPU host. Today it reads the host's topology
//! (`topology`) and writes fixture sysfs trees of known machines
//! (`fixture`); the reconciler arrives with the lifecycle issue.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use kumo_topology::{fixtures, matrix, sysfs, TopologyReport};

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
