//! A segment edge's NAT and filter rules as one nftables table (pure):
//! `ip kumo_edge` in the edge's own namespace, where `lan` is its leg on
//! the segment and `wan` its leg on the uplink.
//!
//! - prerouting: a floating address's traffic, and a forwarded port's, is
//!   sent to the VM (DNAT), from outside and from the segment alike;
//! - postrouting: what the edge turns back into the segment (a VM reaching
//!   a neighbour's public address: hairpin) leaves from the gateway, so
//!   the answer comes back through the edge; a VM with a floating address
//!   leaves from it; the rest of the segment from the egress address, on
//!   fully random ports;
//! - forward (default drop): answers to what went out; the segment going
//!   out when egress is on (its floating VMs always); hairpin; from
//!   outside only what was DNATed and the segment's ingress rules allow,
//!   matched on the VM's own address and port.
//! - guard (prerouting, before NAT and routing): from the segment, only
//!   the segment's own addresses; anything else (a guest forging another
//!   tenant's public address, or any address outside its network) is
//!   dropped and counted in the named counter `spoofed`, which is carried
//!   over when the table is replaced. Before routing, so what goes to the
//!   edge itself (its DNS, which would answer the forged address from the
//!   egress address) is held to it as well as what would be forwarded.
//! - input: from the outside only answers to the edge's own traffic (its
//!   DNS's upstream queries) and pings; its DNS answers the segment only.
//!   A socket bound to the gateway's address would take a query for that
//!   address arriving on `wan` (Linux accepts a local address on any
//!   interface), so binding is not enough: the rule is the kernel's.
//!
//! The table carries a comment with a fingerprint of itself, so whether
//! the kernel's table is the wanted one is read back without parsing nft's
//! normalised rules.

use std::fmt::Write;

use crate::state::{Allow, Edge, Protocol};

pub const TABLE: &str = "kumo_edge";

/// FNV-1a, 64 bits: a stable fingerprint (not a defence against anyone).
fn fingerprint(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn proto(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Icmp => "icmp",
        Protocol::Any => "any",
    }
}

fn allow_rule(a: &Allow) -> String {
    let mut r = String::from("iifname \"wan\" oifname \"lan\" ct status dnat");
    if a.source.len > 0 {
        let _ = write!(r, " ip saddr {}", a.source);
    }
    match a.protocol {
        Protocol::Any => {}
        p => {
            let _ = write!(r, " meta l4proto {}", proto(p));
            if let Some(ports) = a.ports {
                let _ = write!(r, " th dport {ports}");
            }
        }
    }
    r.push_str(" accept");
    r
}

