//! Guest layout, domain XML and NCCL topology files from placements on the
//! fixture machines: golden files, and properties over random GPU subsets.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::OnceLock;

use kumo_topology::domain_xml::DomainSpec;
use kumo_topology::guest_layout::{
    place_avoiding, switch_group, DeviceKind, Firmware, InUse, LayoutError, ROOT_BUS_RESERVE,
};
use kumo_topology::relation::pci_relation;
use kumo_topology::render::{render, Rendered};
use kumo_topology::{pairing, Bdf, HostTopology, Relation};
use proptest::prelude::*;

use crate::common::discover_fixture;

const GPU_MACHINES: [&str; 6] = [
    "dgx-a100",
    "hgx-h100",
    "hgx-h100-roce",
    "hgx-h100-2nic",
    "hgx-h200",
    "l40s-pcie",
];

pub fn spec() -> DomainSpec {
    DomainSpec {
        name: "vm".into(),
        uuid: "00000000-0000-4000-8000-000000000001".into(),
        virt_type: "kvm".into(),
        disk_path: "/var/lib/kumo/vms/vm/disk.qcow2".into(),
        seed_path: Some("/var/lib/kumo/vms/vm/seed.iso".into()),
        hugepages: true,
        host_id: None,
        kernel: None,
        interfaces: Vec::new(),
        volumes: Vec::new(),
        filesystems: Vec::new(),
        console_log: None,
        nvram_path: None,
    }
}

/// A GPU guest boots UEFI with an aperture at least as large as every
/// 64-bit prefetchable BAR it is given (and the root bus's reserve), and a
/// CPU width that reaches its RAM and that aperture, within the host's.
fn check_address_space(topo: &HostTopology, r: &Rendered) {
    let layout = &r.report.layout;
    let space = &layout.address_space;
    assert_eq!(space.firmware, Firmware::Efi);
    layout.bootable().unwrap();
    let bars: u64 = layout
        .devices()
        .flat_map(|(_, p)| std::iter::once(p.device.host_bdf).chain(p.device.group_peers.clone()))
        .flat_map(|f| {
            topo.pci(f)
                .and_then(|d| d.bars.clone())
                .expect("fixture BARs are known")
        })
        .filter(|b| b.above_4g())
        .map(|b| b.size)
        .sum();
    let aperture = space.mmio64_bytes.unwrap();
    assert!(aperture >= bars + ROOT_BUS_RESERVE, "{aperture} < {bars}");
    let memory: u64 = layout.cells.iter().map(|c| c.memory_mib << 20).sum();
    let bits = space.phys_bits.unwrap();
    assert!(
        1u128 << bits >= u128::from(aperture) + u128::from(memory) + (4u128 << 30),
        "{bits} bits for {aperture} + {memory}"
    );
    assert!(bits <= topo.phys_bits.unwrap());
    assert_eq!(r.report.firmware, Firmware::Efi);
    assert_eq!(r.report.mmio64_bytes, Some(aperture));
    assert_eq!(r.report.phys_bits, Some(bits));
    let mib = aperture.div_ceil(1 << 20);
    assert!(r.domain_xml.contains(&format!(
        "<qemu:arg value=\"name=opt/ovmf/X-PciMmio64Mb,string={mib}\"/>"
    )));
    assert!(r
        .domain_xml
        .contains("<qemu:arg value=\"pcie-root-port.io-reserve=0\"/>"));
    assert!(r
        .domain_xml
        .contains(&format!("<maxphysaddr mode=\"emulate\" bits=\"{bits}\"/>")));
}

/// Topologies of the GPU machines, discovered once.
fn machines() -> &'static BTreeMap<&'static str, HostTopology> {
    static M: OnceLock<BTreeMap<&'static str, HostTopology>> = OnceLock::new();
    M.get_or_init(|| {
        GPU_MACHINES
            .iter()
            .map(|n| (*n, discover_fixture(n).1))
            .collect()
    })
}

