//! Random valid machines: host bridges on random NUMA nodes, root ports
//! holding a device or a one- or two-level switch of GPUs and NICs.
//! Whatever the tree, discovery finds exactly what was built, relations
//! are symmetric, pairing is fair, and any GPU subset renders consistently.

use std::collections::BTreeMap;

use kumo_topology::fixtures::{self, Complex, Function, Machine, Node, NumaSpec, Rdma};
use kumo_topology::relation::pci_relation;
use kumo_topology::render::render;
use kumo_topology::{
    pairing, sysfs, Bdf, CpuIdentity, CLASS_3D_CONTROLLER, CLASS_BRIDGE_PCI, CLASS_INFINIBAND,
};
use proptest::prelude::*;

use crate::common::scratch;
use crate::guest::{check, spec};

/// One root port's load: a device, or a switch with leaves (`true` = GPU),
/// optionally nested one level deeper.
#[derive(Debug, Clone)]
enum Port {
    Device(bool),
    Switch(Vec<bool>, Option<Vec<bool>>),
}

fn port() -> impl Strategy<Value = Port> {
    prop_oneof![
        any::<bool>().prop_map(Port::Device),
        (
            proptest::collection::vec(any::<bool>(), 1..4),
            proptest::option::of(proptest::collection::vec(any::<bool>(), 1..3))
        )
            .prop_map(|(l, n)| Port::Switch(l, n)),
    ]
}

fn machine() -> impl Strategy<Value = (u32, Vec<(u32, Vec<Port>)>)> {
    (1u32..4).prop_flat_map(|nodes| {
        (
            Just(nodes),
            proptest::collection::vec((0..nodes, proptest::collection::vec(port(), 1..4)), 1..5),
        )
    })
}

struct Build {
    bus: u8,
    nics: u32,
}

fn function(bdf: Bdf, class: u32, vendor: u16, device: u16, rdma: Option<Rdma>) -> Function {
    Function {
        bdf,
        class,
        vendor,
        device,
        subsystem: (vendor, 1),
        link_speed: "16.0 GT/s PCIe",
        link_width: 16,
        driver: if class == CLASS_BRIDGE_PCI {
            "pcieport"
        } else {
            "vfio-pci"
        },
        rdma,
        // A GPU-sized framebuffer BAR beside the registers.
        bars: if class == CLASS_BRIDGE_PCI {
            &[]
        } else {
            &[(0, 16 << 20, 0x0004_0200), (1, 64 << 30, 0x0014_220c)]
        },
    }
}

impl Build {
    fn next_bus(&mut self) -> u8 {
        self.bus += 1;
        self.bus
    }

    fn leaf(&mut self, gpu: bool) -> Node {
        let bdf = Bdf::new(0, self.next_bus(), 0, 0);
        if gpu {
            Node::Endpoint(function(bdf, CLASS_3D_CONTROLLER, 0x10de, 0x2330, None))
        } else {
            let name = format!("mlx5_{}", self.nics);
            self.nics += 1;
            Node::Endpoint(function(
                bdf,
                CLASS_INFINIBAND,
                0x15b3,
                0x1021,
                Some(Rdma {
                    netdev: format!("ib{name}"),
                    name,
                    rate: "400 Gb/sec (4X NDR)",
                    link_layer: "InfiniBand",
                    total_vfs: 8,
                    num_vfs: 0,
                }),
            ))
        }
    }

    fn switch(&mut self, leaves: &[bool], nested: Option<&[bool]>) -> Node {
        let up = Bdf::new(0, self.next_bus(), 0, 0);
        let down_bus = self.next_bus();
        let mut children: Vec<Node> = leaves.iter().map(|g| self.leaf(*g)).collect();
        if let Some(n) = nested {
            children.push(self.switch(n, None));
        }
        let downs = children
            .into_iter()
            .enumerate()
            .map(|(i, c)| Node::Bridge {
                function: function(
                    Bdf::new(0, down_bus, i as u8, 0),
                    CLASS_BRIDGE_PCI,
                    0x1000,
                    0xc030,
                    None,
                ),
                children: vec![c],
            })
            .collect();
        Node::Bridge {
            function: function(up, CLASS_BRIDGE_PCI, 0x1000, 0xc030, None),
            children: downs,
        }
    }
}

