//! The lost-host detector (and, beside it, shares' keepers moved off
//! hosts that can no longer keep them, maintenance windows opened, the
//! VMs of hosts lost for good handled by their policy, and clusters' health assessed and
//! auto-repairs started, right after hosts are found lost).

use kumo_api_types::HostState;

use crate::context::AppState;
use crate::domain::states::StoredText;

const PURGE_EVERY: std::time::Duration = std::time::Duration::from_secs(300);
const ASSESS_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Marks hosts whose agents fell silent as `unreachable`. Idempotent, so
/// several replicas running it at once do no harm.
pub async fn run(state: AppState) {
    use crate::entity::hosts;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    let timeout = state.config.heartbeat_timeout;
    let mut tick = tokio::time::interval((timeout / 4).max(std::time::Duration::from_millis(250)));
    let mut purged = None;
    let mut assessed = None;
    loop {
        tick.tick().await;
        let Ok(limit) = chrono::Duration::from_std(timeout) else {
            return;
        };
        // Liveness is the one thing measured on the wall clock: agents'
        // heartbeats are stamped with it, and a test's manual clock (which
        // moves billing time in jumps) must not make every host look lost.
        let cutoff = chrono::Utc::now() - limit; // wall clock: liveness
        let lost = hosts::Entity::update_many()
            .col_expr(
                hosts::Column::State,
                sea_orm::sea_query::Expr::value(HostState::Unreachable.to_text()),
            )
            // When, on the state's clock: what the host-loss policy counts
            // from.
            .col_expr(
                hosts::Column::UnreachableSince,
                sea_orm::sea_query::Expr::value(Some(state.config.clock.now())),
            )
            .filter(
                hosts::Column::State
                    .is_in([HostState::Ready.to_text(), HostState::Draining.to_text()]),
            )
            .filter(hosts::Column::LastHeartbeatAt.lt(cutoff))
            .exec(&state.db)
            .await;
        // Housekeeping beside it, every few minutes: GPU minutes past
        // their window fold into hours, hours past the retention go.
        let housekeeping = purged.is_none_or(|t: std::time::Instant| t.elapsed() >= PURGE_EVERY);
        if housekeeping {
            purged = Some(std::time::Instant::now());
            if let Err(e) = crate::app::gpu_telemetry::roll_up(&state).await {
                tracing::warn!(error = %e, "old GPU figures could not be rolled up");
            }
        }
        // Shares kept by hosts that can no longer keep them move on:
        // when hosts were lost, and every few minutes for keepers whose
        // shared filesystem is in trouble.
        let some_lost = matches!(&lost, Ok(r) if r.rows_affected > 0);
        if some_lost || housekeeping {
            // Hosts found silent before the host-loss policy existed (or set
            // unreachable by hand) count from now.
            if let Err(e) = hosts::Entity::update_many()
                .col_expr(
                    hosts::Column::UnreachableSince,
                    sea_orm::sea_query::Expr::value(Some(state.config.clock.now())),
                )
                .filter(hosts::Column::State.eq(HostState::Unreachable.to_text()))
                .filter(hosts::Column::UnreachableSince.is_null())
                .exec(&state.db)
                .await
            {
                tracing::warn!(error = %e, "unreachable hosts' times could not be set");
            }
            if let Err(e) = crate::app::shares::rekeep(&state).await {
                tracing::warn!(error = %e, "shares' keepers could not be moved");
            }
        }
        if let Err(e) = crate::app::maintenance::pass(&state).await {
            tracing::warn!(error = %e, "maintenance windows could not be opened");
        }
        if let Err(e) = crate::app::host_loss::pass(&state).await {
            tracing::warn!(error = %e, "lost hosts' VMs could not be handled");
        }
        // Clusters' health right after hosts are lost, else every couple
        // of seconds (it reads every member).
        if some_lost || assessed.is_none_or(|t: std::time::Instant| t.elapsed() >= ASSESS_EVERY) {
            assessed = Some(std::time::Instant::now());
            if let Err(e) = crate::app::cluster_repair::pass(&state).await {
                tracing::warn!(error = %e, "clusters' health could not be assessed");
            }
        }
        match lost {
            Ok(r) if r.rows_affected > 0 => {
                tracing::warn!(hosts = r.rows_affected, "hosts became unreachable")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "lost-host detector could not run"),
        }
    }
}
