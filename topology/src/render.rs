//! From host topology and chosen GPUs to everything a guest needs:
//! placement, guest layout, domain XML, NCCL topology file.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::domain_xml::{domain_xml, DomainSpec};
use crate::guest_layout::{guest_layout, place, Firmware, GuestLayout, LayoutError, Placement};
use crate::nccl_xml::{nccl_topology_xml, NcclXmlError};
use crate::sysfs::format_cpulist;
use crate::{Bdf, HostTopology};

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Nccl(#[from] NcclXmlError),
}

/// `layout.json`: the placement, the guest layout, and the maps a person
/// or a test reads first.
#[derive(Debug, Clone, Serialize)]
pub struct LayoutReport {
    /// `efi` for a VM with passed-through devices, `bios` otherwise.
    pub firmware: Firmware,
    /// The guest's 64-bit MMIO aperture, sized from its devices' BARs.
    pub mmio64_bytes: Option<u64>,
    /// The guest CPU's physical address width.
    pub phys_bits: Option<u8>,
    /// Host BDF → guest BDF, for every passed-through function.
    pub bdf_map: BTreeMap<Bdf, Bdf>,
    /// Guest NUMA cell → host NUMA node.
    pub numa_map: BTreeMap<u32, u32>,
    /// Guest cell → its vCPUs and the host CPUs they are pinned to.
    pub cpus: BTreeMap<u32, CellCpus>,
    pub placement: Placement,
    pub layout: GuestLayout,
}

#[derive(Debug, Clone, Serialize)]
pub struct CellCpus {
    pub vcpus: String,
    pub host_cpus: String,
}

pub struct Rendered {
    pub domain_xml: String,
    pub nccl_xml: String,
    pub report: LayoutReport,
}

pub fn render(
    topo: &HostTopology,
    gpus: &[Bdf],
    vcpus: u32,
    memory_gib: u32,
    spec: &DomainSpec,
) -> Result<Rendered, RenderError> {
    let placement = place(topo, gpus, vcpus, memory_gib)?;
    let layout = guest_layout(topo, &placement)?;
    let nccl_xml = nccl_topology_xml(topo, &layout)?;
    let domain_xml = domain_xml(spec, &layout);
    let bdf_map = layout
        .devices()
        .map(|(_, p)| (p.device.host_bdf, p.device.guest_bdf))
        .collect();
    let numa_map = layout.cells.iter().map(|c| (c.id, c.host_node)).collect();
    let pins: BTreeMap<u32, u32> = layout.vcpu_pins.iter().copied().collect();
    let cpus = layout
        .cells
        .iter()
        .map(|c| {
            let host: Vec<u32> = c
                .vcpus
                .iter()
                .filter_map(|v| pins.get(v).copied())
                .collect();
            (
                c.id,
                CellCpus {
                    vcpus: format_cpulist(&c.vcpus),
                    host_cpus: format_cpulist(&host),
                },
            )
        })
        .collect();
    Ok(Rendered {
        domain_xml,
        nccl_xml,
        report: LayoutReport {
            firmware: layout.address_space.firmware,
            mmio64_bytes: layout.address_space.mmio64_bytes,
            phys_bits: layout.address_space.phys_bits,
            bdf_map,
            numa_map,
            cpus,
            placement,
            layout,
        },
    })
}
