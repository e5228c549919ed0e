//! What a guest sees of its passed-through devices, derived from where
//! they sit on the host.
//!
//! Devices that share a host PCIe switch group (the top switch below a root
//! port; the root port itself for cards directly on it) go behind one
//! `pcie-expander-bus` on the guest NUMA cell that mirrors their host node,
//! each on a `pcie-root-port` of its own. Guest bus numbers are fixed by
//! the layout: expander *i* (from 0) has `busNr = 0x10·(i+1)` and its root
//! ports' buses follow it in port order, which is how firmware numbers the
//! buses below a PCI expander bridge.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{pairing, Bdf, HostTopology, PciLocation};

pub const BUS_STEP: u8 = 0x10;
/// Expanders fit `0x10…0xf0`; each holds up to 15 root ports.
pub const MAX_GROUPS: usize = 15;
pub const MAX_PORTS_PER_GROUP: usize = (BUS_STEP as usize) - 1;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("{0} is not a GPU of this host")]
    UnknownGpu(Bdf),
    #[error("GPU {0} is listed twice")]
    DuplicateGpu(Bdf),
    #[error("a VM needs at least one vCPU")]
    NoVcpus,
    #[error("the devices sit on {nodes} NUMA nodes; the guest needs a vCPU on each, but {vcpus} were asked")]
    TooFewVcpus { nodes: usize, vcpus: u32 },
    #[error("NUMA node {node} has {available} free CPUs; {wanted} were asked of it")]
    NotEnoughCpus {
        node: u32,
        available: usize,
        wanted: usize,
    },
    #[error("the host has {available} free CPUs; {wanted} were asked ({missing} short)")]
    NotEnoughCpusOnHost {
        available: usize,
        wanted: usize,
        missing: usize,
    },
    #[error("the host reports no NUMA nodes")]
    NoNumaNodes,
    #[error("{0} PCIe switch groups exceed the {MAX_GROUPS} a guest layout holds")]
    TooManyGroups(usize),
    #[error(
        "{0} devices behind one switch exceed the {MAX_PORTS_PER_GROUP} root ports of an expander"
    )]
    TooManyPorts(usize),
    #[error("the BARs of {} are unknown (sysfs resource unreadable, or an agent that predates BAR discovery): the guest's 64-bit aperture cannot be sized", list(.0))]
    UnknownBars(Vec<Bdf>),
    #[error("the guest needs {needed} physical address bits for its memory and its devices' 64-bit BARs; this host's CPU has {host}")]
    AddressSpaceTooWide { needed: u8, host: u8 },
}

