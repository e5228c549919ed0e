//! Reading a host's topology from sysfs (`/sys` or a fixture tree).
//!
//! Only standard files are read (see `../shared/reference/topology.md`).
//! A missing or malformed file makes that fact unknown and adds a warning;
//! only a root that is not a sysfs tree at all is an error. NVLinks are not
//! in sysfs: they come from a hint file (fixtures carry one at
//! `<root>/kumo-hints.json`; operators pass `--hints`).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use crate::{
    gpu_model, Bdf, CpuIdentity, Gpu, HostTopology, Nic, NumaNode, NvLink, NvSwitch, PciDevice,
    PciLocation, CLASS_3D_CONTROLLER, CLASS_BRIDGE_OTHER, CLASS_VGA, VENDOR_NVIDIA,
};

pub const HINTS_FILE: &str = "kumo-hints.json";

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("{0} is not a sysfs tree: {1} is missing")]
    NotSysfs(PathBuf, PathBuf),
    #[error("cannot read hint file {path}: {message}")]
    Hints { path: PathBuf, message: String },
}

/// What sysfs cannot tell, supplied by the operator (or NVML).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Hints {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuIdentity>,
    /// NVLinks per GPU bus id.
    #[serde(default)]
    pub nvlinks: BTreeMap<Bdf, Vec<NvLinkHint>>,
    /// The CPU's physical address width, where `/proc/cpuinfo` is not
    /// beside the sysfs root (fixtures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phys_bits: Option<u8>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct NvLinkHint {
    pub target: Bdf,
    pub count: u32,
}

/// Reads the topology under `root`. `hints` defaults to
/// `<root>/kumo-hints.json` when that file exists.
pub fn discover(root: &Path, hints: Option<&Path>) -> Result<HostTopology, DiscoveryError> {
    let pci_dir = root.join("bus/pci/devices");
    if !pci_dir.is_dir() {
        return Err(DiscoveryError::NotSysfs(root.to_path_buf(), pci_dir));
    }
    let default_hints = root.join(HINTS_FILE);
    let hints_path = hints
        .map(Path::to_path_buf)
        .or_else(|| default_hints.is_file().then_some(default_hints));
    let hints = match &hints_path {
        Some(p) => {
            let text = fs::read_to_string(p).map_err(|e| DiscoveryError::Hints {
                path: p.clone(),
                message: e.to_string(),
            })?;
            serde_json::from_str(&text).map_err(|e| DiscoveryError::Hints {
                path: p.clone(),
                message: e.to_string(),
            })?
        }
        None => Hints::default(),
    };

    let mut topo = HostTopology::default();
    let warnings = &mut topo.warnings;
    topo.numa_nodes = read_numa(root, warnings);
    topo.cpu = hints.cpu.clone().or_else(|| read_cpuinfo(root));
    topo.phys_bits = hints.phys_bits.or_else(|| read_phys_bits(root));
    match topo.phys_bits {
        Some(b) if !(32..=64).contains(&b) => {
            topo.warnings.push(format!(
                "a physical address width of {b} bits is implausible; unknown"
            ));
            topo.phys_bits = None;
        }
        None => topo.warnings.push(
            "the CPU's physical address width is unknown (no address sizes in /proc/cpuinfo)"
                .into(),
        ),
        Some(_) => {}
    }
    let warnings = &mut topo.warnings;
    topo.pci_devices = read_pci(root, warnings);
    // With the IOMMU off the kernel makes no groups at all.
    topo.iommu = Some(
        fs::read_dir(root.join("kernel/iommu_groups"))
            .map(|mut d| d.next().is_some())
            .unwrap_or(false),
    );
    topo.hugepages = read_hugepages(root);

    let rdma = read_rdma(root, warnings);
    let netdevs = read_netdevs(root);
    for dev in &topo.pci_devices {
        let path = root.join("bus/pci/devices").join(dev.bdf().to_string());
        let class_base = dev.class & 0xffff00;
        if dev.vendor == VENDOR_NVIDIA
            && (class_base == CLASS_3D_CONTROLLER || class_base == CLASS_VGA)
        {
            topo.gpus.push(Gpu {
                location: dev.location.clone(),
                model: gpu_model(dev.device),
                iommu_group: dev.iommu_group,
                nvlinks: Vec::new(),
            });
        } else if dev.vendor == VENDOR_NVIDIA && class_base == CLASS_BRIDGE_OTHER {
            topo.nvswitches.push(NvSwitch {
                location: dev.location.clone(),
            });
        } else if let Some(port) = rdma.get(&dev.bdf()) {
            // Virtual functions belong to their physical function's NIC.
            if path.join("physfn").exists() {
                continue;
            }
            topo.nics.push(Nic {
                location: dev.location.clone(),
                rdma_device: port.name.clone(),
                netdev: netdevs.get(&dev.bdf()).cloned(),
                port_speed_mbps: port.speed_mbps,
                link_layer: port.link_layer.clone(),
                sriov_total_vfs: read_u32(&path.join("sriov_totalvfs")).unwrap_or(0),
                sriov_num_vfs: read_u32(&path.join("sriov_numvfs")).unwrap_or(0),
                vfs: read_vfs(&path),
                iommu_group: dev.iommu_group,
            });
        }
    }
    topo.nics.sort_by_key(|n| natural_key(&n.rdma_device));

    for (gpu_bdf, links) in &hints.nvlinks {
        let Some(gpu) = topo.gpus.iter().position(|g| g.location.bdf == *gpu_bdf) else {
            topo.warnings.push(format!(
                "hint names NVLinks of {gpu_bdf}, which is not a GPU here"
            ));
            continue;
        };
        for l in links {
            let target_class = if topo.nvswitches.iter().any(|s| s.location.bdf == l.target) {
                CLASS_BRIDGE_OTHER
            } else if topo.gpus.iter().any(|g| g.location.bdf == l.target) {
                CLASS_3D_CONTROLLER
            } else {
                topo.warnings.push(format!(
                    "hint links {gpu_bdf} to {}, which is neither a GPU nor an NVSwitch here",
                    l.target
                ));
                continue;
            };
            topo.gpus[gpu].nvlinks.push(NvLink {
                target: l.target,
                count: l.count,
                target_class,
            });
        }
    }
    Ok(topo)
}

