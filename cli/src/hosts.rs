//! `kumo host`: GPU hosts for platform admins: their state, draining and
//! maintenance windows, join tokens, and the health of passed-through
//! devices.

use std::io::Write;

use clap::Subcommand;
use kumo_api_types::JoinTokenCreate;

use crate::args::parse_duration;
use crate::client::Client;
use crate::output::{opt, print_one, Format, Table};

#[derive(Subcommand, Debug)]
pub enum HostCmd {
    /// Every host with its GPUs, state and last heartbeat.
    List,
    /// A host with its GPU/NIC matrix and allocations.
    Show {
        /// The host's name.
        host: String,
    },
    /// Take a host out of service: no new VMs; its spot VMs are reclaimed.
    Drain {
        /// The host's name.
        host: String,
    },
    /// Put a drained host back into service.
    Undrain {
        /// The host's name.
        host: String,
    },
    /// Schedule a maintenance window: the host takes nothing new; at TIME
    /// its VMs move to other hosts with their disks (cluster members are
    /// replaced, the rest stopped), and it stays in maintenance until
    /// --done. Every VM on it is told ahead (also in the guest, in
    /// /run/kumo/events).
    Maintenance {
        /// The host's name.
        host: String,
        /// When (RFC 3339, e.g. 2026-12-01T09:00:00Z); again to move it.
        #[arg(long, required_unless_present = "done", conflicts_with = "done")]
        at: Option<chrono::DateTime<chrono::Utc>>,
        /// Told to the tenants whose VMs move.
        #[arg(long, requires = "at")]
        reason: Option<String>,
        /// Maintenance is over (or called off): the host takes VMs again.
        #[arg(long)]
        done: bool,
    },
    /// Let a registered host join again with a join token (a reinstalled
    /// machine); its current credential is revoked at once.
    Rejoin {
        /// The host's name.
        host: String,
    },
    /// Join tokens, which register new hosts.
    #[command(subcommand)]
    JoinToken(JoinTokenCmd),
    /// The health of the GPUs and NICs passed to VMs: list, quarantine,
    /// repair and validate them.
    #[command(subcommand)]
    Device(DeviceCmd),
}

