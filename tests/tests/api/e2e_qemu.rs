//! End to end on QEMU (TCG; KVM is not used): a real guest booted by
//! libvirt's `qemu:///system`, a real `qemu-ga` inside it. The agent writes
//! the VM's NCCL file into the guest; the file there equals what the API
//! serves; after a reboot (the guest's /etc is a tmpfs) it is written again.
//! The VM is on an Ethernet segment: its virtio NIC sits on the segment's
//! bridge, which the agent made, with the API's MAC and the segment's MTU.
//! `cargo xtask test` installs QEMU and libvirtd, starts them, and the test
//! builds its tiny guest with `scripts/build-test-guest.sh`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine;
use kumo_agent::run::{Agent, AgentConfig};
use kumo_api_types::{Vm, VmState};
use serde_json::{json, Value};

use crate::harness::{Backend, TestServer};

fn guest_dir() -> PathBuf {
    let target = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let dir = target.join("test-guest");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-test-guest.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "building the test guest failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// A guest-agent command, straight through libvirt: the test's own view
/// of the guest, independent of the agent under test.
fn qga(dom: &virt::domain::Domain, cmd: Value) -> Result<Value, String> {
    let out = dom
        .qemu_agent_command(&cmd.to_string(), 5, 0)
        .map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
    Ok(v["return"].clone())
}

fn guest_read(dom: &virt::domain::Domain, path: &str) -> Option<String> {
    let h = qga(
        dom,
        json!({"execute": "guest-file-open", "arguments": {"path": path, "mode": "r"}}),
    )
    .ok()?;
    let mut data = Vec::new();
    loop {
        let r = qga(
            dom,
            json!({"execute": "guest-file-read", "arguments": {"handle": h, "count": 65536}}),
        )
        .ok()?;
        data.extend(
            base64::engine::general_purpose::STANDARD
                .decode(r["buf-b64"].as_str().unwrap_or(""))
                .ok()?,
        );
        if r["eof"].as_bool().unwrap_or(true) {
            break;
        }
    }
    let _ = qga(
        dom,
        json!({"execute": "guest-file-close", "arguments": {"handle": h}}),
    );
    String::from_utf8(data).ok()
}

/// Changes on every boot (an uptime comparison can miss a fast reboot).
fn boot_id(dom: &virt::domain::Domain) -> Option<String> {
    guest_read(dom, "/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_owned())
}

/// Removes the test's domains whatever happens.
struct Cleanup(Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Ok(conn) = virt::connect::Connect::open(Some("qemu:///system")) {
            for uuid in &self.0 {
                if let Ok(d) = conn.lookup_domain_by_uuid_string(uuid) {
                    let _ = d.destroy();
                    let _ = d.undefine();
                }
            }
        }
    }
}

async fn until<T>(what: &str, limit: Duration, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn qemu_guest_gets_its_nccl_file_and_gets_it_back_after_a_reboot() {
    let guest = guest_dir();
    let conn = virt::connect::Connect::open(Some("qemu:///system")).unwrap_or_else(|e| {
        panic!("libvirtd with qemu:///system is required (`cargo xtask test` starts it): {e}")
    });
    let s = TestServer::start(Backend::Sqlite).await;
    s.tenant("lab").await;

    // QEMU runs as an unprivileged user: everything it opens must be reachable.
    let work = tempfile::Builder::new()
        .prefix("kumo-e2e")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let base = work.path().join("base.qcow2");
    assert!(std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&base)
        .arg("1G")
        .status()
        .unwrap()
        .success());
    let _: kumo_api_types::Template = s
        .admin
        .post(
            "/api/v1/templates",
            &json!({
                "name": "tiny", "image_path": base, "os": "busybox", "default_user": "root",
                "kernel_path": guest.join("vmlinuz"), "initrd_path": guest.join("initrd.img"),
                "kernel_cmdline": "console=ttyS0 quiet"
            }),
        )
        .await
        .unwrap();

    let sysfs = work.path().join("sysfs");
    kumo_topology::fixtures::write(
        &kumo_topology::fixtures::machine("cpu-only").unwrap(),
        &sysfs,
    )
    .unwrap();
    let agent = Agent::start(AgentConfig {
        server: s.url.clone(),
        join_token: Some(s.join_token().await),
        libvirt_uri: "qemu:///system".into(),
        sysfs_root: sysfs,
        state_dir: work.path().join("state"),
        name: "qemu-host".into(),
        virt_type: "qemu".into(),
        heartbeat: Duration::from_secs(5),
        scalable_unit: None,
        rails: Default::default(),
        // A test address (RFC 2544): the segment has no other hosts, so
        // nothing is ever sent to or from it.
        underlay_ip: Some("198.18.0.1".parse().unwrap()),
        netns: None,
        edge_uplink: None,
        resync: kumo_agent::run::RESYNC,
    })
    .await
    .unwrap();
    let lan: kumo_api_types::Segment = s
        .admin
        .post(
            "/api/v1/tenants/lab/segments",
            &json!({"name": "lan", "kind": "ethernet", "cidr": "10.77.0.0/24"}),
        )
        .await
        .unwrap();

    // `run()` heartbeats in the background; driving passes by hand, so do we.
    let hb = agent.client.clone();
    let heartbeat = tokio::spawn(async move {
        loop {
            let _ = hb.heartbeat(&Default::default()).await;
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    });

    let started = Instant::now();
    let vm: Vm = s
        .admin
        .post("/api/v1/tenants/lab/vms", &json!({"name": "tiny-vm", "vcpus": 1, "memory_gib": 1, "disk_gib": 1, "template": "tiny", "networks": [{"segment": "lan"}]}))
        .await
        .unwrap();
    let _cleanup = Cleanup(vec![vm.id.to_string()]);
    agent.sync_once(None).await.unwrap();
    println!(
        "first pass (define, start, first guest probe): {:?}",
        started.elapsed()
    );
    let v: Vm = s
        .admin
        .get("/api/v1/tenants/lab/vms/tiny-vm")
        .await
        .unwrap();
    assert_eq!(v.state, VmState::Running, "{:?}", v.reason);
    let dom = conn
        .lookup_domain_by_uuid_string(&vm.id.to_string())
        .unwrap();
    assert!(
        dom.xml_desc(0).unwrap().contains("<kernel>"),
        "booted from the template's kernel"
    );

    // The agent keeps trying until the guest agent answers, then writes.
    let condition = until(
        "the NCCL file in the guest",
        Duration::from_secs(120),
        async || {
            agent.resync().await.unwrap();
            let v: Vm = s
                .admin
                .get("/api/v1/tenants/lab/vms/tiny-vm")
                .await
                .unwrap();
            (v.guest_condition.as_deref() == Some("nccl-topology written"))
                .then_some(v.guest_condition)
        },
    )
    .await;
    println!(
        "request → NCCL file in the guest: {:?} ({condition:?})",
        started.elapsed()
    );
    let served = s
        .http()
        .get(format!(
            "{}/api/v1/tenants/lab/vms/tiny-vm/nccl-topology",
            s.url
        ))
        .bearer_auth(&s.admin_token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        guest_read(&dom, "/etc/kumo/nccl-topo.xml").as_deref(),
        Some(served.as_str()),
        "the guest has exactly what the API serves"
    );
    // The NIC, as the guest sees it: the API's MAC, the segment's MTU, on
    // the segment's bridge.
    assert!(
        dom.xml_desc(0)
            .unwrap()
            .contains(&format!("<source bridge='kbr{}'/>", lan.vni)),
        "{}",
        dom.xml_desc(0).unwrap()
    );
    assert_eq!(
        guest_read(&dom, "/sys/class/net/eth0/address").as_deref(),
        Some(format!("{}\n", vm.networks[0].mac).as_str())
    );
    assert_eq!(
        guest_read(&dom, "/sys/class/net/eth0/mtu").as_deref(),
        Some(format!("{}\n", lan.mtu).as_str())
    );
    let conf = guest_read(&dom, "/etc/nccl.conf").unwrap();
    assert!(
        conf.lines()
            .any(|l| l == "NCCL_TOPO_FILE=/etc/kumo/nccl-topo.xml"),
        "{conf}"
    );

    // Reboot through the API: the guest comes back without the file (its
    // /etc is a tmpfs), and the agent writes it again.
    let before = boot_id(&dom).unwrap();
    let r = s
        .http()
        .post(format!("{}/api/v1/tenants/lab/vms/tiny-vm/reboot", s.url))
        .bearer_auth(&s.admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    agent.sync_once(None).await.unwrap();
    until(
        "the guest to reboot",
        Duration::from_secs(120),
        async || {
            // A reboot the guest did not take is retried by the next pass.
            agent.resync().await.unwrap();
            boot_id(&dom).filter(|b| *b != before).map(|_| ())
        },
    )
    .await;
    until(
        "the NCCL file after the reboot",
        Duration::from_secs(120),
        async || {
            agent.resync().await.unwrap();
            (guest_read(&dom, "/etc/kumo/nccl-topo.xml").as_deref() == Some(served.as_str()))
                .then_some(())
        },
    )
    .await;

    let r = s
        .http()
        .delete(format!("{}/api/v1/tenants/lab/vms/tiny-vm", s.url))
        .bearer_auth(&s.admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    agent.sync_once(None).await.unwrap();
    assert!(
        conn.lookup_domain_by_uuid_string(&vm.id.to_string())
            .is_err(),
        "the domain is gone"
    );
    // With its last VM gone, the host keeps nothing of the segment.
    agent.sync_once(None).await.unwrap();
    let host = vxlan_manager::Kernel::connect(None)
        .unwrap()
        .observe()
        .await
        .unwrap();
    assert!(
        !host.links.contains_key(&format!("kbr{}", lan.vni)),
        "{:?}",
        host.links.keys()
    );
    heartbeat.abort();
    s.stop().await;
}