/// Checks everything the issue asks of a rendering; returns nothing, fails loudly.
pub fn check(topo: &HostTopology, gpus: &[Bdf], r: &Rendered) {
    let layout = &r.report.layout;
    let pairs = pairing(topo);
    check_address_space(topo, r);

    // Every GPU is placed once, with a guest address no other device has.
    let guest: BTreeSet<Bdf> = r.report.bdf_map.values().copied().collect();
    assert_eq!(
        guest.len(),
        r.report.bdf_map.len(),
        "guest addresses are unique"
    );
    for g in gpus {
        assert!(r.report.bdf_map.contains_key(g), "{g} is in the guest");
    }

    // A GPU and its paired NIC that share a host switch share the guest
    // expander and the fake NCCL switch; others never pretend to.
    for g in gpus {
        let Some(Some(nic)) = pairs.get(g) else {
            continue;
        };
        let nic = topo.nic(nic).unwrap();
        // The guest has a VF of it, never the PF (nothing of an
        // InfiniBand HCA).
        let placed = r
            .report
            .placement
            .nics
            .iter()
            .find(|n| n.for_gpus.contains(g));
        let Some(placed) = placed else {
            assert_eq!(nic.roce_vf(), None, "{g}'s RoCE NIC has a VF to give");
            continue;
        };
        assert_eq!(
            placed.pf,
            Some(nic.location.bdf),
            "a VF of {g}'s paired NIC"
        );
        assert!(nic.vfs.contains(&placed.host_bdf), "{placed:?}");
        let ge = layout.expander_of(*g).unwrap();
        let ne = layout.expander_of(placed.host_bdf).unwrap();
        let host = pci_relation(&topo.gpu(*g).unwrap().location, &nic.location);
        let same_group =
            switch_group(&topo.gpu(*g).unwrap().location) == switch_group(&nic.location);
        if matches!(host, Relation::Pix | Relation::Pxb) {
            assert_eq!(
                ge.index, ne.index,
                "{g} and {} share an expander",
                nic.rdma_device
            );
        }
        assert_eq!(ge.index == ne.index, same_group);
    }

    // Guest NUMA cells map back to the host nodes of their devices and CPUs.
    for (e, p) in layout.devices() {
        let host_node = topo
            .pci(p.device.host_bdf)
            .unwrap()
            .location
            .numa_node
            .unwrap();
        assert_eq!(
            r.report.numa_map[&e.guest_node], host_node,
            "{}",
            p.device.host_bdf
        );
    }
    for c in &layout.cells {
        let node = topo.numa(c.host_node).unwrap();
        for v in &c.vcpus {
            let pin = layout.vcpu_pins.iter().find(|(vc, _)| vc == v).unwrap().1;
            assert!(
                node.cpus.contains(&pin),
                "vCPU {v} is pinned to a CPU of host node {}",
                c.host_node
            );
        }
    }

    // The NCCL file parses back, obeys NCCL's parser limits, and says the same.
    assert!(!r.nccl_xml.starts_with("<?xml"), "no prolog");
    let doc = roxmltree::Document::parse(&r.nccl_xml).unwrap();
    let elements: Vec<_> = doc.descendants().filter(|n| n.is_element()).collect();
    assert!(elements.len() <= 256);
    assert!(elements.iter().all(|n| n.attributes().len() <= 16));
    assert!(elements
        .iter()
        .flat_map(|n| n.attributes())
        .all(|a| a.value().len() <= 255));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "system");
    let cpus: Vec<_> = root.children().filter(|n| n.has_tag_name("cpu")).collect();
    assert_eq!(cpus.len(), layout.cells.len());
    for (e, p) in layout.devices() {
        let busid = match p.device.kind {
            DeviceKind::Nic { .. } => p.device.guest_bdf.function0().to_string(),
            DeviceKind::Gpu => p.device.guest_bdf.to_string(),
        };
        let node = elements
            .iter()
            .find(|n| n.has_tag_name("pci") && n.attribute("busid") == Some(busid.as_str()))
            .unwrap_or_else(|| panic!("{busid} in the NCCL file"));
        let switch = node.parent_element().unwrap();
        assert_eq!(switch.attribute("class"), Some("0x060400"));
        assert!(
            switch.attribute("busid").unwrap().starts_with("ffff:ff:"),
            "fake switch ids cannot exist in the guest"
        );
        let cpu = switch.parent_element().unwrap();
        assert_eq!(
            cpu.attribute("numaid"),
            Some(e.guest_node.to_string().as_str())
        );
        let host = topo.pci(p.device.host_bdf).unwrap();
        assert_eq!(
            node.attribute("link_speed"),
            host.link_speed.as_deref(),
            "host link values, not the guest's"
        );
    }
    // GPU and paired NIC under one fake switch exactly when under one expander.
    let switch_of = |busid: String| {
        elements
            .iter()
            .find(|n| n.has_tag_name("pci") && n.attribute("busid") == Some(busid.as_str()))
            .and_then(|n| n.parent_element())
            .and_then(|s| s.attribute("busid"))
            .map(str::to_owned)
    };
    for g in gpus {
        let Some(Some(nic)) = pairs.get(g) else {
            continue;
        };
        let Some(placed) = r
            .report
            .placement
            .nics
            .iter()
            .find(|n| n.for_gpus.contains(g))
        else {
            assert_eq!(topo.nic(nic).unwrap().roce_vf(), None);
            continue;
        };
        let gs = switch_of(r.report.bdf_map[g].to_string());
        let ns = switch_of(r.report.bdf_map[&placed.host_bdf].function0().to_string());
        let same_expander = layout.expander_of(*g).unwrap().index
            == layout.expander_of(placed.host_bdf).unwrap().index;
        assert_eq!(gs == ns, same_expander);
    }

    // The domain XML parses and passes every placed function through.
    let dom = roxmltree::Document::parse(&r.domain_xml).unwrap();
    let sources: BTreeSet<String> = kumo_topology::domain_xml::passed_through(&r.domain_xml)
        .iter()
        .map(Bdf::to_string)
        .collect();
    let placed: BTreeSet<String> = r.report.bdf_map.keys().map(Bdf::to_string).collect();
    assert_eq!(sources, placed);
    let expanders = dom
        .descendants()
        .filter(|n| n.attribute("model") == Some("pcie-expander-bus"))
        .count();
    assert_eq!(expanders, layout.expanders.len());
}

