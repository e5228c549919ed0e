//! libvirt domain XML for a guest layout: q35, one `pcie-expander-bus`
//! per host switch group on its guest NUMA cell, a `pcie-root-port` per
//! device, managed `hostdev`s (whole IOMMU groups), pinned vCPUs, strict
//! per-cell hugepage memory, a guest-agent channel, a virtio disk and a
//! cloud-init seed slot.

use crate::fixtures::cpumap;
use crate::guest_layout::{Firmware, GuestLayout};
use crate::sysfs::format_cpulist;
use crate::xml::{el, Element};
use crate::Bdf;

/// What the domain needs besides the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainSpec {
    pub name: String,
    pub uuid: String,
    /// `kvm` in production; `qemu` (TCG) where KVM is unavailable.
    pub virt_type: String,
    pub disk_path: String,
    /// A NoCloud seed image (label `cidata`), attached read-only.
    pub seed_path: Option<String>,
    /// Back memory with hugepages (needs them reserved on the host).
    pub hugepages: bool,
    /// The owning host, recorded in the domain's metadata: an agent manages
    /// only domains of its own host.
    pub host_id: Option<String>,
    /// Boot a kernel directly instead of from the disk.
    pub kernel: Option<KernelBoot>,
    /// Virtio NICs on host bridges (tenant Ethernet segments), in order.
    pub interfaces: Vec<BridgeNic>,
    /// Volumes as virtio disks after the root disk, in order.
    pub volumes: Vec<VolumeDisk>,
    /// Host directories shared into the guest with virtiofs (project
    /// shares); any makes the guest's memory shared with `virtiofsd`.
    pub filesystems: Vec<SharedDir>,
    /// A file the serial console's output is also written to (the
    /// console's scrollback; libvirt hands it to virtlogd, which rotates
    /// it).
    pub console_log: Option<String>,
    /// A UEFI guest's variable store, kept beside its disk (libvirt makes
    /// it from [`OVMF_VARS`] on first start); libvirt's own directory
    /// when `None`.
    pub nvram_path: Option<String>,
}

/// Debian's `ovmf`: the 4 MiB firmware and its empty variable store.
pub const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
pub const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";
/// QEMU's root ports ask the firmware to reserve no I/O space.
pub const ROOT_PORT_NO_IO: &str = "pcie-root-port.io-reserve=0";
/// libvirt's namespace for QEMU command-line additions.
pub const QEMU_NS: &str = "http://libvirt.org/schemas/domain/qemu/1.0";
/// The fw_cfg file OVMF reads its 64-bit aperture size from, in MiB.
pub const OVMF_MMIO64_FW_CFG: &str = "opt/ovmf/X-PciMmio64Mb";

/// A host directory as a guest filesystem (virtiofs; libvirt finds
/// `virtiofsd` through QEMU's vhost-user descriptors): the guest mounts
/// `tag`; `source` is all it sees. Read-only is the source's business
/// (a read-only bind mount): Debian 12's virtiofsd has no such mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedDir {
    pub source: String,
    pub tag: String,
}

/// One shared directory's `<filesystem>` element.
pub fn shared_dir(d: &SharedDir) -> Element {
    el("filesystem")
        .attr("type", "mount")
        .attr("accessmode", "passthrough")
        .child(el("driver").attr("type", "virtiofs").attr("queue", 1024))
        .child(el("source").attr("dir", &d.source))
        .child(el("target").attr("dir", &d.tag))
}

/// A volume as a guest disk, found in the guest by its serial
/// (`/dev/disk/by-id/virtio-<serial>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeDisk {
    pub source: DiskSource,
    pub serial: String,
}

/// Where a volume's data is on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskSource {
    /// An image file (`qcow2`).
    File { path: String, format: String },
    /// A block device, raw (an LVM logical volume).
    Block { path: String },
}

/// PCIe root ports left empty for hot-plugged volumes (q35 plugs a device
/// only into a free port, and QEMU cannot add ports to a running guest).
pub const SPARE_PORTS: usize = 8;

