//! Public addressing rules (pure): a pool's network, gateway and range,
//! and which address of a pool is handed out next.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use chrono::{DateTime, Duration, Utc};

use crate::domain::ipam::Cidr;
use crate::error::ApiError;

/// A pool as checked: its network, router and the addresses handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    pub cidr: Cidr,
    pub gateway: Ipv4Addr,
    pub first: Ipv4Addr,
    pub last: Ipv4Addr,
}

fn addr(field: &str, s: &str) -> Result<Ipv4Addr, ApiError> {
    s.trim()
        .parse()
        .map_err(|_| ApiError::field(field, format!("{s:?} is not an IPv4 address")))
}

impl Pool {
    /// A pool from its parts: the gateway and the range are host addresses
    /// of the network, the range leaves the gateway out or around it, and
    /// the network is clear of every range tenants' segments may use (a
    /// public address that is also a private one would shadow a VM).
    pub fn check(
        cidr: &str,
        gateway: &str,
        range: Option<&str>,
        tenant_ranges: &[Cidr],
    ) -> Result<Pool, ApiError> {
        let c = Cidr::parse("cidr", cidr)?;
        if let Some(r) = tenant_ranges.iter().find(|r| r.overlaps(&c)) {
            return Err(ApiError::field(
                "cidr",
                format!("{c} overlaps the tenant range {r}"),
            ));
        }
        let gateway = addr("gateway", gateway)?;
        if !c.is_host(gateway) {
            return Err(ApiError::field(
                "gateway",
                format!("{gateway} is not a host address of {c}"),
            ));
        }
        let (first, last) = match range {
            None => (
                Ipv4Addr::from(*c.hosts().start()),
                Ipv4Addr::from(*c.hosts().end()),
            ),
            Some(r) => {
                let (a, b) = r.split_once('-').ok_or_else(|| {
                    ApiError::field("range", "FIRST-LAST, e.g. 203.0.113.10-203.0.113.99")
                })?;
                (addr("range", a)?, addr("range", b)?)
            }
        };
        if !c.is_host(first) || !c.is_host(last) || u32::from(first) > u32::from(last) {
            return Err(ApiError::field(
                "range",
                format!("{first}-{last} is not a range of host addresses of {c}"),
            ));
        }
        let pool = Pool {
            cidr: c,
            gateway,
            first,
            last,
        };
        if pool.size() == 0 {
            return Err(ApiError::field("range", "holds no address but the gateway"));
        }
        Ok(pool)
    }

    /// Addresses handed out: the range less the gateway.
    pub fn size(&self) -> u32 {
        let n = u32::from(self.last) - u32::from(self.first) + 1;
        n - u32::from(self.holds(self.gateway))
    }

    fn holds(&self, ip: Ipv4Addr) -> bool {
        (u32::from(self.first)..=u32::from(self.last)).contains(&u32::from(ip))
    }

    /// Whether `ip` is one the pool hands out.
    pub fn offers(&self, ip: Ipv4Addr) -> bool {
        self.holds(ip) && ip != self.gateway
    }