/// `mlx5_10` after `mlx5_9`.
fn natural_key(name: &str) -> (String, u64) {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (prefix, num) = name.split_at(name.len() - digits);
    (prefix.to_owned(), num.parse().unwrap_or(0))
}

fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

fn read_u32(path: &Path) -> Option<u32> {
    read_trimmed(path)?.parse().ok()
}

fn read_hex(path: &Path) -> Option<u32> {
    let s = read_trimmed(path)?;
    u32::from_str_radix(s.strip_prefix("0x").unwrap_or(&s), 16).ok()
}

/// Parses a kernel cpu list such as `0-15,128-143`.
pub fn parse_cpulist(s: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 65_536 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

/// Formats CPUs as a kernel cpu list.
pub fn format_cpulist(cpus: &[u32]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

fn read_numa(root: &Path, warnings: &mut Vec<String>) -> Vec<NumaNode> {
    let dir = root.join("devices/system/node");
    let Ok(entries) = fs::read_dir(&dir) else {
        warnings.push(format!("{} is missing: NUMA layout unknown", dir.display()));
        return Vec::new();
    };
    let mut nodes = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(id) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let cpus = match read_trimmed(&e.path().join("cpulist"))
            .as_deref()
            .map(parse_cpulist)
        {
            Some(Some(c)) => c,
            _ => {
                warnings.push(format!("node{id}/cpulist is missing or malformed"));
                Vec::new()
            }
        };
        let memory_kib = read_trimmed(&e.path().join("meminfo")).and_then(|m| {
            m.lines()
                .find(|l| l.contains("MemTotal:"))
                .and_then(|l| l.split_whitespace().rev().nth(1))
                .and_then(|v| v.parse().ok())
        });
        nodes.push(NumaNode {
            id,
            cpus,
            memory_kib,
        });
    }
    nodes.sort_by_key(|n| n.id);
    nodes
}

/// `/proc/cpuinfo` beside the sysfs root (so `/sys` reads `/proc`).
fn read_cpuinfo(root: &Path) -> Option<CpuIdentity> {
    let text = fs::read_to_string(root.parent()?.join("proc/cpuinfo")).ok()?;
    let field = |key: &str| {
        text.lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
    };
    Some(CpuIdentity {
        arch: std::env::consts::ARCH.to_owned(),
        vendor: field("vendor_id")?,
        family_id: field("cpu family")?.parse().ok()?,
        model_id: field("model")?.parse().ok()?,
    })
}

/// `address sizes : 46 bits physical, 57 bits virtual` in `/proc/cpuinfo`
/// beside the sysfs root.
/// `kernel/mm/hugepages/hugepages-1048576kB/{nr,free}_hugepages`, …
fn read_hugepages(root: &Path) -> Vec<crate::HugePages> {
    let Ok(dir) = fs::read_dir(root.join("kernel/mm/hugepages")) else {
        return Vec::new();
    };
    let mut pools: Vec<crate::HugePages> = dir
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let size_kib = name
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            let number = |f: &str| read_trimmed(&e.path().join(f))?.parse::<u64>().ok();
            Some(crate::HugePages {
                size_kib,
                total: number("nr_hugepages")?,
                free: number("free_hugepages")?,
            })
        })
        .collect();
    pools.sort_by_key(|p| p.size_kib);
    pools
}

