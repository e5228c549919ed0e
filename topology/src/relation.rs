//! How far apart two devices are, in `nvidia-smi topo -m` terms, and the
//! pairing of each GPU with its nearest RDMA NIC.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Serialize, Serializer};

use crate::{Bdf, HostTopology, PciLocation, CLASS_BRIDGE_OTHER};

/// Ordered nearest first, so `min` picks the closest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Relation {
    /// Bonded NVLinks; the count is `Reverse`d so more links sort first.
    Nv(std::cmp::Reverse<u32>),
    /// At most one PCIe switch (or bridge) between.
    Pix,
    /// Several PCIe switches, no host bridge.
    Pxb,
    /// Through a host bridge (the same root complex).
    Phb,
    /// Different host bridges in one NUMA node.
    Node,
    /// Across NUMA nodes (the SMP interconnect), or affinity unknown.
    Sys,
}

impl Relation {
    pub fn nv(links: u32) -> Relation {
        Relation::Nv(std::cmp::Reverse(links))
    }
}

impl fmt::Display for Relation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Relation::Nv(n) => write!(f, "NV{}", n.0),
            Relation::Pix => f.write_str("PIX"),
            Relation::Pxb => f.write_str("PXB"),
            Relation::Phb => f.write_str("PHB"),
            Relation::Node => f.write_str("NODE"),
            Relation::Sys => f.write_str("SYS"),
        }
    }
}

