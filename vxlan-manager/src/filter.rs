//! Segment filters as nftables rules (pure): a table `bridge kumo` with
//! two base chains.
//!
//! - `forward`: frames addressed to a segment's local VMs go to the
//!   segment's chain, which lets in non-IPv4 (ARP), IPv4 from the
//!   segment's own network and what its rules allow, and drops the rest
//!   (ingress).
//! - `guard` (bridge prerouting, before the bridge learns a source): a
//!   VM's port sends only its own MAC and its own address (anti-spoof).
//!   A frame from a local VM's MAC carries IPv4 only from that VM's
//!   address, ARP only with that MAC and address as sender (or 0.0.0.0:
//!   an RFC 5227 probe), and nothing but IPv4, ARP and IPv6 (a VLAN tag
//!   would hide a forged IPv4 header from the checks); a frame with the
//!   MAC of a VM on another host, or of the segment's gateway, enters
//!   only through the segment's VXLAN port `kvx<VNI>` or its edge leg
//!   `kgl<VNI>` (the edge host's own); and, in `forward`, nothing leaves
//!   through those two ports from a local port but with a local VM's
//!   MAC. Every such drop counts in the segment's named counter
//!   `spoofed<VNI>`, carried over when the table is replaced.
//!
//! Bridge-family conntrack and bridge-name matching (`meta ibrname`) are
//! not in every kernel, so the rules are stateless and keyed by MAC and
//! by the names of Kumo's own ports: a VM talking to an outside address
//! needs a rule for the answers, and a VM's tap (named by libvirt) is
//! known by the MAC it may send. What that leaves open is within one
//! segment on one host, so within one tenant: a VM's port may claim a
//! sibling VM's MAC and address, or a MAC no one has towards its local
//! siblings; neither leaves the host.
//!
//! Every rule carries a comment naming a hash of its chain and body, so
//! the kernel's ruleset is compared without parsing nft's normalised
//! expressions back: the same comments in the same order are the same rules.

use serde_json::{json, Value};

use crate::state::{gateway_mac, vxlan_name, Allow, DesiredState, Mac, Net, Protocol};

pub const TABLE: &str = "kumo";
pub const BASE_CHAIN: &str = "forward";
/// The anti-spoof chain, on the bridge's prerouting hook.
pub const GUARD_CHAIN: &str = "guard";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub chain: String,
    pub expr: Value,
    pub comment: String,
}

pub fn segment_chain(vni: u32) -> String {
    format!("seg{vni}")
}

/// The named counter of a segment's anti-spoof drops on this host.
pub fn spoof_counter(vni: u32) -> String {
    format!("spoofed{vni}")
}

/// The segment edge's leg on the segment's bridge (see `edge`): with the
/// VXLAN port, the only ports of a segment's bridge that are not a VM's.
pub fn edge_leg(vni: u32) -> String {
    format!("kgl{vni}")
}

/// A named counter and its values (carried over a table's replacement).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counter {
    pub name: String,
    pub packets: u64,
    pub bytes: u64,
}

