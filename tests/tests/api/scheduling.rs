//! The scheduler behind the API: quotas under concurrent requests, and
//! spot reclamation end to end on a simulated host (notice, grace period,
//! `preempted`, the guaranteed VM placed and running).

use std::time::{Duration, Instant};

use kumo_api_types::{Page, Quota, ServiceLevel, Vm, VmCreate, VmEvent, VmState};

use crate::harness::{on_both_backends, Backend, TestServer};

const H100: &str = "H100-SXM5-80GB";

fn vm(name: &str, gpus: u32, level: ServiceLevel) -> VmCreate {
    VmCreate {
        name: name.into(),
        gpus,
        gpu_model: Some(H100.into()),
        vcpus: Some(8 * gpus.max(1)),
        memory_gib: Some(16),
        disk_gib: None,
        template: None,
        service_level: level,
        ssh_keys: vec![],
    }
}

async fn get_vm(s: &TestServer, name: &str) -> Vm {
    s.admin
        .get(&format!("/api/v1/tenants/lab/vms/{name}"))
        .await
        .unwrap()
}

async fn events_of(s: &TestServer, vm: &Vm) -> Vec<String> {
    let page: Page<VmEvent> = s
        .admin
        .get("/api/v1/tenants/lab/events?limit=500")
        .await
        .unwrap();
    page.items
        .into_iter()
        .filter(|e| e.vm_id == vm.id)
        .map(|e| e.kind)
        .rev()
        .collect()
}

on_both_backends! {
    async fn concurrent_requests_never_exceed_the_quota(s: &TestServer) {
        s.bare_tenant("lab").await;
        let mut q = Quota { vcpus: 1000, memory_gib: 10_000, vms: 100, ..Default::default() };
        q.gpus.insert(H100.into(), 3);
        s.quota("lab", &q).await;
        let _agent = s.sim_agent("gpu-1", "hgx-h100").await;
        // Eight concurrent 1-GPU requests against a quota of three: three
        // win, five hear quota-exceeded naming the GPU model.
        let mut tasks = Vec::new();
        for i in 0..8 {
            let c = s.admin.clone();
            tasks.push(tokio::spawn(async move {
                c.post::<_, Vm>("/api/v1/tenants/lab/vms", &vm(&format!("vm-{i}"), 1, ServiceLevel::Guaranteed)).await
            }));
        }
        let mut ok = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(_) => ok += 1,
                Err(e) => {
                    let p = e.problem().unwrap();
                    assert_eq!(p.kind, "/problems/quota-exceeded", "{p:?}");
                    assert_eq!(p.resource.as_deref(), Some("gpus.H100-SXM5-80GB"));
                }
            }
        }
        assert_eq!(ok, 3);
        // vCPUs count too, and CPU-only VMs.
        let mut q = Quota { vcpus: 30, memory_gib: 10_000, vms: 100, ..Default::default() };
        q.gpus.insert(H100.into(), 3);
        s.quota("lab", &q).await;
        let e = s.admin.post::<_, Vm>("/api/v1/tenants/lab/vms", &vm("cpu", 0, ServiceLevel::Guaranteed)).await.unwrap_err();
        assert_eq!(e.problem().unwrap().resource.as_deref(), Some("vcpus"));
    }

    async fn spot_vms_never_preempt_and_guaranteed_never_are(s: &TestServer) {
        s.tenant("lab").await;
        let _agent = s.sim_agent("gpu-1", "hgx-h100").await;
        let _: Vm = s.admin.post("/api/v1/tenants/lab/vms", &vm("gpu-vm", 8, ServiceLevel::Guaranteed)).await.unwrap();
        // Full of guaranteed VMs: neither kind of request gets in.
        for level in [ServiceLevel::Spot, ServiceLevel::Guaranteed] {
            let e = s.admin.post::<_, Vm>("/api/v1/tenants/lab/vms", &vm("one-more", 1, level)).await.unwrap_err();
            assert_eq!(e.problem().unwrap().kind, "/problems/insufficient-capacity");
        }
        assert_eq!(get_vm(s, "gpu-vm").await.state, VmState::Scheduled);
    }
}

/// Fill a host with spot VMs, ask for a guaranteed 8-GPU VM: the spot VMs
/// get a notice with a deadline, are shut down after the grace period and
/// reported `preempted`, and the guaranteed VM is placed and runs.
#[tokio::test]
async fn a_guaranteed_vm_reclaims_spot_vms_after_the_grace_period() {
    let grace = Duration::from_secs(2);
    let s = TestServer::start_with(Backend::Sqlite, |c| c.preemption_grace = grace).await;
    s.tenant("lab").await;
    let mut agent = s.sim_agent("gpu-1", "hgx-h100").await;
    let mut spot = Vec::new();
    for i in 0..4 {
        let v: Vm = s
            .admin
            .post(
                "/api/v1/tenants/lab/vms",
                &vm(&format!("spot-{i}"), 2, ServiceLevel::Spot),
            )
            .await
            .unwrap();
        spot.push(v);
    }
    agent.converge().await;
    for v in &spot {
        assert_eq!(get_vm(&s, &v.name).await.state, VmState::Running);
    }
    let asked = Instant::now();
    let big: Vm = s
        .admin
        .post(
            "/api/v1/tenants/lab/vms",
            &vm("big", 8, ServiceLevel::Guaranteed),
        )
        .await
        .unwrap();
    assert_eq!(big.state, VmState::Pending);
    assert!(big.host.is_none());
    // Every spot VM is preempting, with a deadline the host is told of.
    let desired = agent.desired(None).await;
    for v in &spot {
        let now = get_vm(&s, &v.name).await;
        assert_eq!(now.state, VmState::Preempting);
        let deadline = now.preempt_deadline.unwrap();
        let d = desired.vms.iter().find(|d| d.id == v.id).unwrap();
        let notice = d.preemption.as_ref().expect("a notice for the host");
        assert_eq!(notice.deadline, deadline);
        assert_eq!(notice.action, "shutdown");
    }
    // Before the deadline nothing is destroyed.
    agent.converge().await;
    assert_eq!(get_vm(&s, "spot-0").await.state, VmState::Preempting);
    // After it: preempted, removed from the host, and the big VM placed.
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        agent.converge().await;
        let b = get_vm(&s, "big").await;
        if b.state == VmState::Running {
            break;
        }
        assert!(Instant::now() < until, "big VM still {:?}", b.state);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        asked.elapsed() >= grace,
        "placed before the grace period ended"
    );
    let b = get_vm(&s, "big").await;
    assert_eq!(b.placement.as_ref().unwrap().gpus.len(), 8);
    for v in &spot {
        let now = get_vm(&s, &v.name).await;
        assert_eq!(now.state, VmState::Preempted);
        assert!(now.host.is_none(), "a preempted VM holds no host");
        let kinds = events_of(&s, v).await;
        for k in ["created", "scheduled", "running", "preempting", "preempted"] {
            assert!(kinds.iter().any(|x| x == k), "{k} missing from {kinds:?}");
        }
    }
    let kinds = events_of(&s, &b).await;
    for k in ["pending", "scheduled", "running"] {
        assert!(kinds.iter().any(|x| x == k), "{k} missing from {kinds:?}");
    }
    // A preempted VM can be deleted, and nothing else.
    let e = s
        .admin
        .vm_action("lab", "spot-0", "start")
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(409));
    s.admin.delete_vm("lab", "spot-0").await.unwrap();
    s.stop().await;
}