/// The chains' bodies, without the fingerprint.
fn body(e: &Edge) -> String {
    let mut pre = Vec::new();
    for f in &e.floating {
        pre.push(format!("ip daddr {} dnat to {}", f.public, f.private));
    }
    for f in &e.forwards {
        pre.push(format!(
            "ip daddr {} meta l4proto {p} th dport {} dnat to {}:{}",
            f.public,
            f.port,
            f.private,
            f.private_port,
            p = proto(f.protocol)
        ));
    }
    let mut post = vec![format!(
        "iifname \"lan\" oifname \"lan\" ip saddr {} snat to {}",
        e.cidr, e.gateway
    )];
    for f in &e.floating {
        post.push(format!(
            "oifname \"wan\" ip saddr {} snat to {}",
            f.private, f.public
        ));
    }
    if let Some(s) = e.snat {
        post.push(format!(
            "oifname \"wan\" ip saddr {} snat to {s} fully-random",
            e.cidr
        ));
    }
    let guard = vec![format!(
        "iifname \"lan\" ip saddr != {} counter name \"spoofed\" drop",
        e.cidr
    )];
    let input = [
        "iifname \"wan\" ct state established,related accept",
        "iifname \"wan\" icmp type echo-request accept",
        "iifname \"wan\" drop",
    ]
    .map(str::to_owned);
    let mut fwd = vec![
        "ct state established,related accept".to_owned(),
        "ct state invalid drop".to_owned(),
        "iifname \"lan\" oifname \"lan\" accept".to_owned(),
    ];
    if e.snat.is_some() {
        fwd.push(format!(
            "iifname \"lan\" oifname \"wan\" ip saddr {} accept",
            e.cidr
        ));
    } else {
        for f in &e.floating {
            fwd.push(format!(
                "iifname \"lan\" oifname \"wan\" ip saddr {} accept",
                f.private
            ));
        }
    }
    fwd.extend(e.allow.iter().map(allow_rule));
    let chain = |name: &str, kind: &str, hook: &str, prio: &str, policy: &str, rules: &[String]| {
        let mut c = format!(
            "  chain {name} {{\n    type {kind} hook {hook} priority {prio}; policy {policy};\n"
        );
        for r in rules {
            let _ = writeln!(c, "    {r}");
        }
        c.push_str("  }\n");
        c
    };
    let mut out = String::new();
    out.push_str(&chain(
        "guard",
        "filter",
        "prerouting",
        "raw",
        "accept",
        &guard,
    ));
    out.push_str(&chain(
        "prerouting",
        "nat",
        "prerouting",
        "dstnat",
        "accept",
        &pre,
    ));
    out.push_str(&chain(
        "input", "filter", "input", "filter", "accept", &input,
    ));
    out.push_str(&chain(
        "postrouting",
        "nat",
        "postrouting",
        "srcnat",
        "accept",
        &post,
    ));
    out.push_str(&chain(
        "forward", "filter", "forward", "filter", "drop", &fwd,
    ));
    out
}

/// The table's comment: what `observe` compares.
pub fn comment(e: &Edge) -> String {
    format!("kumo {:016x}", fingerprint(&body(e)))
}

/// An nft script that replaces the table whole, in one transaction (the
/// empty declaration first, so the delete always has a table to delete);
/// the `spoofed` counter starts from `spoofed` (packets, bytes), what the
/// table it replaces had counted.
pub fn script(e: &Edge, spoofed: (u64, u64)) -> String {
    format!(
        "table ip {TABLE} {{}}\ndelete table ip {TABLE}\ntable ip {TABLE} {{\n  comment \"{}\"\n  counter spoofed {{ packets {} bytes {} }}\n{}}}\n",
        comment(e),
        spoofed.0,
        spoofed.1,
        body(e)
    )
}

