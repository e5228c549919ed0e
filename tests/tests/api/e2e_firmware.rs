//! Proof that a GPU VM's domain boots: the domain Kumo renders for four
//! H100s of the `hgx-h100` fixture (each 128 GiB + 32 MiB + 16 MiB of
//! 64-bit BARs, each behind its own expander bus) is booted under QEMU/TCG
//! with OVMF, by libvirt's `qemu:///system`. The GPUs cannot be passed
//! through here, so each `hostdev` is replaced by a **stand-in**: an
//! `ivshmem-plain` device on sparse shared memory of the GPU's framebuffer
//! BAR size (128 GiB), on the same root port of the same expander. The
//! guest must see every stand-in's BAR assigned, inside its address width.
//! The same domain without the aperture (OVMF's default) must leave them
//! unassigned: what today's GPU VMs met on real servers. Both boot times
//! are printed (BENCHMARKS.md records them).

use std::path::Path;
use std::time::{Duration, Instant};

use kumo_topology::domain_xml::{domain_xml, DomainSpec, KernelBoot, OVMF_MMIO64_FW_CFG};
use kumo_topology::guest_layout::{guest_layout, DeviceKind, Firmware, GuestLayout, Placement};
use kumo_topology::{Bar, Bdf};
use serde_json::json;

use crate::e2e_qemu::{guest_dir, guest_read, qga, until, Cleanup};

/// The framebuffer BAR of an H100 80 GB, which each stand-in reproduces.
const BAR: u64 = 128 << 30;

fn four_h100s(work: &Path) -> (kumo_topology::HostTopology, GuestLayout) {
    let sysfs = work.join("sysfs");
    kumo_topology::fixtures::write(
        &kumo_topology::fixtures::machine("hgx-h100").unwrap(),
        &sysfs,
    )
    .unwrap();
    let topo = kumo_topology::sysfs::discover(&sysfs, None).unwrap();
    // GPUs 0–3 (NUMA node 0), pinned to this machine's CPUs 0 and 1 (the
    // fixture's CPUs are not this machine's), 1 GiB of RAM; no NICs.
    let gpus: Vec<Bdf> = topo.gpus.iter().take(4).map(|g| g.location.bdf).collect();
    let placement = Placement {
        gpus,
        nics: Vec::new(),
        cpus: [(0, vec![0, 1])].into(),
        memory_mib: [(0, 1024)].into(),
    };
    let layout = guest_layout(&topo, &placement).unwrap();
    layout.bootable().unwrap();
    (topo, layout)
}

/// The rendered domain with each GPU's `hostdev` swapped for its stand-in
/// on the GPU's root port, and (for the comparison) without the aperture.
fn with_stand_ins(xml: &str, layout: &GuestLayout, tag: &str, aperture: bool) -> String {
    let mut out = String::new();
    let mut rest = xml;
    while let Some(at) = rest.find("<hostdev ") {
        out.push_str(&rest[..at]);
        let end = rest[at..].find("</hostdev>").expect("hostdev ends") + at;
        rest = &rest[end + "</hostdev>".len()..];
    }
    out.push_str(rest);
    let mut shmems = String::new();
    for (_, port) in layout.devices() {
        assert_eq!(port.device.kind, DeviceKind::Gpu);
        shmems.push_str(&format!(
            "<shmem name=\"{tag}-{}\"><model type=\"ivshmem-plain\"/><size unit=\"G\">{}</size>\
             <address type=\"pci\" domain=\"0x0000\" bus=\"0x{:02x}\" slot=\"0x00\" function=\"0x0\"/></shmem>\n",
            port.index,
            BAR >> 30,
            port.index
        ));
    }
    out = out.replace("</devices>", &format!("{shmems}</devices>"));
    if !aperture {
        // Only the aperture: the root ports' I/O setting stays.
        let fw_cfg = out
            .find("<qemu:arg value=\"-fw_cfg\"/>")
            .expect("the aperture is set");
        let end = out[fw_cfg..].find("<qemu:arg value=\"-global\"/>").unwrap() + fw_cfg;
        out.replace_range(fw_cfg..end, "");
    }
    out
}

