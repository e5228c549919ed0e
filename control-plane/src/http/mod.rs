//! The HTTP edge: axum routers, extractors and middleware. Entry points
//! parse a request, call an `app::` operation and map its answer.

pub mod api;
pub mod device_login;
pub mod extract;
pub mod middleware;
pub mod portal;
pub mod router;
pub mod sso;
