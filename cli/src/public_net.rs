//! `kumo public-ip` and `kumo port-forward`: public addresses of the
//! provider network, attached 1:1 to a VM's NIC or forwarding ports to it.

use std::io::Write;

use anyhow::anyhow;
use clap::Subcommand;
use kumo_api_types::{
    ForwardProtocol, PortForward, PortForwardCreate, PublicIp, PublicIpAllocate, PublicIpAttach,
    PublicIpPool, PublicIpPoolCreate,
};

use crate::args::TenantArg;
use crate::client::{segment, Client};
use crate::output::{print_one, Format, Table};

#[derive(Subcommand, Debug)]
pub enum PublicIpCmd {
    /// Pools of provider-network addresses (platform admins).
    #[command(subcommand)]
    Pool(PoolCmd),
    /// Take an address for the tenant (within its `public_ips` quota).
    Allocate {
        #[command(flatten)]
        tenant: TenantArg,
        /// Take it from this pool [default: any with a free address].
        #[arg(long)]
        pool: Option<String>,
    },
    /// The tenant's public addresses and what each is attached to.
    List {
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// One public address and what it is attached to.
    Show {
        /// The public address, e.g. 203.0.113.10.
        address: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Make it a VM's 1:1 floating address.
    Attach {
        /// The public address, e.g. 203.0.113.10.
        address: String,
        #[command(flatten)]
        tenant: TenantArg,
        /// The VM to attach it to (name or id).
        #[arg(long)]
        vm: String,
        /// For a VM on several segments: which NIC.
        #[arg(long)]
        segment: Option<String>,
    },
    /// Take it off its VM; the tenant keeps the address.
    Detach {
        /// The public address, e.g. 203.0.113.10.
        address: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Give it back (its floating mapping and forwards go with it).
    Release {
        /// The public address, e.g. 203.0.113.10.
        address: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
}

#[derive(Subcommand, Debug)]
pub enum PoolCmd {
    /// Add a pool of provider-network addresses.
    Create {
        /// The pool's name.
        name: String,
        /// The provider network, e.g. 203.0.113.0/24.
        #[arg(long)]
        cidr: String,
        /// The provider network's router.
        #[arg(long)]
        gateway: String,
        /// The addresses to hand out, FIRST-LAST [default: every host
        /// address but the gateway].
        #[arg(long)]
        range: Option<String>,
    },
    /// The pools and how many of their addresses are taken.
    List,
    /// Delete a pool none of whose addresses is taken.
    Delete {
        /// The pool's name.
        name: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum PortForwardCmd {
    /// Forward a port of a public address to a VM's port:
    /// `--public ADDR:PORT/tcp --to VM:PORT`.
    Create {
        #[command(flatten)]
        tenant: TenantArg,
        /// The public side, ADDRESS:PORT/tcp or ADDRESS:PORT/udp (one of
        /// the tenant's addresses, not a floating one).
        #[arg(long, value_parser = parse_public)]
        public: (String, u16, ForwardProtocol),
        /// The VM and its port, VM:PORT.
        #[arg(long, value_parser = parse_target)]
        to: (String, u16),
        /// For a VM on several segments: which NIC.
        #[arg(long)]
        segment: Option<String>,
    },
    /// The tenant's port forwards.
    List {
        #[command(flatten)]
        tenant: TenantArg,
    },
    /// Delete a port forward.
    Delete {
        /// The forward's id (see kumo port-forward list).
        id: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
}

fn parse_public(s: &str) -> Result<(String, u16, ForwardProtocol), String> {
    let bad = || format!("{s:?}: expected ADDRESS:PORT/tcp or ADDRESS:PORT/udp");
    let (rest, proto) = s.rsplit_once('/').unwrap_or((s, "tcp"));
    let proto = match proto {
        "tcp" => ForwardProtocol::Tcp,
        "udp" => ForwardProtocol::Udp,
        _ => return Err(bad()),
    };
    let (addr, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    Ok((addr.to_owned(), port.parse().map_err(|_| bad())?, proto))
}

fn parse_target(s: &str) -> Result<(String, u16), String> {
    let bad = || format!("{s:?}: expected VM:PORT");
    let (vm, port) = s.rsplit_once(':').ok_or_else(bad)?;
    Ok((vm.to_owned(), port.parse().map_err(|_| bad())?))
}

fn ips_table(ips: &[PublicIp]) -> String {
    let mut t = Table::new(&["address", "pool", "attached to"]);
    for ip in ips {
        t.row(vec![
            ip.address.clone(),
            ip.pool.clone(),
            ip.attached
                .as_ref()
                .map(|n| format!("{} ({} on {})", n.vm, n.ip, n.segment))
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    t.render()
}

fn forwards_table(fs: &[PortForward]) -> String {
    let mut t = Table::new(&["id", "public", "to"]);
    for f in fs {
        t.row(vec![
            f.id.to_string(),
            format!("{}:{}/{}", f.public_ip, f.public_port, f.protocol.as_str()),
            format!("{}:{} ({})", f.to.vm, f.private_port, f.to.ip),
        ]);
    }
    t.render()
}

pub async fn public_ip(
    cmd: &PublicIpCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let base = |t: &TenantArg| format!("/api/v1/tenants/{}/public-ips", segment(&t.tenant));
    match cmd {
        PublicIpCmd::Pool(p) => return pool(p, c, fmt, out).await,
        PublicIpCmd::Allocate { tenant, pool } => {
            let ip: PublicIp = c
                .post(&base(tenant), &PublicIpAllocate { pool: pool.clone() })
                .await?;
            print_one(out, fmt, &ip, || ips_table(std::slice::from_ref(&ip)))?;
        }
        PublicIpCmd::List { tenant } => {
            let ips: Vec<PublicIp> = c.list_all(&base(tenant)).await?;
            print_one(out, fmt, &ips, || ips_table(&ips))?;
        }
        PublicIpCmd::Show { address, tenant } => {
            let ip: PublicIp = c
                .get(&format!("{}/{}", base(tenant), segment(address)))
                .await?;
            print_one(out, fmt, &ip, || ips_table(std::slice::from_ref(&ip)))?;
        }
        PublicIpCmd::Attach {
            address,
            tenant,
            vm,
            segment: seg,
        } => {
            let ip: PublicIp = c
                .post(
                    &format!("{}/{}/attach", base(tenant), segment(address)),
                    &PublicIpAttach {
                        vm: vm.clone(),
                        segment: seg.clone(),
                    },
                )
                .await?;
            print_one(out, fmt, &ip, || ips_table(std::slice::from_ref(&ip)))?;
        }
        PublicIpCmd::Detach { address, tenant } => {
            let ip: PublicIp = c
                .post(
                    &format!("{}/{}/detach", base(tenant), segment(address)),
                    &serde_json::json!({}),
                )
                .await?;
            print_one(out, fmt, &ip, || ips_table(std::slice::from_ref(&ip)))?;
        }
        PublicIpCmd::Release { address, tenant } => {
            c.delete(&format!("{}/{}", base(tenant), segment(address)))
                .await?;
            writeln!(out, "Released {address}")?;
        }
    }
    Ok(())
}

async fn pool(cmd: &PoolCmd, c: &Client, fmt: Format, out: &mut dyn Write) -> anyhow::Result<()> {
    let table = |ps: &[PublicIpPool]| {
        let mut t = Table::new(&["name", "cidr", "gateway", "range", "used"]);
        for p in ps {
            t.row(vec![
                p.name.clone(),
                p.cidr.clone(),
                p.gateway.clone(),
                format!("{}-{}", p.first, p.last),
                format!("{}/{}", p.used, p.size),
            ]);
        }
        t.render()
    };
    match cmd {
        PoolCmd::Create {
            name,
            cidr,
            gateway,
            range,
        } => {
            let p: PublicIpPool = c
                .post(
                    "/api/v1/public-ip-pools",
                    &PublicIpPoolCreate {
                        name: name.clone(),
                        cidr: cidr.clone(),
                        gateway: gateway.clone(),
                        range: range.clone(),
                    },
                )
                .await?;
            print_one(out, fmt, &p, || table(std::slice::from_ref(&p)))?;
        }
        PoolCmd::List => {
            let ps: Vec<PublicIpPool> = c.list_all("/api/v1/public-ip-pools").await?;
            print_one(out, fmt, &ps, || table(&ps))?;
        }
        PoolCmd::Delete { name } => {
            c.delete(&format!("/api/v1/public-ip-pools/{}", segment(name)))
                .await?;
            writeln!(out, "Deleted pool {name}")?;
        }
    }
    Ok(())
}

pub async fn port_forward(
    cmd: &PortForwardCmd,
    c: &Client,
    fmt: Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let base = |t: &TenantArg| format!("/api/v1/tenants/{}/port-forwards", segment(&t.tenant));
    match cmd {
        PortForwardCmd::Create {
            tenant,
            public: (address, port, protocol),
            to: (vm, private_port),
            segment: seg,
        } => {
            if *port == 0 || *private_port == 0 {
                return Err(anyhow!("ports run from 1 to 65535"));
            }
            let f: PortForward = c
                .post(
                    &base(tenant),
                    &PortForwardCreate {
                        public_ip: address.clone(),
                        protocol: *protocol,
                        public_port: *port,
                        vm: vm.clone(),
                        segment: seg.clone(),
                        private_port: *private_port,
                    },
                )
                .await?;
            print_one(out, fmt, &f, || forwards_table(std::slice::from_ref(&f)))?;
        }
        PortForwardCmd::List { tenant } => {
            let fs: Vec<PortForward> = c.list_all(&base(tenant)).await?;
            print_one(out, fmt, &fs, || forwards_table(&fs))?;
        }
        PortForwardCmd::Delete { id, tenant } => {
            c.delete(&format!("{}/{}", base(tenant), segment(id)))
                .await?;
            writeln!(out, "Deleted port forward {id}")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwards_are_written_as_users_write_them() {
        assert_eq!(
            parse_public("203.0.113.10:2222/tcp"),
            Ok(("203.0.113.10".into(), 2222, ForwardProtocol::Tcp))
        );
        assert_eq!(
            parse_public("203.0.113.10:53/udp").map(|p| p.2),
            Ok(ForwardProtocol::Udp)
        );
        assert!(parse_public("203.0.113.10/tcp").is_err());
        assert!(parse_public("203.0.113.10:x/tcp").is_err());
        assert!(parse_public("203.0.113.10:22/sctp").is_err());
        assert_eq!(parse_target("vm-a:22"), Ok(("vm-a".into(), 22)));
        assert!(parse_target("vm-a").is_err());
    }
}
