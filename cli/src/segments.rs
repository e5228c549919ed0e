//! `kumo segment`: a tenant's private networks (VXLAN segments, Ethernet or
//! RoCE), their egress and ingress rules.

use std::io::Write;

use anyhow::bail;
use clap::Subcommand;
use kumo_api_types::{
    IngressRule, Segment, SegmentCreate, SegmentIngress, SegmentKind, SegmentUpdate,
};

use crate::args::TenantArg;
use crate::client::Client;
use crate::output::{print_one, Format, Table};

#[derive(Subcommand, Debug)]
pub enum SegmentCmd {
    /// A private network for the tenant's VMs, with a VNI of its own.
    Create {
        /// The segment's name.
        name: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// ethernet (virtio NICs over VXLAN) or roce (the GPUs' RDMA NICs).
        #[arg(long, value_enum, default_value = "ethernet")]
        kind: SegmentKindArg,
        /// IPv4 network, e.g. 10.1.0.0/24.
        #[arg(long)]
        cidr: String,
        /// The gateway address [default: the network's first address].
        #[arg(long)]
        gateway: Option<String>,
        /// The VMs' MTU [default: the underlay MTU less 50].
        #[arg(long)]
        mtu: Option<u32>,
        /// Let in from outside the segment: `PROTO[:PORTS]:SOURCE`, e.g.
        /// `tcp:22:0.0.0.0/0`, `icmp:10.0.0.0/8`; repeat for more.
        #[arg(long, value_parser = parse_ingress)]
        allow: Vec<IngressRule>,
        /// No way out: the VMs reach only the segment (and what reaches
        /// them through public addresses).
        #[arg(long)]
        no_egress: bool,
    },
    /// Switch a segment's egress (VMs reaching outside through its gateway).
    Update {
        /// The segment's name.
        segment: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// true: the VMs reach outside; false: only the segment.
        #[arg(long, value_parser = clap::value_parser!(bool))]
        egress: Option<bool>,
    },
    /// Replace a segment's ingress rules (none: only the segment itself).
    Ingress {
        /// The segment's name.
        segment: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// `PROTO[:PORTS]:SOURCE`; repeat for more.
        #[arg(long, value_parser = parse_ingress)]
        allow: Vec<IngressRule>,
    },
    /// The tenant's segments.
    List {
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// One segment: its network, VNI, VMs, egress and ingress.
    Show {
        /// The segment's name.
        segment: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Delete a segment without VMs on it.
    Delete {
        /// The segment's name.
        segment: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum SegmentKindArg {
    Ethernet,
    Roce,
}

/// `tcp:22:0.0.0.0/0`, `udp:8000-8100:10.0.0.0/8`, `icmp:10.0.0.0/8`, `any:192.0.2.0/24`.
fn parse_ingress(s: &str) -> Result<IngressRule, String> {
    s.parse()
}

fn segments_table(segs: &[Segment]) -> String {
    let mut t = Table::new(&[
        "name", "kind", "cidr", "gateway", "mtu", "vni", "vms", "egress", "ingress",
    ]);
    for s in segs {
        t.row(vec![
            s.name.clone(),
            match s.kind {
                SegmentKind::Ethernet => "ethernet".into(),
                SegmentKind::Roce => format!("roce (path MTU {})", s.roce_mtu.unwrap_or(0)),
            },
            s.cidr.clone(),
            s.gateway.clone(),
            s.mtu.to_string(),
            s.vni.to_string(),
            s.attachments.to_string(),
            match (&s.edge, s.egress) {
                (_, false) => "off".into(),
                (Some(e), true) => e
                    .snat_address
                    .clone()
                    .unwrap_or_else(|| "waiting for an address".into()),
                (None, true) => "waiting for an edge".into(),
            },
            if s.ingress.is_empty() {
                "segment only".into()
            } else {
                s.ingress
                    .iter()
                    .map(|r| {
                        let proto = serde_json::to_value(r.protocol)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default();
                        match &r.ports {
                            Some(p) => format!("{proto}:{p}:{}", r.source),
                            None => format!("{proto}:{}", r.source),
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            },
        ]);
    }
    t.render()
}

pub async fn segment_cmd(
    cmd: &SegmentCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match cmd {
        SegmentCmd::Create {
            name,
            tenant,
            kind,
            cidr,
            gateway,
            mtu,
            allow,
            no_egress,
        } => {
            let s = c
                .create_segment(
                    &tenant.tenant,
                    &SegmentCreate {
                        name: name.clone(),
                        kind: match kind {
                            SegmentKindArg::Ethernet => SegmentKind::Ethernet,
                            SegmentKindArg::Roce => SegmentKind::Roce,
                        },
                        cidr: cidr.clone(),
                        gateway: gateway.clone(),
                        mtu: *mtu,
                        ingress: allow.clone(),
                        egress: no_egress.then_some(false),
                    },
                )
                .await?;
            print_one(out, fmt, &s, || segments_table(std::slice::from_ref(&s)))?;
        }
        SegmentCmd::List { tenant } => {
            let segs = c.list_segments(&tenant.tenant).await?;
            print_one(out, fmt, &segs, || segments_table(&segs))?;
        }
        SegmentCmd::Show { segment, tenant } => {
            let s = c.segment(&tenant.tenant, segment).await?;
            print_one(out, fmt, &s, || segments_table(std::slice::from_ref(&s)))?;
        }
        SegmentCmd::Update {
            segment,
            tenant,
            egress,
        } => {
            if egress.is_none() {
                bail!("nothing to change: give --egress true|false");
            }
            let s = c
                .update_segment(&tenant.tenant, segment, &SegmentUpdate { egress: *egress })
                .await?;
            print_one(out, fmt, &s, || segments_table(std::slice::from_ref(&s)))?;
        }
        SegmentCmd::Ingress {
            segment,
            tenant,
            allow,
        } => {
            let s = c
                .set_segment_ingress(
                    &tenant.tenant,
                    segment,
                    &SegmentIngress {
                        rules: allow.clone(),
                    },
                )
                .await?;
            print_one(out, fmt, &s, || segments_table(std::slice::from_ref(&s)))?;
        }
        SegmentCmd::Delete { segment, tenant } => {
            c.delete_segment(&tenant.tenant, segment).await?;
            if fmt == Format::Table {
                writeln!(out, "Deleted segment {segment}")?;
            }
        }
    }
    Ok(())
}