/// A bridge's PCIe port type (the PCIe capability) and its ACS extended
/// capability, from the bytes of its sysfs `config` (PCI Express Base
/// Specification §7.5.3 and §7.7.8). `None` when the bytes show no PCIe
/// capability. Only root reads past byte 64 (the kernel hides the rest
/// from others) and past 256 on a PCIe device: fewer bytes than that
/// read as [`crate::Acs::Unreadable`], never as absent.
pub fn parse_pcie_port(config: &[u8]) -> Option<crate::PciePort> {
    let u16_at = |at: usize| Some(u16::from_le_bytes([*config.get(at)?, *config.get(at + 1)?]));
    let u32_at = |at: usize| {
        Some(u32::from_le_bytes([
            *config.get(at)?,
            *config.get(at + 1)?,
            *config.get(at + 2)?,
            *config.get(at + 3)?,
        ]))
    };
    const STATUS_CAP_LIST: u16 = 1 << 4;
    const CAP_PCIE: u8 = 0x10;
    const EXT_CAP_ACS: u32 = 0x000d;
    // Not root: the kernel shows the first 64 bytes only, no capability.
    if config.len() <= 0x40 {
        return Some(crate::PciePort {
            port_type: 0,
            acs: crate::Acs::Unreadable,
        });
    }
    if u16_at(0x06)? & STATUS_CAP_LIST == 0 {
        return None;
    }
    // The capability list; bounded, since a broken device can loop it.
    let mut at = usize::from(*config.get(0x34)? & 0xfc);
    let mut port_type = None;
    for _ in 0..48 {
        if at < 0x40 {
            break;
        }
        let (id, next) = (*config.get(at)?, *config.get(at + 1)?);
        if id == CAP_PCIE {
            port_type = Some(((u16_at(at + 2)? >> 4) & 0xf) as u8);
            break;
        }
        at = usize::from(next & 0xfc);
    }
    let port_type = port_type?;
    let mut acs = crate::Acs::Absent;
    if config.len() <= 0x100 {
        acs = crate::Acs::Unreadable;
    } else {
        let mut at = 0x100;
        for _ in 0..512 {
            let Some(header) = u32_at(at) else { break };
            if header == 0 || header == u32::MAX {
                break;
            }
            if header & 0xffff == EXT_CAP_ACS {
                acs = crate::Acs::Present {
                    capable: u16_at(at + 4).unwrap_or(0),
                    control: u16_at(at + 6).unwrap_or(0),
                };
                break;
            }
            let next = ((header >> 20) & 0xffc) as usize;
            if next < 0x100 {
                break;
            }
            at = next;
        }
    }
    Some(crate::PciePort { port_type, acs })
}

