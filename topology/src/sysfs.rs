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
    topo.pci_devices = read_pci(root, warnings);

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
