//! The noisy neighbour: tenant A does its worst against the shared parts
//! (every reserved address range, segments past its quota, a segment its
//! hosts cannot set up, a VM its host cannot build, a stolen join token
//! used to take a host over)
//! while tenant B's VMs on the same hosts are created, reach `running`,
//! stop and are deleted in their usual time. Real `kumo-agent` processes
//! (libvirt `test:///`), tenant networks in network namespaces, on SQLite
//! and on PostgreSQL.

use std::time::{Duration, Instant};

use kumo_api_types::{AgentRegister, Quota, Role, SegmentCreate, SegmentKind, VmCreate, VmState};
use kumo_cli::client::{Client, ClientError};
use vxlan_manager::testbed::{ip, Fabric};

use crate::harness::{fixture_topology, Backend, TestServer};
use crate::networks::{start_agent, Host};
use crate::segments::{seg, vm_on};

/// B's VMs must reach each state within this; they take about a second
/// on an idle fleet.
const USUAL: Duration = Duration::from_secs(30);

fn segment(name: &str, cidr: &str) -> SegmentCreate {
    seg(name, SegmentKind::Ethernet, cidr)
}

fn vm(name: &str, segment: &str) -> VmCreate {
    vm_on(name, &[(segment, None)])
}

fn status_of(e: &ClientError) -> u16 {
    match e {
        ClientError::Api(p) => p.status,
        ClientError::Unexpected { status, .. } => *status,
        other => panic!("no answer: {other}"),
    }
}

