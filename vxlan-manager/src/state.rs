//! A host's desired network state, as the control plane sends it and
//! `kumo-vxlan apply --state FILE` reads it, checked whole before anything
//! touches the kernel.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The IANA VXLAN port (the kernel's default, 8472, predates it).
pub const VXLAN_PORT: u16 = 4789;
/// The largest 24-bit VNI.
pub const MAX_VNI: u32 = (1 << 24) - 1;
/// Outer IPv4 + UDP + VXLAN + inner Ethernet headers.
pub const VXLAN_OVERHEAD: u32 = 50;
pub const MIN_MTU: u32 = 576;
pub const MAX_MTU: u32 = 9216;

/// A unicast Ethernet address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    pub const ZERO: Mac = Mac([0; 6]);

    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl FromStr for Mac {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{s:?} is not a MAC address like 02:00:0a:01:00:05");
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for b in &mut out {
            let p = parts.next().ok_or_else(bad)?;
            if p.len() != 2 {
                return Err(bad());
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Mac(out))
    }
}

/// A VM on another host, reached through that host's VTEP.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    pub mac: Mac,
    pub ip: IpAddr,
    pub vtep: Ipv4Addr,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Segment {
    pub vni: u32,
    pub mtu: u32,
    /// Every other host that has this segment: the flood list.
    #[serde(default)]
    pub remote_vteps: Vec<Ipv4Addr>,
    /// Every VM of the segment on other hosts.
    #[serde(default)]
    pub remote_endpoints: Vec<Endpoint>,
    /// Who may send IPv4 to the segment's VMs here; no filtering without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<Filter>,
}

/// A segment's ingress policy on one host: IPv4 from the segment's own
/// network is let in, from elsewhere only what a rule allows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filter {
    pub cidr: Net,
    /// The segment's VMs on this host: frames to them are the ones checked.
    pub local_macs: Vec<Mac>,
    #[serde(default)]
    pub allow: Vec<Allow>,
    /// The segment edge's gateway MAC, when it has an edge: frames from
    /// it come from outside through the edge, which filtered them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge_mac: Option<Mac>,
    /// Each local VM NIC's MAC and its own address: the only IPv4 source
    /// and ARP sender a frame from that MAC may carry. A local MAC not
    /// named here (other than the segment's gateway on its edge host)
    /// sends no IPv4 or ARP at all: an address the document does not
    /// give is no VM's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_ports: Vec<LocalPort>,
}

/// A VM's NIC on this host: its MAC and the address it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalPort {
    pub mac: Mac,
    pub ip: Ipv4Addr,
}

/// One ingress rule: from `source`, this protocol (and ports).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Allow {
    pub protocol: Protocol,
    /// Only for TCP and UDP; all ports when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<PortRange>,
    pub source: Net,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    Tcp,
    Udp,
    Icmp,
    Any,
}

impl Protocol {
    pub fn has_ports(self) -> bool {
        matches!(self, Protocol::Tcp | Protocol::Udp)
    }
}

impl FromStr for Protocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "tcp" => Protocol::Tcp,
            "udp" => Protocol::Udp,
            "icmp" => Protocol::Icmp,
            "any" => Protocol::Any,
            _ => return Err(format!("{s:?} is not tcp, udp, icmp or any")),
        })
    }
}

/// An IPv4 network, `10.1.0.0/24`: the address is the network's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Net {
    pub addr: Ipv4Addr,
    pub len: u8,
}

impl fmt::Display for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for Net {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{s:?} is not an IPv4 network like 10.1.0.0/24");
        let (a, l) = s.split_once('/').ok_or_else(bad)?;
        let addr: Ipv4Addr = a.parse().map_err(|_| bad())?;
        let len: u8 = l.parse().map_err(|_| bad())?;
        if len > 32 {
            return Err(bad());
        }
        let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
        if u32::from(addr) & !mask != 0 {
            return Err(format!(
                "{s:?} has host bits set (the network is {}/{len})",
                Ipv4Addr::from(u32::from(addr) & mask)
            ));
        }
        Ok(Net { addr, len })
    }
}

/// `22` or `8000-8100`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

impl FromStr for PortRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{s:?} is not a port (1-65535) or a range like 8000-8100");
        let (a, b) = s.split_once('-').unwrap_or((s, s));
        let first: u16 = a.parse().map_err(|_| bad())?;
        let last: u16 = b.parse().map_err(|_| bad())?;
        if first == 0 || first > last {
            return Err(bad());
        }
        Ok(PortRange { first, last })
    }
}

