//! Pure rules over plain data: no database, no HTTP, no clock of their own.

pub mod churn;
pub mod cluster_health;
pub mod device_health;
pub mod faults;
pub mod gpu_telemetry;
pub mod guarantees;
pub mod idle_gpus;
pub mod imports;
pub mod ingress;
pub mod ipam;
pub mod lifecycle;
pub mod maintenance;
pub mod names;
pub mod paging;
pub mod public_net;
pub mod queue;
pub mod quota;
pub mod reservations;
pub mod sessions;
pub mod shares;
pub mod specs;
pub mod states;
