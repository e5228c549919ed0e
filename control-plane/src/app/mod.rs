//! Use cases, one function each: they own the transaction, the access and
//! quota checks, the audit entry and the wake-ups after commit, and take an
//! [`Actor`](crate::context::Actor), never an HTTP extractor. The REST API,
//! the portal and the background jobs call the same operations.

pub mod access;
pub mod admission;
pub mod agents;
pub mod audit;
pub mod auth;
pub mod billing;
pub mod bootstrap;
pub mod budget;
pub mod churn;
pub mod cluster_repair;
pub mod clusters;
pub mod consoles;
pub mod dashboard;
pub mod device_health;
pub mod disk_moves;
pub mod edges;
pub mod fleet;
pub mod fleet_metrics;
pub mod gpu_telemetry;
pub mod guarantees;
pub mod host_loss;
pub mod host_network;
pub mod hosts;
pub mod idle_gpus;
pub mod jobs;
pub mod maintenance;
pub mod members;
pub mod metering;
pub mod public_net;
pub mod queue;
pub mod quotas;
pub mod reservations;
pub mod segments;
pub mod shares;
pub mod templates;
pub mod tenants;
pub mod tokens;
pub mod users;
pub mod vms;
pub mod volumes;
pub mod webhooks;
