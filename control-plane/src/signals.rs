//! In-process wake-ups for agents long-polling their desired state. The
//! database revision is the truth; a wake-up only shortens the wait, and
//! waiters also re-read the database every second, so replicas that did not
//! see the change still answer within a second.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use uuid::Uuid;

#[derive(Default)]
pub struct HostSignals {
    by_host: Mutex<HashMap<Uuid, Arc<Notify>>>,
    /// The server is shutting down: long polls answer now, so the
    /// graceful shutdown does not wait out their timeouts.
    closing: std::sync::atomic::AtomicBool,
    closed: Notify,
}

impl HostSignals {
    fn get(&self, host: Uuid) -> Arc<Notify> {
        let mut map = self.by_host.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(host).or_default().clone()
    }

    pub fn notify(&self, host: Uuid) {
        self.get(host).notify_waiters();
    }

    /// Waits for a wake-up of `host`, at most `limit`, and not past the
    /// start of a shutdown.
    pub async fn wait(&self, host: Uuid, limit: Duration) {
        let n = self.get(host);
        let closed = self.closed.notified();
        if self.closing() {
            return;
        }
        let _ = tokio::time::timeout(limit, async {
            tokio::select! {
                _ = n.notified() => {}
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
