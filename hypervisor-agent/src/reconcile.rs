//! One reconcile pass over libvirt: make the host's domains what the
//! desired state says, and report what is actually there.
//!
//! Level-triggered: a pass looks only at the desired state and at libvirt,
//! never at what an earlier pass did, so a pass after a restart adopts
//! whatever survived, and a second pass in a row changes nothing. A domain
//! is ours when its metadata names this host; all others are left alone.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::storage::root_disks::NVRAM_FILE;
use kumo_api_types::{
    ActualState, DesiredState, DesiredVm, MountReport, Power, SegmentKind, UnfitDevice, VmStatus,
};
use kumo_topology::domain_xml::{
    domain_xml, volume_disk, volume_target, BridgeNic, DiskSource, DomainSpec, KernelBoot,
    VolumeDisk, METADATA_NS,
};
use kumo_topology::guest_layout::guest_layout;
use kumo_topology::{Bdf, FabricManager, HostTopology};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use uuid::Uuid;
use virt::connect::Connect;
use virt::domain::Domain;

/// `VIR_DOMAIN_METADATA_ELEMENT`.
const METADATA_ELEMENT: i32 = 2;
/// `VIR_DOMAIN_REBOOT_GUEST_AGENT`.
const VIR_DOMAIN_REBOOT_GUEST_AGENT: u32 = 2;
/// `VIR_DOMAIN_AFFECT_LIVE`.
const AFFECT_LIVE: u32 = 1;
/// `VIR_DOMAIN_XML_INACTIVE`.
const XML_INACTIVE: u32 = 2;
/// Serials of volume disks start so (the API makes them).
const VOLUME_SERIAL: &str = "kumo";

/// The volumes the host's storage holds ready, by id: what a VM's disks
/// point at. A VM's volume not (yet) among them is left out of it.
pub type ReadyVolumes = BTreeMap<Uuid, DiskSource>;

/// A VM's volume disks, as wanted: the ready ones, in order.
fn volume_disks(vm: &DesiredVm, ready: &ReadyVolumes) -> Vec<VolumeDisk> {
    vm.volumes
        .iter()
        .filter_map(|d| {
            Some(VolumeDisk {
                source: ready.get(&d.volume)?.clone(),
                serial: d.serial.clone(),
            })
        })
        .collect()
}

/// The `<disk>` elements of a domain's XML, as text.
fn disk_elements(xml: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find("<disk ") {
        let Some(len) = rest[start..].find("</disk>") else {
            break;
        };
        let end = start + len + "</disk>".len();
        out.push(&rest[start..end]);
        rest = &rest[end..];
    }
    out
}

/// The volume disks of a domain's XML: serial → (target, element).
fn volume_disks_in(xml: &str) -> BTreeMap<String, (String, String)> {
    let mut out = BTreeMap::new();
    for d in disk_elements(xml) {
        let serial = d
            .split_once("<serial>")
            .and_then(|(_, r)| r.split_once("</serial>"))
            .map(|(s, _)| s.to_owned());
        let target = d
            .split_once("<target dev='")
            .or_else(|| d.split_once("<target dev=\""))
            .and_then(|(_, r)| r.split_once(['\'', '"']))
            .map(|(t, _)| t.to_owned());
        if let (Some(serial), Some(target)) = (serial, target) {
            if serial.starts_with(VOLUME_SERIAL) {
                out.insert(serial, (target, d.to_owned()));
            }
        }
    }
    out
}

/// Every disk target a domain's XML uses.
fn targets_in(xml: &str) -> std::collections::BTreeSet<String> {
    disk_elements(xml)
        .into_iter()
        .filter_map(|d| {
            d.split_once("<target dev=")
                .and_then(|(_, r)| r.get(1..))
                .and_then(|r| r.split_once(['\'', '"']))
                .map(|(t, _)| t.to_owned())
        })
        .collect()
}

/// A driver that cannot hot-plug at all (libvirt's test driver): nothing
/// to warn about.
fn unsupported(e: &virt::error::Error) -> bool {
    use virt::error::ErrorNumber;
    matches!(
        e.code(),
        virt::enumutil::Enum::Known(ErrorNumber::NoSupport | ErrorNumber::OperationUnsupported)
    )
}

pub struct Reconciler {
    /// Open while libvirt answers; reopened from `uri` after it went away.
    conn: Option<Connect>,
    uri: String,
    host_id: Uuid,
    topology: HostTopology,
    virt_type: String,
    state_dir: PathBuf,
    /// `/sys`, or a fixture: where released devices are checked.
    sysfs_root: PathBuf,
    /// Devices that failed their check after a VM let them go, for the
    /// next report (see [`kumo_topology::health::release_check`]).
    pub unfit: Vec<UnfitDevice>,
    /// The host's Fabric Manager (shared NVSwitch mode), when it has one.
    fabric: Option<crate::fabric_manager::Fmpm>,
    /// What Fabric Manager last said (its partitions, or why it did not
    /// answer), shared with the heartbeat that tells the server.
    pub fabric_view: Arc<Mutex<Option<FabricManager>>>,
    /// Partitions Fabric Manager last listed as active.
    fabric_active: BTreeSet<u32>,
    /// Whether this agent has told Fabric Manager its activated list
    /// since it started (it re-sets it then and after Fabric Manager
    /// restarts).
    fabric_told: bool,
    /// Reboot requests applied, by VM: survives restarts in `reboots.json`.
    reboots: BTreeMap<Uuid, i64>,
    /// Preemption notices given, by VM: the deadline each was for.
    noticed: BTreeMap<Uuid, chrono::DateTime<chrono::Utc>>,
    /// libvirt calls that changed something, for tests and logs.
    pub changes: u64,
    /// Times libvirt was opened again after its connection died.
    pub reconnects: u64,
    /// Project shares, where the host has the shared filesystem.
    shares: Option<Arc<Mutex<crate::shares::Shares>>>,
}

