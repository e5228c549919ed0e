//! The agent protocol under `/agent/v1`: registration with a join token,
//! heartbeats, the long-polled desired state, and status reports. Agents
//! authenticate with their host credential (`kumoh_…`); anything an agent
//! says about a VM of another host is refused.

use std::time::Duration;

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use kumo_api_types::{
    AgentHeartbeat, AgentRegister, AgentRegistered, DesiredParams, DesiredState, HostState,
    StatusReport,
};

use super::Problems;
use crate::app::auth;
use crate::context::AppState;
use crate::entity::hosts;
use crate::error::ApiError;
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
        // Kept between the host's changes (`HostRows`): a beat that
        // changes nothing reads no database.
        let host = st
            .capacity
            .host_rows
            .get(&st.reads, id)
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
    origin: crate::context::Origin,
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
    origin: crate::context::Origin,
    Json(body): Json<AgentHeartbeat>,
) -> Result<StatusCode, ApiError> {
    crate::app::agents::heartbeat(&st, host, &body, &origin).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// What the host's GPU guests said of their GPUs (`nvidia-smi` and
/// XIDs, read through their guest agents).
#[utoipa::path(
    post, path = "/agent/v1/telemetry", tag = "agent", security(("host" = [])),
    request_body = kumo_api_types::TelemetryReport,
    responses((status = 204, description = "Noted"), Problems)
)]
pub async fn telemetry(
    State(st): State<AppState>,
    HostCaller(host): HostCaller,
    origin: crate::context::Origin,
    Json(body): Json<kumo_api_types::TelemetryReport>,
) -> Result<StatusCode, ApiError> {
    crate::app::gpu_telemetry::ingest(&st, &host, &body, &origin).await?;
    Ok(StatusCode::NO_CONTENT)
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
    let mut seen = st.signals.seen(host.id);
    // The row is read afresh here, not taken as `HostCaller` kept it: the
    // revision answered and compared is the database's.
    let current = loop {
        // Read after taking the count: a change landing meanwhile is
        // either in this row or counted, so no wake-up is missed.
        let current = crate::store::hosts::by_id_without_topology(&st.reads, host.id)
            .await?
            .ok_or_else(|| ApiError::Unauthenticated("host no longer exists".into()))?;
        let Some(after) = q.after else {
            break current;
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        tracing::debug!(host = %current.id, seen, revision = crate::app::agents::seen_revision(&current), after, "long poll read");
        if crate::app::agents::seen_revision(&current) > after
            || left.is_zero()
            || st.signals.closing()
        {
            break current;
        }
        // Woken by a change made here, or by the host-change follower
        // for one made by another replica (within a second).
        st.signals.wait(current.id, seen, left).await;
        seen = st.signals.seen(current.id);
    };
    Ok(axum::Json(
        crate::app::agents::desired(&st, &current).await?,
    ))
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
    origin: crate::context::Origin,
    Json(report): Json<StatusReport>,
) -> Result<StatusCode, ApiError> {
    // Before the VMs' states: a device leaves the pool before the VM that
    // let it go releases it.
    crate::app::device_health::released_unfit(&st, &host, &report.unfit, &origin).await?;
    crate::app::agents::apply_status(&st, &host, &report).await?;
    Ok(StatusCode::NO_CONTENT)
}