fn build(nodes: u32, complexes: &[(u32, Vec<Port>)]) -> Machine {
    let mut b = Build { bus: 0, nics: 0 };
    let mut out = Vec::new();
    for (i, (numa, ports)) in complexes.iter().enumerate() {
        let rc = (i as u8) * 0x30;
        b.bus = rc;
        let children = ports
            .iter()
            .enumerate()
            .map(|(p, load)| {
                let child = match load {
                    Port::Device(g) => b.leaf(*g),
                    Port::Switch(l, n) => b.switch(l, n.as_deref()),
                };
                Node::Bridge {
                    function: function(
                        Bdf::new(0, rc, 1 + p as u8, 0),
                        CLASS_BRIDGE_PCI,
                        0x8086,
                        0x352a,
                        None,
                    ),
                    children: vec![child],
                }
            })
            .collect();
        out.push(Complex {
            domain: 0,
            bus: rc,
            numa: Some(*numa),
            children,
        });
    }
    Machine {
        name: "random",
        phys_bits: 46,
        cpu: CpuIdentity {
            arch: "x86_64".into(),
            vendor: "GenuineIntel".into(),
            family_id: 6,
            model_id: 143,
        },
        numa: (0..nodes)
            .map(|n| NumaSpec {
                id: n,
                cpus: (n * 16..n * 16 + 16).collect(),
                memory_kib: 64 << 20,
            })
            .collect(),
        complexes: out,
        nvlinks: BTreeMap::new(),
    }
}

fn count_leaves(complexes: &[(u32, Vec<Port>)]) -> (usize, usize) {
    let mut gpus = 0;
    let mut nics = 0;
    let mut tally = |g: &bool| if *g { gpus += 1 } else { nics += 1 };
    for (_, ports) in complexes {
        for p in ports {
            match p {
                Port::Device(g) => tally(g),
                Port::Switch(l, n) => {
                    l.iter().for_each(&mut tally);
                    n.iter().flatten().for_each(&mut tally);
                }
            }
        }
    }
    (gpus, nics)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_trees((nodes, complexes) in machine(), subset in proptest::collection::vec(any::<prop::sample::Index>(), 1..6)) {
        let dir = scratch();
        fixtures::write(&build(nodes, &complexes), dir.path()).unwrap();
        let topo = sysfs::discover(dir.path(), None).unwrap();
        prop_assert!(topo.warnings.is_empty(), "{:?}", topo.warnings);
        let (gpus, nics) = count_leaves(&complexes);
        prop_assert_eq!(topo.gpus.len(), gpus);
        prop_assert_eq!(topo.nics.len(), nics);

        for a in topo.gpus.iter().map(|g| &g.location).chain(topo.nics.iter().map(|n| &n.location)) {
            for b in topo.gpus.iter().map(|g| &g.location).chain(topo.nics.iter().map(|n| &n.location)) {
                prop_assert_eq!(pci_relation(a, b), pci_relation(b, a));
            }
        }

        let p = pairing(&topo);
        if nics > 0 {
            let share = gpus.div_ceil(nics);
            prop_assert!(p.values().all(Option::is_some), "every GPU gets a NIC");
            for n in &topo.nics {
                let served = p.values().filter(|v| v.as_deref() == Some(n.rdma_device.as_str())).count();
                prop_assert!(served <= share);
            }
        }

        if gpus > 0 {
            let mut chosen: Vec<Bdf> = Vec::new();
            for i in subset {
                let g = i.get(&topo.gpus).location.bdf;
                if !chosen.contains(&g) {
                    chosen.push(g);
                }
            }
            let r = render(&topo, &chosen, chosen.len() as u32 + nodes, 8, &spec()).unwrap();
            check(&topo, &chosen, &r);
        }
    }
}