/// A YAML double-quoted scalar.
fn yaml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// NoCloud `meta-data` and `user-data`.
pub fn cloud_init(vm: &DesiredVm) -> (String, String) {
    let meta = format!(
        "instance-id: {}\nlocal-hostname: {}\n",
        vm.id,
        yaml_str(&vm.name)
    );
    let mut user = format!("#cloud-config\nhostname: {}\n", yaml_str(&vm.name));
    if !vm.spec.ssh_keys.is_empty() {
        user.push_str("ssh_authorized_keys:\n");
        for k in &vm.spec.ssh_keys {
            user.push_str(&format!("  - {}\n", yaml_str(k)));
        }
    }
    user.push_str(&crate::shares::cloud_init_mounts(&vm.shares));
    (meta, user)
}

/// The host's tenant networks that a pass could not set up: every one
/// (the host's own failure) or some segments, by VNI, with why.
#[derive(Debug, Default, Clone)]
pub struct Unconverged {
    all: Option<String>,
    segments: std::collections::BTreeMap<u32, String>,
}

impl Unconverged {
    pub fn all(why: String) -> Unconverged {
        Unconverged {
            all: Some(why),
            segments: Default::default(),
        }
    }

    pub fn segments(failed: std::collections::BTreeMap<u32, String>) -> Unconverged {
        Unconverged {
            all: None,
            segments: failed,
        }
    }

    /// What the server hears: the failed segments by VNI (none when the
    /// whole host failed: that is the host's condition, not a segment's).
    pub fn faults(&self) -> std::collections::BTreeMap<u32, String> {
        self.segments.clone()
    }

    /// Why the VM cannot start here yet: one of its bridged segments (or
    /// all of them) did not converge.
    pub fn holds_back(&self, vm: &DesiredVm) -> Option<String> {
        vm.nics
            .iter()
            .filter(|n| n.kind == SegmentKind::Ethernet)
            .find_map(|n| match (&self.all, self.segments.get(&n.vni)) {
                (Some(e), _) => Some(format!("the host's tenant networks are not set up: {e}")),
                (None, Some(e)) => Some(format!(
                    "segment {} (VNI {}) is not set up on this host: {e}",
                    n.segment, n.vni
                )),
                (None, None) => None,
            })
    }
}

/// The VM's Ethernet NICs as virtio NICs on their segments' bridges.
pub fn bridge_nics(vm: &DesiredVm) -> Vec<BridgeNic> {
    vm.nics
        .iter()
        .filter(|n| n.kind == SegmentKind::Ethernet)
        .map(|n| BridgeNic {
            bridge: vxlan_manager::state::bridge_name(n.vni),
            mac: n.mac.clone(),
            mtu: n.mtu,
        })
        .collect()
}

/// NoCloud `network-config` (version 2): each NIC found by its MAC, with
/// its static address and MTU; the first NIC's gateway is the default route.
/// `None` for a VM without NICs (the image's own default applies).
pub fn network_config(vm: &DesiredVm) -> Option<String> {
    if vm.nics.is_empty() {
        return None;
    }
    let mut out = String::from("version: 2\nethernets:\n");
    for (i, n) in vm.nics.iter().enumerate() {
        out.push_str(&format!(
            "  nic{i}:\n    match:\n      macaddress: {}\n    set-name: nic{i}\n    addresses: [{}]\n    mtu: {}\n",
            yaml_str(&n.mac),
            yaml_str(&n.address),
            n.mtu
        ));
        if i == 0 {
            // The gateway is also the segment's resolver (its edge's DNS).
            out.push_str(&format!(
                "    gateway4: {gw}\n    nameservers:\n      addresses: [{gw}]\n",
                gw = yaml_str(&n.gateway)
            ));
        }
    }
    Some(out)
}

/// The value of `attr="…"` in an XML fragment.
fn attr<'a>(xml: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let start = xml.find(&key)? + key.len();
    let end = xml[start..].find('"')?;
    Some(&xml[start..start + end])
}

fn err(e: virt::error::Error) -> String {
    e.to_string()
}

