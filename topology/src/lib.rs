//! A GPU host's topology — NUMA nodes, the PCIe tree, GPUs, RDMA NICs,
//! NVSwitches and NVLinks — as plain data, with the functions over it.
//!
//! `sysfs` reads it from a host (IO at the edge); `relation` computes
//! `nvidia-smi topo -m` relations and the GPU↔NIC pairing; `matrix`
//! prints them; `fixtures` writes sysfs trees of real machine designs for
//! tests and simulated hosts.

use serde::{Deserialize, Serialize};

pub mod bdf;
pub mod domain_xml;
pub mod fixtures;
pub mod gpu_telemetry;
pub mod guest_layout;
pub mod health;
pub mod matrix;
pub mod nccl_xml;
pub mod partitions;
pub mod readiness;
pub mod relation;
pub mod render;
pub mod sysfs;
pub mod xml;

pub use bdf::Bdf;
pub use relation::{pairing, relations, Relation, Relations};

pub const VENDOR_NVIDIA: u16 = 0x10de;
pub const VENDOR_MELLANOX: u16 = 0x15b3;
pub const CLASS_3D_CONTROLLER: u32 = 0x030200;
pub const CLASS_VGA: u32 = 0x030000;
pub const CLASS_INFINIBAND: u32 = 0x020700;
pub const CLASS_ETHERNET: u32 = 0x020000;
pub const CLASS_BRIDGE_PCI: u32 = 0x060400;
pub const CLASS_BRIDGE_OTHER: u32 = 0x068000;

/// What an agent reports about its host.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostTopology {
    /// CPU identity for NCCL's `cpu` element; unknown when neither
    /// `/proc/cpuinfo` nor a hint file says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuIdentity>,
    pub numa_nodes: Vec<NumaNode>,
    /// Every PCI function read, bridges included, by address.
    pub pci_devices: Vec<PciDevice>,
    pub gpus: Vec<Gpu>,
    pub nics: Vec<Nic>,
    pub nvswitches: Vec<NvSwitch>,
    /// The host CPU's physical address width (`address sizes` in
    /// `/proc/cpuinfo`): the most a guest's address space may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phys_bits: Option<u8>,
    /// Whether an IOMMU groups the host's devices (`None`: not read, a
    /// topology from an older agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hugepages: Vec<HugePages>,
    /// NVSwitch partitions as NVIDIA Fabric Manager (shared NVSwitch
    /// mode) supports them, or why they are unknown; `None` on a host
    /// whose agent talks to no Fabric Manager.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric_manager: Option<FabricManager>,
    /// What could not be read or made sense of, in words. Never fatal.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuIdentity {
    pub arch: String,
    pub vendor: String,
    pub family_id: u32,
    pub model_id: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    pub id: u32,
    pub cpus: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_kib: Option<u64>,
}

/// Where a PCI function sits: its root complex and the bridges above it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciLocation {
    pub bdf: Bdf,
    /// The host bridge, as sysfs names it (`pci0000:00`).
    pub root_complex: String,
    /// Bridges from the root complex down to the device's parent.
    pub pcie_path: Vec<Bdf>,
    /// `None` when sysfs says `-1` or nothing: no affinity known.
    pub numa_node: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciDevice {
    #[serde(flatten)]
    pub location: PciLocation,
    pub class: u32,
    pub vendor: u16,
    pub device: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subsystem_vendor: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subsystem_device: Option<u16>,
    /// `max_link_speed`, e.g. `16.0 GT/s PCIe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_speed: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_width: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu_group: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// Memory BARs from sysfs `resource`; `None` when that file could not
    /// be read (a topology from an agent that predates BAR discovery, or
    /// an unreadable file): never guessed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bars: Option<Vec<Bar>>,
    /// A PCIe bridge's port type and ACS, from its config space; `None`
    /// for endpoints, and where config space could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<PciePort>,
}

