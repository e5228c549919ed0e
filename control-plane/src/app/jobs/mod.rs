//! Background jobs. Each runs on every replica and is idempotent, so
//! several running at once do no harm; they call the same operations as
//! the API.

pub mod edge_keeper;
pub mod host_changes;
pub mod lease_keeper;
pub mod ledger_compaction;
pub mod lost_hosts;
pub mod reclaimer;
pub mod replicas;
