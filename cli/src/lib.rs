//! The `kumo` command-line client, and the typed HTTP client it is built on
//! (the tests use the same client).

pub mod billing;
pub mod browser_login;
pub mod client;
pub mod commands;
pub mod console;
pub mod device_login;
pub mod hints;
pub mod idle;
pub mod output;
pub mod profile;
pub mod progress;
pub mod public_net;
pub mod shares;
pub mod ssh;
pub mod volumes;

pub use client::{Client, ClientError};
