//! Host leases: a heartbeat that changes nothing but the host's liveness
//! renews its lease here, in memory, and the lease keeper
//! (`app::jobs::lease_keeper`) writes the renewals of all hosts in
//! batches, one statement per batch, a few times per heartbeat timeout.
//! At 10,000 hosts beating every 5 s that is 2,000 renewals a second
//! folded into one write every second or two instead of 2,000 writes.
//!
//! The database stays the truth of liveness: the lost-host detector of
//! every replica reads `last_heartbeat_at`, which lags a renewal by at
//! most one flush interval (a quarter of the timeout at most, so a host
//! that beats is never seen lost). A heartbeat that changes anything
//! else, or comes back from `unreachable`, is written at once.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use uuid::Uuid;

#[derive(Default)]
pub struct HostLeases {
    renewed: Mutex<HashMap<Uuid, DateTime<Utc>>>,
}

impl HostLeases {
    /// Notes a heartbeat of `host` at `at` (the latest wins).
    pub fn renew(&self, host: Uuid, at: DateTime<Utc>) {
        let mut map = self.renewed.lock().unwrap_or_else(|e| e.into_inner());
        let t = map.entry(host).or_insert(at);
        *t = (*t).max(at);
    }

    /// Takes every renewal not yet written.
    pub fn take(&self) -> Vec<(Uuid, DateTime<Utc>)> {
        let mut map = self.renewed.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = map.drain().collect();
        // Rows in id order: two replicas' batches never lock in opposite
        // orders.
        out.sort_unstable_by_key(|(id, _)| *id);
        out
    }

    /// Puts back renewals whose write failed (newer ones taken meanwhile
    /// win).
    pub fn restore(&self, batch: Vec<(Uuid, DateTime<Utc>)>) {
        for (id, at) in batch {
            self.renew(id, at);
        }
    }

    /// Renewals waiting to be written.
    pub fn pending(&self) -> usize {
        self.renewed.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_renewal_wins_and_a_failed_write_is_not_lost() {
        let l = HostLeases::default();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let t0 = DateTime::<Utc>::from_timestamp(1_000, 0).unwrap();
        let t1 = t0 + chrono::Duration::seconds(5);
        l.renew(a, t1);
        l.renew(a, t0); // a late request does not move it back
        l.renew(b, t0);
        let batch = l.take();
        assert_eq!(batch, vec![(a, t1), (b, t0)]);
        assert_eq!(l.pending(), 0);
        l.renew(b, t1);
        l.restore(batch);
        assert_eq!(l.take(), vec![(a, t1), (b, t1)]);
    }
}
