//! Project shares through the API with real agents (libvirt's test driver,
//! a shares root in the test's directory that both hosts see): made by
//! their keeper host, mounted into VMs and every member of a cluster (the
//! domains' definitions carry the virtiofs filesystem and shared memory),
//! refused across tenants, for mounted deletes, past the quota and without
//! points; a share whose directory went missing fails its own VMs only;
//! charged per GiB-hour of its size. On both databases.

use std::path::Path;

use kumo_agent::run::{Agent, AgentConfig};
use kumo_api_types::{Share, ShareState, Vm, VmCreate, VmState};
use serde_json::json;

use crate::harness::{on_both_backends, scratch, TestServer};

fn agent_config(s: &TestServer, join: &str, dir: &Path, name: &str) -> AgentConfig {
    let sysfs = dir.join(name).join("sysfs");
    kumo_topology::fixtures::write(
        &kumo_topology::fixtures::machine("cpu-only").unwrap(),
        &sysfs,
    )
    .unwrap();
    let mut c = crate::harness::agent_config(
        s,
        Some(join.to_owned()),
        &sysfs,
        &dir.join(name).join("state"),
        name,
    );
    c.shares = Some(kumo_agent::shares::SharesConfig {
        root: dir.join("shared-fs"),
        require_mount: false,
    });
    c
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
        shares: Vec::new(),
        on_reclaim: None,
        on_host_loss: None,
        notice_seconds: None,
        public_ip: false,
        queue: false,
        reservation: None,
    }
}

async fn share(s: &TestServer, tenant: &str, name: &str) -> Result<Share, u16> {
    s.admin
        .get(&format!("/api/v1/tenants/{tenant}/shares/{name}"))
        .await
        .map_err(|e| e.status().unwrap_or(0))
}

async fn post(s: &TestServer, path: &str, body: serde_json::Value) -> Result<Share, u16> {
    s.admin
        .post::<_, Share>(&format!("/api/v1/tenants/lab{path}"), &body)
        .await
        .map_err(|e| e.status().unwrap_or(0))
}

/// The virtiofs filesystems (tag → source) and whether memory is shared,
/// of a domain's persistent definition on the test driver.
fn definition(id: uuid::Uuid) -> (std::collections::BTreeMap<String, String>, bool) {
    let conn = virt::connect::Connect::open(Some("test:///default")).unwrap();
    let d = conn.lookup_domain_by_uuid_string(&id.to_string()).unwrap();
    let xml = d.xml_desc(2).unwrap();
    (
        kumo_topology::domain_xml::filesystems_in(&xml),
        xml.contains("<access mode='shared'/>") || xml.contains("<access mode=\"shared\"/>"),
    )
}

fn forget(ids: &[uuid::Uuid]) {
    let conn = virt::connect::Connect::open(Some("test:///default")).unwrap();
    for id in ids {
        if let Ok(d) = conn.lookup_domain_by_uuid_string(&id.to_string()) {
            let _ = d.destroy();
            let _ = d.undefine();
        }
    }
}

