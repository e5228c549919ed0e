//! Device signals read from generated sysfs trees, as the test changes
//! them: AER counters, a narrowed link, a device gone from the bus, a
//! port down.

use std::fs;

use kumo_topology::health::{self, AerCounts};

use crate::common::discover_fixture;

#[test]
fn a_clean_machine_reads_clean_and_changes_show() {
    let (dir, topo) = discover_fixture("hgx-h100");
    let root = dir.path().join("hgx-h100");
    let s = health::read(&root, &topo);
    let gpus: Vec<_> = s.devices.iter().filter(|d| d.kind == "gpu").collect();
    assert_eq!(gpus.len(), 8);
    assert_eq!(s.devices.len(), 8 + topo.nics.len());
    for d in &s.devices {
        assert!(d.present, "{d:?}");
        assert_eq!(d.aer, Some(AerCounts::default()), "{d:?}");
        let l = d.link.unwrap();
        assert!(!l.narrowed() && l.max_width > 0 && l.speed > 0, "{d:?}");
    }
    assert_eq!(s.ports.len(), topo.nics.len());
    assert!(s
        .ports
        .iter()
        .all(|p| p.active() && p.counters.len() == health::PORT_COUNTERS.len()));

    // A fatal error on GPU 0, a narrowed link on GPU 1, NIC 0 off the
    // bus, NIC 1's port down with congestion.
    let dev = |bdf: &str| root.join("bus/pci/devices").join(bdf);
    let (g0, g1) = (gpus[0].bdf.clone(), gpus[1].bdf.clone());
    fs::write(
        dev(&g0).join("aer_dev_fatal"),
        "Undefined 0\nDLP 0\nSDES 0\nTLP 1\nFCP 0\nTOTAL_ERR_FATAL 1\n",
    )
    .unwrap();
    fs::write(dev(&g1).join("current_link_width"), "8\n").unwrap();
    let n0 = topo.nics[0].location.bdf.to_string();
    fs::remove_file(dev(&n0)).unwrap();
    let ib1 = root
        .join("class/infiniband")
        .join(&topo.nics[1].rdma_device)
        .join("ports/1");
    fs::write(ib1.join("state"), "1: DOWN\n").unwrap();
    fs::write(ib1.join("hw_counters/np_cnp_sent"), "42\n").unwrap();

    let s = health::read(&root, &topo);
    let of = |bdf: &str| s.devices.iter().find(|d| d.bdf == bdf).unwrap();
    assert_eq!(of(&g0).aer.unwrap().fatal, 1);
    assert!(of(&g1).link.unwrap().narrowed());
    assert!(!of(&n0).present && of(&n0).aer.is_none());
    let p1 = s
        .ports
        .iter()
        .find(|p| p.device == topo.nics[1].rdma_device)
        .unwrap();
    assert!(!p1.active());
    assert_eq!(p1.counters["np_cnp_sent"], 42);
}