macro_rules! string_serde {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

string_serde!(Mac);
string_serde!(Net);
string_serde!(PortRange);

/// At most this many ingress rules per segment.
pub const MAX_ALLOW: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DesiredState {
    pub underlay_ip: Ipv4Addr,
    #[serde(default)]
    pub segments: Vec<Segment>,
    /// On an edge host: the segment edges it carries (each one's segment
    /// is among `segments`, with the edge's gateway as a local port).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub edges: Vec<Edge>,
}

/// A segment's way in and out, in a network namespace of its own on an
/// edge host: a leg on the segment's bridge answering the gateway
/// address, a leg on the uplink carrying the public addresses, NAT between
/// them and the segment's ingress rules applied to what comes in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Edge {
    pub vni: u32,
    /// The segment's network and its gateway address there.
    pub cidr: Net,
    pub gateway: Ipv4Addr,
    pub mtu: u32,
    /// The provider network's router, where what leaves is sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uplink_gateway: Option<Ipv4Addr>,
    /// Every public address the edge answers for (ARP on the uplink),
    /// with its prefix on the provider network.
    #[serde(default)]
    pub public: Vec<PublicAddr>,
    /// Egress: VMs without a floating address leave from this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snat: Option<Ipv4Addr>,
    /// 1:1 floating addresses.
    #[serde(default)]
    pub floating: Vec<Floating>,
    #[serde(default)]
    pub forwards: Vec<Forward>,
    /// What may come in from outside (after NAT, to the private address);
    /// answers to what went out always may.
    #[serde(default)]
    pub allow: Vec<Allow>,
    /// Names the gateway answers in DNS: the segment's VMs.
    #[serde(default)]
    pub hosts: Vec<DnsHost>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublicAddr {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Floating {
    pub public: Ipv4Addr,
    pub private: Ipv4Addr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Forward {
    pub public: Ipv4Addr,
    pub protocol: Protocol,
    pub port: u16,
    pub private: Ipv4Addr,
    pub private_port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsHost {
    pub name: String,
    pub addr: Ipv4Addr,
}

/// The MAC of a segment edge's gateway leg: the same on whichever edge
/// host carries it (so a move changes only where the FDB points), locally
/// administered, unique per VNI, and never one `mac_from` hands a VM
/// (their second byte is `0x6b`).
pub fn gateway_mac(vni: u32) -> Mac {
    let b = vni.to_be_bytes();
    Mac([0x02, 0x67, 0x77, b[1], b[2], b[3]])
}

/// The edge namespace of a VNI. Only names of this shape are Kumo's.
pub fn edge_netns(vni: u32) -> String {
    format!("kedge{vni}")
}

/// The VNI of a Kumo edge namespace's name.
pub fn edge_vni(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("kedge")?;
    if rest.is_empty() || rest.starts_with('0') || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let vni: u32 = rest.parse().ok()?;
    (1..=MAX_VNI).contains(&vni).then_some(vni)
}

/// Names of the kernel objects of one VNI. Only names of these shapes are
/// Kumo's; nothing else on the host is looked at or touched.
pub fn vxlan_name(vni: u32) -> String {
    format!("kvx{vni}")
}

pub fn bridge_name(vni: u32) -> String {
    format!("kbr{vni}")
}

/// The VNI of a name that is Kumo's (`kvx100` → 100), else `None`.
pub fn vni_of(name: &str) -> Option<(u32, bool)> {
    let (rest, is_vxlan) = if let Some(r) = name.strip_prefix("kvx") {
        (r, true)
    } else if let Some(r) = name.strip_prefix("kbr") {
        (r, false)
    } else {
        return None;
    };
    if rest.is_empty() || rest.starts_with('0') || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let vni: u32 = rest.parse().ok()?;
    (1..=MAX_VNI).contains(&vni).then_some((vni, is_vxlan))
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct StateError {
    pub field: String,
    pub message: String,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> StateError {
    StateError {
        field: field.into(),
        message: message.into(),
    }
}

impl DesiredState {
    /// Parses and checks a state document; the first problem is named by
    /// its path (`segments[1].remote_endpoints[0].vtep`).
    pub fn from_json(text: &str) -> Result<DesiredState, StateError> {
        let state: DesiredState =
            serde_json::from_str(text).map_err(|e| err("state", e.to_string()))?;
        state.validate()?;
        Ok(state)
    }

    pub fn validate(&self) -> Result<(), StateError> {
        self.check_underlay()?;
        let mut vnis = BTreeSet::new();
        for (i, s) in self.segments.iter().enumerate() {
            s.check(i, self.underlay_ip)?;
            if !vnis.insert(s.vni) {
                return Err(err(
                    format!("segments[{i}].vni"),
                    format!("{} appears twice", s.vni),
                ));
            }
        }
        let mut edged = BTreeSet::new();
        for (i, e) in self.edges.iter().enumerate() {
            e.check(i)?;
            if !vnis.contains(&e.vni) || !edged.insert(e.vni) {
                return Err(err(
                    format!("edges[{i}].vni"),
                    format!("{}: an edge needs its segment, once", e.vni),
                ));
            }
        }
        Ok(())
    }

    fn check_underlay(&self) -> Result<(), StateError> {
        let u = self.underlay_ip;
        if u.is_unspecified() || u.is_multicast() || u.is_broadcast() {
            return Err(err("underlay_ip", format!("{u} is not a unicast address")));
        }
        Ok(())
    }

    /// The segments that can be converged, and why each other one cannot
    /// (by VNI). A bad segment belongs to one tenant: it never stops the
    /// host's other segments. Only a bad underlay address, the host's own,
    /// fails the whole document.
    pub fn usable(&self) -> Result<(DesiredState, BTreeMap<u32, String>), StateError> {
        self.check_underlay()?;
        let mut bad = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for (i, s) in self.segments.iter().enumerate() {
            if let Err(e) = s.check(i, self.underlay_ip) {
                bad.insert(s.vni, e.to_string());
            } else if !seen.insert(s.vni) {
                bad.insert(s.vni, format!("segments[{i}].vni: {} appears twice", s.vni));
            }
        }
        // A VNI named twice: neither copy is the segment.
        let segments: Vec<Segment> = self
            .segments
            .iter()
            .filter(|s| !bad.contains_key(&s.vni))
            .cloned()
            .collect();
        for (i, e) in self.edges.iter().enumerate() {
            if let Err(why) = e.check(i) {
                bad.insert(e.vni, why.to_string());
            }
        }
        let segments: Vec<Segment> = segments
            .into_iter()
            .filter(|s| !bad.contains_key(&s.vni))
            .collect();
        let edges = self
            .edges
            .iter()
            .filter(|e| !bad.contains_key(&e.vni) && segments.iter().any(|s| s.vni == e.vni))
            .cloned()
            .collect();
        let usable = DesiredState {
            underlay_ip: self.underlay_ip,
            segments,
            edges,
        };
        Ok((usable, bad))
    }
}

/// At most this many public addresses, floating addresses, forwards or
/// DNS names per edge.
pub const MAX_EDGE_ENTRIES: usize = 4096;

fn public_unicast(ip: Ipv4Addr) -> bool {
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_link_local()
        || ip.octets()[0] >= 240)
}

/// A DNS label sequence a VM's name may be: letters, digits and hyphens.
fn dns_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 63
        && !n.starts_with('-')
        && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

impl Edge {
    /// Checks one edge (the `i`-th) on its own: it belongs to one tenant's
    /// segment, and a bad one never stops the others.
    pub fn check(&self, i: usize) -> Result<(), StateError> {
        let at = |f: &str| format!("edges[{i}].{f}");
        if !(1..=MAX_VNI).contains(&self.vni) {
            return Err(err(at("vni"), format!("{} is not a VNI", self.vni)));
        }
        let mask = u32::MAX
            .checked_shl(32 - u32::from(self.cidr.len))
            .unwrap_or(0);
        let inside = |ip: Ipv4Addr| u32::from(ip) & mask == u32::from(self.cidr.addr);
        let host = |ip: Ipv4Addr| {
            inside(ip) && ip != self.cidr.addr && u32::from(ip) != u32::from(self.cidr.addr) | !mask
        };
        if !(8..=30).contains(&self.cidr.len) || !host(self.gateway) {
            return Err(err(
                at("gateway"),
                format!("{} is not a host address of {}", self.gateway, self.cidr),
            ));
        }
        if !(MIN_MTU..=MAX_MTU).contains(&self.mtu) {
            return Err(err(at("mtu"), format!("{} is out of range", self.mtu)));
        }
        for (n, len) in [
            ("public", self.public.len()),
            ("floating", self.floating.len()),
            ("forwards", self.forwards.len()),
            ("hosts", self.hosts.len()),
            ("allow", self.allow.len()),
        ] {
            if len > MAX_EDGE_ENTRIES {
                return Err(err(at(n), format!("at most {MAX_EDGE_ENTRIES}")));
            }
        }
        let public: BTreeSet<Ipv4Addr> = self.public.iter().map(|p| p.addr).collect();
        for (j, p) in self.public.iter().enumerate() {
            if !public_unicast(p.addr) || !(8..=32).contains(&p.prefix) || host(p.addr) {
                return Err(err(
                    format!("edges[{i}].public[{j}]"),
                    format!("{}/{} is not a public unicast address", p.addr, p.prefix),
                ));
            }
        }
        if let Some(gw) = self.uplink_gateway.filter(|g| !public_unicast(*g)) {
            return Err(err(at("uplink_gateway"), format!("{gw} is not unicast")));
        }
        let carried = |ip: Ipv4Addr| public.contains(&ip);
        if let Some(s) = self.snat.filter(|s| !carried(*s)) {
            return Err(err(
                at("snat"),
                format!("{s} is not among the public addresses"),
            ));
        }
        for (j, f) in self.floating.iter().enumerate() {
            if !carried(f.public) || !host(f.private) || f.private == self.gateway {
                return Err(err(
                    format!("edges[{i}].floating[{j}]"),
                    format!(
                        "{} → {} is not a public address to a VM's",
                        f.public, f.private
                    ),
                ));
            }
        }
        for (j, f) in self.forwards.iter().enumerate() {
            if !carried(f.public)
                || !host(f.private)
                || f.port == 0
                || f.private_port == 0
                || !matches!(f.protocol, Protocol::Tcp | Protocol::Udp)
            {
                return Err(err(
                    format!("edges[{i}].forwards[{j}]"),
                    "a TCP or UDP port of a public address to a VM's port",
                ));
            }
        }
        for (j, h) in self.hosts.iter().enumerate() {
            if !dns_name(&h.name) || !host(h.addr) {
                return Err(err(
                    format!("edges[{i}].hosts[{j}]"),
                    format!("{:?} → {} is not a VM name and address", h.name, h.addr),
                ));
            }
        }
        for (j, a) in self.allow.iter().enumerate() {
            if a.ports.is_some() && !a.protocol.has_ports() {
                return Err(err(
                    format!("edges[{i}].allow[{j}].ports"),
                    "only TCP and UDP rules have ports",
                ));
            }
        }
        Ok(())
    }
}

impl Segment {
    /// Checks one segment (the `i`-th) on its own.
    fn check(&self, i: usize, underlay: Ipv4Addr) -> Result<(), StateError> {
        let at = |f: &str| format!("segments[{i}].{f}");
        if !(1..=MAX_VNI).contains(&self.vni) {
            return Err(err(
                at("vni"),
                format!("{} is not in 1…{MAX_VNI}", self.vni),
            ));
        }
        if !(MIN_MTU..=MAX_MTU).contains(&self.mtu) {
            return Err(err(
                at("mtu"),
                format!("{} is not in {MIN_MTU}…{MAX_MTU}", self.mtu),
            ));
        }
        let mut vteps = BTreeSet::new();
        for (j, v) in self.remote_vteps.iter().enumerate() {
            if v.is_unspecified() || v.is_multicast() || v.is_broadcast() || *v == underlay {
                return Err(err(
                    at(&format!("remote_vteps[{j}]")),
                    format!("{v} is not another host's unicast address"),
                ));
            }
            if !vteps.insert(*v) {
                return Err(err(
                    at(&format!("remote_vteps[{j}]")),
                    format!("{v} appears twice"),
                ));
            }
        }
        let mut macs = BTreeSet::new();
        let mut ips = BTreeSet::new();
        for (j, e) in self.remote_endpoints.iter().enumerate() {
            let at = |f: &str| at(&format!("remote_endpoints[{j}].{f}"));
            if e.mac == Mac::ZERO || e.mac.is_multicast() {
                return Err(err(at("mac"), format!("{} is not a unicast MAC", e.mac)));
            }
            if !macs.insert(e.mac) {
                return Err(err(at("mac"), format!("{} appears twice", e.mac)));
            }
            if e.ip.is_unspecified() || e.ip.is_multicast() {
                return Err(err(at("ip"), format!("{} is not a unicast address", e.ip)));
            }
            if !ips.insert(e.ip) {
                return Err(err(at("ip"), format!("{} appears twice", e.ip)));
            }
            if !vteps.contains(&e.vtep) {
                return Err(err(
                    at("vtep"),
                    format!("{} is not one of the segment's remote_vteps", e.vtep),
                ));
            }
        }
        if let Some(f) = &self.filter {
            let at = |f: &str| at(&format!("filter.{f}"));
            let mut local = BTreeSet::new();
            for (j, m) in f.local_macs.iter().enumerate() {
                if *m == Mac::ZERO || m.is_multicast() || !local.insert(*m) {
                    return Err(err(
                        at(&format!("local_macs[{j}]")),
                        format!("{m} is not a unicast MAC named once"),
                    ));
                }
            }
            let mut seen = BTreeSet::new();
            for (j, p) in f.local_ports.iter().enumerate() {
                if !local.contains(&p.mac) || !seen.insert(p.mac) {
                    return Err(err(
                        at(&format!("local_ports[{j}].mac")),
                        format!("{} is not one of local_macs, named once", p.mac),
                    ));
                }
                if p.ip.is_unspecified()
                    || p.ip.is_multicast()
                    || p.ip.is_broadcast()
                    || p.ip.is_loopback()
                {
                    return Err(err(
                        at(&format!("local_ports[{j}].ip")),
                        format!("{} is not a unicast address", p.ip),
                    ));
                }
            }
            if f.allow.len() > MAX_ALLOW {
                return Err(err(at("allow"), format!("at most {MAX_ALLOW} rules")));
            }
            for (j, a) in f.allow.iter().enumerate() {
                if a.ports.is_some() && !a.protocol.has_ports() {
                    return Err(err(
                        at(&format!("allow[{j}].ports")),
                        "ports go with tcp or udp only",
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> serde_json::Value {
        serde_json::json!({
            "underlay_ip": "10.99.0.1",
            "segments": [{
                "vni": 100, "mtu": 1450,
                "remote_vteps": ["10.99.0.2"],
                "remote_endpoints": [{"mac": "02:00:0a:01:00:05", "ip": "10.1.0.5", "vtep": "10.99.0.2"}]
            }]
        })
    }

    fn check(mutate: impl FnOnce(&mut serde_json::Value)) -> Result<DesiredState, StateError> {
        let mut v = good();
        mutate(&mut v);
        DesiredState::from_json(&v.to_string())
    }

    #[test]
    fn a_good_state_parses() {
        let s = check(|_| {}).unwrap();
        assert_eq!(
            s.segments[0].remote_endpoints[0].mac.to_string(),
            "02:00:0a:01:00:05"
        );
    }

    #[test]
    fn bad_input_names_its_field() {
        type Mutation = Box<dyn FnOnce(&mut serde_json::Value)>;
        let cases: Vec<(&str, Mutation)> = vec![
            (
                "segments[0].vni",
                Box::new(|v| v["segments"][0]["vni"] = 0.into()),
            ),
            (
                "segments[0].vni",
                Box::new(|v| v["segments"][0]["vni"] = (MAX_VNI + 1).into()),
            ),
            (
                "segments[0].mtu",
                Box::new(|v| v["segments"][0]["mtu"] = 100.into()),
            ),
            (
                "segments[0].remote_endpoints[0].vtep",
                Box::new(|v| v["segments"][0]["remote_endpoints"][0]["vtep"] = "10.99.0.9".into()),
            ),
            (
                "segments[0].remote_endpoints[0].mac",
                Box::new(|v| {
                    v["segments"][0]["remote_endpoints"][0]["mac"] = "01:00:5e:00:00:01".into()
                }),
            ),
            (
                "segments[0].remote_vteps[0]",
                Box::new(|v| v["segments"][0]["remote_vteps"][0] = "10.99.0.1".into()),
            ),
            (
                "underlay_ip",
                Box::new(|v| v["underlay_ip"] = "0.0.0.0".into()),
            ),
        ];
        for (field, mutate) in cases {
            let e = check(mutate).unwrap_err();
            assert_eq!(e.field, field, "{e}");
        }
        // Shapes serde refuses: the message says what was wrong.
        let e =
            check(|v| v["segments"][0]["remote_endpoints"][0]["mac"] = "zz".into()).unwrap_err();
        assert!(e.message.contains("not a MAC address"), "{e}");
        let e = check(|v| v["segments"][0]["extra"] = 1.into()).unwrap_err();
        assert!(e.message.contains("unknown field"), "{e}");
        let e = check(|v| {
            let seg = v["segments"][0].clone();
            v["segments"].as_array_mut().unwrap().push(seg);
        })
        .unwrap_err();
        assert_eq!(e.field, "segments[1].vni");
    }

    #[test]
    fn only_names_of_our_shape_are_ours() {
        assert_eq!(vni_of("kvx100"), Some((100, true)));
        assert_eq!(vni_of("kbr16777215"), Some((16_777_215, false)));
        for other in [
            "kvx",
            "kvx0",
            "kvx012",
            "kbr16777216",
            "eth0",
            "kvx1a",
            "vxlan100",
        ] {
            assert_eq!(vni_of(other), None, "{other}");
        }
    }
}
