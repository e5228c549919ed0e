//! How often one tenant may reprogram shared hosts: each change to an
//! edge, a floating address or a segment's egress rewrites tables on hosts
//! that serve every tenant, so a tenant flipping them in a loop slows the
//! others. A token bucket per tenant: `burst` changes at once, then
//! `per_minute` a minute; past it the change is refused with how long to
//! wait. What gives resources back (deleting, releasing, detaching,
//! stopping) never takes from it: a tenant must always be able to stop
//! spending, and a loop needs its other half anyway.

use chrono::{DateTime, Utc};

/// A tenant's allowance of changes to shared hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowance {
    pub per_minute: u32,
    pub burst: u32,
}

impl Default for Allowance {
    fn default() -> Allowance {
        Allowance {
            per_minute: 120,
            burst: 100,
        }
    }
}

/// What is left of a tenant's allowance, as of `at`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    pub tokens: f64,
    pub at: DateTime<Utc>,
}

impl Bucket {
    pub fn full(a: &Allowance, now: DateTime<Utc>) -> Bucket {
        Bucket {
            tokens: f64::from(a.burst),
            at: now,
        }
    }

    /// One change now: the bucket after it, or the whole seconds to wait
    /// for the next token (at least 1). A clock that went back refills
    /// nothing.
    pub fn take(self, a: &Allowance, now: DateTime<Utc>) -> Result<Bucket, u64> {
        let rate = f64::from(a.per_minute) / 60.0;
        let elapsed = (now - self.at).num_milliseconds().max(0) as f64 / 1000.0;
        let tokens = (self.tokens + elapsed * rate).min(f64::from(a.burst));
        if tokens >= 1.0 {
            return Ok(Bucket {
                tokens: tokens - 1.0,
                at: now.max(self.at),
            });
        }
        if rate <= 0.0 {
            return Err(60);
        }
        Err((((1.0 - tokens) / rate).ceil() as u64).max(1))
    }
}

/// `items` of several tenants in turns: each tenant's first, then each
/// one's second, …, each tenant's own order kept. Work for shared hosts is
/// done in this order so that one tenant's many changes wait behind one
/// change of every other tenant, not the other way round.
pub fn in_turns<K: Ord + Copy, T>(items: Vec<(K, T)>) -> Vec<T> {
    let mut queues: std::collections::BTreeMap<K, std::collections::VecDeque<T>> =
        std::collections::BTreeMap::new();
    for (k, t) in items {
        queues.entry(k).or_default().push_back(t);
    }
    let mut out = Vec::new();
    while !queues.is_empty() {
        queues.retain(|_, q| {
            if let Some(t) = q.pop_front() {
                out.push(t);
            }
            !q.is_empty()
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + secs, 0).unwrap()
    }

    #[test]
    fn tenants_take_turns() {
        let items = vec![
            (1, "a1"),
            (1, "a2"),
            (1, "a3"),
            (2, "b1"),
            (3, "c1"),
            (2, "b2"),
        ];
        assert_eq!(in_turns(items), ["a1", "b1", "c1", "a2", "b2", "a3"]);
    }

    #[test]
    fn a_burst_then_the_rate() {
        let a = Allowance {
            per_minute: 6,
            burst: 3,
        };
        let mut b = Bucket::full(&a, at(0));
        for _ in 0..3 {
            b = b.take(&a, at(0)).unwrap();
        }
        assert_eq!(b.take(&a, at(0)), Err(10), "one token every 10 s");
        assert_eq!(b.take(&a, at(4)), Err(6));
        let b = b.take(&a, at(10)).unwrap();
        assert!(b.take(&a, at(10)).is_err());
        // Idle refills up to the burst, no more.
        let mut b = b.take(&a, at(1000)).unwrap();
        for _ in 0..2 {
            b = b.take(&a, at(1000)).unwrap();
        }
        assert!(b.take(&a, at(1000)).is_err());
        // A clock that went back gives nothing.
        assert!(b.take(&a, at(0)).is_err());
    }
}
