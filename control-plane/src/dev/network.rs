//! The dev fleet's networks, made when it runs as root: an underlay
//! bridge joining the hosts' namespaces (so VXLAN between them carries),
//! one edge host whose uplink reaches a `wan` namespace — the provider
//! network, holding its router and a client address — and
//! `<data-dir>/fleet/network.json`, which tells people and scripts what
//! was made. Every name starts with the fleet's prefix, so a fleet removes
//! exactly what it made.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

use anyhow::Context;
use serde::Serialize;

/// The provider network: TEST-NET-3 (RFC 5737), never routed anywhere.
pub const WAN_CIDR: &str = "203.0.113.0/24";
/// Its router, the pool's gateway: where edges send what leaves.
pub const WAN_ROUTER: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
/// The outside client a person connects from (the wan namespace's
/// primary address, so connections made there leave from it).
pub const WAN_CLIENT: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 200);
pub const POOL_NAME: &str = "dev";
pub const POOL_RANGE: &str = "203.0.113.10-203.0.113.99";
/// The uplink of the edge host, in its namespace.
pub const UPLINK: &str = "up0";
/// The underlay: RFC 2544's benchmarking block, one subnet for the fleet.
pub const UNDERLAY_PREFIX: u8 = 15;

/// The underlay address of dev host `i`.
pub fn underlay_ip(i: usize) -> Ipv4Addr {
    let i = u32::try_from(i).unwrap_or(u32::MAX);
    Ipv4Addr::new(198, 18, (i / 250) as u8, (i % 250 + 1) as u8)
}

/// Runs `program` (from Debian's `package`) with `args`: its standard
/// output, or an error naming the command and what it said.
pub fn run(program: &str, package: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program} (Debian: {package})"))?;
    anyhow::ensure!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `ip` (iproute2) with `args`; a failure names the command.
pub fn ip(args: &[&str]) -> anyhow::Result<()> {
    run("ip", "iproute2", args).map(|_| ())
}

/// An empty qcow2 image of `size` (`2G`) at `path`, unless one is there:
/// a template's base, so VM disks are real overlays.
pub fn empty_image(path: &Path, size: &str) -> anyhow::Result<()> {
    if path.exists() {
        return Ok(());
    }
    let path = path.to_string_lossy();
    run(
        "qemu-img",
        "qemu-utils",
        &["create", "-q", "-f", "qcow2", &path, size],
    )
    .map(|_| ())
}

