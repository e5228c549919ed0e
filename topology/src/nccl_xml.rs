//! The NCCL topology file for a guest: per guest NUMA cell a `cpu` with
//! its affinity and the host CPU's identity; per host switch group a fake
//! switch (`class 0x060400`, bus id `ffff:ff:NN.0`, which no guest has)
//! with the host switch's link, holding the GPUs and NICs that sit
//! together on the host at their guest bus ids; NVLinks for NVSwitch
//! systems. Obeys NCCL's parser: no prolog, quoted values, at most 16
//! attributes per element and 256 elements.

use crate::domain_xml::cell_affinity;
use crate::guest_layout::{DeviceKind, GuestLayout};
use crate::xml::{el, Element};
use crate::{Bdf, HostTopology, CLASS_BRIDGE_OTHER};

pub const MAX_NODES: usize = 256;
pub const MAX_ATTRS: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NcclXmlError {
    #[error("the topology has {0} elements; NCCL reads at most {MAX_NODES}")]
    TooManyNodes(usize),
}

/// Guest RDMA names: the guest kernel names passed-through NICs `mlx5_N`
/// in the order it probes them, which is guest bus order.
pub fn guest_rdma_names(layout: &GuestLayout) -> Vec<(Bdf, String, String)> {
    let mut nics: Vec<(Bdf, String)> = layout
        .devices()
        .filter_map(|(_, p)| match &p.device.kind {
            DeviceKind::Nic { rdma_device } => Some((p.device.guest_bdf, rdma_device.clone())),
            DeviceKind::Gpu => None,
        })
        .collect();
    nics.sort();
    nics.into_iter()
        .enumerate()
        .map(|(i, (bdf, host))| (bdf, host, format!("mlx5_{i}")))
        .collect()
}

fn lower_hex(v: u32, width: usize) -> String {
    format!("0x{v:0width$x}")
}

pub fn nccl_topology_xml(
    topo: &HostTopology,
    layout: &GuestLayout,
) -> Result<String, NcclXmlError> {
    let names = guest_rdma_names(layout);
    // NVLinks are claimed only where they hold: on a partitioned NVSwitch
    // host, for a VM whose GPUs are one (activated) partition.
    let vm_gpus: Vec<Bdf> = layout
        .devices()
        .filter(|(_, p)| matches!(p.device.kind, DeviceKind::Gpu))
        .map(|(_, p)| p.device.host_bdf)
        .collect();
    let nvlinked = crate::partitions::nvlinks_hold(topo, &vm_gpus);
    let mut system = el("system").attr("version", 1);
    for cell in &layout.cells {
        let mut cpu = el("cpu")
            .attr("numaid", cell.id)
            .attr("affinity", cell_affinity(layout, cell.id));
        if let Some(id) = &topo.cpu {
            cpu = cpu
                .attr("arch", &id.arch)
                .attr("vendor", &id.vendor)
                .attr("familyid", id.family_id)
                .attr("modelid", id.model_id);
        }
        for (n, e) in layout
            .expanders
            .iter()
            .enumerate()
            .filter(|(_, e)| e.guest_node == cell.id)
        {
            let mut switch = el("pci")
                .attr("busid", format!("ffff:ff:{:02x}.0", n))
                .attr("class", lower_hex(crate::CLASS_BRIDGE_PCI, 6))
                .opt_attr(
                    "vendor",
                    e.switch_vendor.map(|v| lower_hex(u32::from(v), 4)),
                )
                .opt_attr(
                    "device",
                    e.switch_device.map(|v| lower_hex(u32::from(v), 4)),
                )
                .attr(
                    "link_speed",
                    e.link_speed
                        .clone()
                        .unwrap_or_else(|| "16.0 GT/s PCIe".into()),
                )
                .attr("link_width", e.link_width.unwrap_or(16));
            for p in &e.ports {
                let d = &p.device;
                let mut pci = el("pci")
                    .attr(
                        "busid",
                        match d.kind {
                            DeviceKind::Nic { .. } => d.guest_bdf.function0(),
                            DeviceKind::Gpu => d.guest_bdf,
                        },
                    )
                    .attr("class", lower_hex(d.class, 6))
                    .attr("vendor", lower_hex(u32::from(d.vendor), 4))
                    .attr("device", lower_hex(u32::from(d.device), 4))
                    .attr(
                        "link_speed",
                        d.link_speed
                            .clone()
                            .unwrap_or_else(|| "16.0 GT/s PCIe".into()),
                    )
                    .attr("link_width", d.link_width.unwrap_or(16));
                match &d.kind {
                    DeviceKind::Gpu => {
                        let links: Vec<Element> = topo
                            .gpu(d.host_bdf)
                            .filter(|_| nvlinked)
                            .map(|g| {
                                g.nvlinks
                                    .iter()
                                    .filter_map(|l| {
                                        // NVSwitches keep their host ids (NCCL folds them into
                                        // one NVS node); peer GPUs get their guest ids, and
                                        // peers outside this VM are left out.
                                        let target = if l.target_class == CLASS_BRIDGE_OTHER {
                                            Some(l.target)
                                        } else {
                                            layout.guest_bdf(l.target)
                                        }?;
                                        Some(
                                            el("nvlink")
                                                .attr("target", target)
                                                .attr("count", l.count)
                                                .attr("tclass", lower_hex(l.target_class, 6)),
                                        )
                                    })
                                    .collect()
                            })
                            .unwrap_or_default();
                        if !links.is_empty() {
                            pci = pci.child(el("gpu").children(links));
                        }
                    }
                    DeviceKind::Nic { rdma_device } => {
                        let guest_name = names
                            .iter()
                            .find(|(bdf, host, _)| *bdf == d.guest_bdf && host == rdma_device)
                            .map(|(_, _, g)| g.clone())
                            .unwrap_or_else(|| rdma_device.clone());
                        let speed = topo.nic(rdma_device).and_then(|n| n.port_speed_mbps);
                        pci = pci.child(
                            el("nic").child(
                                el("net")
                                    .attr("name", guest_name)
                                    .opt_attr("speed", speed)
                                    .attr("port", 1),
                            ),
                        );
                    }
                }
                switch = switch.child(pci);
            }
            cpu = cpu.child(switch);
        }
        system = system.child(cpu);
    }
    let count = system.count();
    if count > MAX_NODES {
        return Err(NcclXmlError::TooManyNodes(count));
    }
    debug_assert!(system.max_attrs() <= MAX_ATTRS);
    Ok(system.render())
}