    /// The address handed out next: one not in `taken` that has either
    /// never been held (the lowest of those) or was released (`released`:
    /// when) at least `rest` before `now` (the one released longest ago).
    /// An address released more recently rests: traffic, DNS records and
    /// allowlists still aimed at its last holder must not reach the next
    /// one, and handing out the least recently used lets them fade first.
    pub fn next_free(
        &self,
        taken: &BTreeSet<Ipv4Addr>,
        released: &BTreeMap<Ipv4Addr, DateTime<Utc>>,
        now: DateTime<Utc>,
        rest: Duration,
    ) -> Option<Ipv4Addr> {
        let mut oldest: Option<(DateTime<Utc>, Ipv4Addr)> = None;
        for ip in (u32::from(self.first)..=u32::from(self.last)).map(Ipv4Addr::from) {
            if ip == self.gateway || taken.contains(&ip) {
                continue;
            }
            match released.get(&ip) {
                None => return Some(ip),
                // (A rest too long to add up rests for ever.)
                Some(at) if at.checked_add_signed(rest).is_some_and(|end| end <= now) => {
                    // Addresses go in order, so on a tie the lower stays.
                    if oldest.is_none_or(|(o, _)| *at < o) {
                        oldest = Some((*at, ip));
                    }
                }
                Some(_) => {}
            }
        }
        oldest.map(|(_, ip)| ip)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::domain::ipam::default_tenant_ranges;

    #[test]
    fn pools_are_public_networks_with_a_gateway_and_a_range() {
        let t = default_tenant_ranges();
        let p = Pool::check("203.0.113.0/24", "203.0.113.1", None, &t).unwrap();
        assert_eq!(
            (p.first.to_string(), p.last.to_string()),
            ("203.0.113.1".into(), "203.0.113.254".into())
        );
        assert_eq!(p.size(), 253);
        let p = Pool::check(
            "203.0.113.0/24",
            "203.0.113.1",
            Some("203.0.113.10-203.0.113.12"),
            &t,
        )
        .unwrap();
        assert_eq!(p.size(), 3);
        assert!(p.offers("203.0.113.11".parse().unwrap()));
        assert!(!p.offers("203.0.113.1".parse().unwrap()));
        let now = DateTime::UNIX_EPOCH + Duration::days(1000);
        let none = BTreeMap::new();
        let taken = ["203.0.113.10".parse().unwrap()].into();
        assert_eq!(
            p.next_free(&taken, &none, now, Duration::zero()),
            Some("203.0.113.11".parse().unwrap())
        );
        let all = ["203.0.113.10", "203.0.113.11", "203.0.113.12"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(p.next_free(&all, &none, now, Duration::zero()), None);
        for (cidr, gw, range) in [
            ("10.0.0.0/24", "10.0.0.1", None),        // a tenant range
            ("100.64.0.0/24", "100.64.0.1", None),    // shared space, a tenant range too
            ("203.0.113.0/24", "198.51.100.1", None), // gateway elsewhere
            ("203.0.113.0/24", "203.0.113.1", Some("203.0.113.9")), // not a range
            (
                "203.0.113.0/24",
                "203.0.113.1",
                Some("203.0.113.9-203.0.114.2"),
            ),
            (
                "203.0.113.0/24",
                "203.0.113.1",
                Some("203.0.113.9-203.0.113.8"),
            ),
            (
                "203.0.113.0/24",
                "203.0.113.1",
                Some("203.0.113.1-203.0.113.1"),
            ),
            ("203.0.113.0/24", "203.0.113.255", None), // broadcast
        ] {
            assert!(
                Pool::check(cidr, gw, range, &t).is_err(),
                "{cidr} {gw} {range:?}"
            );
        }
    }

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn released_addresses_rest_then_go_least_recently_used() {
        let t = default_tenant_ranges();
        let p = Pool::check(
            "203.0.113.0/24",
            "203.0.113.1",
            Some("203.0.113.10-203.0.113.13"),
            &t,
        )
        .unwrap();
        let now = DateTime::UNIX_EPOCH + Duration::days(1000);
        let day = Duration::hours(24);
        let taken: BTreeSet<Ipv4Addr> = [ip("203.0.113.11")].into();
        // .10 was released an hour ago: it rests, and a never-used
        // address goes first, the lowest of them.
        let released: BTreeMap<Ipv4Addr, DateTime<Utc>> =
            [(ip("203.0.113.10"), now - Duration::hours(1))].into();
        assert_eq!(
            p.next_free(&taken, &released, now, day),
            Some(ip("203.0.113.12"))
        );
        // Even with no rest, never-used addresses go before reused ones.
        assert_eq!(
            p.next_free(&taken, &released, now, Duration::zero()),
            Some(ip("203.0.113.12"))
        );
        // Every address has been used: the one released longest ago goes,
        // whatever its place in the range.
        let released: BTreeMap<Ipv4Addr, DateTime<Utc>> = [
            (ip("203.0.113.10"), now - Duration::hours(30)),
            (ip("203.0.113.12"), now - Duration::hours(50)),
            (ip("203.0.113.13"), now - Duration::hours(40)),
        ]
        .into();
        assert_eq!(
            p.next_free(&taken, &released, now, day),
            Some(ip("203.0.113.12"))
        );
        // A held address is never handed out, however long ago it was
        // last released.
        let held: BTreeSet<Ipv4Addr> = [ip("203.0.113.11"), ip("203.0.113.12")].into();
        assert_eq!(
            p.next_free(&held, &released, now, day),
            Some(ip("203.0.113.13"))
        );
        // All resting: nothing, until the rest is over.
        let resting: BTreeMap<Ipv4Addr, DateTime<Utc>> = [
            (ip("203.0.113.10"), now - Duration::hours(2)),
            (ip("203.0.113.12"), now - Duration::hours(1)),
            (ip("203.0.113.13"), now - Duration::hours(3)),
        ]
        .into();
        assert_eq!(p.next_free(&taken, &resting, now, day), None);
        assert_eq!(
            p.next_free(&taken, &resting, now + Duration::hours(21), day),
            Some(ip("203.0.113.13")),
            "the first to have rested a whole day"
        );
        // Equal release times: the lower address.
        let tie: BTreeMap<Ipv4Addr, DateTime<Utc>> = [
            (ip("203.0.113.13"), now - Duration::hours(30)),
            (ip("203.0.113.12"), now - Duration::hours(30)),
            (ip("203.0.113.10"), now - Duration::hours(30)),
        ]
        .into();
        assert_eq!(
            p.next_free(&taken, &tie, now, day),
            Some(ip("203.0.113.10"))
        );
    }
}