/// Waits until each VM is in `state`; answers how long that took.
async fn until(c: &Client, tenant: &str, vms: &[&str], state: VmState) -> Duration {
    let start = Instant::now();
    for name in vms {
        loop {
            let v = c.vm(tenant, name).await.unwrap();
            if v.state == state {
                break;
            }
            assert!(
                start.elapsed() < USUAL,
                "{tenant}/{name} is {:?} ({:?}), not {state:?}, after {:?}",
                v.state,
                v.reason,
                start.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    start.elapsed()
}

async fn noisy_neighbour(backend: Backend) {
    let fab = Fabric::new(2);
    let s = TestServer::start(backend).await;
    for t in ["noisy", "quiet"] {
        s.tenant(t).await;
    }
    let (a, _) = s.user("mallory").await;
    let (b, _) = s.user("bob").await;
    s.add("noisy", "mallory", Role::Member).await;
    s.add("quiet", "bob", Role::Member).await;
    let mut q: Quota = s.admin.quota("noisy").await.unwrap();
    q.segments = 3;
    s.quota("noisy", &q).await;
    let root = crate::harness::scratch();
    let join = s.join_token().await;
    let agents: Vec<Host> = (0..2)
        .map(|h| start_agent(&s, &fab, h, "cpu-only", &join, root.path(), &[]))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.admin.list_hosts().await.unwrap().len() < 2 {
        assert!(Instant::now() < deadline, "agents did not register");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Every reserved or foreign range: a clear 4xx, nothing made.
    for cidr in [
        "224.0.0.0/24",
        "239.255.255.0/24",
        "127.0.0.0/24",
        "169.254.0.0/24",
        "0.0.0.0/24",
        "240.0.0.0/24",
        "255.255.255.0/29",
        "8.8.8.0/24",
        "203.0.113.0/24",
    ] {
        let e = a
            .create_segment("noisy", &segment("bad", cidr))
            .await
            .unwrap_err();
        assert_eq!(status_of(&e), 400, "{cidr}: {e}");
    }
    assert!(a.list_segments("noisy").await.unwrap().is_empty());
    // Segments past the quota: the shared VNI and VLAN pools keep room.
    for n in ["seg-1", "seg-2", "seg-3"] {
        a.create_segment("noisy", &segment(n, "10.0.0.0/24"))
            .await
            .unwrap();
    }
    let e = a
        .create_segment("noisy", &segment("seg-4", "10.0.0.0/24"))
        .await
        .unwrap_err();
    assert!(
        matches!(status_of(&e), 403 | 409 | 422 | 429),
        "past quota: {e}"
    );
    b.create_segment("quiet", &segment("quiet-net", "10.0.0.0/24"))
        .await
        .unwrap();

    // A segment neither host can set up: something holds its VNI there.
    let seg1 = a.segment("noisy", "seg-1").await.unwrap();
    for h in 0..2 {
        let local = Fabric::underlay(h).to_string();
        let vni = seg1.vni.to_string();
        ip(&[
            "-n",
            &fab.host_ns(h),
            "link",
            "add",
            "squat",
            "type",
            "vxlan",
            "id",
            &vni,
            "local",
            &local,
            "dstport",
            "4789",
        ]);
    }
    a.create_vm("noisy", &vm("stuck", "seg-1")).await.unwrap();
    // A VM its host cannot build: its template's image is not there.
    let _: kumo_api_types::Template = s
        .admin
        .post(
            "/api/v1/templates",
            &serde_json::json!({"name": "broken", "image_path": "/nonexistent/base.qcow2",
                                "os": "none", "default_user": "root"}),
        )
        .await
        .unwrap();
    let mut unbuildable = vm("unbuildable", "seg-2");
    unbuildable.template = Some("broken".into());
    a.create_vm("noisy", &unbuildable).await.unwrap();

    // A stolen join token cannot take a host's name.
    let stolen = s.join_token().await;
    let r = reqwest::Client::new()
        .post(format!("{}/agent/v1/register", s.url))
        .json(&AgentRegister {
            join_token: stolen,
            name: "net-0".into(),
            topology: fixture_topology("cpu-only"),
            virt_type: "qemu".into(),
            scalable_unit: None,
            rails: Default::default(),
            underlay_ip: None,
            edge_uplink: None,
            transfer_url: None,
        })
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409, "{}", r.text().await.unwrap_or_default());

    // Meanwhile B's VMs live their usual lives on the same hosts.
    let names = ["vm-q1", "vm-q2", "vm-q3"];
    for n in names {
        b.create_vm("quiet", &vm(n, "quiet-net")).await.unwrap();
    }
    let running = until(&b, "quiet", &names, VmState::Running).await;
    let hosts: std::collections::BTreeSet<String> = b
        .list_vms("quiet")
        .await
        .unwrap()
        .into_iter()
        .filter_map(|v| v.host)
        .collect();
    let stuck = a.vm("noisy", "stuck").await.unwrap();
    assert!(
        stuck.host.as_ref().is_some_and(|h| hosts.contains(h)),
        "A's VM shares a host with B's: {:?} vs {hosts:?}",
        stuck.host
    );
    for n in names {
        b.vm_action("quiet", n, "stop").await.unwrap();
    }
    let stopped = until(&b, "quiet", &names, VmState::Stopped).await;
    for n in names {
        b.delete_vm("quiet", n).await.unwrap();
    }
    let start = Instant::now();
    while !b.list_vms("quiet").await.unwrap().is_empty() {
        assert!(start.elapsed() < USUAL, "B's VMs were not deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deleted = start.elapsed();
    eprintln!("quiet tenant beside a noisy one ({backend:?}): running in {running:?}, stopped in {stopped:?}, deleted in {deleted:?}");

    // A's own failure stays with A's resources, named: the VM says which
    // segment holds it back, the segment which host could not set it up.
    until(&a, "noisy", &["stuck"], VmState::Error).await;
    let stuck = a.vm("noisy", "stuck").await.unwrap();
    let reason = stuck.reason.unwrap_or_default();
    assert!(reason.contains("segment seg-1"), "{reason}");
    until(&a, "noisy", &["unbuildable"], VmState::Error).await;
    let reason = a
        .vm("noisy", "unbuildable")
        .await
        .unwrap()
        .reason
        .unwrap_or_default();
    assert!(reason.contains("qemu-img"), "{reason}");
    let start = Instant::now();
    loop {
        let seg = a.segment("noisy", "seg-1").await.unwrap();
        if let Some(f) = seg.faults.first() {
            assert!(f.message.contains("VXLAN"), "{f:?}");
            break;
        }
        assert!(start.elapsed() < USUAL, "the segment shows no fault");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(b
        .segment("quiet", "quiet-net")
        .await
        .unwrap()
        .faults
        .is_empty());
    // Every host still answers, and A can clean up after itself.
    for h in s.admin.list_hosts().await.unwrap() {
        assert_eq!(h.state.as_str(), "ready", "{}", h.name);
    }
    a.delete_vm("noisy", "stuck").await.unwrap();
    a.delete_vm("noisy", "unbuildable").await.unwrap();
    let start = Instant::now();
    while !a.list_vms("noisy").await.unwrap().is_empty() {
        assert!(start.elapsed() < USUAL, "A's stuck VM was not deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The agents' long polls would hold the server's shutdown.
    drop(agents);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noisy_neighbour_sqlite() {
    noisy_neighbour(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noisy_neighbour_postgres() {
    noisy_neighbour(Backend::Postgres).await;
}
