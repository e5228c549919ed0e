//! Reservations: GPUs of one model held free for a project over a window.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// Asks for capacity held for a project from `starts_at` to `ends_at`.
/// Platform admins may reserve any GPUs in service; a project's owners
/// only within the project's guaranteed share of the model (counting its
/// other reservations that overlap the window).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReservationCreate {
    pub name: String,
    /// GPUs held, of `gpu_model`.
    pub gpus: u32,
    pub gpu_model: String,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    /// What becomes of the reservation's VMs when it ends: `release` (the
    /// default: they go on as ordinary guaranteed VMs, counted against the
    /// project's share) or `stop`.
    #[serde(default)]
    pub end_policy: EndPolicy,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EndPolicy {
    #[default]
    Release,
    Stop,
}

impl EndPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            EndPolicy::Release => "release",
            EndPolicy::Stop => "stop",
        }
    }
}

/// Where a reservation is in its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReservationState {
    /// Before its preparation: nothing held yet.
    Scheduled,
    /// Shortly before the start: hosts are held (nothing else may start
    /// on them) and the spot and borrowed VMs on them have notice.
    Preparing,
    /// Between start and end: its VMs may be placed, and it is charged.
    Active,
    /// Past its end, or cancelled (deleted): nothing held, charges closed.
    Ended,
}

impl ReservationState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReservationState::Scheduled => "scheduled",
            ReservationState::Preparing => "preparing",
            ReservationState::Active => "active",
            ReservationState::Ended => "ended",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Reservation {
    pub id: Uuid,
    pub name: String,
    pub tenant: String,
    pub gpus: u32,
    pub gpu_model: String,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub end_policy: EndPolicy,
    pub state: ReservationState,
    /// GPUs of the model on the hosts held for it that it can use (spot
    /// and borrowed VMs there count as usable: they have notice).
    pub held_gpus: u32,
    /// GPUs its VMs take.
    pub used_gpus: u32,
    /// Why it holds fewer GPUs than reserved, while it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short: Option<String>,
    pub created_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<DateTime<Utc>>,
}