fn golden_dir(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/render")
        .join(name)
}

/// All GPUs of each machine: domain.xml, nccl-topo.xml and layout.json
/// checked in. `KUMO_UPDATE_GOLDEN=1` rewrites them.
#[test]
fn full_host_renders_match_golden_files() {
    for (name, topo) in machines() {
        let gpus: Vec<Bdf> = topo.gpus.iter().map(|g| g.location.bdf).collect();
        let r = render(
            topo,
            &gpus,
            8 * gpus.len() as u32,
            64 * gpus.len() as u32,
            &spec(),
        )
        .unwrap();
        check(topo, &gpus, &r);
        let dir = golden_dir(name);
        let files = [
            ("domain.xml", r.domain_xml.clone()),
            ("nccl-topo.xml", r.nccl_xml.clone()),
            (
                "layout.json",
                serde_json::to_string_pretty(&r.report).unwrap() + "\n",
            ),
        ];
        for (file, content) in files {
            let path = dir.join(file);
            if std::env::var_os("KUMO_UPDATE_GOLDEN").is_some() {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &content).unwrap();
            }
            let golden = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                golden == content,
                "{name}/{file} differs from {} (KUMO_UPDATE_GOLDEN=1 to accept)",
                path.display()
            );
        }
    }
}

#[test]
fn dgx_a100_pairs_share_one_expander_per_upper_switch() {
    let topo = &machines()["dgx-a100"];
    let gpus: Vec<Bdf> = topo.gpus.iter().map(|g| g.location.bdf).collect();
    let r = render(topo, &gpus, 64, 512, &spec()).unwrap();
    let layout = &r.report.layout;
    // Four upper switches with 2 GPUs each: not one group per NUMA node of
    // 8. Its HCAs are InfiniBand: no VM gets them (no VFs, no PFs).
    assert!(r.report.placement.nics.is_empty());
    assert_eq!(layout.expanders.len(), 4);
    assert!(layout.expanders.iter().all(|e| e.ports.len() == 2));
    assert_eq!(layout.cells.len(), 4);
    let host_nodes: Vec<u32> = layout.cells.iter().map(|c| c.host_node).collect();
    assert_eq!(host_nodes, vec![1, 3, 5, 7]);
    // GPU0 (host 07:00.0, NUMA 3) lands on guest cell 1, first port of its expander.
    let g0 = Bdf::new(0, 0x07, 0, 0);
    let e = layout.expander_of(g0).unwrap();
    assert_eq!(r.report.numa_map[&e.guest_node], 3);
    assert_eq!(r.report.bdf_map[&g0], Bdf::new(0, e.bus_nr + 1, 0, 0));
}