on_both_backends! {
    async fn project_shares_are_made_mounted_and_refused_where_they_should_be(s: &TestServer) {
        s.bare_tenant("lab").await;
        s.tenant("other").await;
        let _libvirtd = virt::connect::Connect::open(Some("test:///default")).unwrap();
        let dir = scratch();
        std::fs::create_dir_all(dir.path().join("shared-fs")).unwrap();
        let join = s.join_token().await;
        let a = Agent::start(agent_config(s, &join, dir.path(), "sh-a")).await.unwrap();
        let b = Agent::start(agent_config(s, &join, dir.path(), "sh-b")).await.unwrap();
        // A third host without the shared filesystem: VMs with shares
        // never go there.
        let mut bare = agent_config(s, &join, dir.path(), "sh-c");
        bare.shares = None;
        let c = Agent::start(bare).await.unwrap();
        a.report_inventory().await.unwrap();
        b.report_inventory().await.unwrap();
        c.report_inventory().await.unwrap();
        let pass = async || {
            a.sync_once(None).await.unwrap();
            b.sync_once(None).await.unwrap();
            c.sync_once(None).await.unwrap();
        };

        // Without quota, then bad requests: nothing is made.
        assert_eq!(post(s, "/shares", json!({"name": "datasets", "size_gib": 10})).await.unwrap_err(), 409);
        let mut q = s.admin.quota("lab").await.unwrap();
        q.share_gib = 100;
        q.vms = 10;
        q.vcpus = 10;
        q.memory_gib = 10;
        q.disk_gib = 100;
        s.admin.set_quota("lab", &q).await.unwrap();
        for (body, status) in [
            (json!({"name": "datasets", "size_gib": 0}), 400),
            (json!({"name": "datasets", "size_gib": 101}), 409),
            (json!({"name": "Bad Name", "size_gib": 1}), 400),
            (json!({"name": "datasets"}), 400),
        ] {
            assert_eq!(post(s, "/shares", body.clone()).await.unwrap_err(), status, "{body}");
        }
        assert!(s.admin.list_all::<Share>("/api/v1/tenants/lab/shares").await.unwrap().is_empty());

        // Made by its keeper: creating, then available with its directory.
        let ds = post(s, "/shares", json!({"name": "datasets", "size_gib": 60})).await.unwrap();
        assert_eq!(ds.state, ShareState::Creating);
        assert_eq!(post(s, "/shares", json!({"name": "datasets", "size_gib": 1})).await.unwrap_err(), 409);
        assert_eq!(post(s, "/shares", json!({"name": "more", "size_gib": 41})).await.unwrap_err(), 409, "60 + 41 > 100");
        pass().await;
        let ds = share(s, "lab", "datasets").await.unwrap();
        assert_eq!(ds.state, ShareState::Available, "{:?}", ds.reason);
        let ds_dir = dir.path().join("shared-fs").join(ds.id.to_string());
        assert!(ds_dir.is_dir(), "{} is not there", ds_dir.display());
        // Measured off the pass: a later pass reports it.
        let t = std::time::Instant::now();
        let mut ds = ds;
        while ds.used_bytes.is_none() && t.elapsed() < std::time::Duration::from_secs(30) {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            pass().await;
            ds = share(s, "lab", "datasets").await.unwrap();
        }
        assert_eq!(ds.used_bytes.map(|b| b < 1 << 20), Some(true), "{ds:?}");

        // Another tenant neither sees nor mounts it.
        assert_eq!(share(s, "other", "datasets").await.unwrap_err(), 404);
        let mut theirs = small_vm("theirs");
        theirs.shares = vec![kumo_api_types::ShareMountRequest::parse("datasets").unwrap()];
        assert_eq!(s.admin.create_vm("other", &theirs).await.unwrap_err().status(), Some(404));

        // Paths that are not plain directories are refused.
        for path in ["/data/../etc", "data", "/proc/x", "/"] {
            let mut bad = small_vm("bad");
            bad.shares = vec![kumo_api_types::ShareMountRequest {
                share: "datasets".into(),
                path: Some(path.into()),
                read_only: false,
            }];
            assert_eq!(s.admin.create_vm("lab", &bad).await.unwrap_err().status(), Some(400), "{path}");
        }

        // A VM that mounts it: its definition has the filesystem (the
        // share's directory, nothing above it) and shared memory.
        let mut web = small_vm("web");
        web.shares = vec![kumo_api_types::ShareMountRequest::parse("datasets:/data").unwrap()];
        let web: Vm = s.admin.create_vm("lab", &web).await.unwrap();
        assert_ne!(web.host.as_deref(), Some("sh-c"), "a host without the shared filesystem");
        assert_eq!(web.shares.len(), 1);
        assert_eq!((web.shares[0].path.as_str(), web.shares[0].tag.as_str()), ("/data", "datasets"));
        pass().await;
        let (fs, shared) = definition(web.id);
        assert_eq!(fs.get("datasets").map(Path::new), Some(ds_dir.as_path()));
        assert!(shared, "virtiofs needs the guest's memory shared");
        let changes = (a.reconciler.lock().unwrap().changes, b.reconciler.lock().unwrap().changes);
        pass().await;
        let after = (a.reconciler.lock().unwrap().changes, b.reconciler.lock().unwrap().changes);
        assert_eq!(after, changes, "a second pass changes nothing");
        let ds = share(s, "lab", "datasets").await.unwrap();
        assert_eq!(ds.mounts.len(), 1);
        assert_eq!(ds.mounts[0].condition.as_deref(), Some("mounted"), "{ds:?}");

        // A cluster whose every member mounts it.
        let cl: kumo_api_types::Cluster = s
            .admin
            .post(
                "/api/v1/tenants/lab/clusters",
                &json!({"name": "train", "size": 2, "vcpus": 1, "memory_gib": 1, "disk_gib": 1,
                        "shares": [{"share": "datasets", "path": "/data", "read_only": false}]}),
            )
            .await
            .unwrap();
        assert_eq!(cl.members.len(), 2);
        pass().await;
        let mut ids = vec![web.id];
        for m in &cl.members {
            let vm: Vm = s.admin.vm("lab", &m.name).await.unwrap();
            assert_eq!(vm.shares.len(), 1, "{}", m.name);
            assert_ne!(vm.host.as_deref(), Some("sh-c"), "{}", m.name);
            let (fs, _) = definition(vm.id);
            assert_eq!(fs.get("datasets").map(Path::new), Some(ds_dir.as_path()), "{}", m.name);
            ids.push(vm.id);
        }
        assert_eq!(share(s, "lab", "datasets").await.unwrap().mounts.len(), 3);

        // Mounted: it does not go; grown, it is charged at its new size.
        let e = s.admin.delete("/api/v1/tenants/lab/shares/datasets").await.unwrap_err();
        assert_eq!(e.status(), Some(409));
        assert_eq!(post(s, "/shares/datasets/grow", json!({"size_gib": 50})).await.unwrap_err(), 400, "never shrinks");
        assert_eq!(post(s, "/shares/datasets/grow", json!({"size_gib": 101})).await.unwrap_err(), 409, "past the quota");
        assert_eq!(post(s, "/shares/datasets/grow", json!({"size_gib": 80})).await.unwrap().size_gib, 80);

        // Mounted into a running VM later: at its next start, said so.
        let ck = post(s, "/shares", json!({"name": "ckpt", "size_gib": 5})).await.unwrap();
        assert_eq!(post(s, "/vms/web/shares", json!({"share": "ckpt"})).await.unwrap_err(), 409, "not made yet");
        pass().await;
        assert_eq!(post(s, "/vms/web/shares", json!({"share": "ckpt", "path": "/data"})).await.unwrap_err(), 400, "a path in use");
        let mounted = post(s, "/vms/web/shares", json!({"share": "ckpt"})).await.unwrap();
        assert_eq!(mounted.mounts[0].path, "/mnt/ckpt");
        assert_eq!(post(s, "/vms/web/shares", json!({"share": "ckpt"})).await.unwrap_err(), 409, "twice");
        pass().await;
        let ck_dir = dir.path().join("shared-fs").join(ck.id.to_string());
        let (fs, _) = definition(web.id);
        assert_eq!(fs.get("ckpt").map(Path::new), Some(ck_dir.as_path()), "in the definition");
        let ck = share(s, "lab", "ckpt").await.unwrap();
        assert!(ck.mounts[0].condition.as_deref().unwrap().starts_with("at the next start"), "{ck:?}");

        // Its directory lost (the filesystem not mounted, the data gone):
        // the share and the VMs that would mount it say so; a VM without
        // it on the same hosts goes on.
        std::fs::remove_dir(&ck_dir).unwrap();
        pass().await;
        let ck = share(s, "lab", "ckpt").await.unwrap();
        assert!(ck.reason.as_deref().unwrap_or_default().contains("missing"), "{ck:?}");
        assert!(!ck_dir.exists(), "never made again empty");
        let mut late = small_vm("late");
        late.shares = vec![kumo_api_types::ShareMountRequest::parse("ckpt").unwrap()];
        let late: Vm = s.admin.create_vm("lab", &late).await.unwrap();
        let plain: Vm = s.admin.create_vm("lab", &small_vm("plain")).await.unwrap();
        ids.extend([late.id, plain.id]);
        pass().await;
        let late: Vm = s.admin.vm("lab", "late").await.unwrap();
        assert_eq!(late.state, VmState::Error);
        assert!(late.reason.as_deref().unwrap_or_default().contains("missing"), "{late:?}");
        assert!(late.shares[0].condition.as_deref().unwrap().starts_with("failed"), "{late:?}");
        assert_eq!(s.admin.vm("lab", "plain").await.unwrap().state, VmState::Running);
        assert_eq!(s.admin.vm("lab", "web").await.unwrap().state, VmState::Running, "a running VM keeps running");

        // Unmounted and deleted: the keeper removes the directory.
        let e = s.admin.delete("/api/v1/tenants/lab/vms/web/shares/nope").await.unwrap_err();
        assert_eq!(e.status(), Some(404));
        s.admin.delete("/api/v1/tenants/lab/vms/web/shares/ckpt").await.unwrap();
        s.admin.delete("/api/v1/tenants/lab/vms/late").await.unwrap();
        let e = s.admin.delete("/api/v1/tenants/lab/shares/ckpt").await.unwrap_err();
        assert_eq!(e.status(), Some(409), "mounted until the deleted VM is gone");
        pass().await;
        s.admin.delete("/api/v1/tenants/lab/shares/ckpt").await.unwrap();
        assert_eq!(share(s, "lab", "ckpt").await.unwrap().state, ShareState::Deleting);
        pass().await;
        assert_eq!(share(s, "lab", "ckpt").await.unwrap_err(), 404, "its row goes once its keeper says so");
        for vm in ["web", "train-0", "train-1"] {
            s.admin.delete(&format!("/api/v1/tenants/lab/vms/{vm}")).await.unwrap();
        }
        pass().await;
        pass().await;
        assert!(share(s, "lab", "datasets").await.unwrap().mounts.is_empty(), "a VM's mounts go with it");
        std::fs::write(ds_dir.join("weights.bin"), b"x").unwrap();
        s.admin.delete("/api/v1/tenants/lab/shares/datasets").await.unwrap();
        pass().await;
        assert!(!ds_dir.exists(), "its data went with it");
        forget(&ids);
    }
}

