//! `kumo-server`: the control plane, in one-way layers (see
//! `ARCHITECTURE.md`, "Architecture invariants"):
//!
//! - `http/` — axum only: the REST API, the agent API, the portal, SSO,
//!   middleware and extractors; it maps requests to `app::` operations and
//!   their answers to `kumo-api-types`;
//! - `app/` — one function per use case: transactions, access and quota
//!   checks, audit entries, wake-ups after commit; background jobs in
//!   `app/jobs/`;
//! - `store/` — queries, one file per aggregate, over any connection or
//!   transaction;
//! - `domain/` — pure rules over plain data;
//! - beneath them all: `context` (the shared state), `config`, `clock`,
//!   `error`, `entity` (the tables), `db`, `metrics`, `signals`, `oidc`.
//!
//! Nothing calls upward; `cargo xtask layers` checks it.

pub mod app;
pub mod backup;
pub mod bench;
pub mod clock;
pub mod config;
pub mod consoles;
pub mod context;
pub mod db;
pub mod dev;
pub mod domain;
pub mod entity;
pub mod error;
pub mod http;
pub mod leases;
pub mod metrics;
pub mod oidc;
pub mod server;
pub mod signals;
pub mod store;

pub use context::AppState;
pub use server::RunningServer;