fn list(bdfs: &[Bdf]) -> String {
    bdfs.iter()
        .map(Bdf::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A VM's share of a host: GPUs with their NICs, pinned CPUs, memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub gpus: Vec<Bdf>,
    /// NICs passed through, by host function (a PF, or a VF of it), with
    /// the RDMA device of the physical NIC.
    pub nics: Vec<PlacedNic>,
    /// Host CPUs, one per vCPU, grouped by host NUMA node.
    pub cpus: BTreeMap<u32, Vec<u32>>,
    pub memory_mib: BTreeMap<u32, u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacedNic {
    /// What is passed through: the PF, or for RoCE segments a VF of it.
    pub host_bdf: Bdf,
    /// The physical function when `host_bdf` is one of its VFs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pf: Option<Bdf>,
    pub rdma_device: String,
    /// The GPUs this NIC serves (its pairing).
    pub for_gpus: Vec<Bdf>,
}

impl PlacedNic {
    /// The NIC itself: the device allocations and capacity count.
    pub fn physical(&self) -> Bdf {
        self.pf.unwrap_or(self.host_bdf)
    }
}

impl Placement {
    /// The placement without NICs passed through as physical functions
    /// (placements made before Kumo gave tenants VFs only), and the PFs
    /// it let go; `None` when it holds none.
    pub fn without_physical_functions(&self) -> Option<(Placement, Vec<Bdf>)> {
        let pfs: Vec<Bdf> = self
            .nics
            .iter()
            .filter(|n| n.pf.is_none())
            .map(|n| n.host_bdf)
            .collect();
        if pfs.is_empty() {
            return None;
        }
        let mut kept = self.clone();
        kept.nics.retain(|n| n.pf.is_some());
        Some((kept, pfs))
    }
}

/// `total` split in proportion to `weights`, remainders to the first parts.
pub fn split(total: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u64 = weights.iter().sum::<u64>().max(1);
    let mut parts: Vec<u64> = weights.iter().map(|w| total * w / sum).collect();
    let mut rest = total - parts.iter().sum::<u64>();
    for p in parts.iter_mut() {
        if rest == 0 {
            break;
        }
        *p += 1;
        rest -= 1;
    }
    parts
}

/// vCPUs over NUMA nodes: each node of the VM's devices (`weights`:
/// node and device count, in node order) gets one, the rest go in
/// proportion to its devices, each node capped at its `free` CPUs; what
/// does not fit there spills to the device nodes with room (the most
/// devices first), then to the other nodes (the most free CPUs first).
/// Answers `(node, vCPUs)` for the nodes used, in node order, or the
/// device node without a free CPU / the shortfall when the total does not
/// fit. Without this cap a VM asking for all of a machine's CPUs was
/// refused whenever its devices sat unevenly on the nodes.
pub fn spread_vcpus(
    vcpus: u64,
    weights: &[(u32, u64)],
    free: &BTreeMap<u32, u64>,
) -> Result<Vec<(u32, u64)>, SpreadError> {
    let room = |n: u32| free.get(&n).copied().unwrap_or(0);
    if vcpus < weights.len() as u64 {
        return Err(SpreadError::TooFew {
            nodes: weights.len(),
        });
    }
    if let Some((n, _)) = weights.iter().find(|(n, _)| room(*n) == 0) {
        return Err(SpreadError::NoFreeCpu { node: *n });
    }
    let ws: Vec<u64> = weights.iter().map(|(_, w)| *w).collect();
    let wanted = split(vcpus - weights.len() as u64, &ws);
    let mut taken: BTreeMap<u32, u64> = BTreeMap::new();
    let mut over = 0u64;
    for ((n, _), extra) in weights.iter().zip(wanted) {
        let want = extra + 1;
        let take = want.min(room(*n));
        taken.insert(*n, take);
        over += want - take;
    }
    // Spill: device nodes by weight (then node), then the rest by room.
    let mut order: Vec<(u32, u64)> = weights.to_vec();
    order.sort_by_key(|(n, w)| (std::cmp::Reverse(*w), *n));
    let mut others: Vec<u32> = free
        .keys()
        .copied()
        .filter(|n| !weights.iter().any(|(d, _)| d == n))
        .collect();
    others.sort_by_key(|n| (std::cmp::Reverse(room(*n)), *n));
    for n in order.iter().map(|(n, _)| *n).chain(others) {
        if over == 0 {
            break;
        }
        let have = taken.get(&n).copied().unwrap_or(0);
        let more = room(n).saturating_sub(have).min(over);
        if more > 0 {
            taken.insert(n, have + more);
            over -= more;
        }
    }
    if over > 0 {
        return Err(SpreadError::Short { missing: over });
    }
    Ok(taken.into_iter().filter(|(_, v)| *v > 0).collect())
}

/// Why [`spread_vcpus`] found no room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpreadError {
    /// Fewer vCPUs than device nodes.
    TooFew { nodes: usize },
    /// A device node has no free CPU for the device's guest cell.
    NoFreeCpu { node: u32 },
    /// The machine's free CPUs are this many short.
    Short { missing: u64 },
}

/// Memory over the nodes that got vCPUs: a node holding devices gets its
/// devices' share of what the spill-only nodes leave; a node that only
/// took spilled vCPUs, memory in proportion to them (a guest NUMA cell
/// needs memory). Without spill this is the split by devices.
pub fn spread_memory(
    memory_mib: u64,
    weights: &[(u32, u64)],
    vcpus: &[(u32, u64)],
) -> BTreeMap<u32, u64> {
    let total: u64 = vcpus.iter().map(|(_, v)| *v).sum::<u64>().max(1);
    let mut out = BTreeMap::new();
    let mut left = memory_mib;
    for (n, v) in vcpus {
        if !weights.iter().any(|(d, _)| d == n) {
            let m = memory_mib * v / total;
            out.insert(*n, m);
            left -= m;
        }
    }
    let ws: Vec<u64> = weights.iter().map(|(_, w)| *w).collect();
    for ((n, _), m) in weights.iter().zip(split(left, &ws)) {
        out.insert(*n, m);
    }
    out
}

/// A simple placement of `gpus` with a VF of each one's paired RoCE NIC
/// (what a VM on a RoCE segment gets; an InfiniBand HCA goes to no VM):
/// vCPUs and memory split over the NUMA nodes of those devices in
/// proportion to how many sit on each, at least one vCPU per node so every
/// device has a guest cell to belong to (a CPU-only VM uses the first node); CPUs are taken from the
/// start of each node's list. The scheduler makes smarter ones; the layout
/// takes any.
pub fn place(
    topo: &HostTopology,
    gpus: &[Bdf],
    vcpus: u32,
    memory_gib: u32,
) -> Result<Placement, LayoutError> {
    place_avoiding(topo, gpus, vcpus, memory_gib, &InUse::default())
}

/// CPUs and NICs that other VMs on the host already hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InUse {
    pub cpus: std::collections::BTreeSet<u32>,
    pub nics: std::collections::BTreeSet<Bdf>,
}