/// FNV-1a, 64 bits: a stable fingerprint (not a defence against anyone).
fn fingerprint(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn rule(chain: &str, expr: Value) -> Rule {
    let comment = format!("kumo {:016x}", fingerprint(&format!("{chain} {expr}")));
    Rule {
        chain: chain.to_owned(),
        expr,
        comment,
    }
}

fn matches(left: Value, op: &str, right: Value) -> Value {
    json!({"match": {"op": op, "left": left, "right": right}})
}

/// `ip saddr NET`, or nothing for 0.0.0.0/0.
fn from(net: &Net) -> Option<Value> {
    (net.len > 0).then(|| {
        matches(
            json!({"payload": {"protocol": "ip", "field": "saddr"}}),
            "==",
            json!({"prefix": {"addr": net.addr.to_string(), "len": net.len}}),
        )
    })
}

fn allow_expr(a: &Allow) -> Value {
    let mut e: Vec<Value> = from(&a.source).into_iter().collect();
    let proto = match a.protocol {
        Protocol::Tcp => Some("tcp"),
        Protocol::Udp => Some("udp"),
        Protocol::Icmp => Some("icmp"),
        Protocol::Any => None,
    };
    if let Some(p) = proto {
        e.push(matches(json!({"meta": {"key": "l4proto"}}), "==", json!(p)));
        if let Some(r) = a.ports {
            let right = if r.first == r.last {
                json!(r.first)
            } else {
                json!({"range": [r.first, r.last]})
            };
            e.push(matches(
                json!({"payload": {"protocol": p, "field": "dport"}}),
                "==",
                right,
            ));
        }
    }
    e.push(json!({"accept": null}));
    Value::Array(e)
}

fn mac_set(macs: &[Mac]) -> Value {
    json!({"set": macs.iter().map(|m| m.to_string()).collect::<Vec<_>>()})
}

fn ether(field: &str) -> Value {
    json!({"payload": {"protocol": "ether", "field": field}})
}

fn drop_counted(vni: u32) -> [Value; 2] {
    [
        json!({"counter": spoof_counter(vni)}),
        json!({"drop": null}),
    ]
}

/// The anti-spoof rules of one segment: `guard`'s, then `forward`'s.
fn guard_rules(vni: u32, f: &crate::state::Filter, remote: &[Mac]) -> (Vec<Rule>, Vec<Rule>) {
    let ours = json!({"set": [vxlan_name(vni), edge_leg(vni)]});
    let gateway = gateway_mac(vni);
    // The VMs' MACs: the gateway is a local port only on its edge host,
    // where it enters through the edge's leg carrying outside addresses.
    let vms: Vec<Mac> = f
        .local_macs
        .iter()
        .copied()
        .filter(|m| *m != gateway)
        .collect();
    let mut guard = Vec::new();
    let mut forward = Vec::new();
    if !vms.is_empty() {
        let from_vm = matches(ether("saddr"), "==", mac_set(&vms));
        let mut r = vec![
            from_vm.clone(),
            matches(ether("type"), "!=", json!({"set": ["ip", "arp", "ip6"]})),
        ];
        r.extend(drop_counted(vni));
        guard.push(rule(GUARD_CHAIN, Value::Array(r)));
        let ports: Vec<_> = f
            .local_ports
            .iter()
            .filter(|p| vms.contains(&p.mac))
            .collect();
        let mut r = vec![from_vm.clone()];
        if ports.is_empty() {
            r.push(matches(ether("type"), "==", json!("ip")));
        } else {
            let own: Vec<Value> = ports
                .iter()
                .map(|p| json!({"concat": [p.mac.to_string(), p.ip.to_string()]}))
                .collect();
            r.push(matches(
                json!({"concat": [ether("saddr"), {"payload": {"protocol": "ip", "field": "saddr"}}]}),
                "!=",
                json!({ "set": own }),
            ));
        }
        r.extend(drop_counted(vni));
        guard.push(rule(GUARD_CHAIN, Value::Array(r)));
        let mut r = vec![from_vm];
        if ports.is_empty() {
            r.push(matches(ether("type"), "==", json!("arp")));
        } else {
            // An RFC 5227 probe says 0.0.0.0: it claims nothing.
            let own: Vec<Value> = ports
                .iter()
                .flat_map(|p| {
                    let m = p.mac.to_string();
                    [
                        json!({"concat": [m, m, p.ip.to_string()]}),
                        json!({"concat": [m, m, "0.0.0.0"]}),
                    ]
                })
                .collect();
            r.push(matches(
                json!({"concat": [
                    ether("saddr"),
                    {"payload": {"protocol": "arp", "field": "saddr ether"}},
                    {"payload": {"protocol": "arp", "field": "saddr ip"}}
                ]}),
                "!=",
                json!({ "set": own }),
            ));
        }
        r.extend(drop_counted(vni));
        guard.push(rule(GUARD_CHAIN, Value::Array(r)));
        // What leaves the host for other hosts or the edge from a local
        // port carries a local VM's MAC.
        let mut r = vec![
            matches(json!({"meta": {"key": "oifname"}}), "==", ours.clone()),
            matches(json!({"meta": {"key": "iifname"}}), "!=", ours.clone()),
            matches(ether("saddr"), "!=", mac_set(&f.local_macs)),
        ];
        r.extend(drop_counted(vni));
        forward.push(rule(BASE_CHAIN, Value::Array(r)));
    }
    // MACs that live elsewhere (VMs on other hosts, the gateway) come in
    // only through the VXLAN port or the edge's leg.
    let mut elsewhere: Vec<Mac> = remote
        .iter()
        .copied()
        .chain(f.edge_mac)
        .chain([gateway])
        .filter(|m| !vms.contains(m))
        .collect();
    elsewhere.sort();
    elsewhere.dedup();
    let mut r = vec![
        matches(ether("saddr"), "==", mac_set(&elsewhere)),
        matches(json!({"meta": {"key": "iifname"}}), "!=", ours),
    ];
    r.extend(drop_counted(vni));
    guard.push(rule(GUARD_CHAIN, Value::Array(r)));
    (guard, forward)
}

/// The whole ruleset, base chains first (`guard`, then `forward`); empty
/// when no segment here has a filter and a VM to protect.
pub fn rules(want: &DesiredState) -> Vec<Rule> {
    let mut guard = Vec::new();
    let mut base = Vec::new();
    let mut chains = Vec::new();
    for s in &want.segments {
        let Some(f) = &s.filter else {
            continue;
        };
        if f.local_macs.is_empty() {
            continue;
        }
        let remote: Vec<Mac> = s.remote_endpoints.iter().map(|e| e.mac).collect();
        let (g, fwd) = guard_rules(s.vni, f, &remote);
        guard.extend(g);
        base.extend(fwd);
        let chain = segment_chain(s.vni);
        base.push(rule(
            BASE_CHAIN,
            json!([
                matches(ether("daddr"), "==", mac_set(&f.local_macs)),
                {"jump": {"target": chain}}
            ]),
        ));
        chains.push(rule(
            &chain,
            json!([
                matches(json!({"meta": {"key": "protocol"}}), "!=", json!("ip")),
                {"accept": null}
            ]),
        ));
        let mut own: Vec<Value> = from(&f.cidr).into_iter().collect();
        own.push(json!({"accept": null}));
        chains.push(rule(&chain, Value::Array(own)));
        // What the segment's edge routes in has passed its ingress rules
        // there (statefully: answers to what went out pass too).
        if let Some(gw) = f.edge_mac {
            chains.push(rule(
                &chain,
                json!([
                    matches(ether("saddr"), "==", json!(gw.to_string())),
                    {"accept": null}
                ]),
            ));
        }
        for a in &f.allow {
            chains.push(rule(&chain, allow_expr(a)));
        }
        chains.push(rule(&chain, json!([{"drop": null}])));
    }
    guard.extend(base);
    guard.extend(chains);
    guard
}

/// The named counters `rules` count in: a segment's anti-spoof counter
/// for each segment with rules.
pub fn counters(want: &DesiredState) -> Vec<String> {
    want.segments
        .iter()
        .filter(|s| s.filter.as_ref().is_some_and(|f| !f.local_macs.is_empty()))
        .map(|s| spoof_counter(s.vni))
        .collect()
}

/// The nft JSON commands that replace the table with `rules` and the
/// `counters` (starting from the values given) in one transaction (or
/// delete it when there are no rules).
pub fn commands(rules: &[Rule], counters: &[Counter], table_exists: bool) -> Value {
    let table = json!({"family": "bridge", "name": TABLE});
    let mut cmds = Vec::new();
    if table_exists || !rules.is_empty() {
        // `add` first so `delete` never fails on a missing table.
        cmds.push(json!({"add": {"table": table}}));
        cmds.push(json!({"delete": {"table": table}}));
    }
    if !rules.is_empty() {
        cmds.push(json!({"add": {"table": table}}));
        for c in counters {
            cmds.push(json!({"add": {"counter": {
                "family": "bridge", "table": TABLE, "name": c.name,
                "packets": c.packets, "bytes": c.bytes
            }}}));
        }
        cmds.push(json!({"add": {"chain": {
            "family": "bridge", "table": TABLE, "name": GUARD_CHAIN,
            "type": "filter", "hook": "prerouting", "prio": -200, "policy": "accept"
        }}}));
        cmds.push(json!({"add": {"chain": {
            "family": "bridge", "table": TABLE, "name": BASE_CHAIN,
            "type": "filter", "hook": "forward", "prio": 0, "policy": "accept"
        }}}));
        let mut seen: Vec<&str> = vec![GUARD_CHAIN, BASE_CHAIN];
        for r in rules {
            if !seen.contains(&r.chain.as_str()) {
                seen.push(&r.chain);
                cmds.push(json!({"add": {"chain": {
                    "family": "bridge", "table": TABLE, "name": r.chain
                }}}));
            }
        }
        for r in rules {
            cmds.push(json!({"add": {"rule": {
                "family": "bridge", "table": TABLE, "chain": r.chain,
                "comment": r.comment, "expr": r.expr
            }}}));
        }
    }
    json!({ "nftables": cmds })
}

/// The named counters in an `nft -j list table` answer.
pub fn listed_counters(answer: &Value) -> Vec<Counter> {
    answer["nftables"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|i| {
                    let c = i.get("counter")?;
                    Some(Counter {
                        name: c["name"].as_str()?.to_owned(),
                        packets: c["packets"].as_u64().unwrap_or(0),
                        bytes: c["bytes"].as_u64().unwrap_or(0),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `(chain, comment)` of each rule in an `nft -j list table` answer, in order.
pub fn listed(answer: &Value) -> Vec<(String, String)> {
    answer["nftables"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|i| {
                    let r = i.get("rule")?;
                    Some((
                        r["chain"].as_str()?.to_owned(),
                        r["comment"].as_str().unwrap_or("").to_owned(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the kernel's rules are the wanted ones.
pub fn in_place(want: &[Rule], have: &[(String, String)]) -> bool {
    want.len() == have.len()
        && want
            .iter()
            .zip(have)
            .all(|(w, (c, m))| w.chain == *c && w.comment == *m)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn state(filter: &str) -> DesiredState {
        DesiredState::from_json(&format!(
            r#"{{"underlay_ip": "10.99.0.1", "segments": [
                {{"vni": 4096, "mtu": 1450, "filter": {filter}}},
                {{"vni": 4097, "mtu": 1450}}
            ]}}"#
        ))
        .unwrap()
    }

    #[test]
    fn a_filtered_segment_gets_a_jump_and_its_chain() {
        let s = state(
            r#"{"cidr": "10.1.0.0/24", "local_macs": ["02:6b:00:00:00:01", "02:6b:00:00:00:02"],
                "allow": [{"protocol": "tcp", "ports": "22", "source": "0.0.0.0/0"},
                          {"protocol": "udp", "ports": "8000-8100", "source": "192.0.2.0/24"},
                          {"protocol": "icmp", "source": "198.51.100.7/32"}]}"#,
        );
        let all = rules(&s);
        let chains: Vec<&str> = all.iter().map(|r| r.chain.as_str()).collect();
        assert_eq!(
            chains,
            [
                "guard", "guard", "guard", "guard", "forward", "forward", "seg4096", "seg4096",
                "seg4096", "seg4096", "seg4096", "seg4096"
            ]
        );
        // The ingress half: the jump, then the segment's chain.
        let r = &all[5..];
        let text = |i: usize| r[i].expr.to_string();
        assert!(text(0).contains(r#""set":["02:6b:00:00:00:01","02:6b:00:00:00:02"]"#));
        assert!(text(0).contains(r#""jump":{"target":"seg4096"}"#));
        assert!(text(1).contains(r#""!=""#), "non-IPv4 first: {}", text(1));
        assert!(text(2).contains(r#""addr":"10.1.0.0","len":24"#));
        assert!(!text(3).contains("saddr"), "0.0.0.0/0 matches anything");
        assert!(text(3).contains(r#""right":22"#));
        assert!(text(4).contains(r#""range":[8000,8100]"#));
        assert!(text(5).contains(r#""right":"icmp""#) && text(5).contains(r#""len":32"#));
        assert_eq!(text(6), r#"[{"drop":null}]"#);
        let r = all;
        // Comments are stable and differ with the body.
        assert_eq!(rules(&s), r);
        let other = state(r#"{"cidr": "10.1.0.0/24", "local_macs": ["02:6b:00:00:00:01"]}"#);
        assert_ne!(rules(&other)[0].comment, r[0].comment);
        let listed_back: Vec<(String, String)> = r
            .iter()
            .map(|x| (x.chain.clone(), x.comment.clone()))
            .collect();
        assert!(in_place(&r, &listed_back));
        assert!(!in_place(&r, &listed_back[1..]));
    }

    #[test]
    fn nothing_to_protect_means_no_table() {
        let s = state(r#"{"cidr": "10.1.0.0/24", "local_macs": []}"#);
        assert!(rules(&s).is_empty());
        assert!(counters(&s).is_empty());
        assert_eq!(commands(&[], &[], false), json!({"nftables": []}));
        let del = commands(&[], &[], true).to_string();
        assert!(del.contains(r#""delete""#) && !del.contains(r#""chain""#));
    }

    /// Host `4096`'s VMs a (.5) and b (.6) here, c (.7) on another host,
    /// and the segment's edge elsewhere.
    fn guarded() -> DesiredState {
        DesiredState::from_json(
            r#"{"underlay_ip": "10.99.0.1", "segments": [{
                "vni": 4096, "mtu": 1450, "remote_vteps": ["10.99.0.2"],
                "remote_endpoints": [
                    {"mac": "02:6b:00:00:00:07", "ip": "10.1.0.7", "vtep": "10.99.0.2"},
                    {"mac": "02:67:77:00:10:00", "ip": "10.1.0.1", "vtep": "10.99.0.2"}],
                "filter": {"cidr": "10.1.0.0/24",
                    "local_macs": ["02:6b:00:00:00:05", "02:6b:00:00:00:06"],
                    "local_ports": [{"mac": "02:6b:00:00:00:05", "ip": "10.1.0.5"},
                                    {"mac": "02:6b:00:00:00:06", "ip": "10.1.0.6"}],
                    "edge_mac": "02:67:77:00:10:00"}}]}"#,
        )
        .unwrap()
    }

    fn guard_of(s: &DesiredState) -> Vec<String> {
        rules(s)
            .iter()
            .filter(|r| r.chain == GUARD_CHAIN || r.expr.to_string().contains("spoofed"))
            .map(|r| format!("{} {}", r.chain, r.expr))
            .collect()
    }

    #[test]
    fn a_vms_port_sends_only_its_own_mac_and_address() {
        let s = guarded();
        let g = guard_of(&s);
        assert_eq!(g.len(), 5, "{g:#?}");
        let vms = r#""right":{"set":["02:6b:00:00:00:05","02:6b:00:00:00:06"]}"#;
        // Only IPv4, ARP and IPv6 from a VM's MAC: a VLAN tag would hide a
        // forged IPv4 header from the next rule.
        assert!(g[0].starts_with("guard ") && g[0].contains(vms), "{}", g[0]);
        assert!(g[0].contains(r#""op":"!=","right":{"set":["ip","arp","ip6"]}"#));
        // IPv4: the pair (MAC, source) is one of the VMs' own.
        assert!(g[1].contains(vms), "{}", g[1]);
        assert!(g[1].contains(
            r#"{"match":{"left":{"concat":[{"payload":{"field":"saddr","protocol":"ether"}},{"payload":{"field":"saddr","protocol":"ip"}}]},"op":"!=","right":{"set":[{"concat":["02:6b:00:00:00:05","10.1.0.5"]},{"concat":["02:6b:00:00:00:06","10.1.0.6"]}]}}}"#
        ), "{}", g[1]);
        // ARP: the sender is the frame's own MAC with its address, or an
        // RFC 5227 probe (0.0.0.0).
        for want in [
            r#"{"concat":["02:6b:00:00:00:05","02:6b:00:00:00:05","10.1.0.5"]}"#,
            r#"{"concat":["02:6b:00:00:00:05","02:6b:00:00:00:05","0.0.0.0"]}"#,
            r#""field":"saddr ip","protocol":"arp""#,
            r#""field":"saddr ether","protocol":"arp""#,
        ] {
            assert!(g[2].contains(want), "{want} in {}", g[2]);
        }
        // The MACs of VMs elsewhere and of the gateway only through the
        // segment's VXLAN port or the edge's leg.
        assert!(
            g[3].contains(r#""right":{"set":["02:67:77:00:10:00","02:6b:00:00:00:07"]}"#),
            "{}",
            g[3]
        );
        assert!(g[3].contains(r#""op":"!=","right":{"set":["kvx4096","kgl4096"]}"#));
        // Out through those ports from a local one: a local VM's MAC only.
        assert!(g[4].starts_with("forward "), "{}", g[4]);
        assert!(g[4].contains(r#"{"match":{"left":{"meta":{"key":"oifname"}},"op":"==","right":{"set":["kvx4096","kgl4096"]}}}"#));
        assert!(g[4].contains(r#"{"match":{"left":{"meta":{"key":"iifname"}},"op":"!=","right":{"set":["kvx4096","kgl4096"]}}}"#));
        for r in &g {
            assert!(
                r.ends_with(r#"{"counter":"spoofed4096"},{"drop":null}]"#),
                "dropped and counted: {r}"
            );
        }
        assert_eq!(counters(&s), ["spoofed4096"]);
        // The counters are declared with what they had counted.
        let cmds = commands(
            &rules(&s),
            &[Counter {
                name: "spoofed4096".into(),
                packets: 7,
                bytes: 420,
            }],
            true,
        )
        .to_string();
        assert!(cmds.contains(r#"{"add":{"counter":{"bytes":420,"family":"bridge","name":"spoofed4096","packets":7,"table":"kumo"}}}"#), "{cmds}");
        assert!(cmds.contains(r#""hook":"prerouting""#));
        let listing = json!({"nftables": [
            {"counter": {"family": "bridge", "name": "spoofed4096", "table": "kumo", "packets": 3, "bytes": 180}}
        ]});
        assert_eq!(
            listed_counters(&listing),
            [Counter {
                name: "spoofed4096".into(),
                packets: 3,
                bytes: 180
            }]
        );
        // A VM whose address the document does not give sends no IPv4 or
        // ARP at all; the gateway's port on its edge host is no VM's.
        let mut s = guarded();
        let f = s.segments[0].filter.as_mut().unwrap();
        f.local_ports.clear();
        f.local_macs.push("02:67:77:00:10:00".parse().unwrap());
        let g = guard_of(&s);
        assert!(g[0].contains(vms), "{}", g[0]);
        assert!(g[1].contains(r#"{"match":{"left":{"payload":{"field":"type","protocol":"ether"}},"op":"==","right":"ip"}}"#), "{}", g[1]);
        assert!(g[2].contains(r#""op":"==","right":"arp""#), "{}", g[2]);
        assert!(!g[1].contains("02:67:77"), "{}", g[1]);
        // … and its MAC still comes in only through the edge's leg.
        assert!(g[3].contains("02:67:77:00:10:00"), "{}", g[3]);
    }

    #[test]
    fn a_port_must_be_a_local_vm_named_once() {
        let mut s = guarded();
        let f = s.segments[0].filter.as_mut().unwrap();
        f.local_ports[1].mac = "02:6b:00:00:00:09".parse().unwrap();
        let e = s.validate().unwrap_err();
        assert_eq!(e.field, "segments[0].filter.local_ports[1].mac", "{e}");
        let mut s = guarded();
        s.segments[0].filter.as_mut().unwrap().local_ports[0].ip = "0.0.0.0".parse().unwrap();
        let e = s.validate().unwrap_err();
        assert_eq!(e.field, "segments[0].filter.local_ports[0].ip", "{e}");
    }

    #[test]
    fn bad_filters_are_refused() {
        for (f, field, says) in [
            (
                r#"{"cidr": "10.1.0.5/24", "local_macs": []}"#,
                "state",
                "host bits",
            ),
            (
                r#"{"cidr": "10.1.0.0/24", "local_macs": ["ff:ff:ff:ff:ff:ff"]}"#,
                "segments[0].filter.local_macs[0]",
                "unicast",
            ),
            (
                r#"{"cidr": "10.1.0.0/24", "local_macs": [], "allow": [{"protocol": "icmp", "ports": "22", "source": "0.0.0.0/0"}]}"#,
                "segments[0].filter.allow[0].ports",
                "tcp or udp",
            ),
            (
                r#"{"cidr": "10.1.0.0/24", "local_macs": [], "allow": [{"protocol": "tcp", "ports": "0", "source": "0.0.0.0/0"}]}"#,
                "state",
                "port",
            ),
        ] {
            let e = DesiredState::from_json(&format!(
                r#"{{"underlay_ip": "10.99.0.1", "segments": [{{"vni": 4096, "mtu": 1450, "filter": {f}}}]}}"#
            ))
            .unwrap_err();
            assert_eq!(e.field, field, "{f}: {e}");
            assert!(e.message.contains(says), "{f}: {e}");
        }
    }
}