fn read_phys_bits(root: &Path) -> Option<u8> {
    let text = fs::read_to_string(root.parent()?.join("proc/cpuinfo")).ok()?;
    parse_address_sizes(&text)
}

pub fn parse_address_sizes(cpuinfo: &str) -> Option<u8> {
    let line = cpuinfo.lines().find(|l| {
        l.split(':')
            .next()
            .is_some_and(|k| k.trim() == "address sizes")
    })?;
    let (_, v) = line.split_once(':')?;
    let physical = v.split(',').find(|p| p.contains("physical"))?;
    physical.split_whitespace().next()?.parse().ok()
}

/// Linux's resource flags (`include/linux/ioport.h`).
const IORESOURCE_MEM: u64 = 0x200;
const IORESOURCE_PREFETCH: u64 = 0x2000;
const IORESOURCE_MEM_64: u64 = 0x10_0000;
/// Lines 0–5 of `resource` are the BARs; 6 the expansion ROM, then
/// SR-IOV and bridge windows.
const BAR_LINES: usize = 6;

/// A function's memory BARs from its sysfs `resource` file: one
/// `start end flags` line (hex) per resource, size `end − start + 1`
/// (Linux `Documentation/PCI/sysfs-pci.rst`). I/O-port BARs and empty
/// lines are left out; a malformed line is an error, never a guess.
pub fn parse_resource(text: &str) -> Result<Vec<crate::Bar>, String> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16);
    let mut bars = Vec::new();
    for (i, line) in text.lines().take(BAR_LINES).enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [start, end, flags] = f[..] else {
            return Err(format!("line {} has {} fields, not 3", i + 1, f.len()));
        };
        let (Ok(start), Ok(end), Ok(flags)) = (hex(start), hex(end), hex(flags)) else {
            return Err(format!("line {} is not three hex numbers", i + 1));
        };
        if flags & IORESOURCE_MEM == 0 || (start == 0 && end == 0) {
            continue;
        }
        let Some(size) = end.checked_sub(start).and_then(|d| d.checked_add(1)) else {
            return Err(format!("line {} ends before it starts", i + 1));
        };
        bars.push(crate::Bar {
            index: i as u8,
            size,
            mem64: flags & IORESOURCE_MEM_64 != 0,
            prefetchable: flags & IORESOURCE_PREFETCH != 0,
        });
    }
    Ok(bars)
}

