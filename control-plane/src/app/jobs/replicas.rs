//! This replica says it is alive every few seconds (so the others relay
//! consoles to it, and count its consoles), and sweeps what expired.

use crate::context::AppState;

/// Beats between two sweeps (a minute).
const SWEEP_EVERY: u64 = 12;

pub async fn run(state: AppState) {
    let mut tick = tokio::time::interval(crate::app::consoles::BEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once: the replica beat when it registered.
    tick.tick().await;
    for n in 1u64.. {
        tick.tick().await;
        if let Err(e) = crate::app::consoles::beat(&state, n % SWEEP_EVERY == 0).await {
            tracing::warn!(error = %e, "this replica's console beat was not written; retrying");
        }
    }
}
