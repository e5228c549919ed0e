//! Lost hosts with a policy: a host unreachable longer than the platform
//! waits (`[hosts] lost_after_secs`, on the state's clock) loses its VMs.
//! Each is `lost` (charged nothing, counted in no quota, its owners told;
//! it resumes if the host returns) or, when it asked to be
//! (`on_host_loss: recreate`), made again on another host with its name,
//! addresses and attachments on a fresh root disk. Members of clusters
//! that repair themselves are left to their cluster.
//!
//! A host that returns is told which VMs are still its own: the recreated
//! ones are not, so it removes them (and their disks) before it starts
//! anything, and no VM runs twice.

use kumo_api_types::{HostLossAction, HostState, Power, VmState};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QuerySelect, TransactionTrait};
use serde_json::json;
use uuid::Uuid;

use crate::context::AppState;
use crate::domain::states::StoredText;
use crate::entity::{hosts, vms};
use crate::error::ApiError;
use crate::store::vms::{event, stored_spec, stored_state};

/// The states a VM loses to its host: those it holds the host's devices
/// in. (Deleting and shelving VMs finish when the host returns; spot VMs
/// being reclaimed are the reaper's.)
const LOSABLE: [VmState; 5] = [
    VmState::Scheduled,
    VmState::Provisioning,
    VmState::Running,
    VmState::Stopped,
    VmState::Error,
];

/// One pass: every VM of every host lost for longer than the platform
/// waits, one at a time (one VM's failure is logged and the pass goes on).
pub async fn pass(st: &AppState) -> Result<(), ApiError> {
    let now = st.config.clock.now();
    let limit = chrono::Duration::from_std(st.config.lost_after)
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let lost: Vec<(Uuid, String, Option<chrono::DateTime<chrono::Utc>>)> = hosts::Entity::find()
        .select_only()
        .column(hosts::Column::Id)
        .column(hosts::Column::Name)
        .column(hosts::Column::UnreachableSince)
        .filter(hosts::Column::State.eq(HostState::Unreachable.to_text()))
        .filter(hosts::Column::UnreachableSince.lte(now - limit))
        .into_tuple()
        .all(&st.reads)
        .await?;
    for (host, name, since) in lost {
        let rows = vms::Entity::find()
            .filter(vms::Column::HostId.eq(host))
            .filter(vms::Column::State.is_in(LOSABLE.map(VmState::as_str)))
            .all(&st.db)
            .await?;
        for v in rows {
            if let Err(e) = lose(st, host, &name, since, &v).await {
                tracing::warn!(vm = %v.id, host = %name, error = %e, "a VM of a lost host was not handled");
            }
        }
    }
    Ok(())
}

async fn lose(
    st: &AppState,
    host: Uuid,
    host_name: &str,
    since: Option<chrono::DateTime<chrono::Utc>>,
    read: &vms::Model,
) -> Result<(), ApiError> {
    if let Some(c) = read.cluster_id {
        let repairs = crate::store::clusters::by_id(&st.db, c)
            .await?
            .is_some_and(|c| c.auto_repair);
        if repairs {
            return Ok(());
        }
    }
    let now = st.config.clock.now();
    let since_text = since.map_or_else(|| "a while".to_owned(), |t| t.to_rfc3339());
    let why = format!("its host {host_name} has been unreachable since {since_text}");
    let action = stored_spec(read)?.on_host_loss;
    let txn = st.db.begin().await?;
    // Only as read: a VM deleted, moved or already handled (another
    // replica's pass) is left alone.
    let Some(vm) = crate::store::vms::locked(&txn, read.id).await? else {
        return Ok(());
    };
    if vm.host_id != Some(host) || vm.state != read.state {
        return Ok(());
    }
    // Nor a host that came back since the pass read it.
    let still_lost = crate::store::hosts::by_id_without_topology(&txn, host)
        .await?
        .is_some_and(|h| h.state == HostState::Unreachable.to_text());
    if !still_lost {
        return Ok(());
    }
    let wake = match action {
        HostLossAction::Recreate => {
            replace_off_host(&txn, &vm, &why, "the host-loss policy", now).await?
        }
        HostLossAction::Wait => {
            crate::app::metering::gone(&txn, vm.id, now).await?;
            vms::Entity::update_many()
                .col_expr(vms::Column::State, Expr::value(VmState::Lost.as_str()))
                .col_expr(vms::Column::Reason, Expr::value(Some(why.clone())))
                .col_expr(vms::Column::UpdatedAt, Expr::value(now))
                .filter(vms::Column::Id.eq(vm.id))
                .exec(&txn)
                .await?;
            event(
                &txn,
                &vm,
                now,
                "lost",
                format!("{why}: no longer charged or counted in the quota; it resumes if the host returns, or delete it"),
            )
            .await?;
            Vec::new()
        }
    };
    txn.commit().await?;
    for h in wake {
        st.signals.notify(h);
    }
    let project = crate::store::tenancy::tenant_by_id(&st.db, vm.tenant_id)
        .await?
        .map(|t| t.name)
        .unwrap_or_default();
    crate::app::webhooks::notify(
        st,
        vm.tenant_id,
        "vm.host_lost",
        json!({
            "text": format!("Kumo: VM {} of project {project}: {why}; {}", vm.name, match action {
                HostLossAction::Recreate => "recreated on another host from its template",
                HostLossAction::Wait => "it is lost until the host returns",
            }),
            "event": "vm.host_lost",
            "project": project,
            "vm": vm.name,
            "vm_id": vm.id,
            "host": host_name,
            "action": action.as_str(),
            "at": now,
        }),
    );
    if action == HostLossAction::Recreate {
        let rows: Vec<vms::Model> = vms::Entity::find_by_id(vm.id).all(&st.db).await?;
        crate::app::admission::admit_pending(st, vm.cluster_id, &rows).await?;
    }
    Ok(())
}

