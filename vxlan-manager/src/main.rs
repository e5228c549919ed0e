//! `kumo-vxlan`: the host network converger for operators and tests.
//!
//! ```text
//! kumo-vxlan apply --state FILE.json [--netns NAME]   # prints the changes made
//! kumo-vxlan show [--netns NAME]                      # Kumo's devices and entries
//! ```

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use vxlan_manager::{converge, DesiredState, Kernel};

#[derive(Parser)]
#[command(
    name = "kumo-vxlan",
    version,
    about = "Converge a host's tenant networks (VXLAN) through netlink"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Make the kernel (devices, entries, ingress filters) match a desired
    /// state file; print the changes as JSON.
    Apply {
        #[arg(long)]
        state: PathBuf,
        /// A network namespace made by `ip netns add`.
        #[arg(long)]
        netns: Option<String>,
    },
    /// Print Kumo's links, FDB and neighbour entries as JSON.
    Show {
        #[arg(long)]
        netns: Option<String>,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Cmd::Apply { state, netns } => {
            let text = std::fs::read_to_string(&state)
                .with_context(|| format!("reading {}", state.display()))?;
            let want = DesiredState::from_json(&text).with_context(|| {
                format!("{} is not a valid state; nothing changed", state.display())
            })?;
            let kernel = Kernel::connect(netns.as_deref())?;
            let changes = converge(&kernel, &want).await?;
            let filter_rules = vxlan_manager::nft::converge_filters(netns.as_deref(), &want)?;
            println!(
                "{}",
                serde_json::json!({
                    "changes": changes.len(),
                    "applied": changes,
                    "filter_rules_written": filter_rules,
                })
            );
        }
        Cmd::Show { netns } => {
            let kernel = Kernel::connect(netns.as_deref())?;
            println!(
                "{}",
                serde_json::to_string_pretty(&kernel.observe().await?)?
            );
        }
    }
    Ok(())
}
