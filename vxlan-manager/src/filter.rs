//! Segment ingress filters as nftables rules (pure): a table `bridge kumo`
//! whose `forward` chain sends frames addressed to a segment's local VMs
//! to the segment's chain, which lets in non-IPv4 (ARP), IPv4 from the
//! segment's own network and what its rules allow, and drops the rest.
//!
//! Bridge-family conntrack and bridge-name matching are not in every
//! kernel, so the rules are stateless and keyed by destination MAC: a VM
//! talking to an outside address needs a rule for the answers.
//!
//! Every rule carries a comment naming a hash of its chain and body, so
//! the kernel's ruleset is compared without parsing nft's normalised
//! expressions back: the same comments in the same order are the same rules.

use serde_json::{json, Value};

use crate::state::{Allow, DesiredState, Net, Protocol};

pub const TABLE: &str = "kumo";
pub const BASE_CHAIN: &str = "forward";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub chain: String,
    pub expr: Value,
    pub comment: String,
}

pub fn segment_chain(vni: u32) -> String {
    format!("seg{vni}")
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

/// The whole ruleset, base chain first; empty when no segment here has
/// a filter and a VM to protect.
pub fn rules(want: &DesiredState) -> Vec<Rule> {
    let mut base = Vec::new();
    let mut chains = Vec::new();
    for s in &want.segments {
        let Some(f) = &s.filter else {
            continue;
        };
        if f.local_macs.is_empty() {
            continue;
        }
        let chain = segment_chain(s.vni);
        let macs: Vec<String> = f.local_macs.iter().map(|m| m.to_string()).collect();
        base.push(rule(
            BASE_CHAIN,
            json!([
                matches(
                    json!({"payload": {"protocol": "ether", "field": "daddr"}}),
                    "==",
                    json!({"set": macs}),
                ),
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
                    matches(
                        json!({"payload": {"protocol": "ether", "field": "saddr"}}),
                        "==",
                        json!(gw.to_string()),
                    ),
                    {"accept": null}
                ]),
            ));
        }
        for a in &f.allow {
            chains.push(rule(&chain, allow_expr(a)));
        }
        chains.push(rule(&chain, json!([{"drop": null}])));
    }
    base.extend(chains);
    base
}

/// The nft JSON commands that replace the table with `rules` in one
/// transaction (or delete it when there are none).
pub fn commands(rules: &[Rule], table_exists: bool) -> Value {
    let table = json!({"family": "bridge", "name": TABLE});
    let mut cmds = Vec::new();
    if table_exists || !rules.is_empty() {
        // `add` first so `delete` never fails on a missing table.
        cmds.push(json!({"add": {"table": table}}));
        cmds.push(json!({"delete": {"table": table}}));
    }
    if !rules.is_empty() {
        cmds.push(json!({"add": {"table": table}}));
        cmds.push(json!({"add": {"chain": {
            "family": "bridge", "table": TABLE, "name": BASE_CHAIN,
            "type": "filter", "hook": "forward", "prio": 0, "policy": "accept"
        }}}));
        let mut seen: Vec<&str> = vec![BASE_CHAIN];
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
        let r = rules(&s);
        let chains: Vec<&str> = r.iter().map(|r| r.chain.as_str()).collect();
        assert_eq!(
            chains,
            ["forward", "seg4096", "seg4096", "seg4096", "seg4096", "seg4096", "seg4096"]
        );
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
        assert_eq!(commands(&[], false), json!({"nftables": []}));
        let del = commands(&[], true).to_string();
        assert!(del.contains(r#""delete""#) && !del.contains(r#""chain""#));
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
