//! Domain and NCCL XML rendered from any placement on a real machine and
//! any names, paths and kernel command lines: the documents parse, and
//! what was put in reads back out — the name, disk, seed, kernel, every
//! bridge NIC, one `hostdev` per passed-through device at its host
//! address, one NCCL GPU (a display-class `pci`) per GPU and one `cpu` per guest cell.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

use kumo_topology::domain_xml::{domain_xml, BridgeNic, DomainSpec, KernelBoot};
use kumo_topology::guest_layout::{guest_layout, place};
use kumo_topology::xml::xml_char;

#[derive(Debug, Arbitrary)]
struct Input {
    machine: u8,
    gpus: u16,
    vcpus: u8,
    memory_gib: u8,
    name: String,
    disk: String,
    seed: Option<String>,
    kernel: Option<(String, Option<String>, String)>,
    nics: Vec<(String, String, u16)>,
    host_id: Option<String>,
}

/// What a parser gives back for `s`: characters XML cannot carry become
/// U+FFFD (see `xml::escape`).
fn as_read(s: &str) -> String {
    s.chars()
        .map(|c| {
            if xml_char(c) {
                c
            } else {
                char::REPLACEMENT_CHARACTER
            }
        })
        .collect()
}

fn child<'a, 'i>(n: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    n.children().find(|c| c.has_tag_name(name))
}

fn hex(s: Option<&str>) -> u32 {
    let s = s.expect("an address attribute");
    u32::from_str_radix(s.trim_start_matches("0x"), 16).expect("a hex address")
}

fuzz_target!(|input: Input| {
    let topos = kumo_fuzz::fixture_topologies();
    let topo = &topos[usize::from(input.machine) % topos.len()];
    let gpus: Vec<_> = topo
        .gpus
        .iter()
        .enumerate()
        .filter(|(i, _)| input.gpus & (1 << (i % 16)) != 0)
        .map(|(_, g)| g.location.bdf)
        .collect();
    let vcpus = u32::from(input.vcpus % 64) + 1;
    let memory = u32::from(input.memory_gib % 64) + 1;
    let Ok(placement) = place(topo, &gpus, vcpus, memory) else {
        return;
    };
    let layout = guest_layout(topo, &placement).expect("a simple placement lays out");
    let spec = DomainSpec {
        name: input.name.clone(),
        uuid: "6f1d2b9e-0000-4000-8000-000000000001".into(),
        virt_type: "qemu".into(),
        disk_path: input.disk.clone(),
        seed_path: input.seed.clone(),
        hugepages: false,
        host_id: input.host_id.clone(),
        kernel: input
            .kernel
            .clone()
            .map(|(kernel, initrd, cmdline)| KernelBoot {
                kernel,
                initrd,
                cmdline,
            }),
        interfaces: input
            .nics
            .iter()
            .take(8)
            .map(|(bridge, mac, mtu)| BridgeNic {
                bridge: bridge.clone(),
                mac: mac.clone(),
                mtu: u32::from(*mtu),
            })
            .collect(),
        volumes: Vec::new(),
        filesystems: Vec::new(),
        // Any text the disk path can be, as the console log's path too.
        console_log: Some(format!("{}.console.log", input.disk)),
        nvram_path: None,
    };
    let xml = domain_xml(&spec, &layout);
    let doc = kumo_fuzz::well_formed(&xml);
    let dom = doc.root_element();
    assert_eq!(
        child(dom, "name").and_then(|n| n.text()).unwrap_or(""),
        as_read(&spec.name)
    );
    let devices = child(dom, "devices").expect("devices");
    let disks: Vec<_> = devices
        .children()
        .filter(|c| c.has_tag_name("disk"))
        .filter_map(|d| child(d, "source").and_then(|s| s.attribute("file")))
        .collect();
    assert_eq!(
        disks.first().copied(),
        Some(as_read(&spec.disk_path).as_str())
    );
    if let Some(seed) = &spec.seed_path {
        assert!(disks.contains(&as_read(seed).as_str()), "{disks:?}");
    }
    let log = devices
        .children()
        .filter(|c| c.has_tag_name("serial"))
        .find_map(|s| child(s, "log").and_then(|l| l.attribute("file")));
    assert_eq!(log, spec.console_log.as_deref().map(as_read).as_deref());
    if let Some(k) = &spec.kernel {
        let os = child(dom, "os").expect("os");
        assert_eq!(
            child(os, "kernel").and_then(|n| n.text()).unwrap_or(""),
            as_read(&k.kernel)
        );
        assert_eq!(
            child(os, "cmdline").and_then(|n| n.text()).unwrap_or(""),
            as_read(&k.cmdline)
        );
        let initrd = child(os, "initrd").map(|n| n.text().unwrap_or("").to_owned());
        assert_eq!(initrd, k.initrd.as_deref().map(as_read));
    }
    let bridges: Vec<(String, String)> = devices
        .children()
        .filter(|c| c.has_tag_name("interface"))
        .map(|i| {
            let b = child(i, "source").and_then(|s| s.attribute("bridge"));
            let m = child(i, "mac").and_then(|s| s.attribute("address"));
            (b.unwrap_or("").to_owned(), m.unwrap_or("").to_owned())
        })
        .collect();
    let want: Vec<(String, String)> = spec
        .interfaces
        .iter()
        .map(|n| (as_read(&n.bridge), as_read(&n.mac)))
        .collect();
    assert_eq!(bridges, want);
    let mut hostdevs: Vec<(u32, u32, u32, u32)> = devices
        .children()
        .filter(|c| c.has_tag_name("hostdev"))
        .map(|h| {
            let a = child(h, "source")
                .and_then(|s| child(s, "address"))
                .expect("a source");
            (
                hex(a.attribute("domain")),
                hex(a.attribute("bus")),
                hex(a.attribute("slot")),
                hex(a.attribute("function")),
            )
        })
        .collect();
    let mut placed: Vec<(u32, u32, u32, u32)> = placement
        .gpus
        .iter()
        .copied()
        .chain(placement.nics.iter().map(|n| n.host_bdf))
        .map(|b| {
            (
                u32::from(b.domain),
                u32::from(b.bus),
                u32::from(b.device),
                u32::from(b.function),
            )
        })
        .collect();
    hostdevs.sort_unstable();
    placed.sort_unstable();
    assert_eq!(
        hostdevs, placed,
        "one hostdev per device, at its host address"
    );

    let nccl = kumo_topology::nccl_xml::nccl_topology_xml(topo, &layout).expect("NCCL XML");
    let doc = kumo_fuzz::well_formed(&nccl);
    // A GPU is a `pci` element of a display class (its `gpu` child only
    // carries NVLinks).
    let gpus_in_file = doc
        .descendants()
        .filter(|n| n.has_tag_name("pci"))
        .filter(|n| n.attribute("class").is_some_and(|c| c.starts_with("0x03")))
        .count();
    assert_eq!(gpus_in_file, placement.gpus.len());
    let cpus: Vec<u32> = doc
        .descendants()
        .filter(|n| n.has_tag_name("cpu"))
        .filter_map(|n| n.attribute("numaid")?.parse().ok())
        .collect();
    let cells: Vec<u32> = layout.cells.iter().map(|c| c.id).collect();
    assert_eq!(cpus, cells);
});
