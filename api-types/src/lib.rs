//! Request and response bodies of Kumo's REST API (`/api/v1`).
//!
//! The server derives its OpenAPI document from these types, and the CLI and
//! the tests decode responses with them, so the contract lives in one place.
//! Request bodies reject unknown fields: a misspelt field is an error, not a
//! silently ignored wish.
//!
//! The types are laid out by resource, a module each, and every one is
//! re-exported here: callers name them from the crate root, wherever they
//! live.

mod agent;
mod billing;
mod clusters;
mod common;
mod console;
mod hosts;
mod identity;
mod idle;
mod networks;
mod public_net;
mod reservations;
mod storage;
mod templates;
mod vms;

pub use agent::*;
pub use billing::*;
pub use clusters::*;
pub use common::*;
pub use console::*;
pub use hosts::*;
pub use identity::*;
pub use idle::*;
pub use networks::*;
pub use public_net::*;
pub use reservations::*;
pub use storage::*;
pub use templates::*;
pub use vms::*;
