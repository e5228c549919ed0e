//! Whether a host may pass its GPUs and NICs through (pure): an IOMMU,
//! IOMMU groups that hold only what goes to one VM, ACS on the ports
//! above each device, and hugepages where guests are backed by them. A
//! host that is not ready takes CPU-only VMs only; what is wrong is said
//! in words, one problem per line.

use std::collections::{BTreeMap, BTreeSet};

use crate::{Acs, Bdf, HostTopology, ACS_CR, ACS_REQUIRED, ACS_RR, ACS_SV, ACS_UF};

/// The functions this host hands to VMs: GPUs, RDMA NICs and their VFs.
pub fn passthrough_devices(topo: &HostTopology) -> Vec<Bdf> {
    let mut out: Vec<Bdf> = topo.gpus.iter().map(|g| g.location.bdf).collect();
    for n in &topo.nics {
        out.push(n.location.bdf);
        out.extend(n.vfs.iter().copied());
    }
    out
}

fn acs_words(missing: u16) -> String {
    [
        (ACS_SV, "source validation"),
        (ACS_RR, "P2P request redirect"),
        (ACS_CR, "P2P completion redirect"),
        (ACS_UF, "upstream forwarding"),
    ]
    .iter()
    .filter(|(bit, _)| missing & bit != 0)
    .map(|(_, w)| *w)
    .collect::<Vec<_>>()
    .join(", ")
}

/// What keeps the host from passing devices through; empty when it is
/// ready (or has nothing to pass through). Facts an older agent did not
/// report (`iommu: None`, bridges without `port`) are not held against
/// the host. `hugepage_backed`: the host backs guest memory with
/// hugepages (KVM hosts do).
pub fn problems(topo: &HostTopology, hugepage_backed: bool) -> Vec<String> {
    let devices = passthrough_devices(topo);
    if devices.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    if topo.iommu == Some(false) {
        out.push(
            "the IOMMU is off (enable VT-d/AMD-Vi in firmware and boot with intel_iommu=on or amd_iommu=on)"
                .to_owned(),
        );
        return out;
    }
    let by_bdf: BTreeMap<Bdf, &crate::PciDevice> = topo
        .pci_devices
        .iter()
        .map(|d| (d.location.bdf, d))
        .collect();
    let mut groups: BTreeMap<u32, Vec<Bdf>> = BTreeMap::new();
    for d in &topo.pci_devices {
        if let Some(g) = d.iommu_group {
            groups.entry(g).or_default().push(d.location.bdf);
        }
    }
    // A group may hold the device's other functions (a GPU's audio
    // function goes with it); anything else would go to the same VM.
    for bdf in &devices {
        let Some(dev) = by_bdf.get(bdf) else {
            continue;
        };
        match dev.iommu_group {
            None if topo.iommu == Some(true) => out.push(format!("{bdf} is in no IOMMU group")),
            None => {}
            Some(g) => {
                let others: Vec<String> = groups
                    .get(&g)
                    .into_iter()
                    .flatten()
                    .filter(|b| (b.domain, b.bus, b.device) != (bdf.domain, bdf.bus, bdf.device))
                    .map(Bdf::to_string)
                    .collect();
                if !others.is_empty() {
                    out.push(format!(
                        "IOMMU group {g} of {bdf} also holds {} (a VM given {bdf} would get them too)",
                        others.join(", ")
                    ));
                }
            }
        }
    }
    // ACS on every switch downstream port above a device (and on root
    // ports that have it: one without it relies on the platform's own
    // isolation, which the group check above already sees).
    let mut seen = BTreeSet::new();
    for bdf in &devices {
        let Some(dev) = by_bdf.get(bdf) else {
            continue;
        };
        for b in &dev.location.pcie_path {
            let Some(port) = by_bdf.get(b).and_then(|p| p.port) else {
                continue;
            };
            let checked = matches!(
                (port.port_type, port.acs),
                (crate::PORT_DOWNSTREAM | crate::PORT_ROOT, _) | (_, Acs::Unreadable)
            );
            if !checked || !seen.insert(*b) {
                continue;
            }
            let problem = match (port.acs, port.port_type) {
                (Acs::Present { control, .. }, _) if control & ACS_REQUIRED != ACS_REQUIRED => {
                    Some(format!(
                        "ACS on {b} (above {bdf}) lacks {}",
                        acs_words(ACS_REQUIRED & !control)
                    ))
                }
                (Acs::Present { .. }, _) | (Acs::Absent, crate::PORT_ROOT) => None,
                (Acs::Absent, _) => Some(format!(
                    "switch port {b} (above {bdf}) has no ACS: devices below it reach each other past the IOMMU"
                )),
                (Acs::Unreadable, _) => Some(format!(
                    "ACS of {b} (above {bdf}) is unreadable (config space past 256 bytes: the agent must run as root)"
                )),
            };
            out.extend(problem);
        }
    }
    // Not reported (an older agent): unknown, not none.
    if hugepage_backed && !topo.hugepages.is_empty() && topo.hugepages.iter().all(|p| p.total == 0)
    {
        out.push(
            "no hugepages reserved: GPU VMs' memory is pinned for DMA and backed by hugepages"
                .to_owned(),
        );
    }
    out
}

