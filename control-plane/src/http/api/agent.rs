//! The agent protocol under `/agent/v1`: registration with a join token,
//! heartbeats, the long-polled desired state, and status reports. Agents
//! authenticate with their host credential (`kumoh_…`); anything an agent
//! says about a VM of another host is refused.

use std::time::Duration;

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use chrono::Utc;
use kumo_api_types::{
    ActualState, AgentHeartbeat, AgentRegister, AgentRegistered, DesiredParams, DesiredState,
    DesiredVm, HostState, PreemptionNotice, StatusReport, VmState,
};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QuerySelect, Set, TransactionTrait,
};
use uuid::Uuid;

use super::Problems;
use crate::entity::{allocations, clusters, hosts, vms};
use crate::error::ApiError;
use crate::store::vms::{desired_power, event, stored_placement, stored_spec, stored_state};

use crate::app::auth;
use crate::context::AppState;
use crate::domain::lifecycle;
use crate::http::extract::{Json, Query};

/// How long a desired-state request waits for a change.
pub const LONG_POLL: Duration = Duration::from_secs(25);

/// An agent, authenticated by its host credential.
pub struct HostCaller(pub hosts::Model);

impl FromRequestParts<AppState> for HostCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Self, ApiError> {
        let invalid = || {
            ApiError::Unauthenticated(
                "send the host credential as `Authorization: Bearer kumoh_…`".into(),
            )
        };
        let token = crate::http::extract::bearer_token(&parts.headers)
            .and_then(Result::ok)
            .ok_or_else(invalid)?;
        let (id, secret) = auth::parse_prefixed(token, auth::HOST_PREFIX).ok_or_else(invalid)?;
        let host = hosts::Entity::find_by_id(id)
            .one(&st.db)
            .await?
            .ok_or_else(invalid)?;
        if !auth::secret_matches(secret, &host.credential_hash)
            || host.state == HostState::Retired.as_str()
        {
            return Err(invalid());
        }
        Ok(HostCaller(host))
    }
}

/// Register a host with a join token (each counts its uses); answers the
/// host's own credential. A registered name is taken again only by its
/// agent showing its current credential (`Authorization: Bearer kumoh_…`,
/// an agent that lost its state otherwise) or after an administrator's
/// `kumo host rejoin`; the old credential dies.
#[utoipa::path(
    post, path = "/agent/v1/register", tag = "agent", security(()),
    request_body = AgentRegister,
    responses((status = 201, description = "Registered", body = AgentRegistered), Problems)
)]
pub async fn register(
    State(st): State<AppState>,
    headers: axum::http::HeaderMap,
    origin: crate::app::hosts::Origin,
    Json(body): Json<AgentRegister>,
) -> Result<(StatusCode, axum::Json<AgentRegistered>), ApiError> {
    let current = crate::http::extract::bearer_token(&headers).and_then(Result::ok);
    let (host_id, credential) = crate::app::hosts::register(&st, &body, current, &origin).await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(AgentRegistered {
            host_id,
            credential,
        }),
    ))
}

/// Heartbeat, optionally with a fresh inventory.
#[utoipa::path(
    post, path = "/agent/v1/heartbeat", tag = "agent", security(("host" = [])),
    request_body = AgentHeartbeat,
    responses((status = 204, description = "Noted"), Problems)
)]
pub async fn heartbeat(
    State(st): State<AppState>,
    HostCaller(host): HostCaller,
    Json(body): Json<AgentHeartbeat>,
) -> Result<StatusCode, ApiError> {
    let back = host.state == HostState::Unreachable.as_str();
    let name = host.name.clone();
    let id = host.id;
    let underlay = host.underlay_ip.clone();
    let drained = host.drained;
    let mut a: hosts::ActiveModel = host.into();
    a.last_heartbeat_at = Set(Utc::now());
    if back {
        a.state = Set(crate::store::hosts::reachable_state(drained)
            .as_str()
            .into());
    }
    if let Some(t) = &body.topology {
        crate::app::hosts::validate_topology(t)?;
        let text = serde_json::to_string(t).map_err(|e| ApiError::Internal(e.to_string()))?;
        a.topology_digest = Set(Some(auth::hash_secret(&text)));
        a.topology = Set(text);
    }
    if let Some(f) = &body.fabric {
        if f.len() > 64 || f.iter().any(|p| p.vfs.len() > 256) {
            return Err(ApiError::field("fabric", "at most 64 ports of 256 VFs"));
        }
        a.fabric = Set(Some(
            serde_json::to_string(f).map_err(|e| ApiError::Internal(e.to_string()))?,
        ));
    }
    let moved = body.underlay_ip.is_some() && body.underlay_ip.map(|u| u.to_string()) != underlay;
    if moved {
        crate::app::hosts::check_underlay(body.underlay_ip)?;
        a.underlay_ip = Set(body.underlay_ip.map(|u| u.to_string()));
    }
    a.update(&st.db)
        .await
        .map_err(|e| crate::app::hosts::underlay_taken(e, body.underlay_ip))?;
    if moved {
        crate::app::hosts::underlay_moved(&st.db).await?;
        st.capacity.refresh_host(&st.db, id).await?;
        tracing::info!(host = %name, underlay = ?body.underlay_ip, "underlay address changed");
    }
    if back {
        tracing::info!(host = %name, "host reachable again");
    }
    Ok(StatusCode::NO_CONTENT)
}

