//! Address management of tenant segments, as plain functions: CIDRs,
//! gateways, the next free address, MACs, the segment MTU and the VNI to
//! hand out next (with a quarantine for freed ones).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;

use chrono::{DateTime, Utc};

use vxlan_manager::state::{Net, VXLAN_OVERHEAD};

use crate::error::ApiError;

pub const MIN_SEGMENT_MTU: u32 = 1280;

/// An IPv4 network (`10.1.0.0/24`), host bits zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub network: Ipv4Addr,
    pub prefix: u8,
}

/// Blocks no tenant segment may touch, whatever the operator's ranges say
/// (RFC 6890): `(network, prefix)` and what the block is.
const SPECIAL_USE: &[((u32, u8), &str)] = &[
    (
        (0x0000_0000, 8),
        "unspecified (\"this network\", 0.0.0.0/8)",
    ),
    ((0x7f00_0000, 8), "loopback (127.0.0.0/8)"),
    ((0xa9fe_0000, 16), "link-local (169.254.0.0/16)"),
    ((0xe000_0000, 4), "multicast (224.0.0.0/4)"),
    ((0xf000_0000, 4), "reserved and broadcast (240.0.0.0/4)"),
];

fn block_of((network, prefix): (u32, u8)) -> Cidr {
    Cidr {
        network: Ipv4Addr::from(network),
        prefix,
    }
}

/// What tenants get when the operator names no ranges: the RFC 1918
/// private blocks and the shared address space (RFC 6598).
pub fn default_tenant_ranges() -> Vec<Cidr> {
    [
        (0x0a00_0000, 8),
        (0xac10_0000, 12),
        (0xc0a8_0000, 16),
        (0x6440_0000, 10),
    ]
    .into_iter()
    .map(block_of)
    .collect()
}

impl Cidr {
    pub fn parse(field: &str, s: &str) -> Result<Cidr, ApiError> {
        let net: Net = s.parse().map_err(|e: String| ApiError::field(field, e))?;
        if !(8..=29).contains(&net.len) {
            return Err(ApiError::field(field, "the prefix must be 8 to 29"));
        }
        Ok(Cidr {
            network: net.addr,
            prefix: net.len,
        })
    }

    /// A tenant segment's CIDR: well formed, inside one of the ranges the
    /// operator gives tenants, and clear of every special-use block (so
    /// every address handed out is a usable unicast host address).
    pub fn for_tenant(field: &str, s: &str, allowed: &[Cidr]) -> Result<Cidr, ApiError> {
        let c = Cidr::parse(field, s)?;
        if let Some((_, why)) = SPECIAL_USE
            .iter()
            .find(|(block, _)| block_of(*block).overlaps(&c))
        {
            return Err(ApiError::field(
                field,
                format!("{c} overlaps the {why} block"),
            ));
        }
        if !allowed.iter().any(|r| r.covers(&c)) {
            let ranges: Vec<String> = allowed.iter().map(Cidr::to_string).collect();
            return Err(ApiError::field(
                field,
                format!("{c} is outside the tenant ranges ({})", ranges.join(", ")),
            ));
        }
        Ok(c)
    }

    /// Whether the two share an address.
    pub fn overlaps(&self, other: &Cidr) -> bool {
        let wider = if self.prefix <= other.prefix {
            self
        } else {
            other
        };
        let narrower = if self.prefix <= other.prefix {
            other
        } else {
            self
        };
        wider.contains(narrower.network)
    }

    /// Whether every address of `inner` is one of these.
    pub fn covers(&self, inner: &Cidr) -> bool {
        self.prefix <= inner.prefix && self.contains(inner.network)
    }

    pub fn net(&self) -> Net {
        Net {
            addr: self.network,
            len: self.prefix,
        }
    }

    fn mask(&self) -> u32 {
        u32::MAX << (32 - u32::from(self.prefix))
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & self.mask() == u32::from(self.network)
    }

    /// Usable host addresses: not the network, not the broadcast.
    pub fn hosts(&self) -> RangeInclusive<u32> {
        let n = u32::from(self.network);
        (n + 1)..=(n | !self.mask()) - 1
    }

    pub fn first_host(&self) -> Ipv4Addr {
        Ipv4Addr::from(*self.hosts().start())
    }

