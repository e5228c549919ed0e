//! Tenant networks (VXLAN segments, Ethernet or RoCE): making and
//! changing them, their ingress rules (with the short `PROTO[:PORTS]:SOURCE`
//! form), their edge for egress, and the hosts that could not set one up.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SegmentKind {
    /// Virtio NICs on the segment's bridge; VXLAN on the hosts.
    Ethernet,
    /// SR-IOV VFs of the GPUs' paired NICs; lossless (PFC on priority 3).
    Roce,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SegmentCreate {
    pub name: String,
    pub kind: SegmentKind,
    /// An IPv4 network, e.g. `10.1.0.0/24` (prefix 8–29).
    pub cidr: String,
    /// Default: the network's first address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Default: the underlay MTU minus VXLAN's 50 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Who else may reach the segment's VMs. IPv4 from the segment's own
    /// network always may; from anywhere else, only what a rule allows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<IngressRule>,
    /// Whether the VMs reach outside through the segment's gateway
    /// (SNAT to a public address). Default: on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<bool>,
}

/// The name of the segment a project gets when it is made (where the
/// platform makes one), which `kumo vm create` uses when given no
/// network.
pub const DEFAULT_SEGMENT: &str = "default";

/// What may change of a segment after it is made.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SegmentUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum IngressProtocol {
    Tcp,
    Udp,
    Icmp,
    Any,
}

/// Let in IPv4 from `source` of this protocol (and ports).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IngressRule {
    pub protocol: IngressProtocol,
    /// `22` or `8000-8100`; TCP and UDP only; all ports when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<String>,
    /// An IPv4 network, e.g. `192.0.2.0/24` (`0.0.0.0/0` for anywhere).
    pub source: String,
}

/// The short form the CLI and the portal take: `PROTO[:PORTS]:SOURCE`,
/// e.g. `tcp:22:0.0.0.0/0`, `icmp:10.0.0.0/8`.
impl std::str::FromStr for IngressRule {
    type Err = String;

    fn from_str(s: &str) -> Result<IngressRule, String> {
        let bad = || format!("{s:?}: expected PROTO[:PORTS]:SOURCE, e.g. tcp:22:0.0.0.0/0");
        let parts: Vec<&str> = s.split(':').collect();
        let (proto, ports, source) = match parts.as_slice() {
            [p, src] => (*p, None, *src),
            [p, ports, src] => (*p, Some((*ports).to_owned()), *src),
            _ => return Err(bad()),
        };
        let protocol = match proto {
            "tcp" => IngressProtocol::Tcp,
            "udp" => IngressProtocol::Udp,
            "icmp" => IngressProtocol::Icmp,
            "any" => IngressProtocol::Any,
            _ => return Err(bad()),
        };
        Ok(IngressRule {
            protocol,
            ports,
            source: source.to_owned(),
        })
    }
}

impl std::fmt::Display for IngressRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let proto = match self.protocol {
            IngressProtocol::Tcp => "tcp",
            IngressProtocol::Udp => "udp",
            IngressProtocol::Icmp => "icmp",
            IngressProtocol::Any => "any",
        };
        match &self.ports {
            Some(p) => write!(f, "{proto}:{p}:{}", self.source),
            None => write!(f, "{proto}:{}", self.source),
        }
    }
}

/// A segment's whole ingress rule list, replacing the one before.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SegmentIngress {
    pub rules: Vec<IngressRule>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Segment {
    pub id: Uuid,
    pub name: String,
    pub tenant: String,
    pub kind: SegmentKind,
    pub cidr: String,
    pub gateway: String,
    pub mtu: u32,
    /// For RoCE segments: the RoCE path MTU the NICs will use (the
    /// largest of 1024, 2048 and 4096 under `mtu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roce_mtu: Option<u32>,
    pub vni: u32,
    /// RoCE segments: the VLAN of the VMs' VFs, which the leaf switches
    /// map to the VNI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// VMs' NICs attached (a RoCE VM has one per GPU rail).
    pub attachments: u32,
    #[serde(default)]
    pub ingress: Vec<IngressRule>,
    /// Hosts that could not set the segment up, with why: its VMs there
    /// wait (shown in their `reason`) while the host's other work goes on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<SegmentFault>,
    /// VMs reach outside through the gateway.
    #[serde(default)]
    pub egress: bool,
    /// Where the segment's gateway, egress and public addresses live: an
    /// edge host, once the segment needs one and one is up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge: Option<SegmentEdge>,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SegmentEdge {
    pub host: String,
    /// The public address the VMs' outbound traffic leaves from (VMs with
    /// a floating address leave from that instead); none while the pools
    /// have no free address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snat_address: Option<String>,
}

/// A host that could not set a segment up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SegmentFault {
    pub host: String,
    pub message: String,
}
