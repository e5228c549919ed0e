//! Follows hosts changed by other replicas (and by jobs that change rows
//! without telling anyone): every second, one narrow read of all hosts'
//! change marks, then the long polls of hosts whose revision moved are
//! woken and the hosts whose capacity moved are re-read into the index.
//! Long polls wait on these wake-ups instead of each re-reading its host.

use std::time::Duration;

use crate::context::AppState;

pub const EVERY: Duration = Duration::from_secs(1);

pub async fn run(state: AppState) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = state.capacity.catch_up(&state.db, &state.signals).await {
            tracing::warn!(error = %e, "host changes not followed; retrying");
        }
    }
}