#[test]
fn bad_requests_are_errors() {
    let topo = &machines()["hgx-h100"];
    let g = topo.gpus[0].location.bdf;
    let err = |gpus: &[Bdf], vcpus, mem| {
        render(topo, gpus, vcpus, mem, &spec())
            .err()
            .map(|e| e.to_string())
    };
    assert_eq!(
        err(&[Bdf::new(0, 0x77, 0, 0)], 8, 8),
        Some(LayoutError::UnknownGpu(Bdf::new(0, 0x77, 0, 0)).to_string())
    );
    assert_eq!(
        err(&[g, g], 8, 8),
        Some(LayoutError::DuplicateGpu(g).to_string())
    );
    assert_eq!(err(&[g], 0, 8), Some(LayoutError::NoVcpus.to_string()));
    assert!(err(&[g], 1000, 8).unwrap().contains("CPUs"));
    // L40S: a socket-1 GPU's only NIC is on socket 0; both nodes need a vCPU.
    let l40s = &machines()["l40s-pcie"];
    let g3 = l40s.gpus[3].location.bdf;
    let e = render(l40s, &[g3], 1, 8, &spec()).err().unwrap();
    assert!(
        matches!(
            e,
            kumo_topology::render::RenderError::Layout(LayoutError::TooFewVcpus {
                nodes: 2,
                vcpus: 1
            })
        ),
        "{e}"
    );
}

#[test]
fn a_gpu_whose_bars_cannot_be_read_is_reported_not_guessed() {
    let dir = crate::common::scratch();
    let root = dir.path().join("hgx-h100");
    kumo_topology::fixtures::write(
        &kumo_topology::fixtures::machine("hgx-h100").unwrap(),
        &root,
    )
    .unwrap();
    std::fs::write(
        root.join("bus/pci/devices/0000:2a:00.0/resource"),
        "garbage\n",
    )
    .unwrap();
    let topo = kumo_topology::sysfs::discover(&root, None).unwrap();
    assert!(
        topo.warnings
            .iter()
            .any(|w| w.starts_with("0000:2a:00.0: BARs unreadable")),
        "{:?}",
        topo.warnings
    );
    let gpu = |b: &str| b.parse::<Bdf>().unwrap();
    // A VM without that GPU is unaffected.
    let ok = render(&topo, &[gpu("0000:18:00.0")], 8, 64, &spec()).unwrap();
    ok.report.layout.bootable().unwrap();
    // One with it lays out (the API can still show it) but cannot boot.
    let r = render(
        &topo,
        &[gpu("0000:18:00.0"), gpu("0000:2a:00.0")],
        8,
        64,
        &spec(),
    )
    .unwrap();
    assert_eq!(r.report.mmio64_bytes, None);
    let err = r.report.layout.bootable().unwrap_err();
    assert_eq!(err, LayoutError::UnknownBars(vec![gpu("0000:2a:00.0")]));
    assert!(err.to_string().contains("0000:2a:00.0"), "{err}");
}

#[test]
fn a_guest_wider_than_the_host_cpu_cannot_boot() {
    let mut topo = machines()["hgx-h200"].clone();
    let gpus: Vec<Bdf> = topo.gpus.iter().map(|g| g.location.bdf).collect();
    // Eight H200s (8 × 512 GiB windows) need 44 bits with 2 TiB of RAM;
    // a CPU with 43 cannot hold them.
    topo.phys_bits = Some(43);
    let r = render(&topo, &gpus, 64, 2048, &spec()).unwrap();
    assert_eq!(r.report.phys_bits, Some(44));
    assert_eq!(
        r.report.layout.bootable(),
        Err(LayoutError::AddressSpaceTooWide {
            needed: 44,
            host: 43
        })
    );
}

