//! `kumo quota`: a tenant's limits and guaranteed GPUs, and the fleet's
//! standing against every guarantee.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::bail;
use clap::Subcommand;
use kumo_api_types::Quota;

use crate::args::TenantArg;
use crate::client::Client;
use crate::output::{print_one, Format, Table};

#[derive(Subcommand, Debug)]
pub enum QuotaCmd {
    /// The tenant's limits.
    Show {
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Every GPU model's guaranteed shares against its GPUs in service
    /// (platform admins).
    Guarantees,
    /// Change the given limits; others keep their value (platform admins).
    Set {
        #[command(flatten)]
        tenant: TenantArg,
        /// GPUs per model, e.g. --gpus H100-SXM5-80GB=16 (0 removes the model).
        #[arg(long, value_parser = parse_gpu_limit)]
        gpus: Vec<(String, u32)>,
        /// GPUs per model guaranteed to the tenant, e.g. --guarantee
        /// H100-SXM5-80GB=16 (at most the cap; 0 removes it): requests within
        /// it get room by reclaiming other tenants' borrowed VMs.
        #[arg(long, value_parser = parse_gpu_limit)]
        guarantee: Vec<(String, u32)>,
        /// vCPUs over all the tenant's VMs.
        #[arg(long)]
        vcpus: Option<u32>,
        /// Memory over all the tenant's VMs, GiB.
        #[arg(long)]
        memory_gib: Option<u32>,
        /// How many VMs the tenant may have.
        #[arg(long)]
        vms: Option<u32>,
        /// Disk over all the tenant's VMs, GiB.
        #[arg(long)]
        disk_gib: Option<u32>,
        /// How many segments (private networks) the tenant may have.
        #[arg(long)]
        segments: Option<u32>,
        /// RoCE segments (each holds a fabric VLAN).
        #[arg(long)]
        roce_segments: Option<u32>,
        /// How many public addresses the tenant may hold.
        #[arg(long)]
        public_ips: Option<u32>,
        /// Volumes over all the tenant's volumes, GiB.
        #[arg(long)]
        volume_gib: Option<u32>,
        /// Project shares' sizes together, GiB.
        #[arg(long)]
        share_gib: Option<u32>,
    },
}

fn parse_gpu_limit(s: &str) -> Result<(String, u32), String> {
    let (model, n) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected MODEL=COUNT"))?;
    let n = n
        .parse()
        .map_err(|_| format!("{s:?}: COUNT must be a number"))?;
    Ok((model.to_owned(), n))
}

fn quota_table(q: &Quota) -> String {
    let mut t = Table::new(&["resource", "limit"]);
    for (model, n) in &q.gpus {
        t.row(vec![format!("gpus.{model}"), n.to_string()]);
    }
    for (model, n) in &q.guarantee {
        t.row(vec![format!("guarantee.{model}"), n.to_string()]);
    }
    for (name, v) in [
        ("vcpus", q.vcpus),
        ("memory_gib", q.memory_gib),
        ("vms", q.vms),
        ("disk_gib", q.disk_gib),
        ("segments", q.segments),
        ("roce_segments", q.roce_segments),
        ("public_ips", q.public_ips),
        ("volume_gib", q.volume_gib),
        ("share_gib", q.share_gib),
    ] {
        t.row(vec![name.into(), v.to_string()]);
    }
    t.render()
}

pub async fn quota(
    cmd: &QuotaCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match cmd {
        QuotaCmd::Show { tenant } => {
            let q = c.quota(&tenant.tenant).await?;
            print_one(out, fmt, &q, || quota_table(&q))?;
        }
        QuotaCmd::Guarantees => {
            let list: Vec<kumo_api_types::GuaranteeStanding> = c.get("/api/v1/guarantees").await?;
            print_one(out, fmt, &list, || {
                let mut t = Table::new(&["model", "promised", "in service", "tenants"]);
                for g in &list {
                    let short = if g.promised > g.in_service {
                        " (OVERPROMISED)"
                    } else {
                        ""
                    };
                    t.row(vec![
                        g.model.clone(),
                        format!("{}{short}", g.promised),
                        g.in_service.to_string(),
                        g.tenants
                            .iter()
                            .map(|(t, n)| format!("{t}={n}"))
                            .collect::<Vec<_>>()
                            .join(" "),
                    ]);
                }
                t.render()
            })?;
        }
        QuotaCmd::Set {
            tenant,
            gpus,
            guarantee,
            vcpus,
            memory_gib,
            vms,
            disk_gib,
            segments,
            roce_segments,
            public_ips,
            volume_gib,
            share_gib,
        } => {
            let mut q = c.quota(&tenant.tenant).await?;
            let mut models: BTreeMap<String, u32> = q.gpus.clone();
            for (model, n) in gpus {
                if *n == 0 {
                    models.remove(model);
                } else {
                    models.insert(model.clone(), *n);
                }
            }
            q.gpus = models;
            for (model, n) in guarantee {
                if *n == 0 {
                    q.guarantee.remove(model);
                } else {
                    q.guarantee.insert(model.clone(), *n);
                }
            }
            for (slot, v) in [
                (&mut q.vcpus, vcpus),
                (&mut q.memory_gib, memory_gib),
                (&mut q.vms, vms),
                (&mut q.disk_gib, disk_gib),
                (&mut q.segments, segments),
                (&mut q.roce_segments, roce_segments),
                (&mut q.public_ips, public_ips),
                (&mut q.volume_gib, volume_gib),
                (&mut q.share_gib, share_gib),
            ] {
                if let Some(v) = v {
                    *slot = *v;
                }
            }
            if gpus.is_empty()
                && guarantee.is_empty()
                && [
                    vcpus,
                    memory_gib,
                    vms,
                    disk_gib,
                    segments,
                    roce_segments,
                    public_ips,
                    volume_gib,
                    share_gib,
                ]
                .iter()
                .all(|v| v.is_none())
            {
                bail!("nothing to set: give at least one of --gpus, --guarantee, --vcpus, --memory-gib, --vms, --disk-gib, --segments, --roce-segments, --public-ips, --volume-gib, --share-gib");
            }
            let q = c.set_quota(&tenant.tenant, &q).await?;
            print_one(out, fmt, &q, || quota_table(&q))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_limits_parse() {
        assert_eq!(parse_gpu_limit("H100=8"), Ok(("H100".into(), 8)));
        assert!(parse_gpu_limit("H100").is_err());
        assert!(parse_gpu_limit("H100=x").is_err());
    }
}
