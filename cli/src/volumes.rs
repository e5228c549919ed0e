//! `kumo volume`: block volumes that outlive VMs, each on one host and
//! attached to at most one VM there.

use std::io::Write;

use clap::Subcommand;
use kumo_api_types::{
    Volume, VolumeAttach, VolumeCreate, VolumeMove, VolumeResize, VolumeSnapshot,
    VolumeSnapshotCreate, VolumeState,
};

use crate::args::TenantArg;
use crate::client::{segment, Client};
use crate::output::{print_one, Format, Table};

#[derive(Subcommand, Debug)]
pub enum VolumeCmd {
    /// Make a volume (within the tenant's `volume_gib` quota).
    Create {
        /// The volume's name.
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// Its size, GiB [default with --from-snapshot: the snapshot's].
        #[arg(long, required_unless_present = "from_snapshot")]
        size_gib: Option<u32>,
        /// Make it on this VM's host, so it can be attached to it.
        #[arg(long, conflicts_with = "from_snapshot")]
        vm: Option<String>,
        /// `VOLUME@SNAPSHOT`: a copy of that snapshot, on its volume's host.
        #[arg(long)]
        from_snapshot: Option<String>,
    },
    /// The tenant's volumes.
    List {
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// One volume: its state, host, VM and where the guest finds it.
    Show {
        /// The volume's name.
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Grow a detached volume (it never shrinks).
    Grow {
        /// The volume's name.
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// The new size, GiB.
        #[arg(long)]
        size_gib: u32,
    },
    /// Attach it to a VM on its host (hot-plugged if the VM runs).
    Attach {
        /// The volume's name.
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// The VM (on the volume's host) to attach it to.
        #[arg(long)]
        vm: String,
    },
    /// Take it off its VM; the volume and its data stay.
    Detach {
        /// The volume's name.
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Move a detached volume to another host (copied agent to agent,
    /// kept there once whole and checksummed). Naming the host it is on
    /// cancels a move under way.
    Move {
        /// The volume's name.
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// The host to move it to.
        #[arg(long)]
        host: String,
        /// Wait until the move is over (or failed).
        #[arg(long)]
        wait: bool,
    },
    /// Snapshot a detached volume (kept on its host).
    Snapshot {
        /// The volume's name.
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// The snapshot's name.
        #[arg(long = "name")]
        snapshot: String,
    },
    /// A volume's snapshots.
    Snapshots {
        /// The volume's name.
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Delete a snapshot (`VOLUME@SNAPSHOT`) no volume was made from.
    DeleteSnapshot {
        /// The snapshot, VOLUME@SNAPSHOT.
        snapshot: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Delete a detached volume and its data.
    Delete {
        /// The volume's name.
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
}

fn table(vs: &[Volume]) -> String {
    let mut t = Table::new(&["name", "size", "state", "host", "vm", "in the guest"]);
    for v in vs {
        t.row(vec![
            v.name.clone(),
            format!("{} GiB", v.size_gib),
            {
                let state = match &v.moving_to {
                    Some(h) => format!("{} to {h}", v.state.as_str()),
                    None => v.state.as_str().to_owned(),
                };
                match &v.reason {
                    Some(r) => format!("{state} ({r})"),
                    None => state,
                }
            },
            v.host.clone().unwrap_or_else(|| "-".into()),
            v.vm.clone().unwrap_or_else(|| "-".into()),
            v.guest_path(),
        ]);
    }
    t.render()
}

fn snapshots_table(ss: &[VolumeSnapshot]) -> String {
    let mut t = Table::new(&["snapshot", "size", "state", "created"]);
    for s in ss {
        t.row(vec![
            format!("{}@{}", s.volume, s.name),
            format!("{} GiB", s.size_gib),
            s.state.clone(),
            s.created_at.format("%Y-%m-%d %H:%M").to_string(),
        ]);
    }
    t.render()
}

pub async fn volume(
    cmd: &VolumeCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let base = |t: &TenantArg| format!("/api/v1/tenants/{}/volumes", segment(&t.tenant));
    let one = |t: &TenantArg, name: &str| format!("{}/{}", base(t), segment(name));
    let v: Volume = match cmd {
        VolumeCmd::Create {
            name,
            tenant,
            size_gib,
            vm,
            from_snapshot,
        } => {
            c.post(
                &base(tenant),
                &VolumeCreate {
                    name: name.clone(),
                    size_gib: size_gib.unwrap_or(0),
                    vm: vm.clone(),
                    from_snapshot: from_snapshot.clone(),
                },
            )
            .await?
        }
        VolumeCmd::List { tenant } => {
            let vs: Vec<Volume> = c.list_all(&base(tenant)).await?;
            return print_one(out, fmt, &vs, || table(&vs));
        }
        VolumeCmd::Show { name, tenant } => c.get(&one(tenant, name)).await?,
        VolumeCmd::Grow {
            name,
            tenant,
            size_gib,
        } => {
            c.post(
                &format!("{}/resize", one(tenant, name)),
                &VolumeResize {
                    size_gib: *size_gib,
                },
            )
            .await?
        }
        VolumeCmd::Attach { name, tenant, vm } => {
            c.post(
                &format!("{}/attach", one(tenant, name)),
                &VolumeAttach { vm: vm.clone() },
            )
            .await?
        }
        VolumeCmd::Detach { name, tenant } => {
            c.post(
                &format!("{}/detach", one(tenant, name)),
                &serde_json::json!({}),
            )
            .await?
        }
        VolumeCmd::Move {
            name,
            tenant,
            host,
            wait,
        } => {
            let path = one(tenant, name);
            let mut v: Volume = c
                .post(&format!("{path}/move"), &VolumeMove { host: host.clone() })
                .await?;
            let mut said = None;
            let progress = wait.then(|| {
                crate::progress::Progress::start(format!("moving volume {name} to {host}"))
            });
            while let (Some(progress), VolumeState::Moving) = (&progress, v.state) {
                if v.reason.is_some() && v.reason != said {
                    // A failed copy is retried: say why while waiting.
                    progress.println(&format!(
                        "still moving: {}",
                        v.reason.as_deref().unwrap_or_default()
                    ));
                    said = v.reason.clone();
                }
                progress.set(&match &v.moving_to {
                    Some(to) => format!("{} to {to}", v.state.as_str()),
                    None => v.state.as_str().to_owned(),
                });
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                v = c.get(&path).await?;
            }
            drop(progress);
            if *wait && v.host.as_deref() != Some(host.as_str()) {
                anyhow::bail!(
                    "volume {name} is {} on {}, not on {host}{}",
                    v.state.as_str(),
                    v.host.as_deref().unwrap_or("-"),
                    v.reason.map(|r| format!(": {r}")).unwrap_or_default()
                );
            }
            v
        }
        VolumeCmd::Snapshot {
            name,
            tenant,
            snapshot,
        } => {
            let s: VolumeSnapshot = c
                .post(
                    &format!("{}/snapshots", one(tenant, name)),
                    &VolumeSnapshotCreate {
                        name: snapshot.clone(),
                    },
                )
                .await?;
            return print_one(out, fmt, &s, || snapshots_table(std::slice::from_ref(&s)));
        }
        VolumeCmd::Snapshots { name, tenant } => {
            let ss: Vec<VolumeSnapshot> =
                c.get(&format!("{}/snapshots", one(tenant, name))).await?;
            return print_one(out, fmt, &ss, || snapshots_table(&ss));
        }
        VolumeCmd::DeleteSnapshot { snapshot, tenant } => {
            let (vol, snap) = snapshot
                .split_once('@')
                .ok_or_else(|| anyhow::anyhow!("{snapshot:?}: expected VOLUME@SNAPSHOT"))?;
            c.delete(&format!("{}/snapshots/{}", one(tenant, vol), segment(snap)))
                .await?;
            writeln!(out, "Deleting snapshot {snapshot}")?;
            return Ok(());
        }
        VolumeCmd::Delete { name, tenant } => {
            c.delete(&one(tenant, name)).await?;
            writeln!(out, "Deleting volume {name}")?;
            return Ok(());
        }
    };
    print_one(out, fmt, &v, || table(std::slice::from_ref(&v)))?;
    Ok(())
}