impl Serialize for Relation {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The PCIe relation of two functions.
///
/// Below their deepest common bridge, each side passes through at most one
/// downstream port when both sit on one switch (PIX); more bridges mean
/// more switches (PXB). No common bridge means the host bridge (PHB);
/// different root complexes are NODE within a NUMA node, SYS across.
pub fn pci_relation(a: &PciLocation, b: &PciLocation) -> Relation {
    if a.root_complex != b.root_complex {
        return match (a.numa_node, b.numa_node) {
            (Some(x), Some(y)) if x == y => Relation::Node,
            _ => Relation::Sys,
        };
    }
    let common = a
        .pcie_path
        .iter()
        .zip(&b.pcie_path)
        .take_while(|(x, y)| x == y)
        .count();
    if common == 0 {
        // Functions of one device directly on the root complex share no
        // bridge but are still one device.
        return if a.bdf.function0() == b.bdf.function0() {
            Relation::Pix
        } else {
            Relation::Phb
        };
    }
    let below_a = a.pcie_path.len() - common;
    let below_b = b.pcie_path.len() - common;
    if below_a <= 1 && below_b <= 1 {
        Relation::Pix
    } else {
        Relation::Pxb
    }
}

/// NVLinks between two GPUs: direct links plus, through each NVSwitch both
/// reach, the links the weaker side has to it.
pub fn nvlinks_between(topo: &HostTopology, a: Bdf, b: Bdf) -> u32 {
    let (Some(ga), Some(gb)) = (topo.gpu(a), topo.gpu(b)) else {
        return 0;
    };
    let direct: u32 = ga
        .nvlinks
        .iter()
        .filter(|l| l.target == b)
        .map(|l| l.count)
        .sum();
    let via_switch: u32 = ga
        .nvlinks
        .iter()
        .filter(|l| l.target_class == CLASS_BRIDGE_OTHER)
        .filter_map(|la| {
            gb.nvlinks
                .iter()
                .find(|lb| lb.target == la.target)
                .map(|lb| la.count.min(lb.count))
        })
        .sum();
    direct + via_switch
}

pub fn gpu_relation(topo: &HostTopology, a: &PciLocation, b: &PciLocation) -> Relation {
    match nvlinks_between(topo, a.bdf, b.bdf) {
        0 => pci_relation(a, b),
        n => Relation::nv(n),
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Relations {
    pub gpu_gpu: BTreeMap<Bdf, BTreeMap<Bdf, Relation>>,
    /// `{gpu_bdf: {rdma_device: relation}}`.
    pub gpu_nic: BTreeMap<Bdf, BTreeMap<String, Relation>>,
}

pub fn relations(topo: &HostTopology) -> Relations {
    let mut r = Relations::default();
    for a in &topo.gpus {
        let row = r.gpu_gpu.entry(a.location.bdf).or_default();
        for b in topo
            .gpus
            .iter()
            .filter(|b| b.location.bdf != a.location.bdf)
        {
            row.insert(b.location.bdf, gpu_relation(topo, &a.location, &b.location));
        }
        let row = r.gpu_nic.entry(a.location.bdf).or_default();
        for n in &topo.nics {
            row.insert(
                n.rdma_device.clone(),
                pci_relation(&a.location, &n.location),
            );
        }
    }
    r
}

/// Each GPU's RDMA NIC: nearest first, and when NICs are fewer than GPUs
/// no NIC serves more than its fair share (`ceil(gpus / nics)`). Greedy
/// over (relation, GPU, NIC) order, which is deterministic and gives every
/// GPU its nearest NIC whenever the shares allow it.
pub fn pairing(topo: &HostTopology) -> BTreeMap<Bdf, Option<String>> {
    let mut result: BTreeMap<Bdf, Option<String>> =
        topo.gpus.iter().map(|g| (g.location.bdf, None)).collect();
    if topo.nics.is_empty() {
        return result;
    }
    let share = topo.gpus.len().div_ceil(topo.nics.len());
    let mut candidates: Vec<(Relation, Bdf, usize)> = Vec::new();
    for g in &topo.gpus {
        for (i, n) in topo.nics.iter().enumerate() {
            candidates.push((pci_relation(&g.location, &n.location), g.location.bdf, i));
        }
    }
    candidates.sort();
    let mut load = vec![0usize; topo.nics.len()];
    for (_, gpu, nic) in candidates {
        if load[nic] < share && result.get(&gpu).is_some_and(Option::is_none) {
            result.insert(gpu, Some(topo.nics[nic].rdma_device.clone()));
            load[nic] += 1;
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(rc: &str, path: &[&str], bdf: &str, numa: Option<u32>) -> PciLocation {
        PciLocation {
            bdf: bdf.parse().unwrap(),
            root_complex: rc.into(),
            pcie_path: path.iter().map(|p| p.parse().unwrap()).collect(),
            numa_node: numa,
        }
    }

    #[test]
    fn one_switch_is_pix_two_levels_are_pxb() {
        let rp = "0000:00:01.1";
        let gpu = loc(
            "pci0000:00",
            &[rp, "0000:01:00.0", "0000:02:00.0"],
            "0000:03:00.0",
            Some(0),
        );
        let nic = loc(
            "pci0000:00",
            &[rp, "0000:01:00.0", "0000:02:01.0"],
            "0000:04:00.0",
            Some(0),
        );
        assert_eq!(pci_relation(&gpu, &nic), Relation::Pix);
        let deep = loc(
            "pci0000:00",
            &[
                rp,
                "0000:01:00.0",
                "0000:02:02.0",
                "0000:05:00.0",
                "0000:06:00.0",
            ],
            "0000:07:00.0",
            Some(0),
        );
        assert_eq!(pci_relation(&gpu, &deep), Relation::Pxb);
        assert_eq!(pci_relation(&deep, &gpu), Relation::Pxb);
    }

    #[test]
    fn host_bridge_node_and_system() {
        let a = loc("pci0000:00", &["0000:00:01.1"], "0000:01:00.0", Some(0));
        let b = loc("pci0000:00", &["0000:00:03.1"], "0000:02:00.0", Some(0));
        let c = loc("pci0000:40", &["0000:40:01.1"], "0000:41:00.0", Some(0));
        let d = loc("pci0000:80", &["0000:80:01.1"], "0000:81:00.0", Some(1));
        let unknown = loc("pci0000:c0", &["0000:c0:01.1"], "0000:c1:00.0", None);
        assert_eq!(pci_relation(&a, &b), Relation::Phb);
        assert_eq!(pci_relation(&a, &c), Relation::Node);
        assert_eq!(pci_relation(&a, &d), Relation::Sys);
        // Unknown affinity is never guessed to be near.
        assert_eq!(pci_relation(&a, &unknown), Relation::Sys);
    }

    #[test]
    fn relations_order_nearest_first_and_print_like_nvidia_smi() {
        assert!(Relation::nv(18) < Relation::nv(12));
        assert!(Relation::nv(1) < Relation::Pix);
        assert!(
            Relation::Pix < Relation::Pxb
                && Relation::Phb < Relation::Node
                && Relation::Node < Relation::Sys
        );
        assert_eq!(Relation::nv(12).to_string(), "NV12");
        assert_eq!(serde_json::to_string(&Relation::Pxb).unwrap(), "\"PXB\"");
    }
}