/// [`place`], leaving alone what `in_use` lists: a GPU whose paired NIC
/// has no VF left goes without one.
pub fn place_avoiding(
    topo: &HostTopology,
    gpus: &[Bdf],
    vcpus: u32,
    memory_gib: u32,
    in_use: &InUse,
) -> Result<Placement, LayoutError> {
    if vcpus == 0 {
        return Err(LayoutError::NoVcpus);
    }
    let mut seen = Vec::new();
    for g in gpus {
        if topo.gpu(*g).is_none() {
            return Err(LayoutError::UnknownGpu(*g));
        }
        if seen.contains(g) {
            return Err(LayoutError::DuplicateGpu(*g));
        }
        seen.push(*g);
    }
    let first_node = topo.numa_nodes.first().ok_or(LayoutError::NoNumaNodes)?.id;
    let pairs = pairing(topo);
    let mut nics: Vec<PlacedNic> = Vec::new();
    for g in gpus {
        let Some(Some(rdma)) = pairs.get(g) else {
            continue;
        };
        match nics.iter_mut().find(|n| &n.rdma_device == rdma) {
            Some(n) => n.for_gpus.push(*g),
            None => {
                // A VF, never the PF: a guest holding a PF could tag any
                // VLAN on the leaf and rewrite the card's firmware.
                let vf = topo.nic(rdma).and_then(|n| {
                    let free = n.vfs.iter().find(|v| !in_use.nics.contains(v));
                    n.roce_vf().and(free).map(|vf| (*vf, n.location.bdf))
                });
                if let Some((vf, pf)) = vf {
                    nics.push(PlacedNic {
                        host_bdf: vf,
                        pf: Some(pf),
                        rdma_device: rdma.clone(),
                        for_gpus: vec![*g],
                    });
                }
            }
        }
    }
    let device_nodes = gpus
        .iter()
        .filter_map(|g| topo.gpu(*g).map(|x| x.location.numa_node))
        .chain(
            nics.iter()
                .filter_map(|n| topo.nic(&n.rdma_device).map(|x| x.location.numa_node)),
        );
    let mut weight: BTreeMap<u32, u64> = BTreeMap::new();
    for node in device_nodes {
        *weight.entry(node.unwrap_or(first_node)).or_default() += 1;
    }
    if weight.is_empty() {
        // A CPU-only VM goes where the most CPUs are free.
        let free = |n: &crate::NumaNode| n.cpus.iter().filter(|c| !in_use.cpus.contains(c)).count();
        let best = topo
            .numa_nodes
            .iter()
            .max_by(|a, b| free(a).cmp(&free(b)).then(b.id.cmp(&a.id)))
            .map(|n| n.id)
            .unwrap_or(first_node);
        weight.insert(best, 1);
    }
    if (vcpus as usize) < weight.len() {
        return Err(LayoutError::TooFewVcpus {
            nodes: weight.len(),
            vcpus,
        });
    }
    let weights: Vec<(u32, u64)> = weight.into_iter().collect();
    let free: BTreeMap<u32, Vec<u32>> = topo
        .numa_nodes
        .iter()
        .map(|n| {
            let cpus = n.cpus.iter().copied().filter(|c| !in_use.cpus.contains(c));
            (n.id, cpus.collect())
        })
        .collect();
    let room: BTreeMap<u32, u64> = free.iter().map(|(n, c)| (*n, c.len() as u64)).collect();
    let spread = spread_vcpus(u64::from(vcpus), &weights, &room).map_err(|e| match e {
        SpreadError::TooFew { nodes } => LayoutError::TooFewVcpus { nodes, vcpus },
        SpreadError::NoFreeCpu { node } => LayoutError::NotEnoughCpus {
            node,
            available: 0,
            wanted: 1,
        },
        SpreadError::Short { missing } => LayoutError::NotEnoughCpusOnHost {
            available: room.values().sum::<u64>() as usize,
            wanted: vcpus as usize,
            missing: missing as usize,
        },
    })?;
    let memory_mib = spread_memory(u64::from(memory_gib) * 1024, &weights, &spread);
    let cpus = spread
        .iter()
        .map(|(n, v)| {
            let list = free.get(n).map(|c| c[..*v as usize].to_vec());
            (*n, list.unwrap_or_default())
        })
        .collect();
    Ok(Placement {
        gpus: gpus.to_vec(),
        nics,
        cpus,
        memory_mib,
    })
}

