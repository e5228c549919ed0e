//! The `kumo` command-line client, and the typed HTTP client it is built on
//! (the tests use the same client).

pub mod args;
pub mod audit;
pub mod billing;
pub mod browser_login;
pub mod client;
pub mod clusters;
pub mod commands;
pub mod console;
pub mod device_login;
pub mod hints;
pub mod hosts;
pub mod idle;
pub mod login;
pub mod members;
pub mod output;
pub mod profile;
pub mod progress;
pub mod public_net;
pub mod quota;
pub mod reservations;
pub mod segments;
pub mod shares;
pub mod ssh;
pub mod templates;
pub mod tenants;
pub mod tokens;
pub mod users;
pub mod vms;
pub mod volumes;

pub use client::{Client, ClientError};