/// The revision an agent sees: its VMs' and its networks' changes.
/// Both only grow, so their sum does.
fn seen_revision(h: &hosts::Model) -> i64 {
    h.revision.saturating_add(h.network_revision)
}

async fn desired_of(st: &AppState, host: &hosts::Model) -> Result<DesiredState, ApiError> {
    let rows = vms::Entity::find()
        .filter(vms::Column::HostId.eq(host.id))
        .all(&st.db)
        .await?;
    let cluster_ids: Vec<Uuid> = rows.iter().filter_map(|v| v.cluster_id).collect();
    let mut hostfiles = std::collections::HashMap::new();
    for c in clusters::Entity::find()
        .filter(clusters::Column::Id.is_in(cluster_ids))
        .all(&st.db)
        .await?
    {
        hostfiles.insert(
            c.id,
            crate::store::clusters::cluster_hostfile(&st.db, &c).await?,
        );
    }
    let mut net = crate::app::host_network::load(&st.db, host, &rows).await?;
    let mut out = Vec::new();
    let mut remove = Vec::new();
    for v in rows {
        let state = stored_state(&v)?;
        if matches!(
            state,
            VmState::Deleting | VmState::Deleted | VmState::Preempted
        ) {
            remove.push(v.id);
            continue;
        }
        let Some(placement) = stored_placement(&v)? else {
            continue;
        };
        let spec = stored_spec(&v)?;
        let preemption = match (state, v.preempt_deadline) {
            (VmState::Preempting, Some(deadline)) => Some(PreemptionNotice {
                vm: v.id,
                deadline,
                action: if spec.gpus == 0 {
                    "suspend"
                } else {
                    "shutdown"
                }
                .into(),
            }),
            _ => None,
        };
        out.push(DesiredVm {
            id: v.id,
            name: v.name.clone(),
            power: desired_power(&v)?,
            power_generation: v.power_generation,
            spec,
            placement,
            preemption,
            hostfile: v.cluster_id.and_then(|c| hostfiles.get(&c).cloned()),
            nics: net.nics.remove(&v.id).unwrap_or_default(),
        });
    }
    Ok(DesiredState {
        revision: seen_revision(host),
        vms: out,
        remove,
        network: net.network,
    })
}

/// Everything that should exist on this host. With `after`, waits until
/// the revision passes it (at most 25 s), so changes arrive at once.
#[utoipa::path(
    get, path = "/agent/v1/desired", tag = "agent", security(("host" = [])),
    params(DesiredParams),
    responses((status = 200, description = "Desired state", body = DesiredState), Problems)
)]
pub async fn desired(
    State(st): State<AppState>,
    HostCaller(host): HostCaller,
    Query(q): Query<DesiredParams>,
) -> Result<axum::Json<DesiredState>, ApiError> {
    let deadline = tokio::time::Instant::now() + LONG_POLL;
    let mut current = host;
    if let Some(after) = q.after {
        while seen_revision(&current) <= after && tokio::time::Instant::now() < deadline {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            st.signals
                .wait(current.id, left.min(Duration::from_secs(1)))
                .await;
            current = hosts::Entity::find_by_id(current.id)
                .one(&st.db)
                .await?
                .ok_or_else(|| ApiError::Unauthenticated("host no longer exists".into()))?;
        }
    }
    Ok(axum::Json(desired_of(&st, &current).await?))
}