    pub fn is_host(&self, ip: Ipv4Addr) -> bool {
        self.hosts().contains(&u32::from(ip))
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// A VM's address on a segment: the one asked for if it is a free host
/// address other than the gateway, else the lowest free one.
pub fn pick_address(
    cidr: &Cidr,
    gateway: Ipv4Addr,
    taken: &BTreeSet<Ipv4Addr>,
    wanted: Option<Ipv4Addr>,
) -> Result<Ipv4Addr, ApiError> {
    if let Some(ip) = wanted {
        if !cidr.is_host(ip) || ip == gateway {
            return Err(ApiError::field(
                "networks.ip",
                format!("{ip} is not a VM address of {cidr} (gateway {gateway})"),
            ));
        }
        if taken.contains(&ip) {
            return Err(ApiError::Conflict(format!(
                "{ip} is already in use on the segment"
            )));
        }
        return Ok(ip);
    }
    cidr.hosts()
        .map(Ipv4Addr::from)
        .find(|ip| *ip != gateway && !taken.contains(ip))
        .ok_or_else(|| ApiError::Conflict(format!("no free address left in {cidr}")))
}

/// A locally administered unicast MAC from 32 random bits.
pub fn mac_from(random: u32) -> String {
    let b = random.to_be_bytes();
    format!("02:6b:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3])
}

/// The segment MTU: what was asked, within what the underlay carries.
pub fn segment_mtu(underlay_mtu: u32, asked: Option<u32>) -> Result<u32, ApiError> {
    let max = underlay_mtu - VXLAN_OVERHEAD;
    match asked {
        None => Ok(max),
        Some(m) if (MIN_SEGMENT_MTU..=max).contains(&m) => Ok(m),
        Some(_) => Err(ApiError::field(
            "mtu",
            format!("between {MIN_SEGMENT_MTU} and {max} (the underlay's {underlay_mtu} less VXLAN's {VXLAN_OVERHEAD})"),
        )),
    }
}

/// The RoCE path MTU under a netdev MTU: the largest of 1024/2048/4096
/// that fits with RoCE's headers (a 4096 payload needs a netdev MTU of
/// at least 4096 + 124 bytes of IB, UDP and IP headers).
pub fn roce_mtu(mtu: u32) -> Option<u32> {
    const HEADERS: u32 = 124;
    [4096, 2048, 1024].into_iter().find(|p| p + HEADERS <= mtu)
}

/// A VNI lease as stored: held by a live segment, or released at a time.
#[derive(Debug, Clone, Copy)]
pub struct Lease {
    pub vni: u32,
    pub live: bool,
    pub released_at: Option<DateTime<Utc>>,
}

/// Where the next VNI comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextVni {
    /// Never leased: insert a lease.
    Fresh(u32),
    /// Released long enough ago: take its lease over.
    Reused(u32),
}

/// The lowest VNI of `ranges` that is neither held nor resting;
/// `leases` sorted by VNI.
pub fn next_vni(
    ranges: &[RangeInclusive<u32>],
    leases: &[Lease],
    now: DateTime<Utc>,
    quarantine: chrono::Duration,
) -> Option<NextVni> {
    let rested = |l: &Lease| !l.live && l.released_at.is_some_and(|t| t + quarantine <= now);
    for r in ranges {
        let mut v = *r.start();
        for l in leases.iter().filter(|l| r.contains(&l.vni)) {
            if l.vni > v {
                return Some(NextVni::Fresh(v));
            }
            if l.vni == v {
                if rested(l) {
                    return Some(NextVni::Reused(v));
                }
                v += 1;
            }
        }
        if v <= *r.end() {
            return Some(NextVni::Fresh(v));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn cidrs_and_addresses() {
        let c = Cidr::parse("cidr", "10.1.0.0/24").unwrap();
        assert_eq!(c.first_host(), ip("10.1.0.1"));
        assert!(
            c.is_host(ip("10.1.0.254"))
                && !c.is_host(ip("10.1.0.255"))
                && !c.is_host(ip("10.1.0.0"))
        );
        for bad in [
            "10.1.0.0",
            "10.1.0.1/24",
            "10.1.0.0/31",
            "10.1.0.0/4",
            "x/24",
            "10.1.0.0/x",
        ] {
            assert!(Cidr::parse("cidr", bad).is_err(), "{bad}");
        }
        let ranges = default_tenant_ranges();
        for ok in [
            "10.1.0.0/24",
            "172.16.4.0/22",
            "192.168.10.0/24",
            "100.64.0.0/16",
        ] {
            assert!(Cidr::for_tenant("cidr", ok, &ranges).is_ok(), "{ok}");
        }
        for bad in [
            "224.0.0.0/24",
            "239.255.255.0/24",
            "127.0.0.0/24",
            "169.254.1.0/24",
            "0.0.0.0/24",
            "240.0.0.0/24",
            "255.255.255.0/24",
            "8.8.8.0/24",
            "172.32.0.0/24",
            "192.0.2.0/24",
        ] {
            assert!(Cidr::for_tenant("cidr", bad, &ranges).is_err(), "{bad}");
        }
        // An operator who allows everything still gets no special block.
        let all = [
            Cidr::parse("r", "0.0.0.0/8").unwrap(),
            Cidr::parse("r", "224.0.0.0/8").unwrap(),
        ];
        assert!(Cidr::for_tenant("cidr", "224.0.0.0/24", &all).is_err());
        let gw = ip("10.1.0.1");
        let mut taken = BTreeSet::new();
        assert_eq!(pick_address(&c, gw, &taken, None).unwrap(), ip("10.1.0.2"));
        taken.insert(ip("10.1.0.2"));
        assert_eq!(pick_address(&c, gw, &taken, None).unwrap(), ip("10.1.0.3"));
        assert_eq!(
            pick_address(&c, gw, &taken, Some(ip("10.1.0.9"))).unwrap(),
            ip("10.1.0.9")
        );
        assert!(matches!(
            pick_address(&c, gw, &taken, Some(ip("10.1.0.2"))),
            Err(ApiError::Conflict(_))
        ));
        for wrong in ["10.1.0.1", "10.1.0.255", "10.2.0.5"] {
            assert!(
                pick_address(&c, gw, &taken, Some(ip(wrong))).is_err(),
                "{wrong}"
            );
        }
        // A /29 has six host addresses: the gateway and five VMs.
        let small = Cidr::parse("cidr", "10.9.0.0/29").unwrap();
        let mut t = BTreeSet::new();
        for _ in 0..5 {
            let a = pick_address(&small, small.first_host(), &t, None).unwrap();
            t.insert(a);
        }
        assert!(matches!(
            pick_address(&small, small.first_host(), &t, None),
            Err(ApiError::Conflict(_))
        ));
    }

    #[test]
    fn mtus() {
        assert_eq!(segment_mtu(9000, None).unwrap(), 8950);
        assert_eq!(segment_mtu(1500, None).unwrap(), 1450);
        assert!(segment_mtu(1500, Some(1451)).is_err());
        assert_eq!(
            roce_mtu(8950),
            Some(4096),
            "RoCE keeps 4096 on a 9000 underlay"
        );
        assert_eq!(roce_mtu(1450), Some(1024));
        assert_eq!(roce_mtu(4200), Some(2048));
        assert_eq!(mac_from(0x0a0b0c0d), "02:6b:0a:0b:0c:0d");
    }

    #[test]
    fn vnis_are_never_shared_and_rest_before_reuse() {
        let now = Utc::now();
        let q = chrono::Duration::seconds(600);
        let ranges = [5000..=5002, 9000..=9000];
        let lease = |vni, live, ago: Option<i64>| Lease {
            vni,
            live,
            released_at: ago.map(|s| now - chrono::Duration::seconds(s)),
        };
        assert_eq!(next_vni(&ranges, &[], now, q), Some(NextVni::Fresh(5000)));
        let l = [lease(5000, true, None), lease(5001, false, Some(10))];
        assert_eq!(next_vni(&ranges, &l, now, q), Some(NextVni::Fresh(5002)));
        let l = [lease(5000, true, None), lease(5001, false, Some(700))];
        assert_eq!(next_vni(&ranges, &l, now, q), Some(NextVni::Reused(5001)));
        let l = [
            lease(5000, true, None),
            lease(5001, true, None),
            lease(5002, false, Some(1)),
        ];
        assert_eq!(next_vni(&ranges, &l, now, q), Some(NextVni::Fresh(9000)));
        let l = [
            lease(5000, true, None),
            lease(5001, true, None),
            lease(5002, true, None),
            lease(9000, true, None),
        ];
        assert_eq!(next_vni(&ranges, &l, now, q), None);
    }
}
