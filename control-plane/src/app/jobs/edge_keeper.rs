//! The edge keeper: every second, each segment's edge is brought to what
//! it needs (placed, kept, moved off a lost edge host, given up), so edges
//! follow edge hosts coming, going and filling up.

use crate::context::AppState;

pub async fn run(st: AppState) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        if let Err(e) = crate::app::edges::keep(&st).await {
            tracing::warn!(error = %e, "edge keeper pass failed");
        }
    }
}
