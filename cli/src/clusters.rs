//! `kumo cluster`: training clusters, their members placed together and
//! rail-aligned; repairs, events and the MPI hostfile.

use std::io::Write;

use clap::Subcommand;
use kumo_api_types::{Cluster, ClusterCreate};

use crate::args::{parse_duration, SpecArgs, TenantArg};
use crate::client::Client;
use crate::output::{opt, print_one, Format, Table};

#[derive(Subcommand, Debug)]
pub enum ClusterCmd {
    /// Create SIZE identical VMs NAME-0 … placed together, rail-aligned.
    Create {
        /// The cluster's name; its members are NAME-0, NAME-1, …
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// How many VMs.
        #[arg(long)]
        size: u32,
        /// Replace failed members without being asked (`kumo cluster
        /// repair`), once the cluster has been degraded --repair-delay.
        #[arg(long)]
        auto_repair: bool,
        /// How long a degraded cluster waits before it repairs itself
        /// (a host that is only rebooting comes back within it): 2m
        /// unless set.
        #[arg(long, value_parser = parse_duration, requires = "auto_repair")]
        repair_delay: Option<u64>,
        /// Keep N members' worth of room free in the cluster's scalable
        /// unit for repairs (charged at the spare_gpu rate; other tenants'
        /// spot VMs may use it until a repair needs it).
        #[arg(long, default_value_t = 0)]
        spares: u32,
        /// `required`: every member in one scalable unit or no cluster
        /// (repairs wait for room there); `preferred` (the default): one
        /// unit when one has room, else the fewest units.
        #[arg(long, value_parser = parse_single_su, default_value = "preferred")]
        single_su: kumo_api_types::SingleSu,
        /// No NIC at all. Without --network the members go on the
        /// project's `default` segment, when it has one (the network
        /// they reach each other on).
        #[arg(long, conflicts_with = "network")]
        no_network: bool,
        #[command(flatten)]
        spec: Box<SpecArgs>,
    },
    /// Replace failed members (host lost, VM in error, a device
    /// quarantined) by new VMs of the same shape, names and addresses.
    Repair {
        /// The cluster's name.
        cluster: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// The cluster's events: health changes, repairs.
    Events {
        /// The cluster's name.
        cluster: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// The tenant's clusters.
    List {
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Members, their hosts, scalable units and rails.
    Show {
        /// The cluster's name.
        cluster: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// The MPI hostfile (also at /etc/kumo/hostfile in every member).
    Hostfile {
        /// The cluster's name.
        cluster: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Delete a cluster and every member.
    Delete {
        /// The cluster's name.
        cluster: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
}

fn parse_single_su(s: &str) -> Result<kumo_api_types::SingleSu, String> {
    kumo_api_types::SingleSu::parse(s).ok_or_else(|| "preferred or required".to_owned())
}

fn cluster_detail(cl: &Cluster) -> String {
    let mut s = format!(
        "Name:    {}\nTenant:  {}\nState:   {}\nSize:    {} × ({} GPU(s), {} vCPUs, {} GiB memory)\nHealth:  {}{}\nRepair:  {}\n",
        cl.name,
        cl.tenant,
        cl.state,
        cl.size,
        cl.spec.gpus,
        cl.spec.vcpus,
        cl.spec.memory_gib,
        cl.health.as_str(),
        cl.health_since
            .map(|t| format!(" since {}", t.to_rfc3339()))
            .unwrap_or_default(),
        if cl.auto_repair {
            format!("by itself after {} s degraded", cl.repair_delay_seconds)
        } else {
            "by hand (kumo cluster repair)".to_owned()
        },
    );
    for p in &cl.problems {
        s.push_str(&format!("  {}: {}\n", p.member, p.detail));
    }
    if let Some(q) = &cl.queue {
        s.push_str(&crate::output::queue_lines(q));
    }
    if cl.single_su == kumo_api_types::SingleSu::Required {
        s.push_str("Units:   one scalable unit required\n");
    }
    if cl.spares > 0 {
        s.push_str(&format!(
            "Spares:  {} kept in {} ({} with room now)\n",
            cl.spares,
            cl.spare_unit.as_deref().unwrap_or("hosts without a unit"),
            cl.spares_ready
        ));
    }
    s.push('\n');
    let mut t = Table::new(&["member", "state", "host", "su", "rails"]);
    for m in &cl.members {
        let rails: Vec<String> = m
            .rails
            .iter()
            .map(|r| r.map(|r| r.to_string()).unwrap_or_else(|| "-".into()))
            .collect();
        t.row(vec![
            m.name.clone(),
            m.state.as_str().into(),
            opt(&m.host),
            opt(&m.scalable_unit),
            if rails.is_empty() {
                "-".into()
            } else {
                rails.join(",")
            },
        ]);
    }
    s.push_str(&t.render());
    s
}

pub async fn cluster(
    cmd: &ClusterCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match cmd {
        ClusterCmd::Create {
            name,
            tenant,
            size,
            auto_repair,
            repair_delay,
            spares,
            single_su,
            no_network,
            spec,
        } => {
            let mut v = spec.vm(name)?;
            if v.networks.is_empty() && !*no_network {
                v.networks = crate::vms::on_default_segment(c, &tenant.tenant).await?;
            }
            if v.networks.iter().any(|n| n.ip.is_some()) {
                anyhow::bail!(
                    "cluster members get their addresses from the segment: --network SEGMENT"
                );
            }
            if !v.volumes.is_empty() {
                anyhow::bail!("a volume is one VM's disk: attach volumes to VMs, not to clusters");
            }
            if v.on_reclaim.is_some() {
                anyhow::bail!("--on-reclaim is for single spot VMs");
            }
            let cl = c
                .create_cluster(
                    &tenant.tenant,
                    &ClusterCreate {
                        name: v.name,
                        size: *size,
                        gpus: v.gpus,
                        gpu_model: v.gpu_model,
                        vcpus: v.vcpus,
                        memory_gib: v.memory_gib,
                        disk_gib: v.disk_gib,
                        template: v.template,
                        service_level: v.service_level,
                        ssh_keys: v.ssh_keys,
                        networks: v.networks.into_iter().map(|n| n.segment).collect(),
                        shares: v.shares,
                        auto_repair: *auto_repair,
                        repair_delay_seconds: repair_delay
                            .map(|d| u32::try_from(d).unwrap_or(u32::MAX)),
                        spares: *spares,
                        single_su: *single_su,
                        queue: v.queue,
                        reservation: v.reservation,
                    },
                )
                .await?;
            print_one(out, fmt, &cl, || cluster_detail(&cl))?;
        }
        ClusterCmd::List { tenant } => {
            let cls = c.list_clusters(&tenant.tenant).await?;
            print_one(out, fmt, &cls, || {
                let mut t = Table::new(&[
                    "name",
                    "state",
                    "health",
                    "size",
                    "gpus each",
                    "scalable units",
                ]);
                for cl in &cls {
                    let mut sus: Vec<String> = cl
                        .members
                        .iter()
                        .filter_map(|m| m.scalable_unit.clone())
                        .collect();
                    sus.sort();
                    sus.dedup();
                    t.row(vec![
                        cl.name.clone(),
                        cl.state.clone(),
                        cl.health.as_str().into(),
                        cl.size.to_string(),
                        cl.spec.gpus.to_string(),
                        if sus.is_empty() {
                            "-".into()
                        } else {
                            sus.join(",")
                        },
                    ]);
                }
                t.render()
            })?;
        }
        ClusterCmd::Show { cluster, tenant } => {
            let cl = c.cluster(&tenant.tenant, cluster).await?;
            print_one(out, fmt, &cl, || cluster_detail(&cl))?;
        }
        ClusterCmd::Repair { cluster, tenant } => {
            let r = c.repair_cluster(&tenant.tenant, cluster).await?;
            print_one(out, fmt, &r, || {
                let mut s = if r.replaced.is_empty() {
                    format!("Nothing to replace in {}\n", r.cluster.name)
                } else {
                    format!(
                        "Replacing {} of {}: same names and addresses, fresh root disks\n",
                        r.replaced.join(", "),
                        r.cluster.name
                    )
                };
                for p in &r.left {
                    s.push_str(&format!("Left alone: {}: {}\n", p.member, p.detail));
                }
                s
            })?;
        }
        ClusterCmd::Events { cluster, tenant } => {
            let evs = c.cluster_events(&tenant.tenant, cluster).await?;
            print_one(out, fmt, &evs, || {
                let mut t = Table::new(&["at", "kind", "message"]);
                for e in &evs {
                    t.row(vec![e.at.to_rfc3339(), e.kind.clone(), e.message.clone()]);
                }
                t.render()
            })?;
        }
        ClusterCmd::Hostfile { cluster, tenant } => {
            write!(
                out,
                "{}",
                c.cluster(&tenant.tenant, cluster).await?.hostfile
            )?;
        }
        ClusterCmd::Delete { cluster, tenant } => {
            let cl = c.delete_cluster(&tenant.tenant, cluster).await?;
            print_one(out, fmt, &cl, || {
                format!("Deleting {} ({} members)\n", cl.name, cl.members.len())
            })?;
        }
    }
    Ok(())
}