/// The host switch group a device belongs to (see the module docs).
pub fn switch_group(loc: &PciLocation) -> String {
    match loc.pcie_path.as_slice() {
        [_, top, ..] => top.to_string(),
        [port] => port.to_string(),
        [] => loc.root_complex.clone(),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuestLayout {
    pub cells: Vec<GuestCell>,
    pub expanders: Vec<Expander>,
    /// `(vcpu, host cpu)`.
    pub vcpu_pins: Vec<(u32, u32)>,
    /// The guest's firmware and address space (see [`AddressSpace`]).
    #[serde(flatten)]
    pub address_space: AddressSpace,
}

/// Which firmware boots the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Firmware {
    /// SeaBIOS, QEMU's default: what CPU-only VMs keep.
    Bios,
    /// OVMF (UEFI): it maps 64-bit BARs in an aperture whose size the host
    /// sets (`opt/ovmf/X-PciMmio64Mb`); SeaBIOS cannot place 128–256 GiB
    /// BARs at all.
    Efi,
}

/// What a guest with passed-through devices needs to boot: UEFI, a 64-bit
/// MMIO aperture that holds every 64-bit BAR of its devices as the
/// firmware lays them out, and a CPU that can address RAM plus that
/// aperture. Too small an aperture leaves GPUs without BARs (missing in
/// the guest, or a hung boot: kubevirt#11093, lxd#14381).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AddressSpace {
    pub firmware: Firmware,
    /// The 64-bit MMIO aperture in bytes; `None` without devices, or when
    /// a device's BARs are unknown (`unknown_bars`).
    pub mmio64_bytes: Option<u64>,
    /// The guest CPU's physical address width; `None` as for the aperture.
    pub phys_bits: Option<u8>,
    /// The host CPU's width, the most the guest may be given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_phys_bits: Option<u8>,
    /// Passed-through functions whose BARs the host could not read: such
    /// a VM is refused at start rather than given a guessed aperture.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unknown_bars: Vec<Bdf>,
}

