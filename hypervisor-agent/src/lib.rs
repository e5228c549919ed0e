//! `kumo-agent`: one per GPU host. It registers with the server, reports
//! the host's topology, and reconciles libvirt towards the host's desired
//! state — level-triggered and idempotent: it creates what is missing,
//! removes what should not exist, adopts what survived its own restart,
//! and never touches a domain that is not its host's.

pub mod client;
pub mod console;
pub mod credential;
pub mod fabric_manager;
pub mod guest_files;
pub mod nccl_net;
pub mod reconcile;
pub mod roce_ports;
pub mod run;
pub mod shares;
pub mod storage;
pub mod telemetry;
pub mod transfer;
