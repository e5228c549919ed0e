//! Request middleware, outermost first: request ids, problem
//! normalisation, security headers, metrics, authentication, idempotency.

pub mod authn;
pub mod headers;
pub mod idempotency;
pub mod metrics;
pub mod problems;
pub mod request_ids;