/// The root ports to render without addresses: libvirt puts every device
/// it addresses itself on the first free root port, so as many ports as
/// those devices, plus [`SPARE_PORTS`] that stay empty. The devices: the
/// root disk, each volume disk and each NIC (virtio), the virtio-serial
/// controller of the guest-agent channel, and the USB controller libvirt
/// adds to every q35 domain (`qemu-xhci`). The seed's SATA cdrom is on
/// the chipset's AHCI, hostdevs on their own numbered ports.
///
/// Each of these ports takes a bus number below the first expander's
/// `busNr` (the root bus's hierarchy must end before it): with
/// expanders, fewer spares where they would not fit.
pub fn unnumbered_ports(spec: &DomainSpec, layout: &GuestLayout) -> usize {
    let virtio = 1 + spec.volumes.len() + spec.interfaces.len() + spec.filesystems.len();
    let controllers = 2;
    let want = virtio + controllers + SPARE_PORTS;
    match layout.expanders.iter().map(|e| usize::from(e.bus_nr)).min() {
        Some(first) => want.min(first.saturating_sub(1).max(virtio + controllers)),
        None => want,
    }
}

/// The guest target of the `i`-th volume: `vdb`, `vdc`, … (`vda` is the
/// root disk). Only a hint to libvirt; guests find volumes by serial.
pub fn volume_target(i: usize) -> String {
    let mut n = i + 1;
    let mut name = String::new();
    loop {
        name.insert(0, char::from(b'a' + (n % 26) as u8));
        n /= 26;
        if n == 0 {
            break;
        }
        n -= 1;
    }
    format!("vd{name}")
}

/// One volume's `<disk>` element, for a domain's XML or a hot-plug.
pub fn volume_disk(d: &VolumeDisk, target: &str) -> Element {
    let (kind, format, source) = match &d.source {
        DiskSource::File { path, format } => {
            ("file", format.as_str(), el("source").attr("file", path))
        }
        DiskSource::Block { path } => ("block", "raw", el("source").attr("dev", path)),
    };
    el("disk")
        .attr("type", kind)
        .attr("device", "disk")
        .child(
            el("driver")
                .attr("name", "qemu")
                .attr("type", format)
                .attr("cache", "none")
                .attr("io", "native"),
        )
        .child(source)
        .child(el("target").attr("dev", target).attr("bus", "virtio"))
        .child(el("serial").text(&d.serial))
}

/// A virtio NIC on a host bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeNic {
    pub bridge: String,
    pub mac: String,
    pub mtu: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelBoot {
    pub kernel: String,
    pub initrd: Option<String>,
    pub cmdline: String,
}

pub const GUEST_AGENT_CHANNEL: &str = "org.qemu.guest_agent.0";
pub const METADATA_NS: &str = "https://kumo.example/xmlns/domain/1";

fn pci_address(bdf: Bdf) -> Element {
    el("address")
        .attr("domain", format!("0x{:04x}", bdf.domain))
        .attr("bus", format!("0x{:02x}", bdf.bus))
        .attr("slot", format!("0x{:02x}", bdf.device))
        .attr("function", format!("0x{:x}", bdf.function))
}

fn guest_address(bus_index: u32, slot: u8, function: u8) -> Element {
    el("address")
        .attr("type", "pci")
        .attr("domain", "0x0000")
        .attr("bus", format!("0x{bus_index:02x}"))
        .attr("slot", format!("0x{slot:02x}"))
        .attr("function", format!("0x{function:x}"))
}

