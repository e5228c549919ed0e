//! Volumes through the API with real agents (libvirt's test driver, qcow2
//! storage in their state directories): made by their host, attached to
//! VMs there (the domain's definition carries the disk by serial), kept
//! when the VM goes, grown, deleted; the refusals that change nothing;
//! metering per GiB-hour on an injected clock. On both databases.

use std::path::Path;
use std::time::Duration;

use kumo_agent::run::{Agent, AgentConfig};
use kumo_api_types::{Vm, VmCreate, Volume, VolumeState};
use serde_json::json;

use crate::harness::{on_both_backends, scratch, TestServer};

fn agent_config(s: &TestServer, join: &str, dir: &Path, name: &str) -> AgentConfig {
    let sysfs = dir.join(name).join("sysfs");
    kumo_topology::fixtures::write(
        &kumo_topology::fixtures::machine("cpu-only").unwrap(),
        &sysfs,
    )
    .unwrap();
    crate::harness::agent_config(
        s,
        Some(join.to_owned()),
        &sysfs,
        &dir.join(name).join("state"),
        name,
    )
}

/// Two hosts with real agents on libvirt's test driver, `PREFIX-a` and
/// `PREFIX-b`, their state under the returned directory.
async fn two_hosts(s: &TestServer, prefix: &str) -> (tempfile::TempDir, Agent, Agent) {
    let dir = scratch();
    let join = s.join_token().await;
    let a = Agent::start(agent_config(s, &join, dir.path(), &format!("{prefix}-a")))
        .await
        .unwrap();
    let b = Agent::start(agent_config(s, &join, dir.path(), &format!("{prefix}-b")))
        .await
        .unwrap();
    (dir, a, b)
}

/// One pass of each host's agent.
async fn sync_both(a: &Agent, b: &Agent) {
    a.sync_once(None).await.unwrap();
    b.sync_once(None).await.unwrap();
}