impl Reconciler {
    pub fn new(
        conn: Connect,
        uri: &str,
        host_id: Uuid,
        topology: HostTopology,
        virt_type: &str,
        state_dir: &Path,
        sysfs_root: &Path,
    ) -> Reconciler {
        let reboots = std::fs::read_to_string(state_dir.join("reboots.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        let fabric_view = Arc::new(Mutex::new(topology.fabric_manager.clone()));
        Reconciler {
            conn: Some(conn),
            uri: uri.to_owned(),
            host_id,
            topology,
            virt_type: virt_type.to_owned(),
            state_dir: state_dir.to_path_buf(),
            sysfs_root: sysfs_root.to_path_buf(),
            unfit: Vec::new(),
            fabric: None,
            fabric_view,
            fabric_active: BTreeSet::new(),
            fabric_told: false,
            reboots,
            noticed: BTreeMap::new(),
            changes: 0,
            reconnects: 0,
            shares: None,
        }
    }

    /// Mounts VMs' project shares from this host's shared filesystem.
    pub fn with_shares(mut self, shares: Option<Arc<Mutex<crate::shares::Shares>>>) -> Reconciler {
        self.shares = shares;
        self
    }

    /// A VM's shares as its domain's filesystems (each share's directory,
    /// or its read-only bind); the first that cannot be mounted says why.
    fn filesystems(
        &self,
        vm: &DesiredVm,
    ) -> Result<Vec<kumo_topology::domain_xml::SharedDir>, String> {
        if vm.shares.is_empty() {
            return Ok(Vec::new());
        }
        let guard = self.shares_now()?;
        crate::shares::filesystems(guard.as_deref(), &vm.shares)
    }

    /// The shares, unless a pass waiting on a hung shared filesystem holds
    /// them: then a VM with shares waits, and the others go on.
    fn shares_now(
        &self,
    ) -> Result<Option<std::sync::MutexGuard<'_, crate::shares::Shares>>, String> {
        match self.shares.as_ref().map(|s| s.try_lock()) {
            None => Ok(None),
            Some(Ok(g)) => Ok(Some(g)),
            Some(Err(std::sync::TryLockError::Poisoned(p))) => Ok(Some(p.into_inner())),
            Some(Err(std::sync::TryLockError::WouldBlock)) => {
                Err("the shared filesystem is busy (the last shares pass still waits on it)".into())
            }
        }
    }

    /// How each of a VM's shares stands: in the running guest as wanted,
    /// waiting for its next start (libvirt cannot add or change a virtiofs
    /// filesystem in a running guest), or failed with why.
    fn mount_conditions(&self, vm: &DesiredVm, dom: Option<&Domain>) -> Vec<MountReport> {
        if vm.shares.is_empty() {
            return Vec::new();
        }
        let live = dom
            .filter(|d| d.is_active().unwrap_or(false))
            .and_then(|d| d.xml_desc(0).ok())
            .map(|x| kumo_topology::domain_xml::filesystems_in(&x));
        let guard = self.shares_now();
        vm.shares
            .iter()
            .map(|m| {
                let source = match &guard {
                    Ok(Some(s)) => s.source(m),
                    Ok(None) => Err("this host has no shared filesystem (--shares-root)".into()),
                    Err(busy) => Err(busy.clone()),
                };
                let condition = match (source, &live) {
                    (Err(why), _) => format!("failed: {why}"),
                    (Ok(_), None) => "at the next start".into(),
                    (Ok(src), Some(live)) => match live.get(&m.tag) {
                        Some(have) if *have == src.display().to_string() => {
                            if m.read_only { "mounted read-only" } else { "mounted" }.into()
                        }
                        Some(_) if m.read_only => "read-only from the next start (libvirt cannot change a running VM's share)".into(),
                        Some(_) => "writable from the next start (libvirt cannot change a running VM's share)".into(),
                        None => "at the next start (libvirt cannot add a share to a running VM)".into(),
                    },
                };
                MountReport {
                    share: m.share,
                    condition,
                }
            })
            .collect()
    }

    /// The libvirt connection, opened again when it died: a dead
    /// `virConnect` (libvirtd restarted, its socket gone) never recovers
    /// by itself, and every later call on it would fail.
    fn connection(&mut self) -> Result<&Connect, String> {
        let dead = self
            .conn
            .as_ref()
            .is_some_and(|c| !c.is_alive().unwrap_or(false));
        if dead {
            tracing::warn!(uri = %self.uri, "libvirt connection lost; opening it again");
            // Dropping the handle closes it.
            self.conn = None;
        }
        if self.conn.is_none() {
            let c = Connect::open(Some(&self.uri))
                .map_err(|e| format!("cannot open libvirt at {}: {e}", self.uri))?;
            self.reconnects += 1;
            tracing::info!(uri = %self.uri, "libvirt connection opened again");
            self.conn = Some(c);
        }
        self.conn
            .as_ref()
            .ok_or_else(|| format!("no libvirt connection to {}", self.uri))
    }

    /// Whether the libvirt connection still answers.
    fn libvirt_alive(&self) -> bool {
        self.conn
            .as_ref()
            .is_some_and(|c| c.is_alive().unwrap_or(false))
    }

    pub fn topology(&self) -> &HostTopology {
        &self.topology
    }

    /// Domains whose metadata says they belong to this host, by VM id.
    pub fn owned(&mut self) -> Result<HashMap<Uuid, Domain>, String> {
        let host_id = self.host_id;
        let mut out = HashMap::new();
        for d in self.connection()?.list_all_domains(0).map_err(err)? {
            let Ok(meta) = d.metadata(METADATA_ELEMENT, Some(METADATA_NS), 0) else {
                continue;
            };
            let host = attr(&meta, "host").and_then(|h| Uuid::try_parse(h).ok());
            let vm = attr(&meta, "id").and_then(|v| Uuid::try_parse(v).ok());
            if let (Some(host), Some(vm)) = (host, vm) {
                if host == host_id {
                    out.insert(vm, d);
                }
            }
        }
        Ok(out)
    }

    fn vm_dir(&self, id: Uuid) -> PathBuf {
        self.state_dir.join("vms").join(id.to_string())
    }

    /// The VM's directory, made if need be, that no other local user can
    /// list: 0711, since QEMU runs as its own user (`libvirt-qemu` under
    /// `qemu:///system`) and must pass through it to the disk and seed,
    /// which are 0600 (libvirt hands them to QEMU's user while it runs).
    fn ensure_vm_dir(&self, id: Uuid) -> Result<PathBuf, String> {
        let dir = self.vm_dir(id);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        set_mode(&dir, 0o711)?;
        Ok(dir)
    }

    /// The VM's disk: a qcow2 overlay on its template, or an empty qcow2.
    /// Made under a temporary name and renamed, so an agent killed halfway
    /// leaves no truncated disk that a later pass would take as made.
    fn ensure_disk(&self, vm: &DesiredVm) -> Result<PathBuf, String> {
        let dir = self.vm_dir(vm.id);
        let disk = dir.join("disk.qcow2");
        if disk.exists() {
            return Ok(disk);
        }
        self.ensure_vm_dir(vm.id)?;
        let partial = dir.join("disk.qcow2.partial");
        let mut cmd = std::process::Command::new("qemu-img");
        cmd.args(["create", "-q", "-f", "qcow2"]);
        if let Some(base) = &vm.spec.image_path {
            cmd.args(["-b", base, "-F", "qcow2"]);
        }
        cmd.arg(&partial).arg(format!("{}G", vm.spec.disk_gib));
        let out = cmd.output().map_err(|e| format!("running qemu-img: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "qemu-img: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        set_mode(&partial, 0o600)?;
        std::fs::rename(&partial, &disk)
            .map_err(|e| format!("renaming {}: {e}", partial.display()))?;
        Ok(disk)
    }

    /// A cloud-init NoCloud seed (an ISO labelled `cidata`) with the VM's
    /// hostname and SSH keys.
    fn ensure_seed(&self, vm: &DesiredVm) -> Result<PathBuf, String> {
        let dir = self.vm_dir(vm.id);
        let seed = dir.join("seed.iso");
        let src = dir.join("cidata");
        let (meta, user) = cloud_init(vm);
        // Made again when its user-data changed (a share mounted since):
        // the next start reads the new one.
        let same = std::fs::read_to_string(src.join("user-data")).is_ok_and(|u| u == user);
        if seed.exists() && same {
            return Ok(seed);
        }
        self.ensure_vm_dir(vm.id)?;
        // The seed's sources (SSH keys among them) are the agent's alone.
        std::fs::create_dir_all(&src).map_err(|e| format!("creating {}: {e}", src.display()))?;
        set_mode(&src, 0o700)?;
        std::fs::write(src.join("meta-data"), meta).map_err(|e| e.to_string())?;
        std::fs::write(src.join("user-data"), user).map_err(|e| e.to_string())?;
        let mut files = vec![src.join("user-data"), src.join("meta-data")];
        if let Some(net) = network_config(vm) {
            std::fs::write(src.join("network-config"), net).map_err(|e| e.to_string())?;
            files.push(src.join("network-config"));
        }
        // As for the disk: whole or not at all.
        let partial = dir.join("seed.iso.partial");
        let out = std::process::Command::new("genisoimage")
            .args(["-quiet", "-volid", "cidata", "-joliet", "-rock", "-output"])
            .arg(&partial)
            .args(&files)
            .output()
            .map_err(|e| format!("running genisoimage: {e}"))?;
        if !out.status.success() {
            let _ = std::fs::remove_file(&partial);
            return Err(format!(
                "genisoimage: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        set_mode(&partial, 0o600)?;
        std::fs::rename(&partial, &seed)
            .map_err(|e| format!("renaming {}: {e}", partial.display()))?;
        Ok(seed)
    }

    pub fn domain_name(vm: &DesiredVm) -> String {
        format!("kumo-{}-{}", vm.name, &vm.id.simple().to_string()[..8])
    }

    fn render(
        &self,
        vm: &DesiredVm,
        disk: &Path,
        seed: &Path,
        ready: &ReadyVolumes,
    ) -> Result<String, String> {
        let layout = guest_layout(&self.topology, &vm.placement).map_err(|e| e.to_string())?;
        layout.bootable().map_err(|e| e.to_string())?;
        let spec = DomainSpec {
            name: Self::domain_name(vm),
            uuid: vm.id.to_string(),
            virt_type: self.virt_type.clone(),
            disk_path: disk.display().to_string(),
            seed_path: Some(seed.display().to_string()),
            hugepages: self.virt_type == "kvm",
            host_id: Some(self.host_id.to_string()),
            kernel: vm.spec.kernel.as_ref().map(|k| KernelBoot {
                kernel: k.kernel.clone(),
                initrd: k.initrd.clone(),
                cmdline: k.cmdline.clone(),
            }),
            interfaces: bridge_nics(vm),
            volumes: volume_disks(vm, ready),
            filesystems: self.filesystems(vm)?,
            console_log: Some(
                crate::console::log_path(&self.vm_dir(vm.id))
                    .display()
                    .to_string(),
            ),
            // Beside the disk, so it goes wherever the VM's directory goes
            // and is removed with it.
            nvram_path: Some(self.vm_dir(vm.id).join(NVRAM_FILE).display().to_string()),
        };
        Ok(domain_xml(&spec, &layout))
    }

    /// The VM's NCCL file, rendered as the API serves it, kept in the guest.
    fn sync_guest(&self, vm: &DesiredVm, dom: &Domain) -> Option<String> {
        let layout = guest_layout(&self.topology, &vm.placement).ok()?;
        let xml = kumo_topology::nccl_xml::nccl_topology_xml(&self.topology, &layout).ok()?;
        let roce = crate::nccl_net::plan(vm, &vxlan_manager::roce::LOSSLESS);
        let events = serde_json::to_string(&vm.events).unwrap_or_else(|_| "[]".into());
        let (outcome, pending) = crate::guest_files::sync(
            dom,
            &xml,
            vm.hostfile.as_deref(),
            vm.members.as_deref(),
            &events,
            roce.as_ref(),
        );
        if outcome == crate::guest_files::Outcome::Written {
            tracing::info!(vm = %vm.id, "wrote the NCCL topology file into the guest");
        }
        Some(match pending {
            Some(p) => format!("{}; {p}", outcome.condition()),
            None => outcome.condition(),
        })
    }

    /// A VM's volume disks brought in line with what it should have: its
    /// definition (redefined when its volume disks differ: that is what
    /// the next boot gets), and, while it runs, the live domain (disks
    /// hot-plugged and unplugged). A driver that cannot hot-plug (libvirt's
    /// test driver) keeps the definition only.
    fn sync_volumes(
        &mut self,
        vm: &DesiredVm,
        dom: &Domain,
        ready: &ReadyVolumes,
    ) -> Result<(), String> {
        let want = volume_disks(vm, ready);
        let serials: Vec<&str> = want.iter().map(|d| d.serial.as_str()).collect();
        let same = |xml: &str| {
            let have = volume_disks_in(xml);
            have.len() == serials.len() && serials.iter().all(|s| have.contains_key(*s))
        };
        let config = dom.xml_desc(XML_INACTIVE).map_err(err)?;
        // Shares change only the definition (the next start): a running
        // guest cannot take a virtiofs filesystem. One that cannot be
        // mounted fails a VM about to start; a running VM keeps running
        // on its definition as it is (its mounts say why).
        let shares_same = match self.filesystems(vm) {
            Ok(want) => {
                let want: BTreeMap<String, String> =
                    want.into_iter().map(|f| (f.tag, f.source)).collect();
                Some(kumo_topology::domain_xml::filesystems_in(&config) == want)
            }
            Err(_) if dom.is_active().map_err(err)? => None,
            Err(why) => return Err(why),
        };
        if shares_same.is_some() && (!same(&config) || shares_same == Some(false)) {
            let disk = self.ensure_disk(vm)?;
            let seed = self.ensure_seed(vm)?;
            let xml = self.render(vm, &disk, &seed, ready)?;
            self.changes += 1;
            self.connection()?.define_domain_xml(&xml).map_err(err)?;
            tracing::info!(vm = %vm.id, volumes = want.len(), "VM definition takes its volumes");
        }
        if !dom.is_active().map_err(err)? {
            return Ok(());
        }
        let live = dom.xml_desc(0).map_err(err)?;
        let have = volume_disks_in(&live);
        for (serial, (_, element)) in &have {
            if !serials.contains(&serial.as_str()) {
                match dom.detach_device_flags(element, AFFECT_LIVE) {
                    Ok(_) => {
                        self.changes += 1;
                        tracing::info!(vm = %vm.id, %serial, "volume unplugged");
                    }
                    Err(e) if unsupported(&e) => {
                        tracing::debug!(vm = %vm.id, %serial, error = %e, "volume not unplugged (it goes at the next boot)")
                    }
                    // Also while an unplug the guest has not completed yet
                    // is in progress: the next pass asks again.
                    Err(e) => {
                        tracing::warn!(vm = %vm.id, %serial, error = %e, "volume not unplugged (it goes at the next boot)")
                    }
                }
            }
        }
        let mut used = targets_in(&live);
        for d in want.iter().filter(|d| !have.contains_key(&d.serial)) {
            let target = (0..)
                .map(volume_target)
                .find(|t| !used.contains(t))
                .unwrap_or_default();
            let element = volume_disk(d, &target).render();
            match dom.attach_device_flags(&element, AFFECT_LIVE) {
                Ok(_) => {
                    self.changes += 1;
                    used.insert(target);
                    tracing::info!(vm = %vm.id, serial = %d.serial, "volume hot-plugged");
                }
                Err(e) if unsupported(&e) => {
                    tracing::debug!(vm = %vm.id, serial = %d.serial, error = %e, "volume not hot-plugged (it comes at the next boot)")
                }
                Err(e) => {
                    tracing::warn!(vm = %vm.id, serial = %d.serial, error = %e, "volume not hot-plugged (it comes at the next boot)")
                }
            }
        }
        Ok(())
    }

    fn ensure(
        &mut self,
        vm: &DesiredVm,
        existing: Option<Domain>,
        ready: &ReadyVolumes,
    ) -> Result<(ActualState, Option<String>), String> {
        let dom = match existing {
            Some(d) => d,
            None => {
                let disk = self.ensure_disk(vm)?;
                let seed = self.ensure_seed(vm)?;
                let xml = self.render(vm, &disk, &seed, ready)?;
                self.changes += 1;
                self.connection()?.define_domain_xml(&xml).map_err(err)?
            }
        };
        self.sync_volumes(vm, &dom, ready)?;
        let active = dom.is_active().map_err(err)?;
        match vm.power {
            // A VM being reclaimed that shut down on its notice stays down.
            Power::Running if !active && vm.preemption.is_none() => {
                self.activate_partition(vm)?;
                self.changes += 1;
                // Restores a managed-save image when there is one.
                dom.create().map_err(err)?;
            }
            Power::Stopped if active => {
                self.changes += 1;
                dom.destroy().map_err(err)?;
            }
            Power::Suspended if active => {
                self.changes += 1;
                dom.managed_save(0).map_err(err)?;
            }
            _ => {}
        }
        let applied = self.reboots.get(&vm.id).copied().unwrap_or(0);
        if vm.power_generation > applied {
            if vm.power == Power::Running && active {
                // Through the guest agent when it answers (a clean reboot the
                // guest cannot ignore); otherwise libvirt's default (ACPI).
                let agent_up = crate::guest_files::GuestAgent::command(
                    &dom,
                    &serde_json::json!({"execute": "guest-ping"}),
                    2,
                )
                .is_ok();
                let flags = if agent_up {
                    VIR_DOMAIN_REBOOT_GUEST_AGENT
                } else {
                    0
                };
                if let Err(e) = dom.reboot(flags) {
                    // Not recorded as done: the next pass tries again.
                    tracing::warn!(vm = %vm.id, error = %e, "reboot failed; will retry");
                    return Ok((ActualState::Running, None));
                }
                self.changes += 1;
            }
            self.reboots.insert(vm.id, vm.power_generation);
        }
        if dom.is_active().map_err(err)? {
            Ok((ActualState::Running, self.sync_guest(vm, &dom)))
        } else if dom.has_managed_save(0).unwrap_or(false) {
            Ok((ActualState::Suspended, None))
        } else {
            Ok((ActualState::Stopped, None))
        }
    }

    /// Once per VM and deadline: the notice into the guest and, for GPU
    /// VMs, an ACPI shutdown request. Returns what to report, once.
    fn preempt(&mut self, vm: &DesiredVm, dom: &Domain) -> Option<String> {
        let notice = vm.preemption.as_ref()?;
        if self.noticed.get(&vm.id) == Some(&notice.deadline) {
            return None;
        }
        self.noticed.insert(vm.id, notice.deadline);
        if !dom.is_active().unwrap_or(false) {
            return Some("notice not delivered: the VM is not running".into());
        }
        let json = serde_json::to_string(notice).unwrap_or_default();
        let mut said = crate::guest_files::notify_preemption(dom, &json);
        if notice.action == "shutdown" {
            self.changes += 1;
            match dom.shutdown() {
                Ok(()) => said.push_str("; ACPI shutdown requested"),
                Err(e) => said.push_str(&format!("; ACPI shutdown request failed: {e}")),
            }
        }
        tracing::info!(vm = %vm.id, outcome = %said, "preemption notice");
        Some(said)
    }

    /// Talks to this Fabric Manager from now on.
    pub fn with_fabric_manager(mut self, fm: crate::fabric_manager::Fmpm) -> Reconciler {
        self.fabric = Some(fm);
        self
    }

    /// The GPU sets of this host's running domains (from their XML, so a
    /// VM the server no longer lists still counts while it runs).
    fn running_gpu_sets(&mut self) -> Result<Vec<Vec<Bdf>>, String> {
        let gpus: BTreeSet<Bdf> = self.topology.gpus.iter().map(|g| g.location.bdf).collect();
        let mut out = Vec::new();
        for dom in self.owned()?.values() {
            if dom.is_active().unwrap_or(false) {
                let xml = dom.xml_desc(0).map_err(err)?;
                let set: Vec<Bdf> = kumo_topology::domain_xml::passed_through(&xml)
                    .into_iter()
                    .filter(|b| gpus.contains(b))
                    .collect();
                if !set.is_empty() {
                    out.push(set);
                }
            }
        }
        Ok(out)
    }

    /// The partitions as last listed (or as at start).
    fn known_partitions(&self) -> Option<Vec<kumo_topology::Partition>> {
        let view = self
            .fabric_view
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        [view, self.topology.fabric_manager.clone()]
            .into_iter()
            .find_map(|v| match v {
                Some(FabricManager::Partitions(ps)) => Some(ps),
                _ => None,
            })
    }

    /// Brings Fabric Manager in line with the running domains: after this
    /// agent or Fabric Manager (re)started it re-sets the activated list
    /// to the partitions the running VMs hold, and it deactivates every
    /// active partition no running VM holds (and whose GPUs none uses).
    /// Fabric Manager not answering is recorded (the server then places
    /// 1-GPU VMs only) and retried on the next pass.
    fn converge_fabric(&mut self) {
        let Some(fm) = self.fabric.clone() else {
            return;
        };
        let sets = match self.running_gpu_sets() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the running domains; Fabric Manager left as it is");
                return;
            }
        };
        let running: BTreeSet<Bdf> = sets.iter().flatten().copied().collect();
        // Each running VM's own partition (disjoint, since they run); a VM
        // whose GPUs are none (placed before partitions were known) holds
        // none and is left to run without NVLink.
        let held: Option<Vec<u32>> = match self.known_partitions() {
            Some(ps) => Some(
                sets.iter()
                    .filter_map(|s| kumo_topology::partitions::partition_of(&ps, s).map(|p| p.id))
                    .collect(),
            ),
            // Single GPUs started while it did not answer hold none.
            None if sets.iter().all(|s| s.len() == 1) => Some(Vec::new()),
            None => None,
        };
        let tell = |why: &str| -> Result<(), crate::fabric_manager::FmError> {
            let held = held.clone().ok_or_else(|| crate::fabric_manager::FmError {
                status: None,
                message:
                    "the running VMs' partitions are unknown (Fabric Manager never listed them)"
                        .into(),
            })?;
            fm.set_activated(&held)?;
            tracing::info!(partitions = ?held, %why, "told Fabric Manager the activated partitions");
            Ok(())
        };
        if !self.fabric_told {
            // This agent (re)started: the list as it knows it. A Fabric
            // Manager that is not waiting for one may refuse it; its own
            // list then stands and is brought in line below.
            match tell("the agent started") {
                Ok(()) => self.fabric_told = true,
                Err(e) => tracing::debug!(error = %e, "Fabric Manager took no activated list"),
            }
        }
        let mut listed = fm.list();
        if matches!(&listed, Err(e) if e.status == Some(-8)) {
            // Fabric Manager restarted: it takes nothing before the list.
            listed = tell("Fabric Manager restarted").and_then(|()| fm.list());
        }
        if listed.is_ok() {
            self.fabric_told = true;
        }
        let view = match listed {
            Ok(list) => {
                self.fabric_active = list
                    .iter()
                    .filter(|(_, on)| *on)
                    .map(|(p, _)| p.id)
                    .collect();
                for (p, _) in list.iter().filter(|(_, on)| *on) {
                    let held = sets
                        .iter()
                        .any(|s| s.len() == p.gpus.len() && p.gpus.iter().all(|g| s.contains(g)));
                    if held || p.gpus.iter().any(|g| running.contains(g)) {
                        continue;
                    }
                    match fm.deactivate(p.id) {
                        Ok(()) => {
                            self.changes += 1;
                            self.fabric_active.remove(&p.id);
                            tracing::info!(partition = p.id, "NVSwitch partition deactivated");
                        }
                        Err(e) => {
                            tracing::warn!(partition = p.id, error = %e, "could not deactivate an NVSwitch partition")
                        }
                    }
                }
                let view = FabricManager::Partitions(list.into_iter().map(|(p, _)| p).collect());
                // What the NCCL files are rendered from (kept over a spell
                // in which Fabric Manager does not answer: what was
                // activated stays so).
                self.topology.fabric_manager = Some(view.clone());
                view
            }
            Err(e) => {
                tracing::warn!(error = %e, "Fabric Manager does not answer");
                FabricManager::Unreachable(format!("Fabric Manager does not answer: {e}"))
            }
        };
        *self.fabric_view.lock().unwrap_or_else(|e| e.into_inner()) = Some(view);
    }

    /// Activates the NVSwitch partition that is exactly the VM's GPUs
    /// before it starts. A VM whose GPUs are no partition, or whose
    /// activation Fabric Manager refuses, fails alone with the reason.
    fn activate_partition(&mut self, vm: &DesiredVm) -> Result<(), String> {
        let Some(fm) = self.fabric.clone() else {
            return Ok(());
        };
        let gpus = &vm.placement.gpus;
        if gpus.is_empty() {
            return Ok(());
        }
        let view = self
            .fabric_view
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        // Made from the topology's at start, then only ever replaced.
        let partitions = match view {
            None => return Ok(()),
            Some(FabricManager::Unreachable(why)) if gpus.len() > 1 => {
                return Err(format!("no NVLink partition can be activated: {why}"))
            }
            Some(FabricManager::Unreachable(_)) => return Ok(()),
            Some(FabricManager::Partitions(ps)) => ps,
        };
        let Some(p) = kumo_topology::partitions::partition_of(&partitions, gpus) else {
            return Err(format!(
                "its GPUs ({}) are no NVSwitch partition Fabric Manager supports",
                gpus.iter()
                    .map(Bdf::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        };
        if self.fabric_active.contains(&p.id) {
            return Ok(());
        }
        fm.activate(p.id).map_err(|e| {
            format!(
                "Fabric Manager did not activate NVSwitch partition {}: {e}",
                p.id
            )
        })?;
        self.changes += 1;
        self.fabric_active.insert(p.id);
        tracing::info!(vm = %vm.id, partition = p.id, "NVSwitch partition activated");
        Ok(())
    }

    /// Shuts a domain down and undefines it; its files stay. The devices
    /// it passed through are checked once it let them go: one that fails
    /// goes to [`Reconciler::unfit`] (and from there into quarantine)
    /// instead of back to the pool.
    fn undefine(&mut self, id: Uuid, dom: &Domain) -> Result<(), String> {
        let released = dom
            .xml_desc(XML_INACTIVE)
            .map(|x| kumo_topology::domain_xml::passed_through(&x))
            .unwrap_or_default();
        let fatal_before: Vec<Option<u64>> = released
            .iter()
            .map(|b| kumo_topology::health::fatal_aer(&self.sysfs_root, &b.to_string()))
            .collect();
        if dom.is_active().map_err(err)? {
            self.changes += 1;
            dom.destroy().map_err(err)?;
        }
        self.changes += 1;
        // A UEFI domain's variable store is the VM's own file, removed
        // with its directory: libvirt refuses to undefine such a domain
        // without a word on it. Its test driver knows no such word, and
        // has no variable store to keep: plain undefine there.
        dom.undefine_flags(virt::sys::VIR_DOMAIN_UNDEFINE_KEEP_NVRAM)
            .or_else(|_| dom.undefine())
            .map_err(err)?;
        for (bdf, before) in released.iter().zip(fatal_before) {
            let host_driver = self.topology.pci(*bdf).and_then(|d| d.driver.as_deref());
            let bdf = bdf.to_string();
            match kumo_topology::health::release_check(&self.sysfs_root, &bdf, host_driver, before)
            {
                Ok(()) => tracing::debug!(vm = %id, %bdf, "released device checked"),
                Err(problem) => {
                    tracing::warn!(vm = %id, %bdf, %problem, "a released device did not come back after reset");
                    self.unfit.push(UnfitDevice {
                        vm: id,
                        bdf,
                        problem,
                    });
                }
            }
        }
        Ok(())
    }

    /// A VM's files (root disk, seed), once it has no domain.
    fn remove_files(&mut self, id: Uuid) -> Result<(), String> {
        let dir = self.vm_dir(id);
        if dir.exists() {
            self.changes += 1;
            std::fs::remove_dir_all(&dir)
                .map_err(|e| format!("removing {}: {e}", dir.display()))?;
        }
        self.reboots.remove(&id);
        Ok(())
    }

    fn remove(&mut self, id: Uuid, dom: &Domain) -> Result<(), String> {
        self.undefine(id, dom)?;
        self.remove_files(id)
    }

    /// One pass. Returns what to report; a VM that failed is reported
    /// `failed` with the reason and the pass goes on with the others. A VM
    /// not yet defined on a segment that did not converge waits, reported
    /// `failed` with the segment's reason.
    pub fn reconcile(
        &mut self,
        desired: &DesiredState,
        unconverged: &Unconverged,
        ready: &ReadyVolumes,
    ) -> Result<Vec<VmStatus>, String> {
        let mut owned = self.owned()?;
        let mut report = Vec::new();
        // Shelved: no domain, the files kept for when it comes back.
        for id in &desired.shelve {
            let gone = match owned.remove(id) {
                Some(dom) => self.undefine(*id, &dom),
                None => Ok(()),
            };
            report.push(match gone {
                Ok(()) => absent(*id),
                Err(reason) => {
                    tracing::warn!(vm = %id, %reason, "could not shelve a VM");
                    VmStatus {
                        id: *id,
                        state: ActualState::Failed,
                        reason: Some(reason),
                        guest: None,
                        notice: None,
                        mounts: Vec::new(),
                    }
                }
            });
        }
        // Ours, but not wanted (being deleted, or unknown to the server):
        // gone before any VM starts, so that the devices and NVSwitch
        // partitions they free are free for VMs placed on them.
        let wanted: std::collections::HashSet<Uuid> = desired.vms.iter().map(|v| v.id).collect();
        let unwanted: Vec<Uuid> = owned
            .keys()
            .filter(|id| !wanted.contains(id))
            .copied()
            .collect();
        for id in unwanted {
            let Some(dom) = owned.remove(&id) else {
                continue;
            };
            if let Err(reason) = self.remove(id, &dom) {
                tracing::warn!(vm = %id, %reason, "could not remove a domain");
                continue;
            }
            report.push(absent(id));
        }
        self.converge_fabric();
        for vm in &desired.vms {
            let dom = owned.remove(&vm.id);
            let notice = match (&dom, &vm.preemption) {
                (Some(d), Some(_)) => self.preempt(vm, d),
                _ => None,
            };
            // A VM not yet defined on a segment that did not converge
            // waits, failed with the segment's reason.
            let ensured = match (&dom, unconverged.holds_back(vm)) {
                (None, Some(reason)) => Err(reason),
                _ => self.ensure(vm, dom, ready),
            };
            let mounts = if vm.shares.is_empty() {
                Vec::new()
            } else {
                let dom = self
                    .connection()
                    .ok()
                    .and_then(|c| c.lookup_domain_by_name(&Self::domain_name(vm)).ok());
                self.mount_conditions(vm, dom.as_ref())
            };
            let status = match ensured {
                Ok((state, guest)) => VmStatus {
                    id: vm.id,
                    state,
                    reason: None,
                    guest,
                    notice,
                    mounts,
                },
                // The connection died under the pass (libvirtd restarted,
                // its socket cut): libvirt's failure, not the VM's. The
                // pass ends unreported, as it does when libvirt cannot be
                // opened at all, and the next one retries.
                Err(reason) if !self.libvirt_alive() => {
                    return Err(format!("libvirt connection lost: {reason}"));
                }
                Err(reason) => {
                    tracing::warn!(vm = %vm.id, %reason, "could not bring the VM to its desired state");
                    VmStatus {
                        id: vm.id,
                        state: ActualState::Failed,
                        reason: Some(reason),
                        guest: None,
                        notice: None,
                        mounts,
                    }
                }
            };
            report.push(status.bounded());
        }
        for id in &desired.remove {
            if !report.iter().any(|s| s.id == *id) {
                // A shelved VM being deleted has files but no domain.
                if let Err(reason) = self.remove_files(*id) {
                    tracing::warn!(vm = %id, %reason, "could not remove a VM's files");
                    continue;
                }
                report.push(absent(*id));
            }
        }
        // Stopped and removed VMs' partitions go now.
        self.converge_fabric();
        let reboots = serde_json::to_string(&self.reboots).unwrap_or_default();
        if let Err(e) = std::fs::write(self.state_dir.join("reboots.json"), reboots) {
            tracing::warn!(error = %e, "could not record applied reboots");
        }
        Ok(report)
    }
}

/// What a VM without a domain here is reported as.
fn absent(id: Uuid) -> VmStatus {
    VmStatus {
        id,
        state: ActualState::Absent,
        reason: None,
        guest: None,
        notice: None,
        mounts: Vec::new(),
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("setting the mode of {}: {e}", path.display()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn vm() -> DesiredVm {
        use kumo_api_types::{ServiceLevel, VmSpec};
        DesiredVm {
            id: Uuid::nil(),
            name: "train".into(),
            power: Power::Running,
            power_generation: 0,
            spec: VmSpec {
                gpus: 0,
                gpu_model: None,
                vcpus: 1,
                memory_gib: 1,
                disk_gib: 1,
                template: None,
                image_path: None,
                kernel: None,
                service_level: ServiceLevel::Guaranteed,
                ssh_keys: vec![r#"ssh-ed25519 AAAA "quoted" \ user"#.into()],
                on_reclaim: Default::default(),
                on_host_loss: Default::default(),
                notice_seconds: None,
                reservation: None,
            },
            preemption: None,
            events: Vec::new(),
            hostfile: None,
            members: None,
            placement: kumo_topology::guest_layout::Placement {
                gpus: vec![],
                nics: vec![],
                cpus: Default::default(),
                memory_mib: Default::default(),
            },
            nics: vec![],
            volumes: vec![],
            shares: vec![],
        }
    }

    #[test]
    fn cloud_init_carries_hostname_and_quoted_keys() {
        let vm = vm();
        assert_eq!(network_config(&vm), None);
        let (meta, user) = cloud_init(&vm);
        assert_eq!(
            meta,
            "instance-id: 00000000-0000-0000-0000-000000000000\nlocal-hostname: \"train\"\n"
        );
        assert!(user.starts_with("#cloud-config\nhostname: \"train\"\n"));
        assert!(
            user.contains(r#"  - "ssh-ed25519 AAAA \"quoted\" \\ user""#),
            "{user}"
        );
    }

    #[test]
    fn nics_become_bridge_ports_and_static_addresses() {
        let nic = |segment: &str, kind, vni, n: u8| kumo_api_types::DesiredNic {
            segment: segment.into(),
            kind,
            vni,
            mac: format!("02:6b:00:00:00:{n:02x}"),
            address: format!("10.{n}.0.5/24"),
            gateway: format!("10.{n}.0.1"),
            mtu: 8950,
            vlan: None,
            vf: None,
        };
        let mut vm = vm();
        vm.nics = vec![
            nic("data", SegmentKind::Ethernet, 4096, 1),
            nic("rdma", SegmentKind::Roce, 4097, 2),
            nic("mgmt", SegmentKind::Ethernet, 5000, 3),
        ];
        let bridges: Vec<(String, String)> = bridge_nics(&vm)
            .into_iter()
            .map(|b| (b.bridge, b.mac))
            .collect();
        assert_eq!(
            bridges,
            [
                ("kbr4096".to_owned(), "02:6b:00:00:00:01".to_owned()),
                ("kbr5000".to_owned(), "02:6b:00:00:00:03".to_owned()),
            ]
        );
        let net = network_config(&vm).unwrap_or_default();
        assert!(
            net.starts_with("version: 2\nethernets:\n  nic0:\n"),
            "{net}"
        );
        assert!(net.contains("macaddress: \"02:6b:00:00:00:03\""), "{net}");
        assert!(net.contains("addresses: [\"10.3.0.5/24\"]"), "{net}");
        assert_eq!(net.matches("gateway4").count(), 1, "one default route");
        assert!(net.contains("gateway4: \"10.1.0.1\""), "{net}");
        assert!(
            net.contains("nameservers:\n      addresses: [\"10.1.0.1\"]"),
            "{net}"
        );
    }

    #[test]
    fn attributes_are_read_from_metadata() {
        let m =
            r#"<vm xmlns="https://kumo.example/xmlns/domain/1" id="0190-x" host="abc" cells="2"/>"#;
        assert_eq!(attr(m, "id"), Some("0190-x"));
        assert_eq!(attr(m, "host"), Some("abc"));
        assert_eq!(attr(m, "nope"), None);
    }
}
