//! Tenant networks on a host, converged through netlink: per VNI a VXLAN
//! device `kvx<VNI>` (local underlay address, port 4789, learning off) as
//! a port of a bridge `kbr<VNI>` (learning off, `neigh_suppress` on); the
//! head-end flood list (an all-zero FDB entry per remote VTEP); static
//! FDB entries and bridge neighbour entries for every remote VM
//! (l2population style). Anything else of that shape is removed; nothing
//! else is touched; applying the same state twice changes nothing.
//!
//! `state` (the input, checked whole) and `plan` (the diff) are pure;
//! `kernel` is the netlink edge.

#[cfg(feature = "kernel")]
pub mod edge;
pub mod edge_rules;
#[cfg(feature = "kernel")]
pub mod fabric;
pub mod filter;
#[cfg(feature = "kernel")]
pub mod kernel;
#[cfg(feature = "netns")]
pub mod netns;
#[cfg(feature = "kernel")]
pub mod nft;
pub mod plan;
pub mod roce;
pub mod state;
#[cfg(feature = "testbed")]
pub mod testbed;

#[cfg(feature = "kernel")]
pub use kernel::{converge, converge_each, Converged, Kernel, NetError};
pub use plan::{plan, Change, Observed};
pub use state::{DesiredState, Endpoint, Mac, Segment, StateError};
