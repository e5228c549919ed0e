//! The topology as `nvidia-smi topo -m` prints it: GPUs and RDMA NICs in
//! rows and columns, then each GPU's CPU and NUMA affinity.

use crate::relation::{gpu_relation, pci_relation};
use crate::sysfs::format_cpulist;
use crate::HostTopology;

pub fn render(topo: &HostTopology) -> String {
    let mut names: Vec<String> = (0..topo.gpus.len()).map(|i| format!("GPU{i}")).collect();
    names.extend(topo.nics.iter().map(|n| n.rdma_device.clone()));
    let locations: Vec<_> = topo
        .gpus
        .iter()
        .map(|g| (&g.location, true))
        .chain(topo.nics.iter().map(|n| (&n.location, false)))
        .collect();
    let mut rows = vec![{
        let mut h = vec![String::new()];
        h.extend(names.iter().cloned());
        h.push("CPU Affinity".into());
        h.push("NUMA Affinity".into());
        h
    }];
    for (i, (a, a_gpu)) in locations.iter().enumerate() {
        let mut row = vec![names[i].clone()];
        for (j, (b, b_gpu)) in locations.iter().enumerate() {
            row.push(if i == j {
                " X ".into()
            } else if *a_gpu && *b_gpu {
                gpu_relation(topo, a, b).to_string()
            } else {
                pci_relation(a, b).to_string()
            });
        }
        if *a_gpu {
            let node = a.numa_node.and_then(|n| topo.numa(n));
            row.push(
                node.map(|n| format_cpulist(&n.cpus))
                    .unwrap_or_else(|| "N/A".into()),
            );
            row.push(
                a.numa_node
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "N/A".into()),
            );
        }
        rows.push(row);
    }
    let mut out = String::new();
    for row in rows {
        out.push_str(row.join("\t").trim_end());
        out.push('\n');
    }
    out.push_str("\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes\n  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node\n  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n  PIX  = Connection traversing at most a single PCIe bridge\n  NV#  = Connection traversing a bonded set of # NVLinks\n");
    out
}
