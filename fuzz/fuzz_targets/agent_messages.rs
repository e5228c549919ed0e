//! What crosses the wire between agent and server, as JSON: registrations
//! and heartbeats (the server reads them), status reports (the server),
//! and desired states (the agent). Each must parse or be refused, survive a
//! round trip unchanged, and — when it carries a topology or placements —
//! go through everything the receiving side computes from it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;

use kumo_api_types::{AgentHeartbeat, AgentRegister, DesiredState, StatusReport};

/// Parses, and checks that writing and reading again gives the same JSON.
fn round_trip<T: DeserializeOwned + Serialize>(data: &[u8]) -> Option<T> {
    let v: T = serde_json::from_slice(data).ok()?;
    let once = serde_json::to_value(&v).expect("a parsed message serializes");
    let again: T = serde_json::from_value(once.clone()).expect("a message reads back");
    assert_eq!(serde_json::to_value(&again).ok(), Some(once));
    Some(v)
}

fn desired(d: &DesiredState) {
    // The machine with every kind of device: GPUs, NVLinks, RoCE NICs.
    let topo = &kumo_fuzz::fixture_topologies()[0];
    for vm in &d.vms {
        let _ = kumo_agent::reconcile::cloud_init(vm);
        let _ = kumo_agent::reconcile::network_config(vm);
        let _ = kumo_agent::reconcile::bridge_nics(vm);
        let Ok(layout) = kumo_topology::guest_layout::guest_layout(topo, &vm.placement) else {
            continue;
        };
        if let Ok(xml) = kumo_topology::nccl_xml::nccl_topology_xml(topo, &layout) {
            kumo_fuzz::well_formed(&xml);
        }
    }
    let _ = kumo_agent::roce_ports::wanted(topo, d);
}

fuzz_target!(|data: &[u8]| {
    let Some((kind, body)) = data.split_first() else {
        return;
    };
    match kind % 4 {
        0 => {
            if let Some(r) = round_trip::<AgentRegister>(body) {
                kumo_fuzz::exercise_topology(&r.topology);
            }
        }
        1 => {
            if let Some(h) = round_trip::<AgentHeartbeat>(body) {
                if let Some(t) = &h.topology {
                    kumo_fuzz::exercise_topology(t);
                }
            }
        }
        2 => {
            let _ = round_trip::<StatusReport>(body);
        }
        _ => {
            if let Some(d) = round_trip::<DesiredState>(body) {
                desired(&d);
            }
        }
    }
});
