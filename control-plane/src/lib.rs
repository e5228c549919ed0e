//! `kumo-server`: the control plane. The database is the source of truth;
//! handlers are thin and pure rules (names, roles, paging) live in small
//! modules beside them.

pub mod access;
pub mod admission;
pub mod allocation_rows;
pub mod api;
pub mod audit;
pub mod auth;
pub mod bootstrap;
pub mod budget;
pub mod capacity;
pub mod clock;
pub mod config;
pub mod db;
pub mod dev;
pub mod device_login;
pub mod entity;
pub mod error;
pub mod extract;
pub mod host_network;
pub mod ipam;
pub mod lifecycle;
pub mod metering;
pub mod metrics;
pub mod middleware;
pub mod names;
pub mod paging;
pub mod portal;
pub mod reaper;
pub mod server;
pub mod signals;
pub mod sso;

pub use server::{AppState, RunningServer};
