//! Volumes end to end on QEMU (TCG): a real guest under libvirt's
//! `qemu:///system`, the agent's qcow2 pool, `qemu-ga` inside the guest.
//! A volume attached to a running VM is hot-plugged: the guest sees a
//! virtio disk with the volume's serial and writes a marker on it; it is
//! unplugged live on detach; it outlives the VM; a second VM that has it
//! from its definition at boot reads the marker back; moved to a second
//! host (agent to agent, checksummed), a third VM there reads it too;
//! that VM, shelved and unshelved `--anywhere` off its drained host, comes
//! back on the first with its root disk and volume and reads both.
//! `cargo xtask test` installs QEMU and libvirtd and starts them.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use kumo_agent::run::Agent;
use kumo_api_types::{Vm, VmState, Volume, VolumeState};
use serde_json::json;

use crate::e2e_qemu::{guest_dir, guest_exec, qemu_host, qga, until, Cleanup};
use crate::harness::{Backend, TestServer};

/// Runs `sh -c script` in the guest; its standard output once it exited
/// with status 0 (within 30 s).
async fn guest_sh(dom: &virt::domain::Domain, script: &str) -> Option<String> {
    let out = guest_exec(
        dom,
        "/bin/sh",
        &["-c", &format!("{script} && echo kumo-ok")],
    )
    .await?;
    out.strip_suffix("kumo-ok\n").map(str::to_owned)
}

/// The guest's virtio disks: name → serial (`/sys/block/vd*/serial`;
/// busybox has no udev, so no `/dev/disk/by-id`).
async fn guest_disks(dom: &virt::domain::Domain) -> Option<Vec<(String, String)>> {
    let out = guest_sh(
        dom,
        "for d in /sys/block/vd*; do [ -e \"$d\" ] && echo \"${d##*/} $(cat $d/serial 2>/dev/null)\"; done; true",
    )
    .await?;
    Some(
        out.lines()
            .filter_map(|l| {
                let (name, serial) = l.split_once(' ')?;
                Some((name.to_owned(), serial.trim().to_owned()))
            })
            .collect(),
    )
}

/// The guest's block device with this serial, once it is there.
async fn disk_with_serial(dom: &virt::domain::Domain, serial: &str) -> Option<String> {
    guest_disks(dom)
        .await?
        .into_iter()
        .find(|(_, s)| s == serial)
        .map(|(name, _)| name)
}

/// The volume serials in a domain's XML (`flags` 2: its definition).
fn serials_in(dom: &virt::domain::Domain, flags: u32) -> Vec<String> {
    let xml = dom.xml_desc(flags).unwrap();
    xml.split("<serial>")
        .skip(1)
        .filter_map(|r| r.split_once("</serial>").map(|(s, _)| s.to_owned()))
        .collect()
}

/// The `pcie-root-port`s of a live domain's XML that hold no device.
fn free_root_ports(xml: &str) -> usize {
    let attr = |e: &str, name: &str| -> Option<String> {
        let (_, r) = e.split_once(&format!(" {name}='"))?;
        Some(r.split_once('\'')?.0.to_owned())
    };
    let ports: std::collections::BTreeSet<u32> = xml
        .split("<controller ")
        .skip(1)
        .filter(|c| c.contains("model='pcie-root-port'"))
        .filter_map(|c| attr(c, "index")?.parse().ok())
        .collect();
    let used: std::collections::BTreeSet<u32> = xml
        .split("<address type='pci'")
        .skip(1)
        .filter_map(|a| u32::from_str_radix(attr(a, "bus")?.trim_start_matches("0x"), 16).ok())
        .collect();
    ports.difference(&used).count()
}

