//! The dev fleet's one real host (`kumo-server dev --qemu-guest DIR`,
//! what `./x start --qemu` runs): a `kumo-agent` in this machine's own
//! network namespace on libvirt's `qemu:///system`, booting real guests
//! (the tiny guest of `scripts/build-test-guest.sh`: busybox, Dropbear,
//! the QEMU guest agent) from the template `tiny`, so a person can go
//! from `./x start` to an SSH session in a VM. The simulated hosts keep
//! their namespaces; this one joins their underlay through a veth (VXLAN
//! to the edge host carries its VMs' public addresses), and a second veth
//! into the provider network gives this machine an address there, so
//! `kumo vm ssh` reaches a public address from the person's own shell.
//!
//! Everything it makes is named in `fleet/owner.json`, so the fleet's
//! end (or the next start after a kill) removes it: its domains, its two
//! veths, and the VXLAN devices and bridges its agent made here.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::network::{ip, WAN_CIDR};

/// The host's name in the fleet.
pub const HOST: &str = "qemu-001";
/// The template of its guests.
pub const TEMPLATE: &str = "tiny";
/// This machine's address on the provider network (outside the pool).
pub const WAN_LOCAL: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 201);
const LIBVIRT: &str = "qemu:///system";

/// What a QEMU host left on this machine, to be removed when its fleet
/// ends (recorded in `fleet/owner.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Leftovers {
    /// Where its disks, seeds and firmware live (QEMU's own user must
    /// reach them, so not under a home directory): its domains are those
    /// whose definition names it.
    pub work: PathBuf,
    /// Its veths in this namespace (each takes its peer along).
    pub links: Vec<String>,
    /// Its underlay address: the VXLAN devices its agent made here have
    /// it as their local address.
    pub underlay_ip: Ipv4Addr,
}

/// The work directory for the fleet on `data_dir`: one per data
/// directory, so a restarted fleet finds its VMs' disks again.
pub fn work_dir(data_dir: &Path) -> PathBuf {
    use sha2::Digest;
    let canonical = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_owned());
    let digest = sha2::Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    PathBuf::from("/var/tmp").join(format!("kumo-dev-qemu-{}", &hex::encode(digest)[..12]))
}

/// `kvm` where libvirt offers it, else `qemu` (TCG).
fn virt_type() -> &'static str {
    let caps = Command::new("virsh")
        .args(["-c", LIBVIRT, "capabilities"])
        .output();
    match caps {
        Ok(o) if String::from_utf8_lossy(&o.stdout).contains("<domain type='kvm'") => "kvm",
        _ => "qemu",
    }
}

/// Checks what the host needs before anything is made: libvirtd
/// answering on `qemu:///system`, the guest's kernel and initrd, and no
/// other fleet's QEMU host on this machine (the provider network's
/// addresses would clash).
pub fn preflight(guest: &Path) -> anyhow::Result<()> {
    for f in ["vmlinuz", "initrd.img"] {
        anyhow::ensure!(
            guest.join(f).is_file(),
            "{} has no {f}: build the guest with scripts/build-test-guest.sh {} (./x start --qemu does)",
            guest.display(),
            guest.display()
        );
    }
    let answers = Command::new("virsh")
        .args(["-c", LIBVIRT, "version"])
        .output()
        .context("running virsh (Debian: libvirt-clients)")?;
    anyhow::ensure!(
        answers.status.success(),
        "libvirtd does not answer on {LIBVIRT} (start it: scripts/ensure-libvirtd.sh): {}",
        String::from_utf8_lossy(&answers.stderr).trim()
    );
    let routes = Command::new("ip")
        .args(["-j", "route", "show", WAN_CIDR])
        .output()
        .context("running ip (Debian: iproute2)")?;
    anyhow::ensure!(
        !String::from_utf8_lossy(&routes.stdout).contains("dst"),
        "this machine already has a route to {WAN_CIDR}: another dev fleet with a QEMU host runs (stop it first)"
    );
    Ok(())
}

/// Makes the work directory with the guest's kernel, initrd and an empty
/// base image in it; answers the template's request.
pub fn prepare(work: &Path, guest: &Path) -> anyhow::Result<kumo_api_types::TemplateCreate> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
    std::fs::set_permissions(work, std::fs::Permissions::from_mode(0o755))?;
    for f in ["vmlinuz", "initrd.img"] {
        std::fs::copy(guest.join(f), work.join(f))
            .with_context(|| format!("copying {} into {}", f, work.display()))?;
    }
    let base = work.join("base.qcow2");
    if !base.exists() {
        let out = Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&base)
            .arg("1G")
            .output()
            .context("running qemu-img (Debian: qemu-utils)")?;
        anyhow::ensure!(
            out.status.success(),
            "qemu-img: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(kumo_api_types::TemplateCreate {
        name: TEMPLATE.into(),
        image_path: base.display().to_string(),
        os: "busybox (kumo's test guest)".into(),
        default_user: "root".into(),
        kernel_path: Some(work.join("vmlinuz").display().to_string()),
        initrd_path: Some(work.join("initrd.img").display().to_string()),
        kernel_cmdline: Some("console=ttyS0 quiet".into()),
    })
}