#[test]
fn cpu_only_vm_has_a_cell_and_no_expanders() {
    let (_d, topo) = discover_fixture("cpu-only");
    let r = render(&topo, &[], 4, 8, &spec()).unwrap();
    assert!(r.report.layout.expanders.is_empty());
    // CPU-only VMs keep SeaBIOS and QEMU's address space.
    assert_eq!(r.report.firmware, Firmware::Bios);
    assert_eq!((r.report.mmio64_bytes, r.report.phys_bits), (None, None));
    assert!(!r.domain_xml.contains("<loader"));
    assert_eq!(r.report.layout.cells.len(), 1);
    assert!(r.domain_xml.contains("<vcpu placement=\"static\">4</vcpu>"));
    assert!(!r.domain_xml.contains("<interface"));
    let mut with_nic = spec();
    with_nic
        .interfaces
        .push(kumo_topology::domain_xml::BridgeNic {
            bridge: "kbr4096".into(),
            mac: "02:6b:00:00:00:01".into(),
            mtu: 8950,
        });
    let r = render(&topo, &[], 4, 8, &with_nic).unwrap();
    let doc = roxmltree::Document::parse(&r.domain_xml).unwrap();
    let nic = doc
        .descendants()
        .find(|n| n.has_tag_name("interface"))
        .unwrap();
    assert_eq!(nic.attribute("type"), Some("bridge"));
    let child = |tag: &str, attr: &str| {
        nic.children()
            .find(|n| n.has_tag_name(tag))
            .and_then(|n| n.attribute(attr))
            .map(str::to_owned)
    };
    assert_eq!(child("source", "bridge").as_deref(), Some("kbr4096"));
    assert_eq!(
        child("mac", "address").as_deref(),
        Some("02:6b:00:00:00:01")
    );
    assert_eq!(child("model", "type").as_deref(), Some("virtio"));
    assert_eq!(child("mtu", "size").as_deref(), Some("8950"));
    let doc = roxmltree::Document::parse(&r.nccl_xml).unwrap();
    assert_eq!(
        doc.root_element()
            .children()
            .filter(|n| n.is_element())
            .count(),
        1
    );
}

/// The GPUs the picks name, each once, in the order first picked.
fn distinct_gpus(topo: &HostTopology, picks: &[prop::sample::Index]) -> Vec<Bdf> {
    let mut gpus: Vec<Bdf> = Vec::new();
    for p in picks {
        let g = p.get(&topo.gpus).location.bdf;
        if !gpus.contains(&g) {
            gpus.push(g);
        }
    }
    gpus
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Random machines, random non-empty GPU subsets in random order.
    #[test]
    fn any_gpu_subset_renders_consistently(machine in 0..GPU_MACHINES.len(), picks in proptest::collection::vec(any::<prop::sample::Index>(), 1..9), vcpu_per_gpu in 1u32..8) {
        let topo = &machines()[GPU_MACHINES[machine]];
        let gpus = distinct_gpus(topo, &picks);
        // One more vCPU than GPUs covers every NUMA node the GPUs and their NICs use.
        let vcpus = vcpu_per_gpu * gpus.len() as u32 + 1;
        let r = render(topo, &gpus, vcpus, 16 * gpus.len() as u32, &spec()).unwrap();
        check(topo, &gpus, &r);
        // Deterministic: the same request renders the same bytes.
        let again = render(topo, &gpus, vcpus, 16 * gpus.len() as u32, &spec()).unwrap();
        prop_assert_eq!(&r.domain_xml, &again.domain_xml);
        prop_assert_eq!(&r.nccl_xml, &again.nccl_xml);
    }
}