#[derive(Debug, Clone, Serialize)]
pub struct HostNet {
    pub name: String,
    pub namespace: Option<String>,
    pub underlay_ip: Option<Ipv4Addr>,
    /// Set on the edge host: its interface towards the provider network.
    pub edge_uplink: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Underlay {
    pub namespace: String,
    pub bridge: String,
    pub cidr: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Wan {
    /// `ip netns exec <namespace> …` runs a command on the outside.
    pub namespace: String,
    pub client_address: Ipv4Addr,
    pub router: Ipv4Addr,
    pub cidr: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Pool {
    pub name: String,
    pub cidr: String,
    pub gateway: Ipv4Addr,
    pub range: String,
}

/// A stand-in guest: a namespace on its host's bridge with the VM's MAC
/// and address, answering TCP 22 and 80.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct GuestNet {
    pub tenant: String,
    pub vm: String,
    pub namespace: String,
    pub addresses: Vec<String>,
}

/// What `network.json` says.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FleetNetwork {
    pub hosts: Vec<HostNet>,
    pub underlay: Option<Underlay>,
    pub wan: Option<Wan>,
    pub pool: Option<Pool>,
    pub guests: Vec<GuestNet>,
}

impl FleetNetwork {
    /// Writes `<data-dir>/fleet/network.json` whole (a reader never sees
    /// half of it).
    pub fn write(&self, data_dir: &Path) -> anyhow::Result<()> {
        let dir = data_dir.join("fleet");
        std::fs::create_dir_all(&dir)?;
        let tmp = dir.join(".network.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(&tmp, dir.join("network.json"))?;
        Ok(())
    }
}

/// Joins the hosts' namespaces on one underlay bridge (in
/// `<prefix>-ul`), each with `ul0` holding its underlay address.
pub fn underlay(prefix: &str, hosts: &[HostNet]) -> anyhow::Result<Underlay> {
    let ns = format!("{prefix}-ul");
    vxlan_manager::netns::create(&ns).with_context(|| format!("creating namespace {ns}"))?;
    ip(&["-n", &ns, "link", "add", "ul", "type", "bridge"])?;
    ip(&["-n", &ns, "link", "set", "ul", "up"])?;
    for (i, h) in hosts.iter().enumerate() {
        let (Some(host), Some(addr)) = (&h.namespace, h.underlay_ip) else {
            continue;
        };
        let peer = format!("h{i}");
        ip(&[
            "link", "add", "ul0", "netns", host, "type", "veth", "peer", "name", &peer, "netns",
            &ns,
        ])?;
        ip(&["-n", &ns, "link", "set", &peer, "master", "ul", "up"])?;
        ip(&["-n", host, "link", "set", "lo", "up"])?;
        ip(&[
            "-n",
            host,
            "addr",
            "add",
            &format!("{addr}/{UNDERLAY_PREFIX}"),
            "dev",
            "ul0",
        ])?;
        ip(&["-n", host, "link", "set", "ul0", "up"])?;
    }
    Ok(Underlay {
        namespace: ns,
        bridge: "ul".into(),
        cidr: format!("198.18.0.0/{UNDERLAY_PREFIX}"),
    })
}

/// The provider network (`<prefix>-wan`): a bridge holding the client's
/// and the router's addresses, with a leg [`UPLINK`] into the edge host.
pub fn provider(prefix: &str, edge_host_ns: &str) -> anyhow::Result<Wan> {
    let ns = format!("{prefix}-wan");
    vxlan_manager::netns::create(&ns).with_context(|| format!("creating namespace {ns}"))?;
    ip(&["-n", &ns, "link", "set", "lo", "up"])?;
    ip(&["-n", &ns, "link", "add", "pn", "type", "bridge"])?;
    ip(&["-n", &ns, "link", "set", "pn", "up"])?;
    // The client first: the primary address is what connections leave from.
    for a in [WAN_CLIENT, WAN_ROUTER] {
        ip(&["-n", &ns, "addr", "add", &format!("{a}/24"), "dev", "pn"])?;
    }
    ip(&[
        "link",
        "add",
        UPLINK,
        "netns",
        edge_host_ns,
        "type",
        "veth",
        "peer",
        "name",
        "edge0",
        "netns",
        &ns,
    ])?;
    ip(&["-n", &ns, "link", "set", "edge0", "master", "pn", "up"])?;
    ip(&["-n", edge_host_ns, "link", "set", UPLINK, "up"])?;
    Ok(Wan {
        namespace: ns,
        client_address: WAN_CLIENT,
        router: WAN_ROUTER,
        cidr: WAN_CIDR.into(),
    })
}

pub fn pool() -> Pool {
    Pool {
        name: POOL_NAME.into(),
        cidr: WAN_CIDR.into(),
        gateway: WAN_ROUTER,
        range: POOL_RANGE.into(),
    }
}

/// Removes every namespace whose name starts with `<prefix>-` (hosts,
/// underlay, wan, guests, and the edges the agents made), stopping an
/// edge's DNS first: a process inside would keep the namespace alive.
pub fn remove_all(prefix: &str) {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    let mine = format!("{prefix}-");
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with(&mine) {
            continue;
        }
        vxlan_manager::edge::stop_dns(&name);
        if let Err(e) = vxlan_manager::netns::delete(&name) {
            tracing::warn!(netns = %name, error = %e, "could not remove a dev namespace");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn underlay_addresses_are_distinct_and_in_one_subnet() {
        let all: std::collections::BTreeSet<Ipv4Addr> = (0..600).map(underlay_ip).collect();
        assert_eq!(all.len(), 600);
        for a in &all {
            assert_eq!(a.octets()[0..2], [198, 18]);
            assert_ne!(a.octets()[3], 0, "{a}");
        }
    }

    #[test]
    fn the_pool_lies_in_the_provider_network_and_leaves_the_client_out() {
        let p = pool();
        let (first, last) = p.range.split_once('-').unwrap();
        let (first, last): (Ipv4Addr, Ipv4Addr) = (first.parse().unwrap(), last.parse().unwrap());
        assert!(first <= last);
        for a in [first, last, WAN_CLIENT, WAN_ROUTER] {
            assert_eq!(a.octets()[0..3], [203, 0, 113], "{a}");
        }
        assert!(!(first..=last).contains(&WAN_CLIENT));
        assert!(!(first..=last).contains(&WAN_ROUTER));
    }
}