pub fn domain_xml(spec: &DomainSpec, layout: &GuestLayout) -> String {
    let vcpus: usize = layout.cells.iter().map(|c| c.vcpus.len()).sum();
    let memory_mib: u64 = layout.cells.iter().map(|c| c.memory_mib).sum();
    let host_nodes: Vec<u32> = layout.cells.iter().map(|c| c.host_node).collect();

    let mut devices = el("devices").child(
        el("disk")
            .attr("type", "file")
            .attr("device", "disk")
            .child(el("driver").attr("name", "qemu").attr("type", "qcow2"))
            .child(el("source").attr("file", &spec.disk_path))
            .child(el("target").attr("dev", "vda").attr("bus", "virtio")),
    );
    for (i, v) in spec.volumes.iter().enumerate() {
        devices = devices.child(volume_disk(v, &volume_target(i)));
    }
    if let Some(seed) = &spec.seed_path {
        devices = devices.child(
            el("disk")
                .attr("type", "file")
                .attr("device", "cdrom")
                .child(el("driver").attr("name", "qemu").attr("type", "raw"))
                .child(el("source").attr("file", seed))
                .child(el("target").attr("dev", "sda").attr("bus", "sata"))
                .child(el("readonly")),
        );
    }
    for fs in &spec.filesystems {
        devices = devices.child(shared_dir(fs));
    }
    for nic in &spec.interfaces {
        devices = devices.child(
            el("interface")
                .attr("type", "bridge")
                .child(el("mac").attr("address", &nic.mac))
                .child(el("source").attr("bridge", &nic.bridge))
                .child(el("model").attr("type", "virtio"))
                .child(el("mtu").attr("size", nic.mtu)),
        );
    }
    devices = devices.child(
        el("controller")
            .attr("type", "pci")
            .attr("index", 0)
            .attr("model", "pcie-root"),
    );
    for e in &layout.expanders {
        devices = devices.child(
            el("controller")
                .attr("type", "pci")
                .attr("index", e.index)
                .attr("model", "pcie-expander-bus")
                .child(
                    el("target")
                        .attr("busNr", e.bus_nr)
                        .child(el("node").text(e.guest_node)),
                ),
        );
    }
    for e in &layout.expanders {
        for p in &e.ports {
            devices = devices.child(
                el("controller")
                    .attr("type", "pci")
                    .attr("index", p.index)
                    .attr("model", "pcie-root-port")
                    .child(
                        el("target")
                            .attr("chassis", p.index)
                            .attr("port", format!("0x{:x}", p.slot)),
                    )
                    .child(guest_address(e.index, p.slot, 0)),
            );
        }
    }
    // After every numbered controller: libvirt numbers these after them.
    for _ in 0..unnumbered_ports(spec, layout) {
        devices = devices.child(
            el("controller")
                .attr("type", "pci")
                .attr("model", "pcie-root-port"),
        );
    }
    for e in &layout.expanders {
        for p in &e.ports {
            let d = &p.device;
            // The device at its guest function (0 for a VF), the rest of
            // its IOMMU group at their own.
            let functions = std::iter::once((d.host_bdf, d.guest_bdf.function))
                .chain(d.group_peers.iter().map(|b| (*b, b.function)));
            for (host, function) in functions {
                devices = devices.child(
                    el("hostdev")
                        .attr("mode", "subsystem")
                        .attr("type", "pci")
                        .attr("managed", "yes")
                        .child(el("source").child(pci_address(host)))
                        .child(guest_address(p.index, 0, function)),
                );
            }
        }
    }
    devices = devices
        .child(
            el("channel").attr("type", "unix").child(
                el("target")
                    .attr("type", "virtio")
                    .attr("name", GUEST_AGENT_CHANNEL),
            ),
        )
        .child(match &spec.console_log {
            Some(log) => el("serial")
                .attr("type", "pty")
                .child(el("log").attr("file", log).attr("append", "on")),
            None => el("serial").attr("type", "pty"),
        })
        .child(el("console").attr("type", "pty"))
        // A balloon cannot reclaim memory pinned for VFIO DMA.
        .child(el("memballoon").attr("model", "none"));

    let mut domain = el("domain")
        .attr("type", &spec.virt_type)
        .child(el("name").text(&spec.name))
        .child(el("uuid").text(&spec.uuid))
        .child(
            el("metadata").child(
                el("kumo:vm")
                    .attr("xmlns:kumo", METADATA_NS)
                    .attr("id", &spec.uuid)
                    .opt_attr("host", spec.host_id.as_deref())
                    .attr("expanders", layout.expanders.len())
                    .attr("cells", layout.cells.len()),
            ),
        )
        .child(el("memory").attr("unit", "MiB").text(memory_mib));
    // virtiofsd reads and writes the guest's memory: it must be shared
    // (memfd where there are no hugepages).
    let shared = !spec.filesystems.is_empty();
    match (spec.hugepages, shared) {
        (true, false) => domain = domain.child(el("memoryBacking").child(el("hugepages"))),
        (true, true) => {
            domain = domain.child(
                el("memoryBacking")
                    .child(el("hugepages"))
                    .child(el("access").attr("mode", "shared")),
            )
        }
        (false, true) => {
            domain = domain.child(
                el("memoryBacking")
                    .child(el("source").attr("type", "memfd"))
                    .child(el("access").attr("mode", "shared")),
            )
        }
        (false, false) => {}
    }
    domain = domain
        .child(el("vcpu").attr("placement", "static").text(vcpus))
        .child(
            el("cputune").children(
                layout
                    .vcpu_pins
                    .iter()
                    .map(|(v, h)| el("vcpupin").attr("vcpu", v).attr("cpuset", h)),
            ),
        );
    if !host_nodes.is_empty() {
        domain = domain.child(
            el("numatune")
                .child(
                    el("memory")
                        .attr("mode", "strict")
                        .attr("nodeset", format_cpulist(&host_nodes)),
                )
                .children(layout.cells.iter().map(|c| {
                    el("memnode")
                        .attr("cellid", c.id)
                        .attr("mode", "strict")
                        .attr("nodeset", c.host_node)
                })),
        );
    }
    let space = &layout.address_space;
    let efi = space.firmware == Firmware::Efi;
    let mut os = el("os").child(
        el("type")
            .attr("arch", "x86_64")
            .attr("machine", "q35")
            .text("hvm"),
    );
    if efi {
        os = os.child(
            el("loader")
                .attr("readonly", "yes")
                .attr("type", "pflash")
                .text(OVMF_CODE),
        );
        os = os.child(match &spec.nvram_path {
            Some(path) => el("nvram").attr("template", OVMF_VARS).text(path),
            None => el("nvram").attr("template", OVMF_VARS),
        });
    }
    os = match &spec.kernel {
        Some(k) => {
            os = os.child(el("kernel").text(&k.kernel));
            if let Some(initrd) = &k.initrd {
                os = os.child(el("initrd").text(initrd));
            }
            os.child(el("cmdline").text(&k.cmdline))
        }
        None => os.child(el("boot").attr("dev", "hd")),
    };
    // TCG has no host CPU to pass through: QEMU's default model, or for a
    // UEFI guest its `max` model, whose 1 GiB pages OVMF needs to map a
    // large address space in reasonable time (qemu64 took minutes).
    let mut cpu = el("cpu");
    if spec.virt_type == "kvm" {
        cpu = cpu.attr("mode", "host-passthrough");
    } else if efi {
        cpu = cpu.attr("mode", "maximum");
    }
    if let (true, Some(bits)) = (efi, space.phys_bits) {
        cpu = cpu.child(el("maxphysaddr").attr("mode", "emulate").attr("bits", bits));
    }
    domain = domain
        .child(os)
        .child(el("features").child(el("acpi")).child(el("apic")))
        .child(cpu.child(el("numa").children(layout.cells.iter().map(|c| {
            el("cell")
                .attr("id", c.id)
                .attr("cpus", format_cpulist(&c.vcpus))
                .attr("memory", c.memory_mib)
                .attr("unit", "MiB")
        }))))
        .child(el("clock").attr("offset", "utc"))
        .child(el("on_poweroff").text("destroy"))
        .child(el("on_reboot").text("restart"))
        .child(el("on_crash").text("destroy"))
        .child(devices);
    // libvirt reserves `opt/ovmf/` names in `<sysinfo type='fwcfg'>`, so
    // the aperture goes on QEMU's command line (which libvirt marks as a
    // custom argument: the domain reads "tainted" in its log).
    if let (true, Some(bytes)) = (efi, space.mmio64_bytes) {
        domain = domain.attr("xmlns:qemu", QEMU_NS).child(
            el("qemu:commandline")
                .child(el("qemu:arg").attr("value", "-fw_cfg"))
                .child(el("qemu:arg").attr(
                    "value",
                    format!(
                        "name={OVMF_MMIO64_FW_CFG},string={}",
                        bytes.div_ceil(1 << 20)
                    ),
                ))
                // OVMF gives every hot-plug root port 4 KiB of the 64 KiB
                // I/O space unless told otherwise; the expanders' ports and
                // the spares ran out of it (11 spares beside 4 expanders:
                // OVMF assigned no BAR at all). Nothing passed through or
                // hot-plugged here has I/O BARs.
                .child(el("qemu:arg").attr("value", "-global"))
                .child(el("qemu:arg").attr("value", ROOT_PORT_NO_IO)),
        );
    }
    domain.render()
}

