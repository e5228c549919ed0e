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
    pub metrics: Arc<Metrics>,
    pub config: Arc<Config>,
    pub signals: Arc<crate::signals::HostSignals>,
    pub consoles: Arc<crate::consoles::ConsoleHub>,
    pub capacity: Arc<crate::store::capacity::Capacity>,
    pub sso: Arc<crate::oidc::Sso>,
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
