//! What the fuzz targets share: the machines they start from, and the
//! checks every topology must pass however it was obtained (read from a
//! garbled sysfs tree, or sent by an agent).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use kumo_topology::domain_xml::{domain_xml, DomainSpec};
use kumo_topology::guest_layout::{guest_layout, place};
use kumo_topology::HostTopology;

/// Real machine designs, from a GPU server with RoCE NICs to a CPU-only one.
pub const MACHINES: &[&str] = &["hgx-h100-roce", "dgx-a100", "l40s-pcie", "cpu-only"];

/// `machine`'s sysfs tree, written once per process under the temp dir.
pub fn fixture_tree(machine: &str) -> PathBuf {
    let root = std::env::temp_dir()
        .join(format!("kumo-fuzz-{}", std::process::id()))
        .join(machine);
    if !root.exists() {
        let m = kumo_topology::fixtures::machine(machine).expect("a fixture machine");
        kumo_topology::fixtures::write(&m, &root).expect("writing the fixture");
    }
    root
}

/// [`MACHINES`]' topologies as discovery reads them.
pub fn fixture_topologies() -> &'static [HostTopology] {
    static T: OnceLock<Vec<HostTopology>> = OnceLock::new();
    T.get_or_init(|| {
        MACHINES
            .iter()
            .map(|m| {
                kumo_topology::sysfs::discover(&fixture_tree(m), None).expect("a fixture reads")
            })
            .collect()
    })
}

/// Everything the server and the agent compute from a host's topology must
/// answer (a value or an error) without panicking, and what they render
/// must be well-formed XML.
pub fn exercise_topology(topo: &HostTopology) {
    let json = serde_json::to_string(topo).unwrap_or_default();
    let back: HostTopology = serde_json::from_str(&json).expect("a topology reads back");
    assert_eq!(&back, topo, "the JSON round trip changed the topology");
    if topo.plausible().is_err() {
        return; // the server refuses it before looking further
    }
    let report = kumo_topology::TopologyReport::new(topo);
    let _ = serde_json::to_string(&report);
    let _ = kumo_topology::matrix::render(topo);
    let mut models = Vec::new();
    let _ = kumo_scheduler::profile::HostProfile::new(topo, &BTreeMap::new(), |m| {
        let i = models.iter().position(|x| x == m).unwrap_or_else(|| {
            models.push(m.to_owned());
            models.len() - 1
        });
        u16::try_from(i).unwrap_or(u16::MAX)
    });
    let gpus: Vec<_> = topo.gpus.iter().map(|g| g.location.bdf).collect();
    let Ok(placement) = place(topo, &gpus, 4, 8) else {
        return;
    };
    let Ok(layout) = guest_layout(topo, &placement) else {
        return;
    };
    if let Ok(xml) = kumo_topology::nccl_xml::nccl_topology_xml(topo, &layout) {
        well_formed(&xml);
    }
    let spec = DomainSpec {
        name: "fuzz".into(),
        uuid: "00000000-0000-0000-0000-000000000000".into(),
        virt_type: "qemu".into(),
        disk_path: "/var/lib/kumo/disk.qcow2".into(),
        seed_path: None,
        hugepages: false,
        host_id: None,
        kernel: None,
        interfaces: Vec::new(),
        volumes: Vec::new(),
        filesystems: Vec::new(),
        console_log: None,
        nvram_path: None,
    };
    well_formed(&domain_xml(&spec, &layout));
}

/// Parses `xml`, panicking (a finding) when it is not well-formed.
pub fn well_formed(xml: &str) -> roxmltree::Document<'_> {
    match roxmltree::Document::parse(xml) {
        Ok(d) => d,
        Err(e) => panic!("ill-formed XML ({e}):\n{xml}"),
    }
}
