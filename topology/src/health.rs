//! What a host still sees of the devices it passes through: once a GPU or
//! NIC belongs to a guest, the host's driver no longer talks to it, but
//! the PCIe layer does — its AER error counters, whether it is on the
//! bus, and its link's width and speed — and so do the RDMA ports' sysfs
//! files (link state, RoCE congestion counters). Read from a sysfs root
//! like discovery, so fixtures carry them; nothing here judges them (see
//! the control plane's device health rules).

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::HostTopology;

/// The RoCE congestion and ordering counters reported per port, as named
/// under `ports/N/hw_counters` (mlx5): ECN-marked packets received, CNPs
/// sent and handled, packets out of sequence.
pub const PORT_COUNTERS: &[&str] = &[
    "np_ecn_marked_roce_packets",
    "np_cnp_sent",
    "rp_cnp_handled",
    "out_of_sequence",
];

/// One passed-through device's signals.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSignals {
    pub bdf: String,
    /// `gpu` or `nic`.
    pub kind: String,
    /// Whether the device is on the bus (its sysfs directory exists).
    pub present: bool,
    /// AER totals since boot (`aer_dev_correctable|nonfatal|fatal`); `None`
    /// where the device or kernel has no AER statistics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aer: Option<AerCounts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<LinkState>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AerCounts {
    pub correctable: u64,
    pub nonfatal: u64,
    pub fatal: u64,
}

/// A PCIe link, now and at most: speeds in tenths of GT/s, widths in
/// lanes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkState {
    pub speed: u32,
    pub max_speed: u32,
    pub width: u32,
    pub max_width: u32,
}

impl LinkState {
    /// Fewer lanes than the device and slot can train to: a bad riser,
    /// cable or contact. (A lower speed alone is not: GPUs lower their
    /// link speed when idle to save power.)
    pub fn narrowed(&self) -> bool {
        self.max_width > 0 && self.width < self.max_width
    }
}

/// One RDMA port's signals.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortSignals {
    /// The RDMA device, e.g. `mlx5_0`.
    pub device: String,
    pub port: u32,
    /// The NIC's PCI address.
    pub bdf: String,
    /// `ACTIVE`, `DOWN`, … (the word of `ports/N/state`).
    pub state: String,
    /// How often the port's netdev lost or regained its carrier since
    /// boot (`carrier_changes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carrier_changes: Option<u64>,
    /// [`PORT_COUNTERS`] that the port has.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, u64>,
}

impl PortSignals {
    pub fn active(&self) -> bool {
        self.state == "ACTIVE"
    }
}

/// Everything read in one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostSignals {
    pub devices: Vec<DeviceSignals>,
    pub ports: Vec<PortSignals>,
}

/// Reads the signals of the topology's GPUs and RDMA NICs under `root`
/// (`/sys`, or a fixture). Unreadable files read as absent, never as
/// errors: a missing device is a signal, not a failure.
pub fn read(root: &Path, topo: &HostTopology) -> HostSignals {
    let device = |bdf: String, kind: &str| {
        let dir = root.join("bus/pci/devices").join(&bdf);
        let present = dir.join("vendor").is_file();
        DeviceSignals {
            aer: present.then(|| aer(&dir)).flatten(),
            link: present.then(|| link(&dir)).flatten(),
            bdf,
            kind: kind.to_owned(),
            present,
        }
    };
    let mut devices: Vec<DeviceSignals> = topo
        .gpus
        .iter()
        .map(|g| device(g.location.bdf.to_string(), "gpu"))
        .collect();
    devices.extend(
        topo.nics
            .iter()
            .map(|n| device(n.location.bdf.to_string(), "nic")),
    );
    let ports = topo
        .nics
        .iter()
        .flat_map(|n| {
            let ports = root
                .join("class/infiniband")
                .join(&n.rdma_device)
                .join("ports");
            let mut numbers: Vec<u32> = fs::read_dir(&ports)
                .map(|d| {
                    d.flatten()
                        .filter_map(|e| e.file_name().to_str()?.parse().ok())
                        .collect()
                })
                .unwrap_or_default();
            numbers.sort_unstable();
            let carrier = n
                .netdev
                .as_ref()
                .and_then(|d| number(&root.join("class/net").join(d).join("carrier_changes")));
            numbers
                .into_iter()
                .map(|p| {
                    let dir = ports.join(p.to_string());
                    PortSignals {
                        device: n.rdma_device.clone(),
                        port: p,
                        bdf: n.location.bdf.to_string(),
                        state: fs::read_to_string(dir.join("state"))
                            .map(|s| state_word(&s))
                            .unwrap_or_else(|_| "UNKNOWN".into()),
                        carrier_changes: carrier,
                        counters: PORT_COUNTERS
                            .iter()
                            .filter_map(|c| {
                                number(&dir.join("hw_counters").join(c)).map(|v| (c.to_string(), v))
                            })
                            .collect(),
                    }
                })
                .collect::<Vec<_>>()
        })
        .collect();
    HostSignals { devices, ports }
}