/// The root bus's own 64-bit needs beside the expanders': virtio BARs and
/// the firmware's reservations behind empty hot-plug root ports.
pub const ROOT_BUS_RESERVE: u64 = 1 << 30;
/// QEMU's default guest width; a guest is never given less.
pub const MIN_PHYS_BITS: u8 = 40;
const GIB: u64 = 1 << 30;

/// A range firmware must find room for: a BAR (aligned to its size) or a
/// bridge's window (aligned to its largest child's alignment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub size: u64,
    pub align: u64,
}

impl Window {
    pub fn bar(size: u64) -> Window {
        Window {
            size,
            align: size.checked_next_power_of_two().unwrap_or(size),
        }
    }
}

/// A bridge's prefetchable window over what sits below it, as EDK2's PCI
/// bus driver lays it out: children largest alignment first, the window
/// rounded up to its own alignment (the largest child's). Every child's
/// size is a multiple of its alignment (BARs are powers of two, windows
/// are rounded), so in that order they pack without gaps.
pub fn bridge_window(children: impl IntoIterator<Item = Window>) -> Window {
    let mut ws: Vec<Window> = children.into_iter().filter(|w| w.size > 0).collect();
    ws.sort_unstable_by_key(|w| std::cmp::Reverse(w.align));
    let Some(align) = ws.first().map(|w| w.align) else {
        return Window { size: 0, align: 1 };
    };
    let sum = ws.iter().fold(0u64, |a, w| a.saturating_add(w.size));
    Window {
        size: sum.div_ceil(align).saturating_mul(align),
        align,
    }
}

/// The aperture for these expanders (each a list of root ports, each the
/// 64-bit prefetchable BAR sizes of its device and IOMMU-group peers):
/// each root port's window over its BARs, each expander's over its
/// ports', the expanders side by side, plus [`ROOT_BUS_RESERVE`]; in
/// whole GiB (OVMF takes MiB).
pub fn aperture(expander_ports: &[Vec<Vec<u64>>]) -> u64 {
    let expanders = expander_ports.iter().map(|ports| {
        bridge_window(
            ports
                .iter()
                .map(|bars| bridge_window(bars.iter().map(|b| Window::bar(*b)))),
        )
    });
    let total = bridge_window(expanders)
        .size
        .saturating_add(ROOT_BUS_RESERVE);
    total.div_ceil(GIB).saturating_mul(GIB)
}

/// The physical address width that reaches RAM and the aperture: q35
/// puts RAM above 4 GiB (counted whole here, an upper bound), OVMF aligns
/// the aperture to the largest power of two not above its size.
pub fn phys_bits_for(memory_bytes: u64, aperture: u64) -> u8 {
    let ram_top = (4 * GIB).saturating_add(memory_bytes);
    let align = if aperture == 0 {
        1
    } else {
        1u64 << (63 - aperture.leading_zeros())
    };
    let end = ram_top
        .div_ceil(align)
        .saturating_mul(align)
        .saturating_add(aperture);
    let bits = 64 - end.saturating_sub(1).leading_zeros();
    (bits as u8).max(MIN_PHYS_BITS)
}