/// Joins a symlink's target to the link's directory and folds `..`
/// without touching the filesystem, so fixture trees resolve wherever
/// they are.
fn resolve_link(link: &Path) -> Option<PathBuf> {
    let target = fs::read_link(link).ok()?;
    let joined = if target.is_absolute() {
        target
    } else {
        link.parent()?.join(target)
    };
    let mut out = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

fn link_basename(link: &Path) -> Option<String> {
    fs::read_link(link)
        .ok()?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

/// The root complex and the chain of BDFs in a device's real path.
fn locate(real: &Path) -> Option<(String, Vec<Bdf>)> {
    let parts: Vec<String> = real
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let rc = parts
        .iter()
        .rposition(|p| p.starts_with("pci") && p.contains(':'))?;
    let chain: Vec<Bdf> = parts[rc + 1..]
        .iter()
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    Some((parts[rc].clone(), chain))
}

fn read_pci(root: &Path, warnings: &mut Vec<String>) -> Vec<PciDevice> {
    let dir = root.join("bus/pci/devices");
    let mut devices = Vec::new();
    let Ok(entries) = fs::read_dir(&dir) else {
        return devices;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(bdf) = name.parse::<Bdf>() else {
            warnings.push(format!(
                "bus/pci/devices/{name} is not a PCI address; skipped"
            ));
            continue;
        };
        let path = e.path();
        let located = resolve_link(&path).and_then(|real| locate(&real));
        let Some((root_complex, mut chain)) = located.filter(|(_, c)| c.last() == Some(&bdf))
        else {
            warnings.push(format!(
                "bus/pci/devices/{name} does not lead into devices/pci…; skipped"
            ));
            continue;
        };
        chain.pop();
        let Some(class) = read_hex(&path.join("class")) else {
            warnings.push(format!("{bdf}: class unreadable; skipped"));
            continue;
        };
        let numa_node = match read_trimmed(&path.join("numa_node")) {
            Some(s) => match s.parse::<i64>() {
                Ok(n) if n >= 0 => u32::try_from(n).ok(),
                Ok(_) => None,
                Err(_) => {
                    warnings.push(format!(
                        "{bdf}: numa_node {s:?} is not a number; affinity unknown"
                    ));
                    None
                }
            },
            None => None,
        };
        let id16 = |f: &str| read_hex(&path.join(f)).and_then(|v| u16::try_from(v).ok());
        let bars = match fs::read_to_string(path.join("resource")) {
            Ok(text) => parse_resource(&text).map_err(|e| format!("resource {e}")),
            Err(e) => Err(format!("resource: {e}")),
        };
        let bars = bars
            .map_err(|e| {
                warnings.push(format!(
                    "{bdf}: BARs unreadable ({e}); a VM cannot be given it"
                ))
            })
            .ok();
        let (Some(vendor), Some(device)) = (id16("vendor"), id16("device")) else {
            warnings.push(format!("{bdf}: vendor or device id unreadable; skipped"));
            continue;
        };
        devices.push(PciDevice {
            location: PciLocation {
                bdf,
                root_complex,
                pcie_path: chain,
                numa_node,
            },
            class,
            vendor,
            device,
            subsystem_vendor: id16("subsystem_vendor"),
            subsystem_device: id16("subsystem_device"),
            link_speed: read_trimmed(&path.join("max_link_speed"))
                .filter(|s| !s.is_empty() && s.len() < 64),
            link_width: read_u32(&path.join("max_link_width")),
            iommu_group: link_basename(&path.join("iommu_group")).and_then(|g| g.parse().ok()),
            driver: link_basename(&path.join("driver")),
            bars,
            port: if class >> 8 == crate::CLASS_BRIDGE_PCI >> 8 {
                let port = fs::read(path.join("config"))
                    .ok()
                    .and_then(|c| parse_pcie_port(&c));
                if port.is_none() {
                    warnings.push(format!(
                        "{bdf}: a bridge whose config space shows no PCIe port; its ACS is unknown"
                    ));
                }
                port
            } else {
                None
            },
        });
    }
    devices.sort_by_key(|d| d.location.bdf);
    devices
}

struct RdmaPort {
    name: String,
    speed_mbps: Option<u64>,
    link_layer: Option<String>,
}

/// `ports/1/rate` reads like `200 Gb/sec (4X HDR)`.
fn parse_rate(s: &str) -> Option<u64> {
    let mut it = s.split_whitespace();
    let value: f64 = it.next()?.parse().ok()?;
    let unit = it.next()?;
    let mbps = match unit {
        "Gb/sec" => value * 1000.0,
        "Mb/sec" => value,
        _ => return None,
    };
    (mbps.is_finite() && mbps >= 0.0).then_some(mbps as u64)
}

fn read_rdma(root: &Path, warnings: &mut Vec<String>) -> BTreeMap<Bdf, RdmaPort> {
    let mut out = BTreeMap::new();
    let Ok(entries) = fs::read_dir(root.join("class/infiniband")) else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let bdf = resolve_link(&e.path().join("device")).and_then(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse::<Bdf>().ok())
        });
        let Some(bdf) = bdf else {
            warnings.push(format!(
                "class/infiniband/{name}/device does not name a PCI function; skipped"
            ));
            continue;
        };
        let port = e.path().join("ports/1");
        out.insert(
            bdf,
            RdmaPort {
                name,
                speed_mbps: read_trimmed(&port.join("rate")).and_then(|r| parse_rate(&r)),
                link_layer: read_trimmed(&port.join("link_layer")).filter(|s| s.len() < 32),
            },
        );
    }
    out
}