/// The fatal AER count of a device now (`None`: no such device or no AER
/// statistics), to compare a later [`release_check`] with.
pub fn fatal_aer(root: &Path, bdf: &str) -> Option<u64> {
    aer(&root.join("bus/pci/devices").join(bdf)).map(|a| a.fatal)
}

/// The driver that holds devices between VMs.
pub const VFIO_DRIVER: &str = "vfio-pci";

/// Checks a device a VM has just let go, before it goes to the next
/// tenant: it is reset (FLR or a bus reset, whichever the kernel has for
/// it: its sysfs `reset`), its config space answers (the vendor ID read
/// live from `config`, not the cached `vendor`: a device that did not
/// come back reads all ones), it is bound to `vfio-pci` or to the driver
/// the host had it on (`host_driver`: libvirt's managed hostdevs give a
/// device back to that one), and it raised no fatal AER since
/// `fatal_before`. Returns every problem, in words.
pub fn release_check(
    root: &Path,
    bdf: &str,
    host_driver: Option<&str>,
    fatal_before: Option<u64>,
) -> Result<(), String> {
    let dir = root.join("bus/pci/devices").join(bdf);
    if !dir.join("vendor").is_file() {
        return Err("gone from the PCIe bus".into());
    }
    let mut problems = Vec::new();
    let driver = fs::read_link(dir.join("driver"))
        .ok()
        .and_then(|l| Some(l.file_name()?.to_string_lossy().into_owned()));
    // Reset here only while vfio-pci holds it: under its host driver
    // (libvirt hands a managed hostdev back, after resetting it itself) a
    // reset behind that driver's back would break the driver's state.
    let reset = dir.join("reset");
    if !reset.exists() {
        problems.push("no reset method (neither FLR nor a bus reset)".into());
    } else if driver.as_deref() == Some(VFIO_DRIVER) {
        if let Err(e) = fs::write(&reset, "1") {
            problems.push(format!("reset failed: {e}"));
        }
    }
    // A VF's own vendor register reads all ones by design (SR-IOV): its
    // PF's tells whether the card answers.
    let live = if dir.join("physfn").exists() {
        dir.join("physfn").join("config")
    } else {
        dir.join("config")
    };
    let vendor = fs::read(&live)
        .ok()
        .filter(|c| c.len() >= 2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .or_else(|| {
            let text = fs::read_to_string(dir.join("vendor")).ok()?;
            u16::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()
        });
    match vendor {
        Some(0xffff) => problems.push("config space reads 0xffff".into()),
        Some(_) => {}
        None => problems.push("config space unreadable".into()),
    }
    // Back on vfio-pci (a host that keeps its devices there) or on the
    // driver libvirt gave it back to; on none, it is nobody's.
    if driver.is_none() {
        problems.push(format!(
            "bound to no driver (neither {VFIO_DRIVER} nor {})",
            host_driver.unwrap_or("its host driver")
        ));
    }
    let fatal_after = aer(&dir).map(|a| a.fatal);
    if let (Some(before), Some(after)) = (fatal_before, fatal_after) {
        if after > before {
            problems.push(format!("{} new fatal PCIe (AER) error(s)", after - before));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// `4: ACTIVE` → `ACTIVE`.
fn state_word(s: &str) -> String {
    let s = s.trim();
    s.split_once(':')
        .map(|(_, w)| w.trim())
        .unwrap_or(s)
        .to_owned()
}

fn number(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn aer(dir: &Path) -> Option<AerCounts> {
    let total = |file: &str| aer_total(&fs::read_to_string(dir.join(file)).ok()?);
    Some(AerCounts {
        correctable: total("aer_dev_correctable")?,
        nonfatal: total("aer_dev_nonfatal")?,
        fatal: total("aer_dev_fatal")?,
    })
}

/// An `aer_dev_*` file's total: its `TOTAL_ERR_…` line, else the sum of
/// its lines (older kernels have no total line).
pub fn aer_total(text: &str) -> Option<u64> {
    let mut sum = 0u64;
    let mut any = false;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(name), Some(value)) = (it.next(), it.next()) else {
            continue;
        };
        let Ok(v) = value.parse::<u64>() else {
            continue;
        };
        if name.starts_with("TOTAL_ERR_") {
            return Some(v);
        }
        sum = sum.saturating_add(v);
        any = true;
    }
    any.then_some(sum)
}

fn link(dir: &Path) -> Option<LinkState> {
    let read = |f: &str| fs::read_to_string(dir.join(f)).ok();
    Some(LinkState {
        speed: gts_tenths(&read("current_link_speed")?)?,
        max_speed: gts_tenths(&read("max_link_speed")?)?,
        width: read("current_link_width")?.trim().parse().ok()?,
        max_width: read("max_link_width")?.trim().parse().ok()?,
    })
}

/// `16.0 GT/s PCIe` → 160; `2.5 GT/s` → 25; `Unknown` → `None`.
pub fn gts_tenths(s: &str) -> Option<u32> {
    let n = s.split_whitespace().next()?;
    let (whole, frac) = n.split_once('.').unwrap_or((n, "0"));
    let whole: u32 = whole.parse().ok()?;
    let tenth: u32 = frac
        .chars()
        .next()
        .and_then(|c| c.to_digit(10))
        .unwrap_or(0);
    Some(whole * 10 + tenth)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As Linux prints them (Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats).
    const CORRECTABLE: &str = "RxErr 0\nBadTLP 2\nBadDLLP 1\nRollover 0\nTimeout 0\nNonFatalErr 0\nCorrIntErr 0\nHeaderOF 0\nTOTAL_ERR_COR 3\n";

    #[test]
    fn a_released_device_passes_only_when_it_came_back() {
        #![allow(clippy::unwrap_used)]
        let dir = tempfile::tempdir().unwrap();
        let m = crate::fixtures::machine("hgx-h100-roce").unwrap();
        crate::fixtures::write(&m, dir.path()).unwrap();
        let topo = crate::sysfs::discover(dir.path(), None).unwrap();
        let gpu = topo.gpus[0].location.bdf.to_string();
        let host_driver = topo
            .pci_devices
            .iter()
            .find(|d| d.location.bdf == topo.gpus[0].location.bdf)
            .and_then(|d| d.driver.clone());
        let root = dir.path();
        let before = fatal_aer(root, &gpu);
        assert_eq!(before, Some(0));
        assert_eq!(
            release_check(root, &gpu, host_driver.as_deref(), before),
            Ok(())
        );
        let dev = root.join("bus/pci/devices").join(&gpu);
        // A VF: its own vendor register reads ones by design; its PF's counts.
        let vf = topo.nics.iter().find_map(|n| n.vfs.first()).unwrap();
        let vf_dir = root.join("bus/pci/devices").join(vf.to_string());
        let mut c = fs::read(vf_dir.join("config")).unwrap();
        c[..2].copy_from_slice(&[0xff, 0xff]);
        fs::write(vf_dir.join("config"), &c).unwrap();
        assert_eq!(release_check(root, &vf.to_string(), None, None), Ok(()));
        // Given back to no driver.
        let driver = fs::read_link(dev.join("driver")).unwrap();
        fs::remove_file(dev.join("driver")).unwrap();
        assert!(release_check(root, &gpu, host_driver.as_deref(), before)
            .unwrap_err()
            .starts_with("bound to no driver"));
        std::os::unix::fs::symlink(&driver, dev.join("driver")).unwrap();
        // Config space reads all ones: it did not come back from reset.
        let mut config = fs::read(dev.join("config")).unwrap();
        config[..2].copy_from_slice(&[0xff, 0xff]);
        fs::write(dev.join("config"), &config).unwrap();
        // A fatal AER during the release.
        fs::write(dev.join("aer_dev_fatal"), "TOTAL_ERR_FATAL 1\n").unwrap();
        assert_eq!(
            release_check(root, &gpu, host_driver.as_deref(), before),
            Err("config space reads 0xffff; 1 new fatal PCIe (AER) error(s)".into())
        );
        // No reset method: never handed on un-reset.
        fs::remove_file(dev.join("reset")).unwrap();
        assert!(release_check(root, &gpu, host_driver.as_deref(), Some(1))
            .unwrap_err()
            .starts_with("no reset method"));
        assert_eq!(
            release_check(root, "0000:ee:00.0", None, None),
            Err("gone from the PCIe bus".into())
        );
    }

    #[test]
    fn aer_files_read_as_their_totals() {
        assert_eq!(aer_total(CORRECTABLE), Some(3));
        assert_eq!(
            aer_total("Undefined 0\nDLP 1\nSDES 1\n"),
            Some(2),
            "no total line"
        );
        assert_eq!(aer_total(""), None);
        assert_eq!(aer_total("garbage\n"), None);
    }

    #[test]
    fn link_speeds_read_in_tenths() {
        assert_eq!(gts_tenths("16.0 GT/s PCIe\n"), Some(160));
        assert_eq!(gts_tenths("2.5 GT/s PCIe"), Some(25));
        assert_eq!(gts_tenths("32.0 GT/s PCIe"), Some(320));
        assert_eq!(gts_tenths("Unknown"), None);
        let l = LinkState {
            speed: 25,
            max_speed: 320,
            width: 16,
            max_width: 16,
        };
        assert!(!l.narrowed(), "an idle GPU's slower link is not a fault");
        assert!(LinkState { width: 8, ..l }.narrowed());
    }

    #[test]
    fn port_states_are_their_words() {
        assert_eq!(state_word("4: ACTIVE\n"), "ACTIVE");
        assert_eq!(state_word("1: DOWN"), "DOWN");
        assert_eq!(state_word("odd"), "odd");
    }
}
