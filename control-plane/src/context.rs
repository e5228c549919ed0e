//! What every layer above the store shares: the application state (the
//! database pool, configuration, clock, caches and wake-up signals) and the
//! actor an operation runs for.

use std::sync::Arc;

use sea_orm::DatabaseConnection;

use uuid::Uuid;

use crate::config::Config;
use crate::entity::users;
use crate::metrics::Metrics;

#[derive(Clone)]
pub struct AppState {
    pub db: DatabaseConnection,
    /// For reads outside a transaction on the hottest paths (agents'
    /// requests, listings): on SQLite, read-only connections beside the
    /// one writer (`db::open_reads`); otherwise `db` itself.
    pub reads: DatabaseConnection,
    pub metrics: Arc<Metrics>,
    pub config: Arc<Config>,
    pub signals: Arc<crate::signals::HostSignals>,
    /// Heartbeats not yet written (see [`crate::leases`]).
    pub leases: Arc<crate::leases::HostLeases>,
    pub consoles: Arc<crate::consoles::ConsoleHub>,
    pub capacity: Arc<crate::store::capacity::Capacity>,
    pub sso: Arc<crate::oidc::Sso>,
    /// Each tenant's allowance of changes to shared hosts, on this replica.
    pub churn: Arc<SharedHostChanges>,
    /// When this replica's idle pass last judged each GPU VM: the next
    /// pass reads its minutes from there on (the VM's idle row carries
    /// the spell), not its policy's whole window.
    pub idle_checked: Arc<IdleChecked>,
    /// The GPU models last found guaranteed beyond those in service (a
    /// warning is logged when this changes).
    pub overpromised: Arc<std::sync::Mutex<Vec<String>>>,
}

/// VM → the time of its last idle judgement, on this replica.
#[derive(Default)]
pub struct IdleChecked {
    at: std::sync::Mutex<std::collections::HashMap<Uuid, chrono::DateTime<chrono::Utc>>>,
}

impl IdleChecked {
    pub fn get(&self, vm: Uuid) -> Option<chrono::DateTime<chrono::Utc>> {
        self.at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&vm)
            .copied()
    }

    pub fn set(&self, vm: Uuid, at: chrono::DateTime<chrono::Utc>) {
        self.at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(vm, at);
    }

    /// Only the VMs still judged are remembered.
    pub fn keep(&self, vms: &std::collections::HashSet<Uuid>) {
        self.at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|vm, _| vms.contains(vm));
    }
}

/// Per tenant, what is left of its allowance of changes that reprogram
/// shared hosts (see `domain::churn`). Kept by each replica for the
/// requests it serves: behind N replicas a tenant gets up to N times the
/// allowance, still bounded.
#[derive(Default)]
pub struct SharedHostChanges {
    buckets: std::sync::Mutex<std::collections::HashMap<uuid::Uuid, crate::domain::churn::Bucket>>,
}

impl SharedHostChanges {
    /// One change for `tenant` now, or the seconds to wait.
    pub fn take(
        &self,
        tenant: uuid::Uuid,
        allowance: &crate::domain::churn::Allowance,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), u64> {
        use crate::domain::churn::Bucket;
        let mut all = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let b = all
            .get(&tenant)
            .copied()
            .unwrap_or_else(|| Bucket::full(allowance, now));
        let after = b.take(allowance, now)?;
        all.insert(tenant, after);
        Ok(())
    }
}

/// Where and when a request came from, as the audit log records it: the
/// client's address, the id the server gave the request (and the client's
/// own id, if it sent a clean one), and the arrival time by the state's
/// clock.
#[derive(Debug, Clone)]
pub struct Origin {
    pub source_ip: String,
    pub request_id: String,
    pub client_request_id: Option<String>,
    pub at: chrono::DateTime<chrono::Utc>,
}

/// Who asks for an operation and from where: the authenticated caller, the
/// request ids and the source address recorded in the audit log.
#[derive(Debug, Clone)]
pub struct Actor {
    pub caller: Caller,
    pub request_id: String,
    pub client_request_id: Option<String>,
    pub source_ip: String,
    /// When the request arrived, by the state's clock: what the operation
    /// stamps its rows and audit entry with.
    pub at: chrono::DateTime<chrono::Utc>,
}

impl Actor {
    pub fn new(caller: Caller, origin: Origin) -> Actor {
        Actor {
            caller,
            request_id: origin.request_id,
            client_request_id: origin.client_request_id,
            source_ip: origin.source_ip,
            at: origin.at,
        }
    }
}

/// Who is calling: the authenticated user and the token used.
#[derive(Debug, Clone)]
pub struct Caller {
    pub user: users::Model,
    pub token_id: Uuid,
}

impl Caller {
    pub fn is_admin(&self) -> bool {
        self.user.is_admin
    }
}
