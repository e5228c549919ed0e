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
    let mut fwd = vec![
        "ct state established,related accept".to_owned(),
        "ct state invalid drop".to_owned(),
        "iifname \"lan\" oifname \"lan\" accept".to_owned(),
    ];
    if e.snat.is_some() {
        fwd.push("iifname \"lan\" oifname \"wan\" accept".to_owned());
    } else {
        for f in &e.floating {
            fwd.push(format!(
                "iifname \"lan\" oifname \"wan\" ip saddr {} accept",
                f.private
            ));
        }
    }
    fwd.extend(e.allow.iter().map(allow_rule));
    let chain = |name: &str, hook: &str, prio: &str, policy: &str, rules: &[String]| {
        let mut c = format!(
            "  chain {name} {{\n    type {} hook {hook} priority {prio}; policy {policy};\n",
            if hook == "forward" { "filter" } else { "nat" }
        );
        for r in rules {
            let _ = writeln!(c, "    {r}");
        }
        c.push_str("  }\n");
        c
    };
    let mut out = String::new();
    out.push_str(&chain("prerouting", "prerouting", "dstnat", "accept", &pre));
    out.push_str(&chain(
        "postrouting",
        "postrouting",
        "srcnat",
        "accept",
        &post,
    ));
    out.push_str(&chain("forward", "forward", "filter", "drop", &fwd));
    out
}

/// The table's comment: what `observe` compares.
pub fn comment(e: &Edge) -> String {
    format!("kumo {:016x}", fingerprint(&body(e)))
}

/// An nft script that replaces the table whole, in one transaction (the
/// empty declaration first, so the delete always has a table to delete).
pub fn script(e: &Edge) -> String {
    format!(
        "table ip {TABLE} {{}}\ndelete table ip {TABLE}\ntable ip {TABLE} {{\n  comment \"{}\"\n{}}}\n",
        comment(e),
        body(e)
    )
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
        let s = script(&edge());
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
        let s = script(&e);
        assert!(!s.contains("fully-random"));
        assert!(!s.contains("iifname \"lan\" oifname \"wan\" accept"));
        assert!(s.contains("iifname \"lan\" oifname \"wan\" ip saddr 10.1.0.5 accept"));
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
