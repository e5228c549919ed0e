//! Ingress rules as tenants write them (`tcp:22:0.0.0.0/0`) and as hosts
//! apply them.

use kumo_api_types::{IngressProtocol, IngressRule};
use vxlan_manager::state::{Allow, Net, PortRange, Protocol, MAX_ALLOW};

use crate::error::ApiError;

/// Checks rules as the hosts will apply them; the first problem names
/// its field (`ingress[2].ports`).
pub fn parse_rules(field: &str, rules: &[IngressRule]) -> Result<Vec<Allow>, ApiError> {
    if rules.len() > MAX_ALLOW {
        return Err(ApiError::field(field, format!("at most {MAX_ALLOW} rules")));
    }
    rules
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let at = |f: &str| format!("{field}[{i}].{f}");
            let protocol = match r.protocol {
                IngressProtocol::Tcp => Protocol::Tcp,
                IngressProtocol::Udp => Protocol::Udp,
                IngressProtocol::Icmp => Protocol::Icmp,
                IngressProtocol::Any => Protocol::Any,
            };
            let ports = r
                .ports
                .as_deref()
                .map(|p| p.parse::<PortRange>())
                .transpose()
                .map_err(|e| ApiError::field(&at("ports"), e))?;
            if ports.is_some() && !protocol.has_ports() {
                return Err(ApiError::field(
                    &at("ports"),
                    "ports go with tcp or udp only",
                ));
            }
            let source: Net = r
                .source
                .parse()
                .map_err(|e: String| ApiError::field(&at("source"), e))?;
            Ok(Allow {
                protocol,
                ports,
                source,
            })
        })
        .collect()
}

/// Whether `rules` let TCP `port` in from anywhere (so `--public-ip`
/// adds no rule of its own). Rules that do not parse open nothing.
pub fn opens_to_all(rules: &[IngressRule], port: u16) -> bool {
    parse_rules("rules", rules).is_ok_and(|parsed| {
        parsed.iter().any(|a| {
            matches!(a.protocol, Protocol::Tcp | Protocol::Any)
                && a.ports.is_none_or(|p| p.first <= port && port <= p.last)
                && a.source.len == 0
        })
    })
}

/// The rules as stored and shown: normalised (`0022` → `22`).
pub fn rules_json(field: &str, rules: &[IngressRule]) -> Result<Option<String>, ApiError> {
    let parsed = parse_rules(field, rules)?;
    if parsed.is_empty() {
        return Ok(None);
    }
    let normal: Vec<IngressRule> = rules
        .iter()
        .zip(&parsed)
        .map(|(r, p)| IngressRule {
            protocol: r.protocol,
            ports: p.ports.map(|x| x.to_string()),
            source: p.source.to_string(),
        })
        .collect();
    serde_json::to_string(&normal)
        .map(Some)
        .map_err(|e| ApiError::Internal(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_from_anywhere_is_opened_by_wide_enough_rules_only() {
        let r = |s: &str| s.parse::<IngressRule>().unwrap();
        assert!(opens_to_all(&[r("tcp:22:0.0.0.0/0")], 22));
        assert!(opens_to_all(
            &[r("icmp:0.0.0.0/0"), r("tcp:20-30:0.0.0.0/0")],
            22
        ));
        assert!(opens_to_all(&[r("any:0.0.0.0/0")], 22));
        assert!(!opens_to_all(&[r("tcp:22:192.0.2.0/24")], 22));
        assert!(!opens_to_all(
            &[r("tcp:80:0.0.0.0/0"), r("udp:22:0.0.0.0/0")],
            22
        ));
        assert!(!opens_to_all(&[], 22));
    }
}
