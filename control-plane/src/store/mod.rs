//! Every query, one file per aggregate. Functions take a connection or a
//! transaction (`&impl ConnectionTrait`), never the application state, so
//! a query cannot escape the transaction its caller opened.

use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, Select};
use uuid::Uuid;

pub mod allocations;
pub mod billing;
pub mod capacity;
pub mod clusters;
pub mod consoles;
pub mod device_health;
pub mod gpu_telemetry;
pub mod guarantees;
pub mod hosts;
pub mod idempotency;
pub mod identity;
pub mod idle_gpus;
pub mod public_net;
pub mod queue;
pub mod reservations;
pub mod segments;
pub mod shares;
pub mod templates;
pub mod tenancy;
pub mod vms;
pub mod volumes;

/// Narrows `q` to the row `reference` names: by id when it parses as a
/// UUID, by name otherwise. Every resource is addressed both ways.
pub fn name_or_id<E: EntityTrait>(
    q: Select<E>,
    id: E::Column,
    name: E::Column,
    reference: &str,
) -> Select<E> {
    match Uuid::try_parse(reference) {
        Ok(u) => q.filter(id.eq(u)),
        Err(_) => q.filter(name.eq(reference)),
    }
}