/// Passes of `agents` until `done` (long storage work, a copy made of a
/// snapshot or a snapshot merged away, goes on after the pass that starts
/// it), within 60 s.
async fn passes_until<F: AsyncFn() -> bool>(agents: &[&Agent], what: &str, done: F) {
    let t = std::time::Instant::now();
    loop {
        for a in agents {
            a.sync_once(None).await.unwrap();
        }
        if done().await {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn small_vm(name: &str) -> VmCreate {
    VmCreate {
        name: name.into(),
        gpus: 0,
        gpu_model: None,
        vcpus: Some(1),
        memory_gib: Some(1),
        disk_gib: Some(1),
        template: None,
        service_level: Default::default(),
        ssh_keys: Vec::new(),
        networks: Vec::new(),
        volumes: Vec::new(),
        on_reclaim: None,
        on_host_loss: None,
        notice_seconds: None,
        shares: Vec::new(),
        public_ip: false,
        queue: false,
        reservation: None,
    }
}

async fn volume(s: &TestServer, name: &str) -> Volume {
    s.admin
        .get(&format!("/api/v1/tenants/lab/volumes/{name}"))
        .await
        .unwrap()
}

async fn post(s: &TestServer, path: &str, body: serde_json::Value) -> Result<Volume, u16> {
    s.admin
        .post::<_, Volume>(&format!("/api/v1/tenants/lab/volumes{path}"), &body)
        .await
        .map_err(|e| e.status().unwrap_or(0))
}

/// A lifecycle action on one of lab's VMs; its status.
async fn act(s: &TestServer, vm: &str, action: &str) -> u16 {
    s.http()
        .post(format!("{}/api/v1/tenants/lab/vms/{vm}/{action}", s.url))
        .bearer_auth(&s.admin_token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Removes these VMs' domains: the test driver's domains are shared by
/// every client of the daemon.
fn forget(ids: &[uuid::Uuid]) {
    let conn = virt::connect::Connect::open(Some("test:///default")).unwrap();
    for id in ids {
        if let Ok(d) = conn.lookup_domain_by_uuid_string(&id.to_string()) {
            let _ = d.destroy();
            if d.undefine_flags(virt::sys::VIR_DOMAIN_UNDEFINE_NVRAM)
                .is_err()
            {
                let _ = d.undefine();
            }
        }
    }
}

/// A server on SQLite on a clock the test moves, from `t0`, with
/// `prices` in force, and a tenant `lab` with room for volumes.
async fn metered(
    t0: chrono::DateTime<chrono::Utc>,
    prices: serde_json::Value,
) -> (TestServer, kumo_server::clock::Clock) {
    let clock = kumo_server::clock::Clock::manual(t0);
    let s =
        TestServer::start_with(crate::harness::Backend::Sqlite, |c| c.clock = clock.clone()).await;
    let _: kumo_api_types::Rates = s
        .admin
        .put(
            "/api/v1/rates",
            &json!({"effective_from": t0, "prices": prices}),
        )
        .await
        .unwrap();
    s.tenant("lab").await;
    // Priced volumes need points to be made.
    let _: kumo_api_types::PointGrant = s
        .admin
        .post(
            "/api/v1/tenants/lab/points/grants",
            &json!({"amount": "1000000000", "expires_at": t0 + chrono::Duration::days(3650)}),
        )
        .await
        .unwrap();
    (s, clock)
}

/// The volume serials in a domain's persistent definition.
fn serials_in(id: uuid::Uuid) -> Vec<String> {
    let conn = virt::connect::Connect::open(Some("test:///default")).unwrap();
    let d = conn.lookup_domain_by_uuid_string(&id.to_string()).unwrap();
    let xml = d.xml_desc(2).unwrap();
    xml.split("<serial>")
        .skip(1)
        .filter_map(|r| r.split_once("</serial>").map(|(s, _)| s.to_owned()))
        .collect()
}

on_both_backends! {
    async fn volumes_outlive_vms_on_their_host(s: &TestServer) {
        s.tenant("lab").await;
        let mut q = s.admin.quota("lab").await.unwrap();
        q.volume_gib = 100;
        s.admin.set_quota("lab", &q).await.unwrap();
        let _libvirtd = virt::connect::Connect::open(Some("test:///default")).unwrap();
        let (dir, a, b) = two_hosts(s, "vol").await;
        let pass = async || sync_both(&a, &b).await;

        // A VM on each host (the second host drained while the first is
        // placed, then the other way round).
        let _: serde_json::Value = s.admin.post("/api/v1/hosts/vol-b/drain", &json!({})).await.unwrap();
        let web: Vm = s.admin.create_vm("lab", &small_vm("web")).await.unwrap();
        let _: serde_json::Value = s.admin.post("/api/v1/hosts/vol-b/undrain", &json!({})).await.unwrap();
        let _: serde_json::Value = s.admin.post("/api/v1/hosts/vol-a/drain", &json!({})).await.unwrap();
        let far: Vm = s.admin.create_vm("lab", &small_vm("far")).await.unwrap();
        let _: serde_json::Value = s.admin.post("/api/v1/hosts/vol-a/undrain", &json!({})).await.unwrap();
        pass().await;
        let web: Vm = s.admin.vm("lab", &web.name).await.unwrap();
        assert_eq!(web.host.as_deref(), Some("vol-a"));
        assert_eq!(s.admin.vm("lab", &far.name).await.unwrap().host.as_deref(), Some("vol-b"));

        // Bad requests change nothing.
        for (body, status) in [
            (json!({"name": "data", "size_gib": 0}), 400),
            (json!({"name": "data", "size_gib": 101}), 409),
            (json!({"name": "Bad Name", "size_gib": 1}), 400),
            (json!({"name": "data", "size_gib": 1, "vm": "nope"}), 404),
        ] {
            assert_eq!(post(s, "", body.clone()).await.unwrap_err(), status, "{body}");
        }
        assert!(s.admin.list_all::<Volume>("/api/v1/tenants/lab/volumes").await.unwrap().is_empty());

        // Made on the VM's host: creating, then available once its host made it.
        let data = post(s, "", json!({"name": "data", "size_gib": 10, "vm": "web"})).await.unwrap();
        assert_eq!((data.state, data.host.as_deref()), (VolumeState::Creating, Some("vol-a")));
        assert_eq!(data.serial.len(), 20);
        assert_eq!(post(s, "", json!({"name": "data", "size_gib": 1})).await.unwrap_err(), 409);
        pass().await;
        let data = volume(s, "data").await;
        assert_eq!(data.state, VolumeState::Available, "{:?}", data.reason);
        let file = dir.path().join(format!("vol-a/state/volumes/vol-{}.qcow2", data.id));
        assert!(file.exists(), "{} is not there", file.display());

        // Attached to the VM on its host: its definition has the disk.
        assert_eq!(post(s, "/data/attach", json!({"vm": "far"})).await.unwrap_err(), 409, "another host's VM");
        let attached = post(s, "/data/attach", json!({"vm": "web"})).await.unwrap();
        assert_eq!((attached.state, attached.vm.as_deref()), (VolumeState::Attached, Some("web")));
        assert_eq!(post(s, "/data/attach", json!({"vm": "web"})).await.unwrap_err(), 409, "attached already");
        pass().await;
        assert_eq!(serials_in(web.id), std::slice::from_ref(&data.serial));
        let changes = a.reconciler.lock().unwrap().changes;
        pass().await;
        assert_eq!(a.reconciler.lock().unwrap().changes, changes, "a second pass changes nothing");
        // Attached: it neither grows nor goes.
        assert_eq!(post(s, "/data/resize", json!({"size_gib": 20})).await.unwrap_err(), 409);
        let e = s.admin.delete("/api/v1/tenants/lab/volumes/data").await.unwrap_err();
        assert_eq!(e.status(), Some(409));
        // Another tenant does not see it.
        s.tenant("other").await;
        let e = s.admin.get::<Volume>("/api/v1/tenants/other/volumes/data").await.unwrap_err();
        assert_eq!(e.status(), Some(404));

        // The VM goes; the volume stays, detached, with its file.
        s.admin.delete(&format!("/api/v1/tenants/lab/vms/{}", web.name)).await.unwrap();
        pass().await;
        pass().await;
        let data = volume(s, "data").await;
        assert_eq!((data.state, data.vm.as_deref()), (VolumeState::Available, None));
        assert!(file.exists());

        // Grown while detached (never shrunk), past the quota refused.
        assert_eq!(post(s, "/data/resize", json!({"size_gib": 5})).await.unwrap_err(), 400);
        assert_eq!(post(s, "/data/resize", json!({"size_gib": 200})).await.unwrap_err(), 409);
        post(s, "/data/resize", json!({"size_gib": 20})).await.unwrap();
        pass().await;
        let out = std::process::Command::new("qemu-img")
            .args(["info", "--output=json", "-U"])
            .arg(&file)
            .output()
            .unwrap();
        let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(info["virtual-size"], 20u64 << 30, "{info}");

        // A new VM made with the volume goes to the volume's host (the
        // other host has fewer VMs) and boots with it; with that host
        // drained, the refusal says why.
        let _: serde_json::Value = s.admin.post("/api/v1/hosts/vol-a/drain", &json!({})).await.unwrap();
        let mut with = small_vm("next");
        with.volumes = vec!["data".into()];
        let e = s.admin.create_vm("lab", &with).await.unwrap_err();
        assert!(e.to_string().contains("volumes"), "{e}");
        assert_eq!(volume(s, "data").await.state, VolumeState::Available, "nothing changed");
        let _: serde_json::Value = s.admin.post("/api/v1/hosts/vol-a/undrain", &json!({})).await.unwrap();
        let next: Vm = s.admin.create_vm("lab", &with).await.unwrap();
        assert_eq!(next.host.as_deref(), Some("vol-a"));
        assert_eq!(volume(s, "data").await.vm.as_deref(), Some("next"));
        let mut again = small_vm("again");
        again.volumes = vec!["data".into()];
        assert_eq!(s.admin.create_vm("lab", &again).await.unwrap_err().status(), Some(409), "taken");
        pass().await;
        assert_eq!(serials_in(next.id), std::slice::from_ref(&data.serial));
        post(s, "/data/detach", json!({})).await.unwrap();
        pass().await;
        assert!(serials_in(next.id).is_empty(), "detached from the definition");
        s.admin.delete("/api/v1/tenants/lab/volumes/data").await.unwrap();
        assert_eq!(volume(s, "data").await.state, VolumeState::Deleting);
        pass().await;
        assert!(!file.exists(), "its host removed it");
        let e = s.admin.get::<Volume>("/api/v1/tenants/lab/volumes/data").await.unwrap_err();
        assert_eq!(e.status(), Some(404), "its row goes once its host says so");

        // A volume still being made attaches at once, and comes to the VM
        // when its host has made it.
        let tmp = post(s, "", json!({"name": "tmp", "size_gib": 1, "vm": "next"})).await.unwrap();
        let tmp2 = post(s, "/tmp/attach", json!({"vm": "next"})).await.unwrap();
        assert_eq!((tmp2.state, tmp2.vm.as_deref()), (VolumeState::Creating, Some("next")));
        assert_eq!(post(s, "/tmp/attach", json!({"vm": "next"})).await.unwrap_err(), 409);
        pass().await;
        assert_eq!(volume(s, "tmp").await.state, VolumeState::Attached);
        assert_eq!(serials_in(next.id), std::slice::from_ref(&tmp.serial));

        forget(&[next.id, far.id]);
    }
}

#[tokio::test]
async fn volumes_are_charged_per_gib_hour_while_they_exist() {
    use chrono::{Duration, TimeZone, Utc};
    let t0 = Utc.with_ymd_and_hms(2026, 11, 10, 9, 0, 0).unwrap();
    let (s, clock) = metered(
        t0,
        json!({"volume_gib": {"guaranteed": "0.6", "spot": "0.6"}}),
    )
    .await;
    // A host to keep it, which makes what it is told at once.
    let mut agent = s.sim_agent("store-001", "cpu-only").await;
    post(&s, "", json!({"name": "data", "size_gib": 10}))
        .await
        .unwrap();
    agent.converge().await;
    clock.advance(Duration::minutes(10));
    // Grown: 10 GiB for 10 minutes, then 30 GiB for 10 minutes, then
    // deleted: nothing after.
    post(&s, "/data/resize", json!({"size_gib": 30}))
        .await
        .unwrap();
    clock.advance(Duration::minutes(10));
    s.admin
        .delete("/api/v1/tenants/lab/volumes/data")
        .await
        .unwrap();
    agent.converge().await;
    clock.advance(Duration::minutes(10));
    kumo_server::app::metering::post_due(&s.server.state)
        .await
        .unwrap();
    let st: kumo_api_types::Statement = s
        .admin
        .get("/api/v1/tenants/lab/statements/2026-11")
        .await
        .unwrap();
    let held: Vec<(String, i64, String)> = st
        .lines
        .iter()
        .filter(|l| l.resource == "volume_gib")
        .map(|l| (l.vm.clone(), l.seconds, l.amount.clone()))
        .collect();
    // 0.6 points per GiB-hour: 10 GiB × 1/6 h = 1, 30 GiB × 1/6 h = 3.
    let total: f64 = held.iter().map(|h| h.2.parse::<f64>().unwrap()).sum();
    assert!((total - 4.0).abs() < 1e-9, "{held:?}");
    assert_eq!(held.iter().map(|h| h.1).sum::<i64>(), 1200, "{held:?}");
    assert!(held.iter().all(|h| h.0 == "data"), "{held:?}");
    s.stop().await;
}

on_both_backends! {
    async fn a_shelved_vm_gives_its_gpus_back_and_comes_back_with_its_disks(s: &TestServer) {
        s.tenant("lab").await;
        let _libvirtd = virt::connect::Connect::open(Some("test:///default")).unwrap();
        let dir = scratch();
        let join = s.join_token().await;
        let mut config = agent_config(s, &join, dir.path(), "shelf-a");
        config.sysfs_root = dir.path().join("shelf-a/hgx");
        kumo_topology::fixtures::write(
            &kumo_topology::fixtures::machine("hgx-h100").unwrap(),
            &config.sysfs_root,
        )
        .unwrap();
        let a = Agent::start(config).await.unwrap();
        let eight = |name: &str| VmCreate {
            gpus: 8,
            vcpus: Some(16),
            memory_gib: Some(64),
            ..small_vm(name)
        };
        let big: Vm = s.admin.create_vm("lab", &eight("big")).await.unwrap();
        post(s, "", json!({"name": "ckpt", "size_gib": 5, "vm": "big"})).await.unwrap();
        a.sync_once(None).await.unwrap();
        post(s, "/ckpt/attach", json!({"vm": "big"})).await.unwrap();
        a.sync_once(None).await.unwrap();
        assert_eq!(s.admin.vm("lab", "big").await.unwrap().state, kumo_api_types::VmState::Running);
        let disk = dir.path().join(format!("shelf-a/state/vms/{}/disk.qcow2", big.id));
        use std::os::unix::fs::MetadataExt;
        let inode = std::fs::metadata(&disk).unwrap().ino();

        // Shelved: no domain, its GPUs taken by another VM, its disk kept.
        let r = act(s, "big", "shelve").await;
        assert_eq!(r, 202);
        assert_eq!(s.admin.vm("lab", "big").await.unwrap().state, kumo_api_types::VmState::Shelving);
        a.sync_once(None).await.unwrap();
        let shelved = s.admin.vm("lab", "big").await.unwrap();
        assert_eq!((shelved.state, shelved.host.as_deref()), (kumo_api_types::VmState::Shelved, None));
        let conn = virt::connect::Connect::open(Some("test:///default")).unwrap();
        assert!(conn.lookup_domain_by_uuid_string(&big.id.to_string()).is_err(), "no domain");
        assert!(disk.exists(), "its disk stays");
        assert_eq!(volume(s, "ckpt").await.vm.as_deref(), Some("big"), "its volume stays attached");
        let other: Vm = s.admin.create_vm("lab", &eight("other")).await.unwrap();
        assert_eq!(other.host.as_deref(), Some("shelf-a"), "the GPUs were given back");
        a.sync_once(None).await.unwrap();
        let start = act(s, "big", "start").await;
        assert_eq!(start, 409, "a shelved VM is unshelved, not started");

        // Unshelved while its host is full: it waits, saying why.
        let r = act(s, "big", "unshelve").await;
        assert_eq!(r, 202);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let waiting = s.admin.vm("lab", "big").await.unwrap();
        assert_eq!(waiting.state, kumo_api_types::VmState::Pending);
        assert!(waiting.reason.as_deref().unwrap_or("").contains("room"), "{waiting:?}");
        // Room again: placed on the host with its disks, the same disk file
        // and its volume.
        s.admin.delete("/api/v1/tenants/lab/vms/other").await.unwrap();
        a.sync_once(None).await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            a.sync_once(None).await.unwrap();
            let v = s.admin.vm("lab", "big").await.unwrap();
            if v.state == kumo_api_types::VmState::Running {
                assert_eq!(v.host.as_deref(), Some("shelf-a"));
                break;
            }
            assert!(std::time::Instant::now() < deadline, "not unshelved: {v:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(std::fs::metadata(&disk).unwrap().ino(), inode, "the same disk");
        assert_eq!(serials_in(big.id), [volume(s, "ckpt").await.serial]);

        // Shelved and deleted: the host removes its disk.
        assert_eq!(act(s, "big", "shelve").await, 202);
        a.sync_once(None).await.unwrap();
        s.admin.delete("/api/v1/tenants/lab/vms/big").await.unwrap();
        a.sync_once(None).await.unwrap();
        assert!(!disk.exists(), "deleted with its VM");
        assert_eq!(volume(s, "ckpt").await.state, VolumeState::Available, "the volume outlives it");
        forget(&[big.id, other.id]);
    }
}

#[tokio::test]
async fn a_shelved_vm_is_charged_for_its_disk_only() {
    use chrono::{Duration, TimeZone, Utc};
    let t0 = Utc.with_ymd_and_hms(2026, 11, 12, 9, 0, 0).unwrap();
    let (s, clock) = metered(
        t0,
        json!({"gpu:H100-SXM5-80GB": {"guaranteed": "60", "spot": "20"},
               "disk_gib": {"guaranteed": "0.06", "spot": "0.06"}}),
    )
    .await;
    let mut agent = s.sim_agent("gpu-001", "hgx-h100").await;
    let vm = VmCreate {
        gpus: 8,
        vcpus: Some(16),
        memory_gib: Some(64),
        disk_gib: Some(100),
        ..small_vm("train")
    };
    let _: Vm = s.admin.create_vm("lab", &vm).await.unwrap();
    agent.converge().await;
    clock.advance(Duration::minutes(10));
    let r = act(&s, "train", "shelve").await;
    assert_eq!(r, 202);
    agent.converge().await;
    assert_eq!(
        s.admin.vm("lab", "train").await.unwrap().state,
        kumo_api_types::VmState::Shelved
    );
    // A weekend on the shelf.
    clock.advance(Duration::hours(48));
    kumo_server::app::metering::post_due(&s.server.state)
        .await
        .unwrap();
    let st: kumo_api_types::Statement = s
        .admin
        .get("/api/v1/tenants/lab/statements/2026-11")
        .await
        .unwrap();
    let seconds = |resource: &str| -> i64 {
        st.lines
            .iter()
            .filter(|l| l.resource == resource)
            .map(|l| l.seconds)
            .sum()
    };
    // GPUs for the 10 running minutes only; the disk all along.
    assert_eq!(seconds("gpu:H100-SXM5-80GB"), 600, "{:?}", st.lines);
    assert_eq!(seconds("disk_gib"), 600 + 48 * 3600, "{:?}", st.lines);
    s.stop().await;
}

/// The portal's volumes page does what the API does: made, attached,
/// detached and deleted from its forms; a refusal comes back with the
/// API's reason.
#[tokio::test]
async fn the_portal_volumes_page_acts_through_the_api() {
    let s = TestServer::start(crate::harness::Backend::Sqlite).await;
    s.tenant("lab").await;
    let mut agent = s.sim_agent("store-001", "cpu-only").await;
    let _: Vm = s.admin.create_vm("lab", &small_vm("web")).await.unwrap();
    agent.converge().await;
    let portal = s.portal_admin().await;
    let page = s.page(&portal, "/t/lab/volumes").await;
    assert!(page.contains("No volume yet"), "{page}");
    assert!(
        page.contains("href=\"/t/lab/volumes\""),
        "in the project's navigation"
    );
    let csrf = crate::harness::csrf_of(&page);
    let form = async |path: &str, fields: &[(&str, &str)]| {
        let mut f = vec![("csrf", csrf.as_str())];
        f.extend_from_slice(fields);
        let r = portal
            .post(format!("{}{path}", s.url))
            .form(&f)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    let (status, page) = form("/t/lab/volumes", &[("name", "data"), ("size_gib", "0")]).await;
    assert_eq!(status, 400);
    assert!(
        page.contains("class=\"error\"") && page.contains("GiB"),
        "{page}"
    );
    let (status, _) = form(
        "/t/lab/volumes",
        &[("name", "data"), ("size_gib", "5"), ("vm", "web")],
    )
    .await;
    assert_eq!(status, 303);
    agent.converge().await;
    let page = s.page(&portal, "/t/lab/volumes").await;
    assert!(
        page.contains("data")
            && page.contains("5 GiB")
            && page.contains("data-state=\"available\""),
        "{page}"
    );
    assert!(
        page.contains(&volume(&s, "data").await.guest_path()),
        "{page}"
    );
    let (status, _) = form("/t/lab/volumes", &[("attach", "data"), ("vm", "web")]).await;
    assert_eq!(status, 303);
    assert_eq!(volume(&s, "data").await.vm.as_deref(), Some("web"));
    // The VM's page shows its volume and where the guest finds it.
    let vm_page = s.page(&portal, "/t/lab/vms/web").await;
    assert!(
        vm_page.contains(&volume(&s, "data").await.guest_path()),
        "{vm_page}"
    );
    let (status, _) = form("/t/lab/volumes/data/detach", &[]).await;
    assert_eq!(status, 303);
    assert_eq!(volume(&s, "data").await.vm, None);
    let (status, _) = form("/t/lab/volumes/data/delete", &[]).await;
    assert_eq!(status, 303);
    assert_eq!(volume(&s, "data").await.state, VolumeState::Deleting);
    s.stop().await;
}

/// Writes a byte pattern into the first MiB of a qcow2 image (`read`
/// checks it instead); whether `qemu-io` succeeded.
fn qemu_io(file: &Path, op: &str, pattern: u8) -> bool {
    std::process::Command::new("qemu-io")
        .args(["-f", "qcow2", "-c"])
        .arg(format!("{op} -P 0x{pattern:02x} 0 1M"))
        .arg(file)
        .output()
        .map(|o| {
            o.status.success()
                && !String::from_utf8_lossy(&o.stdout).contains("Pattern verification failed")
        })
        .unwrap_or(false)
}

on_both_backends! {
    async fn snapshots_copy_a_volume_on_its_host(s: &TestServer) {
        s.tenant("lab").await;
        let _libvirtd = virt::connect::Connect::open(Some("test:///default")).unwrap();
        let dir = scratch();
        let join = s.join_token().await;
        let a = Agent::start(agent_config(s, &join, dir.path(), "snap-a")).await.unwrap();
        let src = post(s, "", json!({"name": "src", "size_gib": 1})).await.unwrap();
        a.sync_once(None).await.unwrap();
        let pool = dir.path().join("snap-a/state/volumes");
        let src_file = pool.join(format!("vol-{}.qcow2", src.id));
        assert!(qemu_io(&src_file, "write", 0x5a));

        // A snapshot of what was there; the volume changes after it.
        let snap: kumo_api_types::VolumeSnapshot = s.admin
            .post("/api/v1/tenants/lab/volumes/src/snapshots", &json!({"name": "snap1"}))
            .await
            .unwrap();
        assert_eq!((snap.state.as_str(), snap.size_gib), ("creating", 1));
        let e = s.admin
            .post::<_, serde_json::Value>("/api/v1/tenants/lab/volumes/src/snapshots", &json!({"name": "snap1"}))
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(409), "one name per volume");
        a.sync_once(None).await.unwrap();
        let listed: Vec<kumo_api_types::VolumeSnapshot> =
            s.admin.get("/api/v1/tenants/lab/volumes/src/snapshots").await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].state, "available");
        assert!(qemu_io(&src_file, "write", 0x33));

        // Copies: bad references refused, then one made on the same host
        // holding the snapshot's contents, not the volume's since.
        for (body, status) in [
            (json!({"name": "copy", "from_snapshot": "src"}), 400),
            (json!({"name": "copy", "from_snapshot": "src@nope"}), 404),
            (json!({"name": "copy", "from_snapshot": "nope@snap1"}), 404),
        ] {
            assert_eq!(post(s, "", body.clone()).await.unwrap_err(), status, "{body}");
        }
        let copy = post(s, "", json!({"name": "copy", "from_snapshot": "src@snap1"})).await.unwrap();
        assert_eq!((copy.size_gib, copy.host.as_deref()), (1, Some("snap-a")));
        passes_until(&[&a], "the copy to be made", async || {
            volume(s, "copy").await.state == VolumeState::Available
        })
        .await;
        let copy_file = pool.join(format!("vol-{}.qcow2", copy.id));
        assert!(qemu_io(&copy_file, "read", 0x5a), "the copy has the snapshot's contents");
        assert!(qemu_io(&src_file, "read", 0x33), "the volume kept its own");

        // Neither the snapshot nor its volume goes while a copy needs it.
        let e = s.admin.delete("/api/v1/tenants/lab/volumes/src/snapshots/snap1").await.unwrap_err();
        assert_eq!(e.status(), Some(409));
        let e = s.admin.delete("/api/v1/tenants/lab/volumes/src").await.unwrap_err();
        assert_eq!(e.status(), Some(409));
        s.admin.delete("/api/v1/tenants/lab/volumes/copy").await.unwrap();
        a.sync_once(None).await.unwrap();
        assert!(!copy_file.exists());
        s.admin.delete("/api/v1/tenants/lab/volumes/src/snapshots/snap1").await.unwrap();
        passes_until(&[&a], "the snapshot to be merged away", async || {
            let listed: Vec<kumo_api_types::VolumeSnapshot> =
                s.admin.get("/api/v1/tenants/lab/volumes/src/snapshots").await.unwrap();
            listed.is_empty()
        })
        .await;
        assert!(qemu_io(&src_file, "read", 0x33), "the volume outlives its snapshot");
        let files: Vec<String> = std::fs::read_dir(&pool)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(files, [format!("vol-{}.qcow2", src.id)], "nothing else left");
        let _ = a;
    }
}

on_both_backends! {
    async fn a_detached_volume_moves_to_another_host_whole(s: &TestServer) {
        s.tenant("lab").await;
        let _libvirtd = virt::connect::Connect::open(Some("test:///default")).unwrap();
        let (dir, a, b) = two_hosts(s, "mv").await;
        let pass = async || sync_both(&a, &b).await;
        let file = |host: &str, id: uuid::Uuid| {
            dir.path().join(format!("{host}/state/volumes/vol-{id}.qcow2"))
        };
        let names_of = |host: &str, id: uuid::Uuid| -> Vec<String> {
            std::fs::read_dir(dir.path().join(format!("{host}/state/volumes")))
                .map(|d| {
                    d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                        .filter(|n| n.contains(&id.to_string()))
                        .collect()
                })
                .unwrap_or_default()
        };

        // `data` on mv-a, a copy of a snapshot of `base`, with a marker.
        let base = post(s, "", json!({"name": "base", "size_gib": 1})).await.unwrap();
        assert_eq!(base.host.as_deref(), Some("mv-a"));
        pass().await;
        assert!(qemu_io(&file("mv-a", base.id), "write", 0x5a));
        let _: kumo_api_types::VolumeSnapshot = s.admin
            .post("/api/v1/tenants/lab/volumes/base/snapshots", &json!({"name": "snap1"}))
            .await
            .unwrap();
        pass().await;
        let data = post(s, "", json!({"name": "data", "from_snapshot": "base@snap1"})).await.unwrap();
        passes_until(&[&a, &b], "the copy to be made", async || {
            volume(s, "data").await.state == VolumeState::Available
        })
        .await;
        assert!(qemu_io(&file("mv-a", data.id), "read", 0x5a));

        // Refusals change nothing.
        assert_eq!(post(s, "/data/move", json!({"host": "nope"})).await.unwrap_err(), 404);
        assert_eq!(post(s, "/data/move", json!({"hots": "mv-b"})).await.unwrap_err(), 400);
        assert_eq!(post(s, "/base/move", json!({"host": "mv-b"})).await.unwrap_err(), 409, "it has a snapshot");
        let _: serde_json::Value = s.admin.post("/api/v1/hosts/mv-b/drain", &json!({})).await.unwrap();
        assert_eq!(post(s, "/data/move", json!({"host": "mv-b"})).await.unwrap_err(), 409, "a drained host");
        let _: serde_json::Value = s.admin.post("/api/v1/hosts/mv-b/undrain", &json!({})).await.unwrap();
        s.tenant("other").await;
        let e = s.admin
            .post::<_, Volume>("/api/v1/tenants/other/volumes/data/move", &json!({"host": "mv-b"}))
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(404), "another tenant's volume does not exist");
        let v = volume(s, "data").await;
        assert_eq!((v.state, v.host.as_deref(), v.moving_to.as_deref()), (VolumeState::Available, Some("mv-a"), None));

        // Moving: it stays on mv-a and cannot be attached, grown,
        // snapshotted or deleted until the copy on mv-b is whole.
        let m = post(s, "/data/move", json!({"host": "mv-b"})).await.unwrap();
        assert_eq!((m.state, m.host.as_deref(), m.moving_to.as_deref()), (VolumeState::Moving, Some("mv-a"), Some("mv-b")));
        let portal = s.portal_admin().await;
        let page = s.page(&portal, "/t/lab/volumes").await;
        assert!(page.contains("moving → mv-b"), "the portal says where it goes: {page}");
        assert_eq!(post(s, "/data/resize", json!({"size_gib": 2})).await.unwrap_err(), 409);
        assert_eq!(post(s, "/data/snapshots", json!({"name": "snapx"})).await.unwrap_err(), 409);
        assert_eq!(s.admin.delete("/api/v1/tenants/lab/volumes/data").await.unwrap_err().status(), Some(409));
        let moved = std::time::Instant::now();
        loop {
            pass().await;
            let v = volume(s, "data").await;
            if v.state == VolumeState::Available {
                assert_eq!(v.host.as_deref(), Some("mv-b"));
                assert_eq!(v.moving_to, None);
                break;
            }
            assert_eq!(v.state, VolumeState::Moving, "{:?}", v.reason);
            assert!(moved.elapsed() < Duration::from_secs(90), "still moving: {:?}", v.reason);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        println!("1 GiB volume moved in {:?}", moved.elapsed());
        assert!(qemu_io(&file("mv-b", data.id), "read", 0x5a), "the marker arrived");
        pass().await;
        assert!(names_of("mv-a", data.id).is_empty(), "mv-a removed its copy: {:?}", names_of("mv-a", data.id));
        // The copy stands alone: the snapshot it was made from can go.
        s.admin.delete("/api/v1/tenants/lab/volumes/base/snapshots/snap1").await.unwrap();

        // To the host it is on: nothing. A move cancelled (by naming the
        // host it is on) leaves nothing at the destination.
        assert_eq!(post(s, "/data/move", json!({"host": "mv-b"})).await.unwrap().state, VolumeState::Available);
        assert_eq!(post(s, "/data/move", json!({"host": "mv-a"})).await.unwrap().state, VolumeState::Moving);
        pass().await;
        let back = post(s, "/data/move", json!({"host": "mv-b"})).await.unwrap();
        assert_eq!((back.state, back.host.as_deref(), back.moving_to), (VolumeState::Available, Some("mv-b"), None));
        pass().await;
        pass().await;
        assert!(!a.transfers.importing(kumo_api_types::TransferKind::Volume, data.id));
        assert!(names_of("mv-a", data.id).is_empty(), "{:?}", names_of("mv-a", data.id));
        assert!(qemu_io(&file("mv-b", data.id), "read", 0x5a), "mv-b keeps it");
    }
}

on_both_backends! {
    async fn a_vm_unshelved_anywhere_takes_its_root_disk_and_volumes_along(s: &TestServer) {
        s.tenant("lab").await;
        let _libvirtd = virt::connect::Connect::open(Some("test:///default")).unwrap();
        let (dir, a, b) = two_hosts(s, "any").await;
        let pass = async || sync_both(&a, &b).await;
        let work: Vm = s.admin.create_vm("lab", &small_vm("work")).await.unwrap();
        let from = work.host.clone().unwrap();
        let to = if from == "any-a" { "any-b" } else { "any-a" };
        let ckpt = post(s, "", json!({"name": "ckpt", "size_gib": 1, "vm": "work"})).await.unwrap();
        pass().await;
        post(s, "/ckpt/attach", json!({"vm": "work"})).await.unwrap();
        pass().await;
        let root = |host: &str| dir.path().join(format!("{host}/state/vms/{}/disk.qcow2", work.id));
        let vol = |host: &str| dir.path().join(format!("{host}/state/volumes/vol-{}.qcow2", ckpt.id));
        // What the guest wrote: on its root disk and on its volume.
        assert!(qemu_io(&root(&from), "write", 0x5a));
        assert!(qemu_io(&vol(&from), "write", 0xa5));
        // And its UEFI variable store (boot entries it set).
        let nvram = |host: &str| root(host).with_file_name("nvram.fd");
        let store: Vec<u8> = (0..131_072u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(nvram(&from), &store).unwrap();
        let anywhere = |vm: &str, tenant: &str| {
            s.http()
                .post(format!("{}/api/v1/tenants/{tenant}/vms/{vm}/unshelve?anywhere=true", s.url))
                .bearer_auth(&s.admin_token)
                .send()
        };
        assert_eq!(anywhere("work", "lab").await.unwrap().status(), 409, "a running VM");
        assert_eq!(act(s, "work", "shelve").await, 202);
        pass().await;
        assert_eq!(s.admin.vm("lab", "work").await.unwrap().state, kumo_api_types::VmState::Shelved);
        s.tenant("other").await;
        assert_eq!(anywhere("work", "other").await.unwrap().status(), 404, "another tenant's VM");
        assert_eq!(
            s.admin.vm("lab", "work").await.unwrap().state,
            kumo_api_types::VmState::Shelved,
            "refusals change nothing"
        );

        // Its host is drained: unshelved anywhere, it goes to the other,
        // held back (no domain, no fresh disk) until its disks are there.
        let _: serde_json::Value = s.admin.post(&format!("/api/v1/hosts/{from}/drain"), &json!({})).await.unwrap();
        let r = anywhere("work", "lab").await.unwrap();
        assert_eq!(r.status(), 202);
        let v: Vm = r.json().await.unwrap();
        assert!(v.reason.as_deref().unwrap_or("").contains("any host"), "{v:?}");
        let started = std::time::Instant::now();
        let mut saw_moving = false;
        loop {
            let v = s.admin.vm("lab", "work").await.unwrap();
            if v.state == kumo_api_types::VmState::Scheduled {
                // First what moves where; then a retried copy's reason
                // (the first fetch comes before the source was told).
                let why = v.reason.clone().unwrap_or_default();
                if !saw_moving {
                    assert!(why.contains("root disk and 1 volume(s)") && why.contains(to), "{why}");
                }
                // (none once all is there, until the agent defines it).
                assert!(why.is_empty() || why.contains("root disk") || why.contains("volume"), "{why}");
                assert_eq!(v.host.as_deref(), Some(to));
                saw_moving = true;
            }
            if v.state == kumo_api_types::VmState::Running {
                assert_eq!(v.host.as_deref(), Some(to));
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(90), "not unshelved: {v:?}");
            pass().await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        println!("unshelved on another host, disks moved, in {:?}", started.elapsed());
        assert!(saw_moving, "it waited for its disks in a visible state");
        assert!(qemu_io(&root(to), "read", 0x5a), "its root disk came along");
        assert!(qemu_io(&vol(to), "read", 0xa5), "and its volume");
        assert_eq!(std::fs::read(nvram(to)).unwrap(), store, "and its variable store");
        let c = volume(s, "ckpt").await;
        assert_eq!((c.state, c.host.as_deref(), c.vm.as_deref()), (VolumeState::Attached, Some(to), Some("work")));
        assert_eq!(serials_in(work.id), [c.serial], "attached on the new host");
        pass().await;
        assert!(!root(&from).exists(), "the old host removed its root disk");
        assert!(!vol(&from).exists(), "and its copy of the volume");
        assert!(!nvram(&from).exists(), "and its variable store");

        // Deleted while its disk moves: neither host keeps a copy.
        let _: serde_json::Value = s.admin.post(&format!("/api/v1/hosts/{from}/undrain"), &json!({})).await.unwrap();
        let _: serde_json::Value = s.admin.post(&format!("/api/v1/hosts/{to}/drain"), &json!({})).await.unwrap();
        assert_eq!(act(s, "work", "shelve").await, 202);
        pass().await;
        // This time through the portal's button.
        let portal = s.portal_admin().await;
        let page = s.page(&portal, "/t/lab/vms").await;
        assert!(page.contains("data-action=\"unshelve-anywhere\""), "{page}");
        let csrf = crate::harness::csrf_of(&page);
        let r = portal
            .post(format!("{}/t/lab/vms/work/unshelve-anywhere", s.url))
            .form(&[("csrf", csrf.as_str())])
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success() || r.status().is_redirection(), "{}", r.status());
        let placed = std::time::Instant::now();
        while s.admin.vm("lab", "work").await.unwrap().state != kumo_api_types::VmState::Scheduled {
            assert!(placed.elapsed() < Duration::from_secs(30), "not placed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        s.admin.delete("/api/v1/tenants/lab/vms/work").await.unwrap();
        for _ in 0..3 {
            pass().await;
        }
        assert!(s.admin.vm("lab", "work").await.is_err(), "deleted");
        assert!(!root(to).exists(), "the old host dropped its root disk");
        assert!(!root(&from).exists(), "nothing half-made stays on the new one");
        assert_eq!(volume(s, "ckpt").await.vm, None, "the volume outlives it");
        forget(&[work.id]);
    }
}
