//! Public networking: the provider pools of public addresses, a tenant's
//! public IPs (floating addresses attached to a NIC), and port forwards from
//! a public address's port to a VM's.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// A provider network's addresses, for edges to carry (platform admins).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublicIpPoolCreate {
    pub name: String,
    /// The provider network, e.g. `203.0.113.0/24`.
    pub cidr: String,
    /// Its router: where edges send what leaves.
    pub gateway: String,
    /// `FIRST-LAST`: the addresses Kumo hands out. Default: every host
    /// address of `cidr` but the gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PublicIpPool {
    pub id: Uuid,
    pub name: String,
    pub cidr: String,
    pub gateway: String,
    pub first: String,
    pub last: String,
    /// Addresses in `first..=last`.
    pub size: u32,
    /// Addresses in use: tenants' and segment edges'.
    pub used: u32,
    pub created_at: DateTime<Utc>,
}

/// Allocate a public address to the tenant (members; within the
/// `public_ips` quota).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublicIpAllocate {
    /// Default: the first pool with a free address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
}

/// Which NIC: a VM and, for a VM on several segments, the segment.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublicIpAttach {
    pub vm: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<String>,
}

/// A NIC a public address leads to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NicRef {
    pub vm: String,
    pub segment: String,
    pub ip: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PublicIp {
    pub id: Uuid,
    pub address: String,
    pub pool: String,
    pub tenant: String,
    /// The NIC it is the 1:1 floating address of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attached: Option<NicRef>,
    pub created_at: DateTime<Utc>,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ForwardProtocol {
    Tcp,
    Udp,
}

impl ForwardProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            ForwardProtocol::Tcp => "tcp",
            ForwardProtocol::Udp => "udp",
        }
    }
}

/// `public_ip:public_port/protocol` → the VM's NIC's `private_port`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PortForwardCreate {
    /// One of the tenant's public addresses, not attached to a NIC.
    pub public_ip: String,
    pub protocol: ForwardProtocol,
    pub public_port: u16,
    pub vm: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<String>,
    pub private_port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PortForward {
    pub id: Uuid,
    pub tenant: String,
    pub public_ip: String,
    pub protocol: ForwardProtocol,
    pub public_port: u16,
    pub to: NicRef,
    pub private_port: u16,
    pub created_at: DateTime<Utc>,
}
