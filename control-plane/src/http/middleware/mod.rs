//! Request middleware, outermost first: problem normalisation, metrics,
//! authentication, idempotency.

pub mod authn;
pub mod headers;
pub mod idempotency;
pub mod metrics;
pub mod problems;