/// A PCIe port (a bridge function): what kind, and its Access Control
/// Services, which keep peer-to-peer traffic below it going through the
/// IOMMU rather than straight to a neighbour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciePort {
    /// The PCIe capability's device/port type: 4 root port, 5 switch
    /// upstream port, 6 switch downstream port.
    pub port_type: u8,
    pub acs: Acs,
}

pub const PORT_ROOT: u8 = 4;
pub const PORT_UPSTREAM: u8 = 5;
pub const PORT_DOWNSTREAM: u8 = 6;

/// A port's ACS extended capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Acs {
    /// Config space past 256 bytes was not readable (not root).
    Unreadable,
    Absent,
    /// The capability and control registers.
    Present {
        capable: u16,
        control: u16,
    },
}

/// ACS controls a passthrough port must have on (what Linux enables):
/// source validation, P2P request and completion redirect, upstream
/// forwarding.
pub const ACS_SV: u16 = 1 << 0;
pub const ACS_RR: u16 = 1 << 2;
pub const ACS_CR: u16 = 1 << 3;
pub const ACS_UF: u16 = 1 << 4;
pub const ACS_REQUIRED: u16 = ACS_SV | ACS_RR | ACS_CR | ACS_UF;

/// What a host's Fabric Manager says of its NVSwitch partitions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FabricManager {
    /// The partitions it supports: a multi-GPU VM gets NVLink only on a
    /// GPU set that is one of them, activated.
    Partitions(Vec<Partition>),
    /// It did not answer: the host takes 1-GPU VMs only.
    Unreachable(String),
}

/// One supported NVSwitch partition: its Fabric Manager id and its GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    pub id: u32,
    pub gpus: Vec<Bdf>,
}

/// One hugepage pool of the host (`/sys/kernel/mm/hugepages`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HugePages {
    pub size_kib: u64,
    pub total: u64,
    pub free: u64,
}

/// One memory BAR of a PCI function (`resource` line `index`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bar {
    pub index: u8,
    pub size: u64,
    /// A 64-bit BAR (`IORESOURCE_MEM_64`): firmware may place it above 4 GiB.
    pub mem64: bool,
    pub prefetchable: bool,
}

impl Bar {
    /// Goes into the guest's 64-bit aperture: bridges forward 64-bit
    /// addresses only through their prefetchable window.
    pub fn above_4g(&self) -> bool {
        self.mem64 && self.prefetchable
    }
}

impl PciDevice {
    pub fn bdf(&self) -> Bdf {
        self.location.bdf
    }

