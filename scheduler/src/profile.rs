//! What the scheduler needs to know of a host's design, derived once from
//! its topology: GPU and NIC slots as bit positions, NUMA nodes with their
//! CPUs and memory, NVLink domains, GPU↔NIC pairing and rails.

use std::collections::{BTreeMap, HashMap};

use kumo_topology::guest_layout::switch_group;
use kumo_topology::relation::pci_relation;
use kumo_topology::{pairing, Bdf, FabricManager, HostTopology, Relation};

/// Devices of one kind a host may have: one bit each in a `u64`.
pub const MAX_SLOTS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSlot {
    pub bdf: Bdf,
    /// Interned model (see [`crate::Index::model_id`]).
    pub model: u16,
    /// Index into [`HostProfile::nodes`].
    pub node: usize,
    /// The paired NIC (index into [`HostProfile::nics`]).
    pub nic: Option<usize>,
    /// NICs at PIX or PXB distance.
    pub near_nics: u64,
    /// NVLink domain: GPUs joined by NVLinks, directly or through NVSwitches.
    pub domain: u16,
    /// PCIe switch group (GPUs that share a switch share a NIC on DGX A100).
    pub group: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicSlot {
    pub bdf: Bdf,
    pub rdma_device: String,
    pub node: usize,
    /// The rail this port is cabled to: the same rail on every host of a
    /// scalable unit reaches the same leaf switch.
    pub rail: Option<u32>,
    /// The VF a VM on a RoCE segment gets (Ethernet ports with SR-IOV).
    pub roce_vf: Option<Bdf>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSlot {
    pub id: u32,
    pub cpus: Vec<u32>,
    pub memory_mib: u64,
    /// GPUs on this node.
    pub gpus: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostProfile {
    pub gpus: Vec<GpuSlot>,
    pub nics: Vec<NicSlot>,
    pub nodes: Vec<NodeSlot>,
    /// `(model, GPUs of that model)`.
    pub model_masks: Vec<(u16, u64)>,
    /// The largest NVLink domain: a request no larger than this should not
    /// be split across domains.
    pub max_domain: u32,
    /// Every GPU's paired NIC has a RoCE VF: GPU VMs on RoCE segments fit.
    pub roce: bool,
    /// On an NVSwitch host in Fabric Manager's shared mode, the GPU sets
    /// a VM may have (its partitions, as GPU masks); while Fabric Manager
    /// does not answer, single GPUs only. `None`: any set.
    pub partitions: Option<Vec<u64>>,
    gpu_by_bdf: HashMap<Bdf, usize>,
    nic_by_bdf: HashMap<Bdf, usize>,
    cpu_pos: HashMap<u32, (usize, usize)>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("{1} {0} exceed the {MAX_SLOTS} a host may have")]
    TooMany(&'static str, usize),
    #[error("the host reports no NUMA nodes")]
    NoNumaNodes,
}

fn find(parent: &mut [usize], mut i: usize) -> usize {
    while parent[i] != i {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    i
}

impl HostProfile {
    /// `intern` turns a GPU model name into its id; `rails` maps RDMA
    /// devices to rails (from the host's configuration). Without it, the
    /// NICs paired with GPUs take rails 0, 1, … in bus order.
    pub fn new(
        topo: &HostTopology,
        rails: &BTreeMap<String, u32>,
        mut intern: impl FnMut(&str) -> u16,
    ) -> Result<HostProfile, ProfileError> {
        if topo.gpus.len() > MAX_SLOTS {
            return Err(ProfileError::TooMany("GPUs", topo.gpus.len()));
        }
        if topo.nics.len() > MAX_SLOTS {
            return Err(ProfileError::TooMany("RDMA NICs", topo.nics.len()));
        }
        let first = topo.numa_nodes.first().ok_or(ProfileError::NoNumaNodes)?.id;
        let node_index: HashMap<u32, usize> = topo
            .numa_nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id, i))
            .collect();
        let node_of = |n: Option<u32>| {
            node_index
                .get(&n.unwrap_or(first))
                .copied()
                .unwrap_or_default()
        };
        let pairs = pairing(topo);
        let paired: std::collections::BTreeSet<&str> =
            pairs.values().flatten().map(String::as_str).collect();
        let mut next_rail = 0;
        let nics: Vec<NicSlot> = topo
            .nics
            .iter()
            .map(|n| {
                let rail = match rails.get(&n.rdma_device) {
                    Some(r) => Some(*r),
                    None if rails.is_empty() && paired.contains(n.rdma_device.as_str()) => {
                        next_rail += 1;
                        Some(next_rail - 1)
                    }
                    None => None,
                };
                NicSlot {
                    bdf: n.location.bdf,
                    rdma_device: n.rdma_device.clone(),
                    node: node_of(n.location.numa_node),
                    rail,
                    roce_vf: n.roce_vf(),
                }
            })
            .collect();
        // NVLink domains by union-find over GPUs and the switches they reach.
        let n_gpus = topo.gpus.len();
        let gpu_by_bdf: HashMap<Bdf, usize> = topo
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| (g.location.bdf, i))
            .collect();
        let mut switch_ids: HashMap<Bdf, usize> = HashMap::new();
        for g in &topo.gpus {
            for l in &g.nvlinks {
                if !gpu_by_bdf.contains_key(&l.target) {
                    let next = n_gpus + switch_ids.len();
                    switch_ids.entry(l.target).or_insert(next);
                }
            }
        }
        let mut parent: Vec<usize> = (0..n_gpus + switch_ids.len()).collect();
        for (i, g) in topo.gpus.iter().enumerate() {
            for l in g.nvlinks.iter().filter(|l| l.count > 0) {
                let j = gpu_by_bdf
                    .get(&l.target)
                    .or_else(|| switch_ids.get(&l.target))
                    .copied();
                if let Some(j) = j {
                    let (a, b) = (find(&mut parent, i), find(&mut parent, j));
                    parent[a] = b;
                }
            }
        }
        let mut domain_ids: HashMap<usize, u16> = HashMap::new();
        let mut groups: HashMap<String, u16> = HashMap::new();
        let mut gpus = Vec::with_capacity(n_gpus);
        for (i, g) in topo.gpus.iter().enumerate() {
            let root = find(&mut parent, i);
            let next = domain_ids.len() as u16;
            let domain = *domain_ids.entry(root).or_insert(next);
            let next = groups.len() as u16;
            let group = *groups.entry(switch_group(&g.location)).or_insert(next);
            let nic = pairs
                .get(&g.location.bdf)
                .cloned()
                .flatten()
                .and_then(|r| nics.iter().position(|n| n.rdma_device == r));
            let near_nics = topo
                .nics
                .iter()
                .enumerate()
                .filter(|(_, n)| {
                    matches!(
                        pci_relation(&g.location, &n.location),
                        Relation::Pix | Relation::Pxb
                    )
                })
                .fold(0u64, |m, (j, _)| m | (1 << j));
            gpus.push(GpuSlot {
                bdf: g.location.bdf,
                model: intern(&g.model),
                node: node_of(g.location.numa_node),
                nic,
                near_nics,
                domain,
                group,
            });
        }
        let mut nodes: Vec<NodeSlot> = topo
            .numa_nodes
            .iter()
            .map(|n| NodeSlot {
                id: n.id,
                cpus: n.cpus.clone(),
                memory_mib: n.memory_kib.unwrap_or(0) / 1024,
                gpus: 0,
            })
            .collect();
        let mut model_masks: Vec<(u16, u64)> = Vec::new();
        let mut domain_size: HashMap<u16, u32> = HashMap::new();
        for (i, g) in gpus.iter().enumerate() {
            nodes[g.node].gpus |= 1 << i;
            match model_masks.iter_mut().find(|(m, _)| *m == g.model) {
                Some((_, mask)) => *mask |= 1 << i,
                None => model_masks.push((g.model, 1 << i)),
            }
            *domain_size.entry(g.domain).or_default() += 1;
        }
        let mut cpu_pos = HashMap::new();
        for (ni, n) in nodes.iter().enumerate() {
            for (p, c) in n.cpus.iter().enumerate() {
                cpu_pos.insert(*c, (ni, p));
            }
        }
        let nic_by_bdf = nics.iter().enumerate().map(|(i, n)| (n.bdf, i)).collect();
        let roce = !gpus.is_empty()
            && gpus
                .iter()
                .all(|g| g.nic.is_some_and(|n| nics[n].roce_vf.is_some()));
        let index_of: HashMap<Bdf, usize> =
            gpus.iter().enumerate().map(|(i, g)| (g.bdf, i)).collect();
        let partitions = match &topo.fabric_manager {
            None => None,
            // A partition naming a GPU the host does not list is left out.
            Some(FabricManager::Partitions(ps)) => Some(
                ps.iter()
                    .filter_map(|p| {
                        p.gpus
                            .iter()
                            .map(|b| index_of.get(b).map(|i| 1u64 << i))
                            .try_fold(0u64, |m, b| Some(m | b?))
                    })
                    .filter(|m| *m != 0)
                    .collect(),
            ),
            Some(FabricManager::Unreachable(_)) => {
                Some((0..gpus.len()).map(|i| 1u64 << i).collect())
            }
        };
        Ok(HostProfile {
            max_domain: domain_size.values().copied().max().unwrap_or(0),
            roce,
            partitions,
            gpus,
            nics,
            nodes,
            model_masks,
            gpu_by_bdf,
            nic_by_bdf,
            cpu_pos,
        })
    }

    pub fn gpu_index(&self, bdf: &Bdf) -> Option<usize> {
        self.gpu_by_bdf.get(bdf).copied()
    }

    pub fn nic_index(&self, bdf: &Bdf) -> Option<usize> {
        self.nic_by_bdf.get(bdf).copied()
    }

    /// `(node index, position in the node's CPU list)`.
    pub fn cpu_position(&self, cpu: u32) -> Option<(usize, usize)> {
        self.cpu_pos.get(&cpu).copied()
    }

    pub fn model_mask(&self, model: u16) -> u64 {
        self.model_masks
            .iter()
            .find(|(m, _)| *m == model)
            .map(|(_, mask)| *mask)
            .unwrap_or(0)
    }

    pub fn all_gpus(&self) -> u64 {
        mask_of(self.gpus.len())
    }
}

/// The low `n` bits.
pub fn mask_of(n: usize) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

/// Set bit positions, lowest first.
pub fn bits(mut m: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if m == 0 {
            None
        } else {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            Some(i)
        }
    })
}
