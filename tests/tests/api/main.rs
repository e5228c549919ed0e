//! Tests of the whole API through real HTTP against a real server on SQLite
//! and on PostgreSQL. One test binary, so the world is linked once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

mod agent;
mod api_fuzz;
mod authz;
mod bad_input;
mod billing;
mod book;
mod cli;
mod console_replicas;
mod crash;
mod dev;
mod device_health;
mod e2e_console;
mod e2e_firmware;
mod e2e_qemu;
mod e2e_shares;
mod e2e_volumes;
mod faults;
mod guarded_figures;
mod host_storage;
mod idempotency;
mod idle_gpus;
mod isolation;
mod networks;
mod nvswitch;
mod openapi;
mod packages;
mod portal_devices;
mod portal_pages;
mod portal_shares;
mod process;
mod public_net;
mod readme;
mod replicas;
mod reservations;
mod resources;
mod scheduling;
mod segments;
mod shares;
mod sso;
mod upgrade;
mod vms;
mod volumes;