/// Each guest cell's CPUs as the hex words NCCL's `affinity` expects.
/// The virtiofs filesystems of a domain's XML: tag → source directory.
pub fn filesystems_in(xml: &str) -> std::collections::BTreeMap<String, String> {
    let Ok(doc) = roxmltree::Document::parse(xml) else {
        return Default::default();
    };
    doc.descendants()
        .filter(|n| n.has_tag_name("filesystem"))
        .filter(|n| {
            n.children()
                .any(|c| c.has_tag_name("driver") && c.attribute("type") == Some("virtiofs"))
        })
        .filter_map(|n| {
            let child = |name: &str, attr: &str| {
                n.children()
                    .find(|c| c.has_tag_name(name))
                    .and_then(|c| c.attribute(attr))
                    .map(str::to_owned)
            };
            Some((child("target", "dir")?, child("source", "dir")?))
        })
        .collect()
}

/// The host PCI functions a domain's XML passes through (its `hostdev`
/// sources), to check once the domain lets them go. XML that does not
/// parse, or an address that does not, yields nothing for it.
pub fn passed_through(xml: &str) -> Vec<Bdf> {
    let Ok(doc) = roxmltree::Document::parse(xml) else {
        return Vec::new();
    };
    let hex = |n: &roxmltree::Node, a: &str| {
        let v = n.attribute(a)?;
        u16::from_str_radix(v.trim_start_matches("0x"), 16).ok()
    };
    doc.descendants()
        .filter(|n| n.has_tag_name("hostdev") && n.attribute("type") == Some("pci"))
        .filter_map(|h| {
            let source = h.children().find(|c| c.has_tag_name("source"))?;
            let a = source.children().find(|c| c.has_tag_name("address"))?;
            Some(Bdf::new(
                hex(&a, "domain")?,
                u8::try_from(hex(&a, "bus")?).ok()?,
                u8::try_from(hex(&a, "slot")?).ok()?,
                u8::try_from(hex(&a, "function")?).ok()?,
            ))
        })
        .collect()
}