/// A PF's VFs from its `virtfnN` links, in index order.
fn read_vfs(pf: &Path) -> Vec<Bdf> {
    let Ok(entries) = fs::read_dir(pf) else {
        return Vec::new();
    };
    let mut vfs: Vec<(u32, Bdf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let n: u32 = name.strip_prefix("virtfn")?.parse().ok()?;
            let bdf = resolve_link(&e.path())?
                .file_name()?
                .to_str()?
                .parse::<Bdf>()
                .ok()?;
            Some((n, bdf))
        })
        .collect();
    vfs.sort();
    vfs.into_iter().map(|(_, b)| b).collect()
}

fn read_netdevs(root: &Path) -> BTreeMap<Bdf, String> {
    let mut out = BTreeMap::new();
    let Ok(entries) = fs::read_dir(root.join("class/net")) else {
        return out;
    };
    for e in entries.flatten() {
        let bdf = resolve_link(&e.path().join("device")).and_then(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse::<Bdf>().ok())
        });
        if let Some(bdf) = bdf {
            out.entry(bdf)
                .or_insert_with(|| e.file_name().to_string_lossy().into_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists_round_trip() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11").unwrap(),
            vec![0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(format_cpulist(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(parse_cpulist("").unwrap(), Vec::<u32>::new());
        assert!(parse_cpulist("3-1").is_none());
        assert!(parse_cpulist("a-b").is_none());
        assert!(parse_cpulist("0-4294967295").is_none());
    }

    #[test]
    fn address_sizes_from_cpuinfo() {
        let info = "processor\t: 0\naddress sizes\t: 46 bits physical, 57 bits virtual\n";
        assert_eq!(parse_address_sizes(info), Some(46));
        assert_eq!(parse_address_sizes("address sizes : many"), None);
        assert_eq!(parse_address_sizes("model : 1"), None);
    }

    #[test]
    fn bars_from_a_resource_file() {
        // An H100 SXM5 as Linux prints it: BAR0 16 MiB, BAR2 128 GiB, BAR4
        // 32 MiB, all 64-bit prefetchable; the ROM line is not a BAR.
        let text = "\
0x000000c002000000 0x000000c002ffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x000000a000000000 0x000000bfffffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x000000c000000000 0x000000c001ffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x00000000fa000000 0x00000000fa07ffff 0x0000000000046200
";
        let bars = parse_resource(text).unwrap();
        assert_eq!(
            bars.iter().map(|b| (b.index, b.size)).collect::<Vec<_>>(),
            [(0, 16 << 20), (2, 128 << 30), (4, 32 << 20)]
        );
        assert!(bars.iter().all(|b| b.above_4g()));
        // A 32-bit non-prefetchable register BAR and an I/O BAR.
        let bars = parse_resource(
            "0x00000000f6000000 0x00000000f6ffffff 0x0000000000040200\n0x0000000000005000 0x000000000000507f 0x0000000000040101\n",
        )
        .unwrap();
        assert_eq!(bars.len(), 1);
        assert!(!bars[0].mem64 && !bars[0].prefetchable);
        assert!(parse_resource("0x1 0x2\n").is_err());
        assert!(parse_resource("0x10 0x1 0x200\n").is_err());
        assert!(parse_resource("zz 0x1 0x200\n").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("200 Gb/sec (4X HDR)"), Some(200_000));
        assert_eq!(parse_rate("400 Gb/sec (4X NDR)"), Some(400_000));
        assert_eq!(parse_rate("2.5 Gb/sec (1X SDR)"), Some(2_500));
        assert_eq!(parse_rate("fast"), None);
    }

    #[test]
    fn natural_order_of_rdma_names() {
        let mut v = vec!["mlx5_10", "mlx5_2", "mlx5_1"];
        v.sort_by_key(|n| natural_key(n));
        assert_eq!(v, vec!["mlx5_1", "mlx5_2", "mlx5_10"]);
    }

    #[test]
    fn a_directory_that_is_not_sysfs_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            discover(dir.path(), None),
            Err(DiscoveryError::NotSysfs(..))
        ));
    }
}