/// A VM off its host, back to `pending` for a new one of the same shape
/// elsewhere (a cluster's repair, a lost host's `recreate` policy): its devices released (a
/// quarantined one stays quarantined: its state is the device's, not the
/// allocation's), its old root disk and domain left for the old host to
/// remove should it return, its volumes detached (they stay on that
/// host), its compute charges stopped. Answers the hosts to wake.
pub async fn replace_off_host(
    txn: &sea_orm::DatabaseTransaction,
    vm: &vms::Model,
    why: &str,
    by: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<Uuid>, ApiError> {
    let state = stored_state(vm)?;
    let mut wake = crate::app::host_network::touch_peers(txn, vm.id).await?;
    crate::store::allocations::release_all(txn, vm.id).await?;
    for h in [vm.host_id, vm.disk_host_id].into_iter().flatten() {
        crate::store::vms::mark_stale_disk(txn, vm.id, h, now).await?;
        crate::store::hosts::bump_revision(txn, h).await?;
        wake.push(h);
    }
    let volumes = crate::store::volumes::of_vm(txn, vm.id).await?;
    if !volumes.is_empty() {
        crate::store::volumes::detach_all(txn, vm.id).await?;
        let names: Vec<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
        event(
            txn,
            vm,
            now,
            "volumes-detached",
            format!(
                "{} detached; they stay on the old host until it returns",
                names.join(", ")
            ),
        )
        .await?;
    }
    if state == VmState::Lost {
        // Charged nothing while lost: its new disk is charged from now.
        crate::app::metering::created(txn, vm, now).await?;
    }
    crate::app::metering::transition(txn, vm, state, VmState::Pending, None, now).await?;
    vms::Entity::update_many()
        .col_expr(vms::Column::State, Expr::value(VmState::Pending.as_str()))
        .col_expr(
            vms::Column::Reason,
            Expr::value(Some(format!("replacing: {why}"))),
        )
        .col_expr(vms::Column::HostId, Expr::value(Option::<Uuid>::None))
        .col_expr(vms::Column::Placement, Expr::value(Option::<String>::None))
        .col_expr(vms::Column::DiskHostId, Expr::value(Option::<Uuid>::None))
        .col_expr(vms::Column::UnshelveAnywhere, Expr::value(false))
        .col_expr(
            vms::Column::GuestCondition,
            Expr::value(Option::<String>::None),
        )
        .col_expr(
            vms::Column::PreemptDeadline,
            Expr::value(Option::<chrono::DateTime<chrono::Utc>>::None),
        )
        .col_expr(
            vms::Column::DesiredPower,
            Expr::value(Power::Running.to_text()),
        )
        .col_expr(
            vms::Column::PowerGeneration,
            Expr::col(vms::Column::PowerGeneration).add(1),
        )
        .col_expr(vms::Column::UpdatedAt, Expr::value(now))
        .filter(vms::Column::Id.eq(vm.id))
        .exec(txn)
        .await?;
    event(
        txn,
        vm,
        now,
        "replacing",
        format!(
            "by {by}: {why}; a new VM of the same shape, name and addresses takes its place on a fresh root disk from its template"
        ),
    )
    .await?;
    Ok(wake)
}
