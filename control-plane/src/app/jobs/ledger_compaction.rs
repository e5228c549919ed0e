//! Folds ledgers kept a row per piece (by releases before ledger entries)
//! into entries: once soon after a start, then daily, so a ledger
//! migrates while the server serves, and rows an older replica still
//! posts beside this one are folded too.

use std::time::Duration;

use crate::context::AppState;

const FIRST_AFTER: Duration = Duration::from_secs(30);
const EVERY: Duration = Duration::from_secs(24 * 3600);

pub async fn run(st: AppState) {
    tokio::time::sleep(FIRST_AFTER).await;
    loop {
        match crate::app::metering::compact_ledger(&st).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(rows = n, "ledger rows folded into entries"),
            Err(e) => tracing::warn!(error = %e, "ledger compaction failed; retrying tomorrow"),
        }
        tokio::time::sleep(EVERY).await;
    }
}