    pub fn is_bridge(&self) -> bool {
        self.class >> 8 == CLASS_BRIDGE_PCI >> 8
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    #[serde(flatten)]
    pub location: PciLocation,
    /// Marketing model from the PCI ids, e.g. `H100-SXM5-80GB`.
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu_group: Option<u32>,
    /// NVLinks to NVSwitches or peer GPUs (from NVML or a hint file;
    /// sysfs does not show them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlinks: Vec<NvLink>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvLink {
    pub target: Bdf,
    pub count: u32,
    /// `0x068000` NVSwitch, `0x030200` GPU (NCCL's `tclass`).
    pub target_class: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nic {
    #[serde(flatten)]
    pub location: PciLocation,
    /// The RDMA device name NCCL matches, e.g. `mlx5_0`.
    pub rdma_device: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netdev: Option<String>,
    /// Port 1 speed in Mb/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_speed_mbps: Option<u64>,
    /// `InfiniBand` or `Ethernet` (RoCE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_layer: Option<String>,
    pub sriov_total_vfs: u32,
    pub sriov_num_vfs: u32,
    /// The enabled virtual functions, by index (`virtfn0`, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vfs: Vec<Bdf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu_group: Option<u32>,
}

impl Nic {
    /// An Ethernet (RoCE) port with a VF to pass through: what a VM on a
    /// RoCE segment gets of it.
    pub fn roce_vf(&self) -> Option<Bdf> {
        (self.link_layer.as_deref() == Some("Ethernet"))
            .then(|| self.vfs.first().copied())
            .flatten()
    }

    /// The index of a VF of this NIC (`virtfnN`).
    pub fn vf_index(&self, vf: Bdf) -> Option<u32> {
        self.vfs.iter().position(|v| *v == vf).map(|i| i as u32)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvSwitch {
    #[serde(flatten)]
    pub location: PciLocation,
}

/// A GPU's marketing name from its PCI device id.
pub fn gpu_model(device: u16) -> String {
    match device {
        0x20b0 => "A100-SXM4-40GB".into(),
        0x20b2 => "A100-SXM4-80GB".into(),
        0x20b5 => "A100-PCIE-80GB".into(),
        0x20f1 => "A100-PCIE-40GB".into(),
        0x2330 => "H100-SXM5-80GB".into(),
        0x2331 => "H100-PCIE-80GB".into(),
        0x2335 => "H200-SXM5-141GB".into(),
        0x26b5 => "L40".into(),
        0x26b9 => "L40S".into(),
        0x2230 => "RTX-A6000".into(),
        0x27b8 => "L4".into(),
        other => format!("NVIDIA-{other:04x}"),
    }
}

/// Topologies larger than this are not a server, they are an attack.
pub const MAX_PCI_DEVICES: usize = 4096;
pub const MAX_NUMA_NODES: usize = 1024;

impl HostTopology {
    /// Whether a topology an agent sent is small enough to take: what the
    /// server checks before anything else looks at it.
    pub fn plausible(&self) -> Result<(), String> {
        if self.pci_devices.len() > MAX_PCI_DEVICES || self.numa_nodes.len() > MAX_NUMA_NODES {
            return Err(format!(
                "implausibly large: {} PCI functions (at most {MAX_PCI_DEVICES}), {} NUMA nodes (at most {MAX_NUMA_NODES})",
                self.pci_devices.len(),
                self.numa_nodes.len()
            ));
        }
        // Fabric Manager supports at most 64 partitions (fmpm takes ids
        // below 64); each holds at most the host's GPUs.
        if let Some(FabricManager::Partitions(ps)) = &self.fabric_manager {
            if ps.len() > 64 || ps.iter().any(|p| p.gpus.len() > self.gpus.len().max(1)) {
                return Err(format!(
                    "implausible NVSwitch partitions: {} (at most 64, each of at most the host's {} GPUs)",
                    ps.len(),
                    self.gpus.len()
                ));
            }
        }
        if let Some(FabricManager::Unreachable(why)) = &self.fabric_manager {
            if why.len() > 1000 {
                return Err("Fabric Manager's reason is longer than 1,000 bytes".into());
            }
        }
        Ok(())
    }

    pub fn gpu(&self, bdf: Bdf) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.location.bdf == bdf)
    }

    pub fn nic(&self, rdma_device: &str) -> Option<&Nic> {
        self.nics.iter().find(|n| n.rdma_device == rdma_device)
    }

    pub fn pci(&self, bdf: Bdf) -> Option<&PciDevice> {
        self.pci_devices.iter().find(|d| d.location.bdf == bdf)
    }

    pub fn numa(&self, id: u32) -> Option<&NumaNode> {
        self.numa_nodes.iter().find(|n| n.id == id)
    }
}

/// What `kumo-agent topology` prints: the topology, every GPU's relation
/// to every NIC (`relations`) and GPU (`gpu_relations`), and the pairing.
#[derive(Debug, Clone, Serialize)]
pub struct TopologyReport<'a> {
    #[serde(flatten)]
    pub topology: &'a HostTopology,
    pub relations: std::collections::BTreeMap<Bdf, std::collections::BTreeMap<String, Relation>>,
    pub gpu_relations: std::collections::BTreeMap<Bdf, std::collections::BTreeMap<Bdf, Relation>>,
    pub pairing: std::collections::BTreeMap<Bdf, Option<String>>,
}

impl<'a> TopologyReport<'a> {
    pub fn new(topology: &'a HostTopology) -> TopologyReport<'a> {
        let r = relations(topology);
        TopologyReport {
            topology,
            relations: r.gpu_nic,
            gpu_relations: r.gpu_gpu,
            pairing: pairing(topology),
        }
    }
}
