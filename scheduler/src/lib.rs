//! Where VMs and training clusters go. Pure: an in-memory [`Index`] of
//! every host's free devices, CPUs and memory, kept in step with the
//! database by its owner (the server), and functions that choose over it.
//! The database commit stays the arbiter; a choice is only a proposal.

pub mod bench;
pub mod cluster;
pub mod disk;
pub mod index;
pub mod place;
pub mod profile;
pub mod reclaim;
pub mod reservations;
pub mod spares;

pub use cluster::{place_cluster, ClusterRequest};
pub use disk::{DiskUse, HostDisk, Pool};
pub use index::{Hold, HostInput, HostUse, Index};
pub use place::{Choice, Request, Strategy};
pub use profile::HostProfile;
pub use spares::Spare;