/// The veths joining this namespace to the fleet's underlay (with
/// `left.underlay_ip`) and to its provider network (with [`WAN_LOCAL`]).
/// Each link goes into `left` as soon as it exists, so a failure half way
/// leaves nothing its removal misses.
pub fn join_networks(
    underlay: &super::network::Underlay,
    wan: &super::network::Wan,
    left: &mut Leftovers,
) -> anyhow::Result<()> {
    let pid = std::process::id();
    let (ul, wl) = (format!("kdu{pid}"), format!("kdw{pid}"));
    for (link, peer, ns) in [
        (&ul, "q0", &underlay.namespace),
        (&wl, "q1", &wan.namespace),
    ] {
        ip(&[
            "link", "add", link, "type", "veth", "peer", "name", peer, "netns", ns,
        ])?;
        left.links.push(link.clone());
    }
    ip(&[
        "-n",
        &underlay.namespace,
        "link",
        "set",
        "q0",
        "master",
        &underlay.bridge,
        "up",
    ])?;
    ip(&[
        "-n",
        &wan.namespace,
        "link",
        "set",
        "q1",
        "master",
        "pn",
        "up",
    ])?;
    let ul_addr = format!("{}/{}", left.underlay_ip, super::network::UNDERLAY_PREFIX);
    let wl_addr = format!("{WAN_LOCAL}/24");
    for (link, addr) in [(&ul, &ul_addr), (&wl, &wl_addr)] {
        ip(&["addr", "add", addr, "dev", link])?;
        ip(&["link", "set", link, "up"])?;
    }
    Ok(())
}

/// `kumo-agent run`'s arguments for the host (beside the server, name,
/// sysfs, state and the fleet's common ones).
pub fn agent_args(left: &Leftovers) -> Vec<String> {
    vec![
        "--libvirt-uri".into(),
        LIBVIRT.into(),
        "--virt-type".into(),
        virt_type().into(),
        "--underlay-ip".into(),
        left.underlay_ip.to_string(),
    ]
}

/// Removes what the host left: its domains (destroyed, undefined with
/// their firmware variables), its VXLAN devices and the bridges they
/// were in, and its veths. Best effort: each failure is logged and the
/// rest goes on.
pub fn remove(left: &Leftovers) {
    if !left.work.as_os_str().is_empty() {
        for dom in domains_under(&left.work) {
            let _ = virsh(&["destroy", &dom]);
            if virsh(&["undefine", "--nvram", &dom]).is_err() {
                if let Err(e) = virsh(&["undefine", &dom]) {
                    tracing::warn!(domain = %dom, error = %e, "could not undefine a dev domain");
                }
            }
        }
    }
    for (vxlan, bridge) in vxlans_from(left.underlay_ip) {
        let _ = ip(&["link", "del", &vxlan]);
        if let Some(b) = bridge {
            let _ = ip(&["link", "del", &b]);
        }
    }
    for l in &left.links {
        if let Err(e) = ip(&["link", "del", l]) {
            tracing::debug!(link = %l, error = %e, "dev link already gone");
        }
    }
    // The agent's bridge filters, unless another agent's segments still
    // use this namespace (a segment bridge `kbr…` left): then its table.
    let bridges = Command::new("ip")
        .args(["-br", "link", "show", "type", "bridge"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if !bridges.lines().any(|l| l.starts_with("kbr")) {
        let _ = Command::new("nft")
            .args(["delete", "table", "bridge", vxlan_manager::filter::TABLE])
            .output();
    }
}

fn virsh(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("virsh")
        .args(["-q", "-c", LIBVIRT])
        .args(args)
        .output()
        .context("running virsh")?;
    anyhow::ensure!(
        out.status.success(),
        "virsh {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The agent's domains (`kumo-…`) whose definition names `work`.
fn domains_under(work: &Path) -> Vec<String> {
    let Ok(names) = virsh(&["list", "--all", "--name"]) else {
        return Vec::new();
    };
    let work = work.display().to_string();
    names
        .lines()
        .map(str::trim)
        .filter(|n| n.starts_with("kumo-"))
        .filter(|n| virsh(&["dumpxml", n]).is_ok_and(|x| x.contains(&work)))
        .map(str::to_owned)
        .collect()
}

/// This namespace's VXLAN devices whose local address is `local`, with
/// the bridge each is a port of.
fn vxlans_from(local: Ipv4Addr) -> Vec<(String, Option<String>)> {
    let Ok(out) = Command::new("ip")
        .args(["-d", "-j", "link", "show", "type", "vxlan"])
        .output()
    else {
        return Vec::new();
    };
    let links: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
    links
        .iter()
        .filter(|l| l["linkinfo"]["info_data"]["local"].as_str() == Some(&local.to_string()))
        .filter_map(|l| {
            Some((
                l["ifname"].as_str()?.to_owned(),
                l["master"].as_str().map(str::to_owned),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_directory_has_one_work_directory_outside_home() {
        let a = work_dir(Path::new("/root/kumo/.kumo"));
        assert_eq!(a, work_dir(Path::new("/root/kumo/.kumo")));
        assert_ne!(a, work_dir(Path::new("/root/other/.kumo")));
        assert!(a.starts_with("/var/tmp"), "{}", a.display());
    }

    #[test]
    fn the_local_address_is_in_the_provider_network_and_outside_the_pool() {
        let (first, last) = super::super::network::POOL_RANGE.split_once('-').unwrap();
        let (first, last): (Ipv4Addr, Ipv4Addr) = (first.parse().unwrap(), last.parse().unwrap());
        assert_eq!(WAN_LOCAL.octets()[..3], [203, 0, 113]);
        assert!(!(first..=last).contains(&WAN_LOCAL));
        assert_ne!(WAN_LOCAL, super::super::network::WAN_CLIENT);
        assert_ne!(WAN_LOCAL, super::super::network::WAN_ROUTER);
    }
}