#[derive(Subcommand, Debug)]
pub enum DeviceCmd {
    /// Devices with their state and why (every host's, or one's).
    List {
        /// Only this host's devices.
        #[arg(long)]
        host: Option<String>,
        /// Only devices in this state: healthy, suspect, quarantined,
        /// repairing, validating.
        #[arg(long)]
        state: Option<String>,
    },
    /// Take a device out of service: no new VMs; its spot VMs are reclaimed.
    Quarantine {
        /// The device's host.
        host: String,
        /// Its PCI address, e.g. 0000:18:00.0.
        bdf: String,
        /// Why (kept with the device and in the audit log).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Mark a quarantined device as being repaired.
    Repair {
        /// The device's host.
        host: String,
        /// Its PCI address, e.g. 0000:18:00.0.
        bdf: String,
        /// Why (kept with the device and in the audit log).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Validate a repaired device: its next clean reading makes it healthy
    /// (a finding quarantines it again).
    Validate {
        /// The device's host.
        host: String,
        /// Its PCI address, e.g. 0000:18:00.0.
        bdf: String,
        /// Why (kept with the device and in the audit log).
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum JoinTokenCmd {
    /// Make a join token; it is shown only once.
    Create {
        /// What (which machines) it is for.
        #[arg(long)]
        description: Option<String>,
        /// Lifetime, e.g. 24h (default), 7d.
        #[arg(long, value_parser = parse_duration)]
        ttl: Option<u64>,
        /// How many hosts it may register (default 1).
        #[arg(long)]
        uses: Option<u32>,
    },
    /// Join tokens with their uses (never their secrets).
    List,
    /// Revoke a join token: it registers no more hosts.
    Revoke {
        /// The join token's id (see kumo host join-token list).
        id: String,
    },
}

pub async fn host(
    cmd: &HostCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match cmd {
        HostCmd::List => {
            let hosts = c.list_hosts().await?;
            print_one(out, fmt, &hosts, || {
                let mut t = Table::new(&[
                    "name",
                    "state",
                    "gpus",
                    "free",
                    "models",
                    "nics",
                    "cpus",
                    "last heartbeat",
                ]);
                for h in &hosts {
                    t.row(vec![
                        h.name.clone(),
                        h.state.as_str().into(),
                        h.gpus.to_string(),
                        h.gpus_free.to_string(),
                        if h.gpu_models.is_empty() {
                            "-".into()
                        } else {
                            h.gpu_models.join(",")
                        },
                        h.rdma_nics.to_string(),
                        h.cpus.to_string(),
                        h.last_heartbeat_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                    ]);
                }
                t.render()
            })?;
        }
        HostCmd::Show { host } => {
            let h = c.host(host).await?;
            print_one(out, fmt, &h, || {
                let passthrough = if h.host.passthrough_ready {
                    format!(
                        "ready ({} GiB hugepages free)",
                        h.host.hugepages_free_bytes >> 30
                    )
                } else {
                    format!(
                        "NOT READY, CPU-only VMs only:\n        - {}",
                        h.host.passthrough_problems.join("\n        - ")
                    )
                };
                let mut nvswitch = String::new();
                if let Some(p) = &h.host.fabric_manager_problem {
                    nvswitch = format!("NVSwitch: {p}\n");
                } else if !h.host.partitions.is_empty() {
                    nvswitch = format!(
                        "NVSwitch partitions: {}\n",
                        h.host
                            .partitions
                            .iter()
                            .map(|p| format!("{}={}", p.id, p.gpus.len()))
                            .collect::<Vec<_>>()
                            .join(" ")
                    );
                }
                format!(
                    "Name:   {}\nState:  {}\nGPUs:   {} ({} free) {}\nCPUs:   {}\nVirt:   {}\nPassthrough: {}\n{nvswitch}\n{}\nAllocations: {}\n",
                    h.host.name,
                    h.host.state.as_str(),
                    h.host.gpus,
                    h.host.gpus_free,
                    h.host.gpu_models.join(","),
                    h.host.cpus,
                    h.host.virt_type,
                    passthrough,
                    h.matrix,
                    h.allocations.len()
                )
            })?;
        }
        HostCmd::Maintenance {
            host,
            at,
            reason,
            done,
        } => {
            let h = match at {
                Some(at) if !*done => {
                    c.schedule_maintenance(
                        host,
                        &kumo_api_types::MaintenanceCreate {
                            at: *at,
                            reason: reason.clone(),
                        },
                    )
                    .await?
                }
                _ => c.end_maintenance(host).await?,
            };
            print_one(out, fmt, &h, || match &h.maintenance {
                Some(w) => format!(
                    "{}: {}, maintenance at {}\n",
                    h.name,
                    h.state.as_str(),
                    w.at.to_rfc3339()
                ),
                None => format!("{}: {}\n", h.name, h.state.as_str()),
            })?;
        }
        HostCmd::Drain { host } | HostCmd::Undrain { host } => {
            let action = if matches!(cmd, HostCmd::Drain { .. }) {
                "drain"
            } else {
                "undrain"
            };
            let h = c.host_action(host, action).await?;
            print_one(out, fmt, &h, || {
                format!("{}: {}\n", h.name, h.state.as_str())
            })?;
        }
        HostCmd::JoinToken(JoinTokenCmd::Create {
            description,
            ttl,
            uses,
        }) => {
            let t = c
                .create_join_token(&JoinTokenCreate {
                    description: description.clone(),
                    ttl_seconds: *ttl,
                    uses: *uses,
                })
                .await?;
            print_one(out, fmt, &t, || {
                format!(
                    "Join token {} for {} host(s) (expires {}). It is shown only once:\n{}\n",
                    t.id, t.uses, t.expires_at, t.token
                )
            })?;
        }
        HostCmd::JoinToken(JoinTokenCmd::List) => {
            let ts = c.list_join_tokens().await?;
            print_one(out, fmt, &ts, || {
                let mut t = Table::new(&["id", "description", "expires", "used", "revoked"]);
                for x in &ts {
                    t.row(vec![
                        x.id.to_string(),
                        x.description.clone(),
                        x.expires_at.format("%Y-%m-%d %H:%M").to_string(),
                        format!("{}/{}", x.used, x.uses),
                        opt(&x.revoked_at.map(|e| e.format("%Y-%m-%d %H:%M").to_string())),
                    ]);
                }
                t.render()
            })?;
        }
        HostCmd::JoinToken(JoinTokenCmd::Revoke { id }) => {
            c.revoke_join_token(id).await?;
            if fmt == Format::Table {
                writeln!(out, "Revoked join token {id}")?;
            }
        }
        HostCmd::Device(DeviceCmd::List { host, state }) => {
            let state = match state {
                Some(s) => Some(kumo_api_types::DeviceState::parse(s).ok_or_else(|| {
                    anyhow::anyhow!(
                        "unknown state {s:?}: healthy, suspect, quarantined, repairing or validating"
                    )
                })?),
                None => None,
            };
            let list = c
                .devices(&kumo_api_types::DeviceQuery {
                    host: host.clone(),
                    state,
                })
                .await?;
            print_one(out, fmt, &list, || {
                let mut t = Table::new(&["host", "device", "kind", "state", "since", "vms", "why"]);
                for d in &list.items {
                    t.row(vec![
                        d.host.clone(),
                        d.bdf.clone(),
                        d.kind.clone(),
                        d.state.as_str().into(),
                        d.since.format("%Y-%m-%d %H:%M").to_string(),
                        d.vms.len().to_string(),
                        opt(&d.reason),
                    ]);
                }
                let counts: Vec<String> = list
                    .counts
                    .iter()
                    .map(|(s, n)| format!("{n} {s}"))
                    .collect();
                format!(
                    "{}\nFleet: {} (Kumo quarantines at most {} by itself)\n",
                    t.render().trim_end(),
                    if counts.is_empty() {
                        "no device reported yet".into()
                    } else {
                        counts.join(", ")
                    },
                    list.quarantine_cap
                )
            })?;
        }
        HostCmd::Device(
            DeviceCmd::Quarantine { host, bdf, reason }
            | DeviceCmd::Repair { host, bdf, reason }
            | DeviceCmd::Validate { host, bdf, reason },
        ) => {
            let action = match cmd {
                HostCmd::Device(DeviceCmd::Quarantine { .. }) => "quarantine",
                HostCmd::Device(DeviceCmd::Repair { .. }) => "repair",
                _ => "validate",
            };
            let d = c.device_action(host, bdf, action, reason.clone()).await?;
            print_one(out, fmt, &d, || {
                format!(
                    "{} {}: {} ({})\n",
                    d.host,
                    d.bdf,
                    d.state.as_str(),
                    opt(&d.reason)
                )
            })?;
        }
        HostCmd::Rejoin { host } => {
            c.rejoin_host(host).await?;
            if fmt == Format::Table {
                writeln!(out, "{host} may join again; its old credential is revoked")?;
            }
        }
    }
    Ok(())
}