/// The `spoofed` counter's (packets, bytes) in `nft list table`'s text.
pub fn listed_spoofed(listing: &str) -> Option<(u64, u64)> {
    let mut lines = listing
        .lines()
        .skip_while(|l| l.trim() != "counter spoofed {");
    lines.next()?;
    let mut words = lines.next()?.split_whitespace();
    match (words.next()?, words.next()?, words.next()?, words.next()?) {
        ("packets", p, "bytes", b) => Some((p.parse().ok()?, b.parse().ok()?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::state::{Floating, Forward, PublicAddr};

    fn edge() -> Edge {
        Edge {
            vni: 5000,
            cidr: "10.1.0.0/24".parse().unwrap(),
            gateway: "10.1.0.1".parse().unwrap(),
            mtu: 1450,
            uplink_gateway: Some("203.0.113.1".parse().unwrap()),
            public: vec![
                PublicAddr {
                    addr: "203.0.113.10".parse().unwrap(),
                    prefix: 24,
                },
                PublicAddr {
                    addr: "203.0.113.11".parse().unwrap(),
                    prefix: 24,
                },
            ],
            snat: Some("203.0.113.10".parse().unwrap()),
            floating: vec![Floating {
                public: "203.0.113.11".parse().unwrap(),
                private: "10.1.0.5".parse().unwrap(),
            }],
            forwards: vec![Forward {
                public: "203.0.113.10".parse().unwrap(),
                protocol: Protocol::Tcp,
                port: 2222,
                private: "10.1.0.6".parse().unwrap(),
                private_port: 22,
            }],
            allow: vec![Allow {
                protocol: Protocol::Tcp,
                ports: Some("22".parse().unwrap()),
                source: "0.0.0.0/0".parse().unwrap(),
            }],
            hosts: vec![],
        }
    }

    #[test]
    fn the_table_says_what_the_edge_does() {
        let s = script(&edge(), (0, 0));
        for line in [
            "ip daddr 203.0.113.11 dnat to 10.1.0.5",
            "ip daddr 203.0.113.10 meta l4proto tcp th dport 2222 dnat to 10.1.0.6:22",
            "iifname \"lan\" oifname \"lan\" ip saddr 10.1.0.0/24 snat to 10.1.0.1",
            "oifname \"wan\" ip saddr 10.1.0.5 snat to 203.0.113.11",
            "oifname \"wan\" ip saddr 10.1.0.0/24 snat to 203.0.113.10 fully-random",
            "iifname \"wan\" oifname \"lan\" ct status dnat meta l4proto tcp th dport 22 accept",
            "type filter hook forward priority filter; policy drop;",
        ] {
            assert!(s.contains(line), "{line}\n{s}");
        }
        // The floating VM's own SNAT comes before the segment's.
        assert!(s.find("snat to 203.0.113.11").unwrap() < s.find("fully-random").unwrap());
    }

    #[test]
    fn without_egress_only_floating_vms_go_out() {
        let mut e = edge();
        e.snat = None;
        let s = script(&e, (0, 0));
        assert!(!s.contains("fully-random"));
        assert!(!s.contains("iifname \"lan\" oifname \"wan\" ip saddr 10.1.0.0/24 accept"));
        assert!(s.contains("iifname \"lan\" oifname \"wan\" ip saddr 10.1.0.5 accept"));
    }

    #[test]
    fn from_the_segment_only_its_own_addresses_and_the_outside_gets_no_dns() {
        let s = script(&edge(), (12, 720));
        // Before NAT and routing, counted; carried over a replacement.
        for line in [
            "counter spoofed { packets 12 bytes 720 }",
            "type filter hook prerouting priority raw; policy accept;",
            "iifname \"lan\" ip saddr != 10.1.0.0/24 counter name \"spoofed\" drop",
            "type filter hook input priority filter; policy accept;",
            "iifname \"wan\" ct state established,related accept",
            "iifname \"wan\" icmp type echo-request accept",
            "iifname \"wan\" drop",
        ] {
            assert!(s.contains(line), "{line}\n{s}");
        }
        // The guard comes before the NAT that would rewrite a forged
        // source of the segment's own range, and a forged one is never
        // accepted on the way out: only the CIDR's sources are.
        assert!(s.find("hook prerouting priority raw").unwrap() < s.find("dstnat").unwrap());
        for l in s
            .lines()
            .filter(|l| l.contains("oifname \"wan\"") && l.contains("accept"))
        {
            assert!(l.contains("ip saddr 10.1.0."), "{l}");
        }
        // The counts are not part of the rules.
        assert_eq!(
            script(&edge(), (0, 0)).replace("packets 0 bytes 0", "packets 12 bytes 720"),
            s
        );
        let listing = "table ip kumo_edge {\n\tcomment \"kumo 1\"\n\tcounter spoofed {\n\t\tpackets 3 bytes 252\n\t}\n}\n";
        assert_eq!(listed_spoofed(listing), Some((3, 252)));
        assert_eq!(listed_spoofed("table ip kumo_edge {\n}\n"), None);
    }

    #[test]
    fn the_fingerprint_follows_the_rules() {
        let a = edge();
        let mut b = edge();
        assert_eq!(comment(&a), comment(&b));
        b.forwards.clear();
        assert_ne!(comment(&a), comment(&b));
    }
}
