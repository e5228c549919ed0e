//! The lease keeper: writes the heartbeats renewed in memory
//! ([`crate::leases`]) in batches.

use std::time::Duration;

use crate::context::AppState;
use crate::error::ApiError;

/// How often renewals are written: at most every 2 s, and at least four
/// times per heartbeat timeout, so the lost-host detector (which reads
/// the database) never sees a beating host as silent.
fn every(heartbeat_timeout: Duration) -> Duration {
    (heartbeat_timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(2))
}

pub async fn run(state: AppState) {
    let mut tick = tokio::time::interval(every(state.config.heartbeat_timeout));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = flush(&state).await {
            tracing::warn!(error = %e, "host leases not written; retrying");
        }
    }
}

/// Writes every pending renewal now; on failure they stay pending.
/// Returns the statements run.
pub async fn flush(state: &AppState) -> Result<usize, ApiError> {
    let batch = state.leases.take();
    if batch.is_empty() {
        return Ok(0);
    }
    match crate::store::hosts::write_leases(&state.db, &batch).await {
        Ok(n) => {
            state.metrics.lease_batch(batch.len());
            Ok(n)
        }
        Err(e) => {
            state.leases.restore(batch);
            Err(e)
        }
    }
}