/// Heartbeats for an agent driven by hand (its `run` loop is not running).
pub(crate) fn heartbeats(agent: &Agent) -> tokio::task::JoinHandle<()> {
    let hb = agent.client.clone();
    tokio::spawn(async move {
        loop {
            let _ = hb.heartbeat(&Default::default()).await;
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    })
}

/// The first sector of the disk with this serial, once guest `who` sees
/// it: its device name and the text there.
async fn read_marker(dom: &virt::domain::Domain, serial: &str, who: &str) -> (String, String) {
    let dev = until(
        &format!("the disk in guest {who}"),
        Duration::from_secs(120),
        async || disk_with_serial(dom, serial).await,
    )
    .await;
    let got = guest_sh(dom, &read_first_sector(&dev)).await.unwrap();
    (dev, got)
}

/// A guest command printing the text in a disk's first sector.
fn read_first_sector(dev: &str) -> String {
    format!("dd if=/dev/{dev} bs=512 count=1 2>/dev/null | tr -d '\\000'")
}

/// Deletes one of `vols`'s VMs and passes its host's agent until its
/// domain is gone.
async fn delete_vm(
    s: &TestServer,
    agent: &Agent,
    conn: &virt::connect::Connect,
    name: &str,
    id: uuid::Uuid,
) {
    s.admin
        .delete(&format!("/api/v1/tenants/vols/vms/{name}"))
        .await
        .unwrap();
    until(
        &format!("{name}'s domain to go"),
        Duration::from_secs(60),
        async || {
            agent.sync_once(None).await.unwrap();
            conn.lookup_domain_by_uuid_string(&id.to_string())
                .is_err()
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_outlives_its_vm_on_qemu() {
    let guest = guest_dir();
    let conn = virt::connect::Connect::open(Some("qemu:///system")).unwrap_or_else(|e| {
        panic!("libvirtd with qemu:///system is required (`cargo xtask test` starts it): {e}")
    });
    let s = TestServer::start(Backend::Sqlite).await;
    s.tenant("vols").await;
    let mut q = s.admin.quota("vols").await.unwrap();
    q.volume_gib = 10;
    s.admin.set_quota("vols", &q).await.unwrap();

    let (_work, config) = qemu_host(&s, &guest, "vol-host").await;
    let state_dir = config.state_dir.clone();
    let agent = Agent::start(config).await.unwrap();
    let heartbeat = heartbeats(&agent);
    let mut cleanup = Cleanup(Vec::new());
    let vm_body = |name: &str| json!({"name": name, "vcpus": 1, "memory_gib": 1, "disk_gib": 1, "template": "tiny"});

    // VM A, running, its guest agent answering.
    let booted_a = Instant::now();
    let a: Vm = s
        .admin
        .post("/api/v1/tenants/vols/vms", &vm_body("vm-a"))
        .await
        .unwrap();
    cleanup.0.push(a.id.to_string());
    agent.sync_once(None).await.unwrap();
    let v: Vm = s.admin.get("/api/v1/tenants/vols/vms/vm-a").await.unwrap();
    assert_eq!(v.state, VmState::Running, "{:?}", v.reason);
    let dom_a = conn
        .lookup_domain_by_uuid_string(&a.id.to_string())
        .unwrap();
    until("A's guest agent", Duration::from_secs(120), async || {
        qga(&dom_a, json!({"execute": "guest-ping"})).ok()
    })
    .await;
    assert_eq!(
        free_root_ports(&dom_a.xml_desc(0).unwrap()),
        kumo_topology::domain_xml::SPARE_PORTS,
        "root ports left for hot-plug"
    );
    let before = guest_disks(&dom_a).await.unwrap();
    println!(
        "A: guest agent up {:?} after the request; disks {before:?}",
        booted_a.elapsed()
    );
    assert!(
        before.iter().any(|(n, _)| n == "vda"),
        "the guest sees virtio disks (its root disk): {before:?}"
    );

    // The volume, made on A's host.
    let data: Volume = s
        .admin
        .post(
            "/api/v1/tenants/vols/volumes",
            &json!({"name": "data", "size_gib": 1, "vm": "vm-a"}),
        )
        .await
        .unwrap();
    assert_eq!(data.host.as_deref(), Some("vol-host"));
    let file = state_dir.join(format!("volumes/vol-{}.qcow2", data.id));
    until(
        "the volume to be made",
        Duration::from_secs(60),
        async || {
            agent.sync_once(None).await.unwrap();
            let v: Volume = s
                .admin
                .get("/api/v1/tenants/vols/volumes/data")
                .await
                .unwrap();
            assert_ne!(v.state, VolumeState::Error, "{:?}", v.reason);
            (v.state == VolumeState::Available).then_some(())
        },
    )
    .await;
    assert!(file.exists(), "{} is not there", file.display());
    // QEMU (`libvirt-qemu` under qemu:///system) passes through the
    // pool's directory to the file libvirt hands it while attached.
    let pool = file.parent().unwrap();
    let mode = std::fs::metadata(pool).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o711, "{}", pool.display());

    // Attached while A runs: hot-plugged, the guest sees its serial.
    let attached: Volume = s
        .admin
        .post(
            "/api/v1/tenants/vols/volumes/data/attach",
            &json!({"vm": "vm-a"}),
        )
        .await
        .unwrap();
    assert_eq!(attached.state, VolumeState::Attached);
    let attach = Instant::now();
    agent.sync_once(None).await.unwrap();
    assert_eq!(
        serials_in(&dom_a, 0),
        std::slice::from_ref(&data.serial),
        "hot-plugged: the live domain has the disk"
    );
    assert_eq!(
        serials_in(&dom_a, 2),
        std::slice::from_ref(&data.serial),
        "its definition too: {}",
        dom_a.xml_desc(2).unwrap()
    );
    let plugged = attach.elapsed();
    let dev = until("the disk in guest A", Duration::from_secs(60), async || {
        disk_with_serial(&dom_a, &data.serial).await
    })
    .await;
    let visible = attach.elapsed();
    println!("attach → hot-plugged {plugged:?}, → /dev/{dev} in the guest {visible:?}");
    assert!(
        guest_sh(&dom_a, &format!("[ -b /dev/{dev} ]"))
            .await
            .is_some(),
        "/dev/{dev} is a block device"
    );
    let size = guest_sh(&dom_a, &format!("cat /sys/block/{dev}/size"))
        .await
        .unwrap();
    assert_eq!(
        size.trim(),
        ((1u64 << 30) / 512).to_string(),
        "1 GiB in sectors"
    );
    let changes = agent.reconciler.lock().unwrap().changes;
    agent.sync_once(None).await.unwrap();
    assert_eq!(
        agent.reconciler.lock().unwrap().changes,
        changes,
        "a second pass changes nothing"
    );

    // A marker, written through the guest.
    let marker = format!("kumo-marker-{}", uuid::Uuid::new_v4().simple());
    guest_sh(
        &dom_a,
        &format!(
            "echo {marker} | dd of=/dev/{dev} bs=512 count=1 conv=sync,fsync 2>/dev/null && sync"
        ),
    )
    .await
    .expect("the marker is written");
    assert_eq!(
        guest_sh(&dom_a, &read_first_sector(&dev))
            .await
            .as_deref()
            .map(str::trim),
        Some(marker.as_str())
    );

    // Detached while A runs: unplugged live, gone from the definition.
    let _: Volume = s
        .admin
        .post("/api/v1/tenants/vols/volumes/data/detach", &json!({}))
        .await
        .unwrap();
    let detach = Instant::now();
    agent.sync_once(None).await.unwrap();
    assert!(
        serials_in(&dom_a, 2).is_empty(),
        "gone from the definition: {}",
        dom_a.xml_desc(2).unwrap()
    );
    until(
        "the disk to leave guest A",
        Duration::from_secs(90),
        async || {
            agent.sync_once(None).await.unwrap();
            let disks = guest_disks(&dom_a).await?;
            (!disks.iter().any(|(_, s)| *s == data.serial)).then_some(())
        },
    )
    .await;
    until(
        "the disk to leave A's live domain",
        Duration::from_secs(30),
        async || {
            agent.sync_once(None).await.unwrap();
            serials_in(&dom_a, 0).is_empty().then_some(())
        },
    )
    .await;
    println!(
        "detach → gone from the guest and the live domain {:?}",
        detach.elapsed()
    );

    // A goes; the volume stays, available, with its file.
    delete_vm(&s, &agent, &conn, "vm-a", a.id).await;
    let v: Volume = s
        .admin
        .get("/api/v1/tenants/vols/volumes/data")
        .await
        .unwrap();
    assert_eq!((v.state, v.vm.as_deref()), (VolumeState::Available, None));
    assert!(file.exists(), "the volume's file stays");

    // VM B has the volume from its definition at boot: attached before
    // the agent's first pass for it.
    let booted_b = Instant::now();
    let b: Vm = s
        .admin
        .post("/api/v1/tenants/vols/vms", &vm_body("vm-b"))
        .await
        .unwrap();
    cleanup.0.push(b.id.to_string());
    let attached: Volume = s
        .admin
        .post(
            "/api/v1/tenants/vols/volumes/data/attach",
            &json!({"vm": "vm-b"}),
        )
        .await
        .unwrap();
    assert_eq!(attached.vm.as_deref(), Some("vm-b"));
    agent.sync_once(None).await.unwrap();
    let v: Vm = s.admin.get("/api/v1/tenants/vols/vms/vm-b").await.unwrap();
    assert_eq!(v.state, VmState::Running, "{:?}", v.reason);
    let dom_b = conn
        .lookup_domain_by_uuid_string(&b.id.to_string())
        .unwrap();
    assert_eq!(serials_in(&dom_b, 2), std::slice::from_ref(&data.serial));
    assert_eq!(serials_in(&dom_b, 0), std::slice::from_ref(&data.serial));
    assert_eq!(
        free_root_ports(&dom_b.xml_desc(0).unwrap()),
        kumo_topology::domain_xml::SPARE_PORTS,
        "root ports left for hot-plug beside the volume"
    );
    let (dev, got) = read_marker(&dom_b, &data.serial, "B").await;
    println!(
        "B: boot → marker read from /dev/{dev} {:?} after the request",
        booted_b.elapsed()
    );
    assert_eq!(got.trim(), marker, "B reads what A wrote");

    // B goes; the volume moves to a second host, agent to agent, and a
    // VM made with it there reads the marker.
    delete_vm(&s, &agent, &conn, "vm-b", b.id).await;
    let (_work2, config2) = qemu_host(&s, &guest, "vol-host-2").await;
    let state_dir2 = config2.state_dir.clone();
    let agent2 = Agent::start(config2).await.unwrap();
    let heartbeat2 = heartbeats(&agent2);
    let moving: Volume = s
        .admin
        .post(
            "/api/v1/tenants/vols/volumes/data/move",
            &json!({"host": "vol-host-2"}),
        )
        .await
        .unwrap();
    assert_eq!(moving.state, VolumeState::Moving);
    let move_started = Instant::now();
    until(
        "the volume to arrive on vol-host-2",
        Duration::from_secs(120),
        async || {
            agent.sync_once(None).await.unwrap();
            agent2.sync_once(None).await.unwrap();
            let v: Volume = s
                .admin
                .get("/api/v1/tenants/vols/volumes/data")
                .await
                .unwrap();
            assert_ne!(v.state, VolumeState::Error, "{:?}", v.reason);
            (v.state == VolumeState::Available && v.host.as_deref() == Some("vol-host-2"))
                .then_some(())
        },
    )
    .await;
    println!(
        "move → on vol-host-2 (1 GiB checksummed, sent, imported) {:?}",
        move_started.elapsed()
    );
    let file2 = state_dir2.join(format!("volumes/vol-{}.qcow2", data.id));
    assert!(file2.exists(), "{} is not there", file2.display());
    until(
        "vol-host's old copy to go",
        Duration::from_secs(60),
        async || {
            agent.sync_once(None).await.unwrap();
            (!file.exists()).then_some(())
        },
    )
    .await;
    let booted_c = Instant::now();
    let mut c_body = vm_body("vm-c");
    c_body["volumes"] = json!(["data"]);
    let c: Vm = s
        .admin
        .post("/api/v1/tenants/vols/vms", &c_body)
        .await
        .unwrap();
    cleanup.0.push(c.id.to_string());
    assert_eq!(
        c.host.as_deref(),
        Some("vol-host-2"),
        "placed with its volume"
    );
    agent2.sync_once(None).await.unwrap();
    let v: Vm = s.admin.get("/api/v1/tenants/vols/vms/vm-c").await.unwrap();
    assert_eq!(v.state, VmState::Running, "{:?}", v.reason);
    let dom_c = conn
        .lookup_domain_by_uuid_string(&c.id.to_string())
        .unwrap();
    let (dev, got) = read_marker(&dom_c, &data.serial, "C").await;
    println!(
        "C on vol-host-2: boot → marker read from /dev/{dev} {:?} after the request",
        booted_c.elapsed()
    );
    assert_eq!(got.trim(), marker, "C, on another host, reads what A wrote");

    // C writes on its root disk, is shelved, and its host drained: unshelved
    // `--anywhere`, it comes back on vol-host with its root disk and its
    // volume moved there, and reads both.
    let root_marker = format!("kumo-root-{}", uuid::Uuid::new_v4().simple());
    guest_sh(
        &dom_c,
        &format!(
            "echo {root_marker} | dd of=/dev/vda bs=512 seek=2048 count=1 conv=sync,fsync 2>/dev/null && sync"
        ),
    )
    .await
    .expect("the root disk marker is written");
    let _: Vm = s
        .admin
        .post("/api/v1/tenants/vols/vms/vm-c/shelve", &json!({}))
        .await
        .unwrap();
    until("C to be shelved", Duration::from_secs(60), async || {
        agent2.sync_once(None).await.unwrap();
        let v: Vm = s.admin.get("/api/v1/tenants/vols/vms/vm-c").await.unwrap();
        (v.state == VmState::Shelved).then_some(())
    })
    .await;
    let _: serde_json::Value = s
        .admin
        .post("/api/v1/hosts/vol-host-2/drain", &json!({}))
        .await
        .unwrap();
    let unshelved = Instant::now();
    let _: Vm = s
        .admin
        .post(
            "/api/v1/tenants/vols/vms/vm-c/unshelve?anywhere=true",
            &json!({}),
        )
        .await
        .unwrap();
    until(
        "C to run on vol-host",
        Duration::from_secs(180),
        async || {
            agent.sync_once(None).await.unwrap();
            agent2.sync_once(None).await.unwrap();
            let v: Vm = s.admin.get("/api/v1/tenants/vols/vms/vm-c").await.unwrap();
            assert_ne!(v.state, VmState::Error, "{:?}", v.reason);
            (v.state == VmState::Running && v.host.as_deref() == Some("vol-host")).then_some(())
        },
    )
    .await;
    let dom_c = conn
        .lookup_domain_by_uuid_string(&c.id.to_string())
        .unwrap();
    let (dev, got) = read_marker(&dom_c, &data.serial, "C (unshelved)").await;
    println!(
        "C unshelved --anywhere: disks moved, booted on vol-host, volume read {:?} after the request",
        unshelved.elapsed()
    );
    assert_eq!(got.trim(), marker, "its volume came along, on /dev/{dev}");
    let root = guest_sh(
        &dom_c,
        "dd if=/dev/vda bs=512 skip=2048 count=1 2>/dev/null | tr -d '\\000'",
    )
    .await
    .unwrap();
    assert_eq!(root.trim(), root_marker, "its root disk came along");
    let v: Volume = s
        .admin
        .get("/api/v1/tenants/vols/volumes/data")
        .await
        .unwrap();
    assert_eq!(
        (v.state, v.host.as_deref()),
        (VolumeState::Attached, Some("vol-host"))
    );
    let old_root = state_dir2.join(format!("vms/{}", c.id));
    until(
        "vol-host-2's copies to go",
        Duration::from_secs(60),
        async || {
            agent2.sync_once(None).await.unwrap();
            (!old_root.exists() && !file2.exists()).then_some(())
        },
    )
    .await;

    // Tidy: C goes, then the volume.
    delete_vm(&s, &agent, &conn, "vm-c", c.id).await;
    until(
        "the volume to be deletable",
        Duration::from_secs(60),
        async || {
            agent.sync_once(None).await.unwrap();
            s.admin
                .delete("/api/v1/tenants/vols/volumes/data")
                .await
                .ok()
        },
    )
    .await;
    until(
        "the volume's file to go",
        Duration::from_secs(60),
        async || {
            agent.sync_once(None).await.unwrap();
            (!file.exists()).then_some(())
        },
    )
    .await;
    heartbeat.abort();
    heartbeat2.abort();
    s.stop().await;
}
