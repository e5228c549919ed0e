//! Topology, guest layout and rendering on generated sysfs trees of real
//! machine designs. One test binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod gpu_telemetry;
mod guest;
mod machines;
mod random_trees;
mod signals;
