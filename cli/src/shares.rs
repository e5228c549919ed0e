//! `kumo share`: project shares, directories on the filesystem every host
//! mounts, mounted into the project's VMs with virtiofs.

use std::io::Write;

use clap::Subcommand;
use kumo_api_types::{Share, ShareCreate, ShareGrow, ShareMountRequest, ShareState};

use crate::args::TenantArg;
use crate::client::{segment, Client};
use crate::output::{print_one, Format, Table};

#[derive(Subcommand, Debug)]
pub enum ShareCmd {
    /// Make a share (within the tenant's `share_gib` quota; charged per
    /// GiB-hour of its size).
    Create {
        /// The share's name.
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// Its size limit, GiB.
        #[arg(long)]
        size_gib: u32,
        /// Wait until its directory is made (or failed).
        #[arg(long)]
        wait: bool,
    },
    /// The tenant's shares.
    List {
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// One share: its size, usage, and the VMs that mount it.
    Show {
        /// The share's name.
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Grow a share (it never shrinks).
    Grow {
        /// The share's name.
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// The new size, GiB.
        #[arg(long)]
        size_gib: u32,
    },
    /// Mount it in a VM (a running VM gets it at its next start).
    Mount {
        /// `NAME[:/PATH][:ro]`.
        #[arg(value_parser = ShareMountRequest::parse)]
        share: ShareMountRequest,
        #[command(flatten)]
        tenant: TenantArg,
        /// The VM.
        #[arg(long)]
        vm: String,
    },
    /// Take it out of a VM (from its next start); the data stays.
    Unmount {
        /// The share's name.
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// The VM.
        #[arg(long)]
        vm: String,
    },
    /// Delete a share no VM mounts, and its data.
    Delete {
        /// The share's name.
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

fn table(ss: &[Share]) -> String {
    let mut t = Table::new(&["name", "size", "used", "state", "mounted in"]);
    for s in ss {
        let mut state = s.state.as_str().to_owned();
        if s.read_only {
            state.push_str(", read-only");
        }
        if let Some(r) = &s.reason {
            state = format!("{state} ({r})");
        }
        t.row(vec![
            s.name.clone(),
            format!("{} GiB", s.size_gib),
            s.used_bytes.map(gib).unwrap_or_else(|| "-".into()),
            state,
            if s.mounts.is_empty() {
                "-".into()
            } else {
                s.mounts
                    .iter()
                    .map(|m| {
                        let ro = if m.read_only { ":ro" } else { "" };
                        let how = m
                            .condition
                            .as_deref()
                            .map(|c| format!(" ({c})"))
                            .unwrap_or_default();
                        format!("{}:{}{ro}{how}", m.vm, m.path)
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        ]);
    }
    t.render()
}

pub async fn share(
    cmd: &ShareCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let base = |t: &TenantArg| format!("/api/v1/tenants/{}/shares", segment(&t.tenant));
    let one = |t: &TenantArg, name: &str| format!("{}/{}", base(t), segment(name));
    let vm_shares = |t: &TenantArg, vm: &str| {
        format!(
            "/api/v1/tenants/{}/vms/{}/shares",
            segment(&t.tenant),
            segment(vm)
        )
    };
    let s: Share = match cmd {
        ShareCmd::Create {
            name,
            tenant,
            size_gib,
            wait,
        } => {
            let mut s: Share = c
                .post(
                    &base(tenant),
                    &ShareCreate {
                        name: name.clone(),
                        size_gib: *size_gib,
                    },
                )
                .await?;
            let progress =
                wait.then(|| crate::progress::Progress::start(format!("making share {name}")));
            while progress.is_some() && s.state == ShareState::Creating {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                s = c.get(&one(tenant, name)).await?;
            }
            drop(progress);
            if *wait && s.state != ShareState::Available {
                anyhow::bail!(
                    "share {name} is {}{}",
                    s.state.as_str(),
                    s.reason.map(|r| format!(": {r}")).unwrap_or_default()
                );
            }
            s
        }
        ShareCmd::List { tenant } => {
            let ss: Vec<Share> = c.list_all(&base(tenant)).await?;
            return print_one(out, fmt, &ss, || table(&ss));
        }
        ShareCmd::Show { name, tenant } => c.get(&one(tenant, name)).await?,
        ShareCmd::Grow {
            name,
            tenant,
            size_gib,
        } => {
            c.post(
                &format!("{}/grow", one(tenant, name)),
                &ShareGrow {
                    size_gib: *size_gib,
                },
            )
            .await?
        }
        ShareCmd::Mount { share, tenant, vm } => c.post(&vm_shares(tenant, vm), share).await?,
        ShareCmd::Unmount { name, tenant, vm } => {
            c.delete(&format!("{}/{}", vm_shares(tenant, vm), segment(name)))
                .await?;
            writeln!(
                out,
                "Unmounted share {name} from {vm} (from its next start)"
            )?;
            return Ok(());
        }
        ShareCmd::Delete { name, tenant } => {
            c.delete(&one(tenant, name)).await?;
            writeln!(out, "Deleting share {name}")?;
            return Ok(());
        }
    };
    print_one(out, fmt, &s, || table(std::slice::from_ref(&s)))?;
    Ok(())
}
