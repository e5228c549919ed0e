//! In-process wake-ups for agents long-polling their desired state. The
//! database revision is the truth; a wake-up only ends the wait, and the
//! host-change follower (`app::jobs::host_changes`) wakes the waiters of
//! hosts whose revision another replica moved, within a second.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use uuid::Uuid;

#[derive(Default)]
pub struct HostSignals {
    by_host: Mutex<HashMap<Uuid, Arc<Slot>>>,
    /// The server is shutting down: long polls answer now, so the
    /// graceful shutdown does not wait out their timeouts.
    closing: std::sync::atomic::AtomicBool,
    closed: Notify,
}

/// One host's wake-ups, counted: a waiter that read the database after
/// taking the count misses no wake-up that came in between.
#[derive(Default)]
struct Slot {
    count: std::sync::atomic::AtomicU64,
    notify: Notify,
}

impl HostSignals {
    fn get(&self, host: Uuid) -> Arc<Slot> {
        let mut map = self.by_host.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(host).or_default().clone()
    }

    pub fn notify(&self, host: Uuid) {
        let slot = self.get(host);
        slot.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        slot.notify.notify_waiters();
    }

    /// The wake-ups of `host` so far: take it before reading the
    /// database, then [`HostSignals::wait`] past it.
    pub fn seen(&self, host: Uuid) -> u64 {
        self.get(host)
            .count
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits for a wake-up of `host` after `seen` of them, at most
    /// `limit`, and not past the start of a shutdown.
    pub async fn wait(&self, host: Uuid, seen: u64, limit: Duration) {
        let slot = self.get(host);
        let woken = slot.notify.notified();
        let closed = self.closed.notified();
        tokio::pin!(woken);
        tokio::pin!(closed);
        woken.as_mut().enable();
        closed.as_mut().enable();
        if self.closing() || slot.count.load(std::sync::atomic::Ordering::SeqCst) != seen {
            return;
        }
        let _ = tokio::time::timeout(limit, async {
            tokio::select! {
                _ = woken => {}
                _ = closed => {}
            }
        })
        .await;
    }

    /// Ends every wait, now and from now on.
    pub fn close(&self) {
        self.closing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.closed.notify_waiters();
    }

    pub fn closing(&self) -> bool {
        self.closing.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wake_up_between_the_read_and_the_wait_is_not_lost() {
        let s = HostSignals::default();
        let h = Uuid::now_v7();
        let seen = s.seen(h);
        s.notify(h); // lands after the waiter's read, before its wait
        let t = std::time::Instant::now();
        s.wait(h, seen, Duration::from_secs(10)).await;
        assert!(t.elapsed() < Duration::from_secs(1), "the wake-up was lost");
        // With nothing new, it waits out its limit.
        let seen = s.seen(h);
        let t = std::time::Instant::now();
        s.wait(h, seen, Duration::from_millis(200)).await;
        assert!(t.elapsed() >= Duration::from_millis(200));
    }
}