/// What the agent found: each VM's actual state.
#[utoipa::path(
    post, path = "/agent/v1/status", tag = "agent", security(("host" = [])),
    request_body = StatusReport,
    responses((status = 204, description = "Applied"), Problems)
)]
pub async fn status(
    State(st): State<AppState>,
    HostCaller(host): HostCaller,
    Json(report): Json<StatusReport>,
) -> Result<StatusCode, ApiError> {
    if report.vms.len() > 10_000 {
        return Err(ApiError::field("vms", "too many entries"));
    }
    let now = st.config.clock.now();
    let txn = st.db.begin().await?;
    let mut freed = false;
    // Hosts sharing a segment with a VM that left: woken after the commit.
    let mut peers: Vec<Uuid> = Vec::new();
    // Rows are locked in id order (a report never deadlocks another), and
    // held to the commit: an API action on one of these VMs waits for this
    // report, or this report sees the action, never a mix.
    let mut entries: Vec<&kumo_api_types::VmStatus> = report.vms.iter().collect();
    entries.sort_by_key(|s| s.id);
    for s in entries {
        let Some(vm) = vms::Entity::find_by_id(s.id)
            .lock_exclusive()
            .one(&txn)
            .await?
        else {
            continue; // already gone: nothing to apply
        };
        if vm.host_id.is_none() && s.state == ActualState::Absent {
            continue; // released already (a preempted VM): a repeated report
        }
        // A host speaking for another host's VM is forging: the whole report
        // is refused. What a guest or libvirt wrote is another matter: an
        // entry whose text does not fit is dropped (and logged), and the
        // rest of the host's report still counts.
        if vm.host_id != Some(host.id) {
            tracing::warn!(host = %host.name, vm = %s.id, "agent reported a VM of another host; refused");
            return Err(ApiError::validation(format!(
                "VM {} does not belong to host {}",
                s.id, host.name
            )));
        }
        if !s.texts_fit() {
            tracing::warn!(host = %host.name, vm = %s.id, "a status entry's text has control characters or is too long; entry dropped");
            continue;
        }
        if let Some(notice) = &s.notice {
            event(
                &txn,
                &vm,
                st.config.clock.now(),
                "preemption-notice",
                notice.clone(),
            )
            .await?;
        }
        let state = stored_state(&vm)?;
        if state == VmState::Preempted && s.state == ActualState::Absent {
            // Gone from the host: its devices are free; the row stays so
            // the tenant sees what happened.
            release(&txn, &vm).await?;
            peers.extend(crate::app::host_network::touch_peers(&txn, vm.id).await?);
            let mut a: vms::ActiveModel = vm.into();
            a.host_id = Set(None);
            a.updated_at = Set(Utc::now());
            a.update(&txn).await?;
            freed = true;
            continue;
        }
        if s.guest.is_some() && s.guest != vm.guest_condition {
            let mut a: vms::ActiveModel = vm.clone().into();
            a.guest_condition = Set(s.guest.clone());
            a.update(&txn).await?;
        }
        let Some(next) = lifecycle::observe(stored_state(&vm)?, desired_power(&vm)?, s.state)
        else {
            continue;
        };
        let message = s
            .reason
            .clone()
            .unwrap_or_else(|| format!("reported by {}", host.name));
        event(&txn, &vm, st.config.clock.now(), next.as_str(), message).await?;
        if next == VmState::Deleted {
            release(&txn, &vm).await?;
            peers.extend(crate::app::vms::delete_row(&txn, &vm, now).await?);
            freed = true;
            continue;
        }
        if next == VmState::Suspended {
            // Saved to disk: its CPUs and memory go to others meanwhile.
            release(&txn, &vm).await?;
            freed = true;
        }
        let model = crate::app::metering::billable(next)
            .then(|| crate::app::metering::gpu_model_of(&st, &vm))
            .flatten();
        crate::app::metering::transition(&txn, &vm, stored_state(&vm)?, next, model, now).await?;
        let mut a: vms::ActiveModel = vm.into();
        a.state = Set(next.as_str().to_owned());
        a.reason = Set(if next == VmState::Error {
            s.reason.clone()
        } else {
            None
        });
        a.updated_at = Set(Utc::now());
        a.update(&txn).await?;
    }
    txn.commit().await?;
    for h in peers {
        st.signals.notify(h);
    }
    if freed {
        st.capacity.refresh_host(&st.db, host.id).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

async fn release(txn: &sea_orm::DatabaseTransaction, vm: &vms::Model) -> Result<(), ApiError> {
    allocations::Entity::delete_many()
        .filter(allocations::Column::VmId.eq(vm.id))
        .exec(txn)
        .await?;
    Ok(())
}