pub fn cell_affinity(layout: &GuestLayout, cell: u32) -> String {
    let total: u32 = layout.cells.iter().map(|c| c.vcpus.len() as u32).sum();
    layout
        .cells
        .iter()
        .find(|c| c.id == cell)
        .map(|c| cpumap(&c.vcpus, total))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest_layout::Expander;

    fn spec(volumes: usize, nics: usize) -> DomainSpec {
        DomainSpec {
            name: "vm".into(),
            uuid: "00000000-0000-4000-8000-000000000001".into(),
            virt_type: "qemu".into(),
            disk_path: "/d.qcow2".into(),
            seed_path: None,
            hugepages: false,
            host_id: None,
            kernel: None,
            interfaces: (0..nics)
                .map(|i| BridgeNic {
                    bridge: format!("kbr{i}"),
                    mac: format!("52:54:00:00:00:{i:02x}"),
                    mtu: 1450,
                })
                .collect(),
            volumes: (0..volumes)
                .map(|i| VolumeDisk {
                    source: DiskSource::File {
                        path: format!("/v{i}.qcow2"),
                        format: "qcow2".into(),
                    },
                    serial: format!("kumo{i:016}"),
                })
                .collect(),
            filesystems: Vec::new(),
            console_log: Some("/vms/a/console.log".into()),
            nvram_path: None,
        }
    }

    fn layout(expander_bus: Option<u8>) -> GuestLayout {
        GuestLayout {
            cells: Vec::new(),
            expanders: expander_bus
                .map(|bus_nr| Expander {
                    index: 1,
                    bus_nr,
                    guest_node: 0,
                    host_group: "0000:00:01.0".into(),
                    link_speed: None,
                    link_width: None,
                    switch_vendor: None,
                    switch_device: None,
                    ports: Vec::new(),
                })
                .into_iter()
                .collect(),
            vcpu_pins: Vec::new(),
            address_space: crate::guest_layout::AddressSpace {
                firmware: if expander_bus.is_some() {
                    Firmware::Efi
                } else {
                    Firmware::Bios
                },
                mmio64_bytes: expander_bus.map(|_| 513 << 30),
                phys_bits: expander_bus.map(|_| 41),
                host_phys_bits: Some(46),
                unknown_bars: Vec::new(),
            },
        }
    }

    #[test]
    fn a_gpu_guest_boots_uefi_with_its_aperture_and_address_width() {
        let compact = |xml: String| xml.lines().map(str::trim).collect::<String>();
        let mut s = spec(0, 0);
        s.nvram_path = Some("/vms/a/nvram.fd".into());
        let xml = compact(domain_xml(&s, &layout(Some(16))));
        for want in [
            "<loader readonly=\"yes\" type=\"pflash\">/usr/share/OVMF/OVMF_CODE_4M.fd</loader>",
            "<nvram template=\"/usr/share/OVMF/OVMF_VARS_4M.fd\">/vms/a/nvram.fd</nvram>",
            "<qemu:commandline><qemu:arg value=\"-fw_cfg\"/><qemu:arg value=\"name=opt/ovmf/X-PciMmio64Mb,string=525312\"/><qemu:arg value=\"-global\"/><qemu:arg value=\"pcie-root-port.io-reserve=0\"/></qemu:commandline>",
            "xmlns:qemu=\"http://libvirt.org/schemas/domain/qemu/1.0\"",
            "<cpu mode=\"maximum\"><maxphysaddr mode=\"emulate\" bits=\"41\"/>",
        ] {
            assert!(xml.contains(want), "{want} in {xml}");
        }
        // A CPU-only guest stays on SeaBIOS with QEMU's defaults.
        let xml = compact(domain_xml(&s, &layout(None)));
        for absent in [
            "<loader",
            "<nvram",
            "qemu:commandline",
            "maxphysaddr",
            "mode=\"maximum\"",
        ] {
            assert!(!xml.contains(absent), "{absent} in {xml}");
        }
    }

    #[test]
    fn spare_ports_stay_spare_after_libvirt_places_its_devices() {
        // Root disk, virtio-serial, USB: three; then each volume and NIC.
        let free = |v, n| unnumbered_ports(&spec(v, n), &layout(None)) - 3 - v - n;
        assert_eq!(free(0, 0), SPARE_PORTS);
        assert_eq!(free(4, 2), SPARE_PORTS);
        let xml = domain_xml(&spec(2, 1), &layout(None));
        assert_eq!(
            xml.matches("<controller type=\"pci\" model=\"pcie-root-port\"/>")
                .count(),
            3 + 2 + 1 + SPARE_PORTS
        );
    }

    #[test]
    fn root_ports_end_below_the_first_expanders_bus() {
        // Buses 1..=15 below an expander at 16: 4 taken, 11 left.
        assert_eq!(unnumbered_ports(&spec(0, 0), &layout(Some(16))), 11);
        assert_eq!(unnumbered_ports(&spec(4, 4), &layout(Some(16))), 15);
        // More devices than fit: as many ports as they need (libvirt
        // would add them anyway).
        assert_eq!(unnumbered_ports(&spec(12, 4), &layout(Some(16))), 19);
    }

    #[test]
    fn the_serial_console_logs_to_its_scrollback_file() {
        let compact = |xml: String| xml.lines().map(str::trim).collect::<String>();
        let xml = compact(domain_xml(&spec(0, 0), &layout(None)));
        assert!(
            xml.contains(
                "<serial type=\"pty\"><log file=\"/vms/a/console.log\" append=\"on\"/></serial>"
            ),
            "{xml}"
        );
        let mut none = spec(0, 0);
        none.console_log = None;
        assert!(compact(domain_xml(&none, &layout(None))).contains("<serial type=\"pty\"/>"));
    }

    #[test]
    fn volume_targets_follow_the_root_disk() {
        assert_eq!(volume_target(0), "vdb");
        assert_eq!(volume_target(24), "vdz");
        assert_eq!(volume_target(25), "vdaa");
        assert_eq!(volume_target(26), "vdab");
    }

    #[test]
    fn a_volume_disk_is_a_virtio_disk_with_its_serial() {
        let d = &spec(1, 0).volumes[0];
        let xml = volume_disk(d, "vdb").render();
        assert!(
            xml.contains("<target dev=\"vdb\" bus=\"virtio\"/>"),
            "{xml}"
        );
        assert!(
            xml.contains("<serial>kumo0000000000000000</serial>"),
            "{xml}"
        );
        assert!(xml.contains("<source file=\"/v0.qcow2\"/>"), "{xml}");
    }

    #[test]
    fn a_domain_says_its_virtiofs_filesystems() {
        let xml = "<domain><devices><filesystem type='mount' accessmode='passthrough'><driver type='virtiofs'/><source dir='/srv/s/1'/><target dir='data'/></filesystem><filesystem type='mount'><driver type='path'/><source dir='/x'/><target dir='y'/></filesystem></devices></domain>";
        let fs = filesystems_in(xml);
        assert_eq!(fs.len(), 1);
        assert_eq!(fs.get("data").map(String::as_str), Some("/srv/s/1"));
        assert!(filesystems_in("not xml").is_empty());
    }
}