/// A VM asking for every CPU of the machine places, whatever its devices:
/// the split follows the devices, capped at each node's CPUs, and spills
/// to the other nodes (it was refused when the devices sat unevenly).
#[test]
fn a_vm_may_ask_for_every_cpu_of_the_machine() {
    for (name, topo) in machines() {
        let all: u32 = topo.numa_nodes.iter().map(|n| n.cpus.len() as u32).sum();
        for g in &topo.gpus {
            let gpus = [g.location.bdf];
            let r = render(topo, &gpus, all, 16, &spec())
                .unwrap_or_else(|e| panic!("{name} {}: {e}", g.location.bdf));
            check(topo, &gpus, &r);
            let cells = &r.report.layout.cells;
            assert_eq!(
                cells.len(),
                topo.numa_nodes.len(),
                "{name}: every node has a cell"
            );
            assert_eq!(cells.iter().map(|c| c.vcpus.len() as u32).sum::<u32>(), all);
        }
        // One more is refused, and says by how many.
        let e = render(topo, &[topo.gpus[0].location.bdf], all + 1, 16, &spec())
            .err()
            .unwrap();
        assert!(e.to_string().contains("1 short"), "{name}: {e}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Random machines with random CPUs already taken, random GPUs, any
    /// vCPU count the free CPUs can hold (with one free on each device
    /// node): it always places, on free CPUs only, every device node in,
    /// every cell with memory.
    #[test]
    fn a_vm_whose_total_fits_always_places(
        machine in 0..GPU_MACHINES.len(),
        picks in proptest::collection::vec(any::<prop::sample::Index>(), 0..9),
        taken in proptest::collection::vec(any::<bool>(), 256),
        share in 0.0f64..=1.0,
    ) {
        let topo = &machines()[GPU_MACHINES[machine]];
        let gpus = distinct_gpus(topo, &picks);
        let cpus: Vec<u32> = topo.numa_nodes.iter().flat_map(|n| n.cpus.iter().copied()).collect();
        let in_use = InUse {
            cpus: cpus.iter().copied().filter(|c| taken[*c as usize % 256]).collect(),
            nics: Default::default(),
        };
        let free = cpus.len() - in_use.cpus.len();
        // The nodes the devices need a vCPU on, from a placement without
        // anything taken.
        let needs = match kumo_topology::guest_layout::place(topo, &gpus, cpus.len() as u32, 1) {
            Ok(p) => p,
            Err(e) => return Err(TestCaseError::fail(e.to_string())),
        };
        let device_nodes: Vec<u32> = needs.cpus.keys().copied().filter(|n| {
            gpus.iter().any(|g| topo.gpu(*g).and_then(|x| x.location.numa_node) == Some(*n))
                || needs.nics.iter().any(|x| topo.nic(&x.rdma_device).and_then(|y| y.location.numa_node) == Some(*n))
        }).collect();
        let node_free = |n: u32| topo.numa(n).map_or(0, |x| x.cpus.iter().filter(|c| !in_use.cpus.contains(c)).count());
        prop_assume!(device_nodes.iter().all(|n| node_free(*n) > 0));
        let least = device_nodes.len().max(1);
        prop_assume!(free >= least);
        let vcpus = (least + ((free - least) as f64 * share) as usize) as u32;
        let p = place_avoiding(topo, &gpus, vcpus, 16, &in_use);
        let p = match p {
            Ok(p) => p,
            Err(e) => return Err(TestCaseError::fail(format!("{vcpus} of {free} free: {e}"))),
        };
        let placed: Vec<u32> = p.cpus.values().flatten().copied().collect();
        prop_assert_eq!(placed.len() as u32, vcpus);
        prop_assert!(placed.iter().all(|c| !in_use.cpus.contains(c)));
        let unique: BTreeSet<u32> = placed.iter().copied().collect();
        prop_assert_eq!(unique.len(), placed.len());
        for (n, list) in &p.cpus {
            let node = topo.numa(*n).unwrap();
            prop_assert!(list.iter().all(|c| node.cpus.contains(c)));
            prop_assert!(p.memory_mib.get(n).copied().unwrap_or(0) > 0, "node {} has no memory", n);
        }
        for n in &device_nodes {
            prop_assert!(p.cpus.get(n).is_some_and(|l| !l.is_empty()), "device node {} has a vCPU", n);
        }
        prop_assert_eq!(p.memory_mib.values().sum::<u64>(), 16 * 1024);
    }
}