/// Free hugepage memory, in bytes.
pub fn hugepages_free_bytes(topo: &HostTopology) -> u64 {
    topo.hugepages
        .iter()
        .map(|p| p.free.saturating_mul(p.size_kib).saturating_mul(1024))
        .fold(0, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::fixtures;
    use std::path::Path;

    fn discovered(root: &Path) -> HostTopology {
        crate::sysfs::discover(root, None).unwrap()
    }

    fn hgx() -> (tempfile::TempDir, HostTopology) {
        let dir = tempfile::tempdir().unwrap();
        fixtures::write(&fixtures::machine("hgx-h100").unwrap(), dir.path()).unwrap();
        let t = discovered(dir.path());
        (dir, t)
    }

    #[test]
    fn a_fixture_host_is_ready_and_shows_its_ports() {
        let (_d, t) = hgx();
        assert_eq!(t.iommu, Some(true));
        assert_eq!(problems(&t, true), Vec::<String>::new());
        assert_eq!(hugepages_free_bytes(&t), t.hugepages[0].free << 30);
        assert!(t.hugepages[0].free > 0);
        // Every GPU sits below a switch downstream port with ACS on.
        for g in &t.gpus {
            let ports: Vec<_> = g
                .location
                .pcie_path
                .iter()
                .filter_map(|b| t.pci_devices.iter().find(|d| d.location.bdf == *b)?.port)
                .collect();
            assert_eq!(ports.first().map(|p| p.port_type), Some(crate::PORT_ROOT));
            assert!(
                ports.iter().any(|p| p.port_type == crate::PORT_DOWNSTREAM
                    && p.acs
                        == Acs::Present {
                            capable: ACS_REQUIRED,
                            control: ACS_REQUIRED
                        }),
                "{ports:?}"
            );
        }
    }

    #[test]
    fn acs_off_above_a_gpu_makes_the_host_not_ready() {
        let (dir, t) = hgx();
        let gpu = &t.gpus[0];
        let downstream = *gpu.location.pcie_path.last().unwrap();
        let port = t
            .pci_devices
            .iter()
            .find(|d| d.location.bdf == downstream)
            .unwrap();
        let config = dir
            .path()
            .join("bus/pci/devices")
            .join(downstream.to_string())
            .join("config");
        // Redirects off (what `pcie_acs_override` or a BIOS leaves).
        std::fs::write(
            &config,
            fixtures::bridge_config(
                port.vendor,
                port.device,
                crate::PORT_DOWNSTREAM,
                Some(ACS_SV),
            ),
        )
        .unwrap();
        let p = problems(&discovered(dir.path()), false);
        assert_eq!(
            p,
            vec![format!(
                "ACS on {downstream} (above {}) lacks P2P request redirect, P2P completion redirect, upstream forwarding",
                gpu.location.bdf
            )]
        );
        // No ACS capability at all on a switch port.
        std::fs::write(
            &config,
            fixtures::bridge_config(port.vendor, port.device, crate::PORT_DOWNSTREAM, None),
        )
        .unwrap();
        assert!(problems(&discovered(dir.path()), false)[0].contains("has no ACS"));
        // Not root: config space past 64 bytes is hidden.
        std::fs::write(
            &config,
            &fixtures::bridge_config(port.vendor, port.device, crate::PORT_DOWNSTREAM, None)[..64],
        )
        .unwrap();
        assert!(problems(&discovered(dir.path()), false)
            .iter()
            .any(|l| l.contains("unreadable")));
        // Root, but the extended config space reads short.
        std::fs::write(
            &config,
            &fixtures::bridge_config(port.vendor, port.device, crate::PORT_DOWNSTREAM, None)[..256],
        )
        .unwrap();
        assert!(problems(&discovered(dir.path()), false)[0].contains("unreadable"));
    }

    #[test]
    fn a_shared_iommu_group_the_iommu_off_and_no_hugepages_are_each_said() {
        let (dir, t) = hgx();
        let (a, b) = (t.gpus[0].location.bdf, t.gpus[1].location.bdf);
        // GPU b moved into GPU a's group (what a missing ACS does).
        let devices = dir.path().join("bus/pci/devices");
        let group_a =
            std::fs::canonicalize(devices.join(a.to_string()).join("iommu_group")).unwrap();
        let b_dir = std::fs::canonicalize(devices.join(b.to_string())).unwrap();
        std::fs::remove_file(b_dir.join("iommu_group")).unwrap();
        std::os::unix::fs::symlink(&group_a, b_dir.join("iommu_group")).unwrap();
        let p = problems(&discovered(dir.path()), false);
        assert!(
            p.iter()
                .any(|l| l.contains(&format!("of {a} also holds {b}"))),
            "{p:?}"
        );
        // Hugepages matter where guests are backed by them.
        let mut none = discovered(dir.path());
        none.hugepages.clear();
        assert!(
            problems(&none, true)
                .iter()
                .all(|l| !l.starts_with("no hugepages")),
            "not reported (an older agent) is unknown"
        );
        none.hugepages = vec![crate::HugePages {
            size_kib: 1 << 20,
            total: 0,
            free: 0,
        }];
        assert!(problems(&none, true)
            .iter()
            .any(|l| l.starts_with("no hugepages")));
        assert!(!problems(&none, false)
            .iter()
            .any(|l| l.starts_with("no hugepages")));
        // The IOMMU off: no groups at all.
        std::fs::remove_dir_all(dir.path().join("kernel/iommu_groups")).unwrap();
        std::fs::create_dir_all(dir.path().join("kernel/iommu_groups")).unwrap();
        let off = discovered(dir.path());
        assert_eq!(off.iommu, Some(false));
        assert!(problems(&off, false)[0].starts_with("the IOMMU is off"));
        // A CPU-only host has nothing to pass through: always ready.
        let mut cpu = off.clone();
        cpu.gpus.clear();
        cpu.nics.clear();
        assert!(problems(&cpu, true).is_empty());
        // An older agent's topology (nothing read): not held against it.
        let (_fresh, mut old) = hgx();
        old.iommu = None;
        old.hugepages.clear();
        for d in &mut old.pci_devices {
            d.port = None;
        }
        assert!(problems(&old, false).is_empty());
    }
}