impl GuestLayout {
    /// Whether a domain can be started from this layout: every device's
    /// BARs known, and the address space within the host CPU's.
    pub fn bootable(&self) -> Result<(), LayoutError> {
        let a = &self.address_space;
        if !a.unknown_bars.is_empty() {
            return Err(LayoutError::UnknownBars(a.unknown_bars.clone()));
        }
        if let (Some(needed), Some(host)) = (a.phys_bits, a.host_phys_bits) {
            if needed > host {
                return Err(LayoutError::AddressSpaceTooWide { needed, host });
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuestCell {
    pub id: u32,
    pub host_node: u32,
    pub vcpus: Vec<u32>,
    pub memory_mib: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Expander {
    /// libvirt controller index.
    pub index: u32,
    pub bus_nr: u8,
    pub guest_node: u32,
    /// The host switch (or root port) the group mirrors.
    pub host_group: String,
    /// Link of the host switch's upstream port, for the NCCL file.
    pub link_speed: Option<String>,
    pub link_width: Option<u32>,
    pub switch_vendor: Option<u16>,
    pub switch_device: Option<u16>,
    pub ports: Vec<RootPort>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RootPort {
    /// libvirt controller index; also the chassis number.
    pub index: u32,
    /// Slot on the expander's bus.
    pub slot: u8,
    pub device: GuestDevice,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    Gpu,
    Nic { rdma_device: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuestDevice {
    pub kind: DeviceKind,
    pub host_bdf: Bdf,
    pub guest_bdf: Bdf,
    /// Other functions of the same IOMMU group: they must go along.
    pub group_peers: Vec<Bdf>,
    pub class: u32,
    pub vendor: u16,
    pub device: u16,
    pub link_speed: Option<String>,
    pub link_width: Option<u32>,
}

impl GuestLayout {
    pub fn devices(&self) -> impl Iterator<Item = (&Expander, &RootPort)> {
        self.expanders
            .iter()
            .flat_map(|e| e.ports.iter().map(move |p| (e, p)))
    }

    pub fn guest_bdf(&self, host: Bdf) -> Option<Bdf> {
        self.devices()
            .find(|(_, p)| p.device.host_bdf == host)
            .map(|(_, p)| p.device.guest_bdf)
    }

    pub fn expander_of(&self, host: Bdf) -> Option<&Expander> {
        self.devices()
            .find(|(_, p)| p.device.host_bdf == host)
            .map(|(e, _)| e)
    }
}

/// The guest's NUMA cells, expanders, root ports and vCPU pinning.
pub fn guest_layout(
    topo: &HostTopology,
    placement: &Placement,
) -> Result<GuestLayout, LayoutError> {
    let mut host_nodes: Vec<u32> = placement
        .cpus
        .keys()
        .chain(placement.memory_mib.keys())
        .copied()
        .collect();
    host_nodes.sort_unstable();
    host_nodes.dedup();
    let mut cells = Vec::new();
    let mut vcpu_pins = Vec::new();
    let mut next_vcpu = 0u32;
    for (i, node) in host_nodes.iter().enumerate() {
        let host_cpus = placement.cpus.get(node).cloned().unwrap_or_default();
        let vcpus: Vec<u32> = (next_vcpu..next_vcpu + host_cpus.len() as u32).collect();
        next_vcpu += host_cpus.len() as u32;
        vcpu_pins.extend(vcpus.iter().copied().zip(host_cpus.iter().copied()));
        cells.push(GuestCell {
            id: i as u32,
            host_node: *node,
            vcpus,
            memory_mib: placement.memory_mib.get(node).copied().unwrap_or(0),
        });
    }
    let guest_node = |host: Option<u32>| {
        cells
            .iter()
            .find(|c| Some(c.host_node) == host)
            .or(cells.first())
            .map(|c| c.id)
            .unwrap_or(0)
    };

    // Group devices by host switch group, ordered by guest node then group.
    let mut members: Vec<(&PciLocation, DeviceKind)> = Vec::new();
    for g in &placement.gpus {
        if let Some(gpu) = topo.gpu(*g) {
            members.push((&gpu.location, DeviceKind::Gpu));
        }
    }
    for n in &placement.nics {
        let loc = topo
            .pci(n.host_bdf)
            .map(|d| &d.location)
            .or_else(|| topo.nic(&n.rdma_device).map(|x| &x.location));
        if let Some(loc) = loc {
            members.push((
                loc,
                DeviceKind::Nic {
                    rdma_device: n.rdma_device.clone(),
                },
            ));
        }
    }
    let mut groups: BTreeMap<(u32, String), Vec<(&PciLocation, DeviceKind)>> = BTreeMap::new();
    for (loc, kind) in members {
        groups
            .entry((guest_node(loc.numa_node), switch_group(loc)))
            .or_default()
            .push((loc, kind));
    }
    if groups.len() > MAX_GROUPS {
        return Err(LayoutError::TooManyGroups(groups.len()));
    }
    let mut expanders = Vec::new();
    let mut next_index = groups.len() as u32 + 1;
    for (i, ((node, group), mut devs)) in groups.into_iter().enumerate() {
        if devs.len() > MAX_PORTS_PER_GROUP {
            return Err(LayoutError::TooManyPorts(devs.len()));
        }
        devs.sort_by_key(|(loc, _)| loc.bdf);
        let bus_nr = BUS_STEP * (i as u8 + 1);
        let top = group.parse::<Bdf>().ok().and_then(|b| topo.pci(b));
        let mut ports = Vec::new();
        for (slot, (loc, kind)) in devs.into_iter().enumerate() {
            let host = topo.pci(loc.bdf);
            let group_peers = match host.and_then(|h| h.iommu_group) {
                Some(g) => topo
                    .pci_devices
                    .iter()
                    .filter(|d| {
                        d.iommu_group == Some(g) && d.location.bdf != loc.bdf && !d.is_bridge()
                    })
                    .map(|d| d.location.bdf)
                    .collect(),
                None => Vec::new(),
            };
            ports.push(RootPort {
                index: next_index,
                slot: slot as u8,
                device: GuestDevice {
                    kind,
                    host_bdf: loc.bdf,
                    // A VF is a device of its own in the guest: function 0.
                    guest_bdf: Bdf::new(
                        0,
                        bus_nr + 1 + slot as u8,
                        0,
                        if topo.nics.iter().any(|n| n.vfs.contains(&loc.bdf)) {
                            0
                        } else {
                            loc.bdf.function
                        },
                    ),
                    group_peers,
                    class: host.map(|h| h.class).unwrap_or(0),
                    vendor: host.map(|h| h.vendor).unwrap_or(0),
                    device: host.map(|h| h.device).unwrap_or(0),
                    link_speed: host.and_then(|h| h.link_speed.clone()),
                    link_width: host.and_then(|h| h.link_width),
                },
            });
            next_index += 1;
        }
        expanders.push(Expander {
            index: i as u32 + 1,
            bus_nr,
            guest_node: node,
            host_group: group,
            link_speed: top.and_then(|t| t.link_speed.clone()),
            link_width: top.and_then(|t| t.link_width),
            switch_vendor: top.map(|t| t.vendor),
            switch_device: top.map(|t| t.device),
            ports,
        });
    }
    let address_space = address_space(topo, &cells, &expanders);
    Ok(GuestLayout {
        cells,
        expanders,
        vcpu_pins,
        address_space,
    })
}

/// Firmware, aperture and address width for the devices of `expanders`.
fn address_space(topo: &HostTopology, cells: &[GuestCell], expanders: &[Expander]) -> AddressSpace {
    if expanders.is_empty() {
        return AddressSpace {
            firmware: Firmware::Bios,
            mmio64_bytes: None,
            phys_bits: None,
            host_phys_bits: topo.phys_bits,
            unknown_bars: Vec::new(),
        };
    }
    let mut unknown_bars = Vec::new();
    let ports: Vec<Vec<Vec<u64>>> = expanders
        .iter()
        .map(|e| {
            e.ports
                .iter()
                .map(|p| {
                    let functions = std::iter::once(p.device.host_bdf)
                        .chain(p.device.group_peers.iter().copied());
                    let mut sizes = Vec::new();
                    for f in functions {
                        match topo.pci(f).and_then(|d| d.bars.as_ref()) {
                            Some(bars) => {
                                sizes.extend(bars.iter().filter(|b| b.above_4g()).map(|b| b.size))
                            }
                            None => unknown_bars.push(f),
                        }
                    }
                    sizes
                })
                .collect()
        })
        .collect();
    let (mmio64_bytes, phys_bits) = if unknown_bars.is_empty() {
        let memory: u64 = cells.iter().map(|c| c.memory_mib << 20).sum();
        let bytes = aperture(&ports);
        (Some(bytes), Some(phys_bits_for(memory, bytes)))
    } else {
        (None, None)
    };
    AddressSpace {
        firmware: Firmware::Efi,
        mmio64_bytes,
        phys_bits,
        host_phys_bits: topo.phys_bits,
        unknown_bars,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridge_windows_round_to_their_largest_alignment() {
        let bars = |s: &[u64]| bridge_window(s.iter().map(|b| Window::bar(*b)));
        // An H100 on its root port: 128 GiB + 32 MiB + 16 MiB takes
        // 256 GiB, as the next 128 GiB-aligned window starts there.
        let h100 = bars(&[128 * GIB, 32 << 20, 16 << 20]);
        assert_eq!(
            h100,
            Window {
                size: 256 * GIB,
                align: 128 * GIB
            }
        );
        assert_eq!(bars(&[128 * GIB]).size, 128 * GIB);
        assert_eq!(bars(&[128 * GIB, 128 * GIB]).size, 256 * GIB);
        assert_eq!(bars(&[]).size, 0);
        // An expander with that GPU's port and its NIC's (32 MiB): the
        // window aligns to 128 GiB, not to its 256 GiB child's size.
        let nic = bars(&[32 << 20]);
        assert_eq!(bridge_window([h100, nic]).size, 384 * GIB);
    }

    #[test]
    fn the_aperture_holds_every_expander_and_the_root_bus() {
        let h100 = vec![128 * GIB, 32 << 20, 16 << 20];
        // Four H100s, each behind its own expander: 4 × 256 GiB + 1 GiB.
        // (Four windows of 256 GiB aligned to 128 GiB pack without gaps.)
        let four: Vec<Vec<Vec<u64>>> = (0..4).map(|_| vec![h100.clone()]).collect();
        assert_eq!(aperture(&four), 1025 * GIB);
        // Four bare 128 GiB BARs (the boot test's stand-ins).
        let bare: Vec<Vec<Vec<u64>>> = (0..4).map(|_| vec![vec![128 * GIB]]).collect();
        assert_eq!(aperture(&bare), 513 * GIB);
        assert_eq!(aperture(&[]), GIB);
    }

    #[test]
    fn the_address_width_reaches_ram_and_the_aligned_aperture() {
        // 1 GiB of RAM: the 513 GiB aperture aligns to 512 GiB, ends at
        // 1025 GiB: 41 bits.
        assert_eq!(phys_bits_for(GIB, 513 * GIB), 41);
        // 2 TiB of RAM and 8 H200s (8 × 512 GiB + 1 GiB): the RAM top at
        // 2 TiB + 4 GiB aligns to 4 TiB, plus 4 TiB + 1 GiB: past 8 TiB,
        // 44 bits.
        assert_eq!(phys_bits_for(2048 * GIB, 4097 * GIB), 44);
        // Small guests keep QEMU's 40.
        assert_eq!(phys_bits_for(GIB, GIB), MIN_PHYS_BITS);
    }

    #[test]
    fn a_placement_lets_its_physical_functions_go() {
        let b = |s: &str| s.parse::<Bdf>().unwrap();
        let nic = |host: &str, pf: Option<&str>| PlacedNic {
            host_bdf: b(host),
            pf: pf.map(b),
            rdma_device: "mlx5_0".into(),
            for_gpus: vec![b("0000:18:00.0")],
        };
        let mut p = Placement {
            gpus: vec![b("0000:18:00.0")],
            nics: vec![
                nic("0000:19:00.0", None),
                nic("0000:1a:00.2", Some("0000:1a:00.0")),
            ],
            cpus: BTreeMap::new(),
            memory_mib: BTreeMap::new(),
        };
        let (kept, pfs) = p.without_physical_functions().unwrap();
        assert_eq!(pfs, vec![b("0000:19:00.0")]);
        assert_eq!(kept.nics.len(), 1);
        assert_eq!(kept.nics[0].pf, Some(b("0000:1a:00.0")));
        p.nics.remove(0);
        assert!(p.without_physical_functions().is_none());
    }

    #[test]
    fn splits_are_proportional_and_exact() {
        assert_eq!(split(10, &[1, 1]), vec![5, 5]);
        assert_eq!(split(7, &[3, 1]), vec![6, 1]);
        assert_eq!(split(5, &[1, 1, 1]), vec![2, 2, 1]);
        assert_eq!(split(0, &[1]), vec![0]);
    }
}
