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

use super::network::{ip, run, WAN_CIDR};

/// The host's name in the fleet.
pub const HOST: &str = "qemu-001";
/// The template of its guests.
pub const TEMPLATE: &str = "tiny";
/// This machine's address on the provider network (outside the pool).
pub const WAN_LOCAL: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 201);
/// The host's underlay address: the underlay's last, far from the
/// simulated hosts' (198.18.0.1 up) and from those other agents in this
/// namespace use (the QEMU tests').
pub const UNDERLAY_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 254);
/// Where the work directories live: root's own (`/var/lib` is), and
/// searchable by QEMU's user, which opens the disks inside.
const WORK_ROOT: &str = "/var/lib/kumo-dev";
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
    /// Its nftables table here (`inet`), which keeps the provider network
    /// from reaching this machine but for answers.
    #[serde(default)]
    pub table: Option<String>,
}

/// The work directory for the fleet on `data_dir`: one per data
/// directory, so a restarted fleet finds its VMs' disks again.
pub fn work_dir(data_dir: &Path) -> PathBuf {
    use sha2::Digest;
    let canonical = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_owned());
    let digest = sha2::Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    PathBuf::from(WORK_ROOT).join(&hex::encode(digest)[..12])
}

/// Refuses a directory that is not root's own, a real directory, and
/// closed to others' writes: root copies files into it and QEMU boots
/// from it, so no one else may have planted anything there.
fn ours(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
    anyhow::ensure!(
        m.file_type().is_dir() && m.uid() == 0 && m.mode() & 0o022 == 0,
        "{} is not a directory of root's that only root writes to: remove it",
        dir.display()
    );
    Ok(())
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
/// other Kumo agent's networks in this namespace (another fleet's QEMU
/// host, a real agent, a QEMU test): an agent removes the segment devices
/// it does not want, so two would undo each other.
pub fn preflight(guest: &Path) -> anyhow::Result<()> {
    for f in ["vmlinuz", "initrd.img"] {
        anyhow::ensure!(
            guest.join(f).is_file(),
            "{} has no {f}: build the guest with scripts/build-test-guest.sh {} (./x start --qemu does)",
            guest.display(),
            guest.display()
        );
    }
    virsh(&["version"]).with_context(|| {
        format!("libvirtd does not answer on {LIBVIRT} (start it: scripts/ensure-libvirtd.sh)")
    })?;
    let routes = run("ip", "iproute2", &["-j", "route", "show", WAN_CIDR])?;
    anyhow::ensure!(
        !routes.contains("dst"),
        "this machine already has a route to {WAN_CIDR}: another dev fleet with a QEMU host runs (stop it first)"
    );
    if let Some(link) = segment_links().first() {
        anyhow::bail!(
            "another Kumo agent's segment device {link} is in this network namespace (a QEMU host, a test): stop it first"
        );
    }
    Ok(())
}

/// This namespace's segment devices (`kbr…` bridges, `kvx…` VXLAN).
fn segment_links() -> Vec<String> {
    let out = Command::new("ip")
        .args(["-br", "link"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(|n| n.split('@').next().unwrap_or(n))
        .filter(|n| n.starts_with("kbr") || n.starts_with("kvx"))
        .map(str::to_owned)
        .collect()
}

/// Makes the work directory with the guest's kernel, initrd and an empty
/// base image in it; answers the template's request.
pub fn prepare(work: &Path, guest: &Path) -> anyhow::Result<kumo_api_types::TemplateCreate> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    for dir in [Path::new(WORK_ROOT), work] {
        match std::fs::DirBuilder::new().mode(0o755).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
        ours(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    }
    for f in ["vmlinuz", "initrd.img"] {
        std::fs::copy(guest.join(f), work.join(f))
            .with_context(|| format!("copying {} into {}", f, work.display()))?;
    }
    let base = work.join("base.qcow2");
    super::network::empty_image(&base, "1G")?;
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
    // Before the address: from the provider network — where tenants'
    // VMs leave through their edges — only answers to this machine's own
    // connections come in (no VXLAN from a VM into the host's segments,
    // no services, no routing through it).
    let table = format!("kumo_dev_{pid}");
    left.table = Some(table.clone());
    nft(&format!(
        "table inet {table} {{\n\
         chain input {{ type filter hook input priority -10; policy accept;\n\
           iifname \"{wl}\" ct state established,related accept\n\
           iifname \"{wl}\" drop\n\
         }}\n\
         chain forward {{ type filter hook forward priority -10; policy accept;\n\
           iifname \"{wl}\" drop\n\
         }}\n\
         }}\n"
    ))?;
    for (link, addr) in [(&ul, &ul_addr), (&wl, &wl_addr)] {
        ip(&["addr", "add", addr, "dev", link])?;
        ip(&["link", "set", link, "up"])?;
    }
    Ok(())
}

/// Runs `nft -f -` with `rules`.
fn nft(rules: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running nft (Debian: nftables)")?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(rules.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "nft: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
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
        // The agent's read-only binds of project shares, for virtiofsd.
        for m in mounts_under(&left.work) {
            let _ = Command::new("umount").arg("-l").arg(&m).output();
        }
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
        if let Some(b) = bridge.filter(|b| b.starts_with("kbr")) {
            let _ = ip(&["link", "del", &b]);
        }
    }
    if let Some(t) = &left.table {
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", t])
            .output();
    }
    for l in &left.links {
        if let Err(e) = ip(&["link", "del", l]) {
            tracing::debug!(link = %l, error = %e, "dev link already gone");
        }
    }
    // The agent's bridge filters, unless another agent's segments still
    // use this namespace (a segment bridge `kbr…` left): then its table.
    if segment_links().is_empty() {
        let _ = Command::new("nft")
            .args(["delete", "table", "bridge", vxlan_manager::filter::TABLE])
            .output();
    }
}

fn virsh(args: &[&str]) -> anyhow::Result<String> {
    let all: Vec<&str> = ["-q", "-c", LIBVIRT].iter().chain(args).copied().collect();
    super::network::run("virsh", "libvirt-clients", &all)
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

/// Mount points at or under `dir` (`/proc/self/mountinfo`'s fifth field;
/// octal escapes are left as they are: the agent's paths have none).
fn mounts_under(dir: &Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let dir = dir.display().to_string();
    let mut out: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&dir))
        .map(str::to_owned)
        .collect();
    // Deepest first.
    out.sort_by_key(|m| std::cmp::Reverse(m.len()));
    out
}

/// This namespace's VXLAN devices (`kvx…`) whose local address is `local`, with
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
        .filter(|l| l["ifname"].as_str().is_some_and(|n| n.starts_with("kvx")))
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
        assert!(a.starts_with(WORK_ROOT), "{}", a.display());
    }

    #[test]
    fn a_work_directory_others_could_write_or_a_link_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("w");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata("/proc/self").unwrap().uid() == 0
        };
        assert_eq!(ours(&dir).is_ok(), root, "a 0755 directory of ours");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(ours(&dir).is_err(), "writable by others");
        let link = t.path().join("l");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(ours(&link).is_err(), "a link");
    }

    #[test]
    fn the_underlay_address_is_in_the_underlay_and_not_a_simulated_hosts() {
        assert_eq!(UNDERLAY_IP.octets()[..2], [198, 19]);
        assert!((0..1000).all(|i| super::super::network::underlay_ip(i) != UNDERLAY_IP));
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