/// Boots the domain; answers the seconds to the guest agent's first
/// answer and each stand-in's BAR 2 as the guest's sysfs has it.
async fn boot(xml: &str, uuid: &str, layout: &GuestLayout) -> (f64, Vec<Option<Bar>>) {
    let conn = virt::connect::Connect::open(Some("qemu:///system")).unwrap_or_else(|e| {
        panic!("libvirtd with qemu:///system is required (`cargo xtask test` starts it): {e}")
    });
    let _cleanup = Cleanup(vec![uuid.to_owned()]);
    let started = Instant::now();
    let dom = conn
        .create_domain_xml(xml, 0)
        .unwrap_or_else(|e| panic!("starting the domain: {e}\n{xml}"));
    until("the guest agent", Duration::from_secs(420), async || {
        qga(&dom, json!({"execute": "guest-ping"})).ok()
    })
    .await;
    let secs = started.elapsed().as_secs_f64();
    let mut bars = Vec::new();
    for (_, port) in layout.devices() {
        let path = format!("/sys/bus/pci/devices/{}/resource", port.device.guest_bdf);
        let text = until(&path, Duration::from_secs(30), async || {
            guest_read(&dom, &path)
        })
        .await;
        let bar2 = kumo_topology::sysfs::parse_resource(&text)
            .unwrap()
            .into_iter()
            .find(|b| b.index == 2);
        // BAR 2's start address (line 3): 0 when the firmware found no room.
        let start = text
            .lines()
            .nth(2)
            .and_then(|l| l.split_whitespace().next())
            .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
            .unwrap_or(0);
        bars.push(bar2.filter(|_| start != 0));
    }
    let _ = dom.destroy();
    (secs, bars)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_four_h100_guest_boots_uefi_with_every_bar_assigned() {
    let guest = guest_dir();
    let work = tempfile::Builder::new()
        .prefix("kumo-uefi")
        .tempdir_in("/var/tmp")
        .unwrap();
    // QEMU's own user opens the disk and the NVRAM file in it.
    std::fs::set_permissions(
        work.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let (_topo, layout) = four_h100s(work.path());
    let space = &layout.address_space;
    assert_eq!(space.firmware, Firmware::Efi);
    assert_eq!(
        layout.expanders.len(),
        4,
        "each H100 behind its own expander"
    );
    let aperture = space.mmio64_bytes.unwrap();
    let bits = space.phys_bits.unwrap();
    assert!(aperture >= 4 * BAR, "{aperture}");

    let disk = work.path().join("disk.qcow2");
    assert!(std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&disk)
        .arg("1G")
        .status()
        .unwrap()
        .success());
    let tag = format!("kumo-bar-{}", std::process::id());
    let mut times = Vec::new();
    for (i, with_aperture) in [(1u8, true), (2, false)] {
        let uuid = format!("00000000-0000-4000-8000-0000000000{i:02x}");
        let spec = DomainSpec {
            name: format!("kumo-uefi-{}-{i}", std::process::id()),
            uuid: uuid.clone(),
            virt_type: "qemu".into(),
            disk_path: disk.display().to_string(),
            seed_path: None,
            hugepages: false,
            host_id: None,
            kernel: Some(KernelBoot {
                kernel: guest.join("vmlinuz").display().to_string(),
                initrd: Some(guest.join("initrd.img").display().to_string()),
                cmdline: "console=ttyS0 quiet".into(),
            }),
            interfaces: Vec::new(),
            volumes: Vec::new(),
            filesystems: Vec::new(),
            console_log: None,
            nvram_path: Some(
                work.path()
                    .join(format!("nvram-{i}.fd"))
                    .display()
                    .to_string(),
            ),
        };
        let rendered = domain_xml(&spec, &layout);
        assert!(rendered.contains(OVMF_MMIO64_FW_CFG), "{rendered}");
        let xml = with_stand_ins(&rendered, &layout, &tag, with_aperture);
        let (secs, bars) = boot(&xml, &uuid, &layout).await;
        for f in std::fs::read_dir("/dev/shm").unwrap().flatten() {
            if f.file_name().to_string_lossy().starts_with(&tag) {
                let _ = std::fs::remove_file(f.path());
            }
        }
        // The per-VM variable store was made beside the disk.
        assert!(
            Path::new(spec.nvram_path.as_deref().unwrap()).is_file(),
            "the NVRAM file"
        );
        times.push(secs);
        if with_aperture {
            for (bar, (_, port)) in bars.iter().zip(layout.devices()) {
                let bar = bar.unwrap_or_else(|| {
                    panic!(
                        "{}: BAR 2 unassigned with the aperture",
                        port.device.guest_bdf
                    )
                });
                assert_eq!(bar.size, BAR, "{}", port.device.guest_bdf);
                assert!(bar.above_4g());
            }
        } else {
            assert!(
                bars.iter().any(Option::is_none),
                "without the aperture OVMF found room for every 128 GiB BAR: {bars:?}"
            );
        }
    }
    println!(
        "4 x 128 GiB stand-ins, OVMF under TCG: {:.1} s to the guest agent with a {} GiB aperture and {bits} address bits; {:.1} s without an aperture (BARs unassigned)",
        times[0],
        aperture >> 30,
        times[1]
    );
}