#[tokio::test]
async fn shares_are_charged_per_gib_hour_and_need_points() {
    use chrono::{TimeZone, Utc};
    let t0 = Utc.with_ymd_and_hms(2026, 11, 10, 9, 0, 0).unwrap();
    let clock = kumo_server::clock::Clock::manual(t0);
    let s =
        TestServer::start_with(crate::harness::Backend::Sqlite, |c| c.clock = clock.clone()).await;
    let _: kumo_api_types::Rates = s
        .admin
        .put(
            "/api/v1/rates",
            &json!({"effective_from": t0,
                    "prices": {"share_gib": {"guaranteed": "0.6", "spot": "0.6"}}}),
        )
        .await
        .unwrap();
    s.tenant("lab").await;
    let mut q = s.admin.quota("lab").await.unwrap();
    q.share_gib = 5000;
    s.admin.set_quota("lab", &q).await.unwrap();
    let mut agent = s.sim_agent("keeper-001", "cpu-only").await;
    assert!(agent.heartbeat_with_shares().await.is_success());
    let grant =
        |amount: &str| json!({"amount": amount, "expires_at": t0 + chrono::Duration::days(3650)});
    let _: kumo_api_types::PointGrant = s
        .admin
        .post("/api/v1/tenants/lab/points/grants", &grant("1000"))
        .await
        .unwrap();
    post(&s, "/shares", json!({"name": "data", "size_gib": 10}))
        .await
        .unwrap();
    agent.converge().await;
    clock.advance(chrono::Duration::minutes(10));
    post(&s, "/shares/data/grow", json!({"size_gib": 30}))
        .await
        .unwrap();
    clock.advance(chrono::Duration::minutes(10));
    s.admin
        .delete("/api/v1/tenants/lab/shares/data")
        .await
        .unwrap();
    agent.converge().await;
    clock.advance(chrono::Duration::minutes(10));
    kumo_server::app::metering::post_due(&s.server.state)
        .await
        .unwrap();
    let st: kumo_api_types::Statement = s
        .admin
        .get("/api/v1/tenants/lab/statements/2026-11")
        .await
        .unwrap();
    // 10 GiB × 1/6 h × 0.6 + 30 GiB × 1/6 h × 0.6 = 1 + 3 points.
    let held: Vec<(String, i64, String)> = st
        .lines
        .iter()
        .filter(|l| l.resource == "share_gib")
        .map(|l| (l.vm.clone(), l.seconds, l.amount.clone()))
        .collect();
    let total: f64 = held.iter().map(|h| h.2.parse::<f64>().unwrap()).sum();
    assert!((total - 4.0).abs() < 1e-9, "{held:?}");
    assert_eq!(held.iter().map(|h| h.1).sum::<i64>(), 1200, "{held:?}");
    // Out of points (1,000 GiB for 10 hours is 6,000 of them): no share
    // is made or grown.
    let spend = post(&s, "/shares", json!({"name": "big", "size_gib": 1000})).await;
    assert!(spend.is_ok(), "{spend:?}");
    agent.converge().await;
    clock.advance(chrono::Duration::hours(10));
    kumo_server::app::metering::post_due(&s.server.state)
        .await
        .unwrap();
    kumo_server::app::budget::enforce(&s.server.state)
        .await
        .unwrap();
    assert_eq!(
        post(&s, "/shares", json!({"name": "more", "size_gib": 1}))
            .await
            .unwrap_err(),
        402
    );
    assert_eq!(
        post(&s, "/shares/big/grow", json!({"size_gib": 1001}))
            .await
            .unwrap_err(),
        402
    );

    // Its keeper lost: the share moves to a host that can keep it, which
    // is told at once.
    let other = s.sim_agent("keeper-002", "cpu-only").await;
    assert!(other.heartbeat_with_shares().await.is_success());
    use sea_orm::{ActiveModelTrait, EntityTrait, Set};
    let row = kumo_server::entity::shares::Entity::find()
        .all(s.db())
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.name == "big")
        .unwrap();
    assert_eq!(row.keeper_host_id, Some(agent.host_id));
    let lost = kumo_server::entity::hosts::ActiveModel {
        id: Set(agent.host_id),
        state: Set("unreachable".into()),
        ..Default::default()
    };
    lost.update(s.db()).await.unwrap();
    assert_eq!(
        kumo_server::app::shares::rekeep(&s.server.state)
            .await
            .unwrap(),
        1
    );
    let row = kumo_server::entity::shares::Entity::find_by_id(row.id)
        .one(s.db())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.keeper_host_id, Some(other.host_id));
    assert_eq!(
        kumo_server::app::shares::rekeep(&s.server.state)
            .await
            .unwrap(),
        0,
        "once"
    );
}
