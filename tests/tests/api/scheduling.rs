//! The scheduler behind the API: quotas under concurrent requests, spot
//! reclamation end to end on a simulated host (notice, grace period,
//! `preempted`, the guaranteed VM placed and running), training clusters,
//! and draining hosts.

use std::time::{Duration, Instant};

use kumo_api_types::{
    Cluster, ClusterCreate, HostState, Quota, ServiceLevel, Vm, VmCreate, VmState,
};

use crate::harness::{events_of, on_both_backends, Backend, TestServer};

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

async fn get_vm(s: &TestServer, name: &str) -> Vm {
    s.admin
        .get(&format!("/api/v1/tenants/lab/vms/{name}"))
        .await
        .unwrap()
}

on_both_backends! {
    /// The capacity index's full re-read walks the hosts a page at a time:
    /// every host is found whatever the page size, with its VMs, and a
    /// walk over pages removes no host that is still there.
    async fn the_capacity_reread_finds_every_host_page_by_page(s: &TestServer) {
        s.tenant("lab").await;
        let mut agents = Vec::new();
        for i in 0..5 {
            agents.push(s.sim_agent(&format!("gpu-{i}"), "hgx-h100").await);
        }
        let v: Vm = s.admin.post("/api/v1/tenants/lab/vms", &vm("one", 2, ServiceLevel::Guaranteed)).await.unwrap();
        use sea_orm::EntityTrait;
        let mut want: Vec<uuid::Uuid> = kumo_server::entity::hosts::Entity::find()
            .all(s.db()).await.unwrap().into_iter().map(|h| h.id).collect();
        want.sort();
        assert_eq!(want.len(), 5);
        for page in [1, 2, 5, 500] {
            let cap = kumo_server::store::capacity::Capacity::default();
            for _ in 0..2 {
                cap.refresh_all_paged(s.db(), page).await.unwrap();
                let index = cap.lock();
                let mut got: Vec<uuid::Uuid> = index.hosts.iter().map(|h| h.id).collect();
                got.sort();
                assert_eq!(got, want, "page size {page}");
                let holding = index.hosts.iter().filter(|h| h.holds.iter().any(|x| x.vm == v.id)).count();
                assert_eq!(holding, 1, "the VM on its host, page size {page}");
            }
        }
    }

    async fn concurrent_requests_never_exceed_the_quota(s: &TestServer) {
        s.bare_tenant("lab").await;
        let mut q = Quota { vcpus: 1000, memory_gib: 10_000, vms: 100, disk_gib: 100_000, ..Default::default() };
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
        let mut q = Quota { vcpus: 30, memory_gib: 10_000, vms: 100, disk_gib: 100_000, ..Default::default() };
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
/// reported `preempted` — or `shelved`, for the one whose owner chose to
/// keep it — and the guaranteed VM is placed and runs.
#[tokio::test]
async fn a_guaranteed_vm_reclaims_spot_vms_after_the_grace_period() {
    let grace = Duration::from_secs(2);
    let s = TestServer::start_with(Backend::Sqlite, |c| c.preemption_grace = grace).await;
    s.tenant("lab").await;
    let mut agent = s.sim_agent("gpu-1", "hgx-h100").await;
    let mut spot = Vec::new();
    for i in 0..4 {
        let mut req = vm(&format!("spot-{i}"), 2, ServiceLevel::Spot);
        if i == 3 {
            req.on_reclaim = Some(kumo_api_types::ReclaimAction::Shelve);
        }
        let v: Vm = s.admin.post("/api/v1/tenants/lab/vms", &req).await.unwrap();
        spot.push(v);
    }
    // Only spot VMs are reclaimed: a guaranteed one takes no such choice.
    let mut kept = vm("kept", 1, ServiceLevel::Guaranteed);
    kept.on_reclaim = Some(kumo_api_types::ReclaimAction::Shelve);
    let e = s
        .admin
        .post::<_, Vm>("/api/v1/tenants/lab/vms", &kept)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(400));
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
    for v in &spot[..3] {
        let now = get_vm(&s, &v.name).await;
        assert_eq!(now.state, VmState::Preempted);
        assert!(now.host.is_none(), "a preempted VM holds no host");
        let kinds = events_of(&s, "lab", v).await;
        for k in ["created", "scheduled", "running", "preempting", "preempted"] {
            assert!(kinds.iter().any(|x| x == k), "{k} missing from {kinds:?}");
        }
    }
    // The one to keep is shelved instead: no host, its disk kept there;
    // unshelved, it waits for room.
    let shelved = get_vm(&s, "spot-3").await;
    assert_eq!(shelved.state, VmState::Shelved);
    assert!(shelved.host.is_none());
    let kinds = events_of(&s, "lab", &spot[3]).await;
    for k in ["preempting", "shelving", "shelved"] {
        assert!(kinds.iter().any(|x| x == k), "{k} missing from {kinds:?}");
    }
    let back = s
        .admin
        .vm_action("lab", "spot-3", "unshelve")
        .await
        .unwrap();
    assert_eq!(back.state, VmState::Pending);
    let kinds = events_of(&s, "lab", &b).await;
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

fn cluster(name: &str, size: u32, gpus: u32, level: ServiceLevel) -> ClusterCreate {
    ClusterCreate {
        name: name.into(),
        size,
        gpus,
        gpu_model: Some(H100.into()),
        vcpus: Some(8 * gpus.max(1)),
        memory_gib: Some(16),
        disk_gib: None,
        template: None,
        service_level: level,
        ssh_keys: vec![],
        networks: vec![],
        shares: Vec::new(),
        auto_repair: false,
        repair_delay_seconds: None,
        spares: 0,
        single_su: Default::default(),
        queue: false,
        reservation: None,
    }
}

async fn get_cluster(s: &TestServer, name: &str) -> Result<Cluster, kumo_cli::client::ClientError> {
    s.admin
        .get(&format!("/api/v1/tenants/lab/clusters/{name}"))
        .await
}

on_both_backends! {
    async fn clusters_are_placed_whole_in_one_scalable_unit_and_rail_aligned(s: &TestServer) {
        s.tenant("lab").await;
        let mut agents = Vec::new();
        for (name, su) in [("a-1", "su-a"), ("a-2", "su-a"), ("b-1", "su-b"), ("b-2", "su-b"), ("b-3", "su-b")] {
            agents.push(s.sim_agent_in(name, "hgx-h100", Some(su)).await);
        }
        // Three whole hosts: only su-b has them.
        let train: Cluster = s.admin.post("/api/v1/tenants/lab/clusters", &cluster("train", 3, 8, ServiceLevel::Guaranteed)).await.unwrap();
        assert_eq!(train.state, "placed");
        assert_eq!(train.members.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), ["train-0", "train-1", "train-2"]);
        let mut hosts: Vec<_> = train.members.iter().map(|m| m.host.clone().unwrap()).collect();
        hosts.sort();
        hosts.dedup();
        assert_eq!(hosts.len(), 3, "one member per host");
        assert!(train.members.iter().all(|m| m.scalable_unit.as_deref() == Some("su-b")), "{:?}", train.members);
        // Rail-aligned: GPU i of every member is on rail i.
        let rails: Vec<Option<u32>> = (0..8).map(Some).collect();
        for m in &train.members {
            assert_eq!(m.rails, rails, "{}", m.name);
        }
        assert_eq!(train.hostfile, "train-0 slots=8\ntrain-1 slots=8\ntrain-2 slots=8\n");
        // Each member's host hands the hostfile to its agent for the guest.
        let b1 = &agents[2];
        let d = b1.desired(None).await;
        assert_eq!(d.vms.len(), 1);
        assert_eq!(d.vms[0].hostfile.as_deref(), Some(train.hostfile.as_str()));
        // Members are VMs of the tenant, naming their cluster.
        let v = get_vm(s, "train-1").await;
        assert_eq!(v.cluster.as_deref(), Some("train"));

        // Two more fill su-a; nothing is left.
        let small: Cluster = s.admin.post("/api/v1/tenants/lab/clusters", &cluster("small", 2, 8, ServiceLevel::Guaranteed)).await.unwrap();
        assert!(small.members.iter().all(|m| m.scalable_unit.as_deref() == Some("su-a")));
        // All or nothing: a cluster that does not fit leaves no trace.
        let e = s.admin.post::<_, Cluster>("/api/v1/tenants/lab/clusters", &cluster("more", 2, 1, ServiceLevel::Guaranteed)).await.unwrap_err();
        assert_eq!(e.problem().unwrap().kind, "/problems/insufficient-capacity");
        assert_eq!(get_cluster(s, "more").await.unwrap_err().status(), Some(404));
        let vms = s.admin.list_vms("lab").await.unwrap();
        assert_eq!(vms.len(), 5, "{:?}", vms.iter().map(|v| &v.name).collect::<Vec<_>>());

        // Bad requests and name clashes.
        let e = s.admin.post::<_, Cluster>("/api/v1/tenants/lab/clusters", &cluster("train", 1, 0, ServiceLevel::Guaranteed)).await.unwrap_err();
        assert_eq!(e.status(), Some(409));
        let e = s.admin.post::<_, Cluster>("/api/v1/tenants/lab/clusters", &cluster("none", 0, 1, ServiceLevel::Guaranteed)).await.unwrap_err();
        assert_eq!(e.status(), Some(400));
        assert_eq!(e.problem().unwrap().errors[0].field, "size");
        let long = "x".repeat(61);
        let e = s.admin.post::<_, Cluster>("/api/v1/tenants/lab/clusters", &cluster(&long, 20, 0, ServiceLevel::Guaranteed)).await.unwrap_err();
        assert_eq!(e.status(), Some(400), "member names would be too long");

        let listed = s.admin.list_clusters("lab").await.unwrap();
        assert_eq!(listed.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["small", "train"]);

        // Deleting a cluster deletes its members; it is gone with the last.
        let d = s.admin.delete_cluster("lab", "small").await.unwrap();
        assert!(d.members.iter().all(|m| m.state == VmState::Deleting));
        for a in &mut agents {
            a.converge().await;
        }
        assert_eq!(get_cluster(s, "small").await.unwrap_err().status(), Some(404));
        let names: Vec<_> = s.admin.list_vms("lab").await.unwrap().into_iter().map(|v| v.name).collect();
        assert_eq!(names, ["train-0", "train-1", "train-2"]);
        // The room it left takes a new cluster, in su-a again.
        let again: Cluster = s.admin.post("/api/v1/tenants/lab/clusters", &cluster("small", 2, 8, ServiceLevel::Guaranteed)).await.unwrap();
        assert!(again.members.iter().all(|m| m.scalable_unit.as_deref() == Some("su-a")));
    }

    /// `single_su: required` refuses a cluster no unit has room for, where
    /// `preferred` spans units; it is shown on the cluster.
    async fn a_cluster_that_requires_one_unit_is_refused_rather_than_spread(s: &TestServer) {
        s.tenant("lab").await;
        for (name, su) in [("a-1", "su-a"), ("a-2", "su-a"), ("b-1", "su-b"), ("b-2", "su-b")] {
            s.sim_agent_in(name, "hgx-h100", Some(su)).await;
        }
        let strict = ClusterCreate {
            single_su: kumo_api_types::SingleSu::Required,
            queue: false,
            reservation: None,
            ..cluster("strict", 3, 8, ServiceLevel::Guaranteed)
        };
        let e = s.admin.post::<_, Cluster>("/api/v1/tenants/lab/clusters", &strict).await.unwrap_err();
        assert_eq!(e.problem().unwrap().kind, "/problems/insufficient-capacity");
        assert!(e.to_string().contains("single_su required"), "{e}");
        assert_eq!(get_cluster(s, "strict").await.unwrap_err().status(), Some(404));
        // Preferred (the default) spans the two units when neither has room.
        let spread: Cluster = s.admin.post("/api/v1/tenants/lab/clusters", &cluster("spread", 3, 8, ServiceLevel::Guaranteed)).await.unwrap();
        assert_eq!(spread.single_su, kumo_api_types::SingleSu::Preferred);
        let units: std::collections::BTreeSet<_> = spread.members.iter().map(|m| m.scalable_unit.clone()).collect();
        assert_eq!(units.len(), 2, "{spread:#?}");
        // What fits in one unit is placed, and the cluster says it must stay.
        let one: Cluster = s.admin.post("/api/v1/tenants/lab/clusters", &ClusterCreate { size: 1, ..strict.clone() }).await.unwrap();
        assert_eq!(one.single_su, kumo_api_types::SingleSu::Required);
    }

    async fn a_drained_host_takes_no_vms_and_gives_back_its_spot_vms(s: &TestServer) {
        s.tenant("lab").await;
        let mut one = s.sim_agent("gpu-1", "hgx-h100").await;
        let spot: Vm = s.admin.post("/api/v1/tenants/lab/vms", &vm("spot", 4, ServiceLevel::Spot)).await.unwrap();
        let host = spot.host.clone().unwrap();
        let steady: Vm = s.admin.post("/api/v1/tenants/lab/vms", &vm("steady", 2, ServiceLevel::Guaranteed)).await.unwrap();
        assert_eq!(steady.host.as_deref(), Some(host.as_str()));
        one.converge().await;
        let mut two = s.sim_agent("gpu-2", "hgx-h100").await;

        let h = s.admin.host_action(&host, "drain").await.unwrap();
        assert_eq!(h.state, HostState::Draining);
        // The spot VM is told to go; the guaranteed one stays.
        assert_eq!(get_vm(s, "spot").await.state, VmState::Preempting);
        assert_eq!(get_vm(s, "steady").await.state, VmState::Running);
        let kinds = events_of(s, "lab", &spot).await;
        assert!(kinds.iter().any(|k| k == "preempting"), "{kinds:?}");
        // New VMs go elsewhere, even though the drained host is the fuller.
        let next: Vm = s.admin.post("/api/v1/tenants/lab/vms", &vm("next", 1, ServiceLevel::Guaranteed)).await.unwrap();
        assert_eq!(next.host.as_deref(), Some("gpu-2"));
        // Draining twice is harmless.
        assert_eq!(s.admin.host_action(&host, "drain").await.unwrap().state, HostState::Draining);

        // A drain outlives the host going silent and coming back.
        use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
        use sea_orm::sea_query::Expr;
        kumo_server::entity::hosts::Entity::update_many()
            .col_expr(kumo_server::entity::hosts::Column::State, Expr::value("unreachable"))
            .filter(kumo_server::entity::hosts::Column::Name.eq(host.clone()))
            .exec(s.db()).await.unwrap();
        assert_eq!(one.heartbeat().await, 204);
        assert_eq!(s.admin.host(&host).await.unwrap().host.state, HostState::Draining);

        let h = s.admin.host_action(&host, "undrain").await.unwrap();
        assert_eq!(h.state, HostState::Ready);
        two.converge().await;
        // Back in service: the fuller host is chosen again.
        let back: Vm = s.admin.post("/api/v1/tenants/lab/vms", &vm("back", 1, ServiceLevel::Guaranteed)).await.unwrap();
        assert_eq!(back.host.as_deref(), Some(host.as_str()));
        let e = s.admin.host_action("no-such-host", "drain").await.unwrap_err();
        assert_eq!(e.status(), Some(404));
        let audit = s.admin.audit(None, 100).await.unwrap();
        for action in ["host.drain", "host.undrain"] {
            assert!(audit.iter().any(|a| a.action == action), "{action}");
        }
    }
}
/// A guaranteed GPU VM that names no model and must wait for a reclaim is
/// pending, counted against (and held to) the model of the host it waits
/// for; never refused as over a quota of no model. (It was, and made the
/// README walk flaky whenever deleted spot VMs were still on their host.)
#[tokio::test]
async fn a_guaranteed_vm_naming_no_model_waits_for_a_reclaim() {
    let s = TestServer::start(Backend::Sqlite).await;
    s.tenant("lab").await;
    let mut agent = s.sim_agent("gpu-1", "hgx-h100").await;
    let _: Vm = s
        .admin
        .post(
            "/api/v1/tenants/lab/vms",
            &vm("spot", 8, ServiceLevel::Spot),
        )
        .await
        .unwrap();
    agent.converge().await;
    let mut req = vm("big", 2, ServiceLevel::Guaranteed);
    req.gpu_model = None;
    let big: Vm = s.admin.post("/api/v1/tenants/lab/vms", &req).await.unwrap();
    assert_eq!(big.state, VmState::Pending);
    assert_eq!(
        get_vm(&s, "big").await.spec.gpu_model.as_deref(),
        Some(H100)
    );
}

/// A tenant's quota with a cap of 16 H100s and `guarantee` of them
/// promised.
fn share_quota(guarantee: u32) -> Quota {
    let mut q = Quota {
        vcpus: 10_000,
        memory_gib: 100_000,
        vms: 100,
        disk_gib: 100_000,
        ..Default::default()
    };
    q.gpus.insert(H100.into(), 16);
    if guarantee > 0 {
        q.guarantee.insert(H100.into(), guarantee);
    }
    q
}

async fn vm_of(s: &TestServer, tenant: &str, name: &str) -> Vm {
    s.admin
        .get(&format!("/api/v1/tenants/{tenant}/vms/{name}"))
        .await
        .unwrap()
}

on_both_backends! {
    config = |c| c.preemption_grace = Duration::from_secs(2);

    /// Issue 42, guaranteed shares: alpha (8 of 16 H100s promised) runs
    /// 16 — its second VM is borrowed, and says so in the API, its events
    /// and its host's desired state (the guest's events file); beta (8
    /// promised) asks for 8 on the full fleet → alpha's borrowed VM gets
    /// its notice, is reclaimed after the grace and beta's VM runs, while
    /// alpha's VM within its share is never touched. A tenant with no
    /// share gets no room that way; beta beyond its share waits without
    /// reclaiming; and the platform promises no more than it has.
    async fn a_tenant_within_its_share_reclaims_another_tenants_borrowed_vms(s: &TestServer) {
        for t in ["alpha", "beta", "gamma"] {
            s.bare_tenant(t).await;
        }
        let mut agents = [
            s.sim_agent("gpu-0", "hgx-h100").await,
            s.sim_agent("gpu-1", "hgx-h100").await,
        ];
        // Bad guarantees: over the cap (400), beyond the fleet (409).
        let mut q = share_quota(8);
        q.guarantee.insert(H100.into(), 17);
        let e = s.admin.set_quota("alpha", &q).await.unwrap_err();
        assert_eq!(e.status(), Some(400), "{e}");
        s.quota("alpha", &share_quota(8)).await;
        let e = s.admin.set_quota("beta", &share_quota(9)).await.unwrap_err();
        assert_eq!(e.status(), Some(409), "{e}");
        assert!(e.to_string().contains("17") && e.to_string().contains("16 are in service"), "{e}");
        s.quota("beta", &share_quota(8)).await;
        s.quota("gamma", &share_quota(0)).await;
        assert_eq!(s.admin.quota("beta").await.unwrap().guarantee.get(H100), Some(&8));
        let standing: Vec<kumo_api_types::GuaranteeStanding> = s.admin.get("/api/v1/guarantees").await.unwrap();
        assert_eq!((standing[0].promised, standing[0].in_service), (16, 16), "{standing:?}");
        assert_eq!(standing[0].tenants.get("alpha"), Some(&8));

        let post = async |tenant: &str, name: &str| {
            s.admin.post::<_, Vm>(&format!("/api/v1/tenants/{tenant}/vms"), &vm(name, 8, ServiceLevel::Guaranteed)).await
        };
        let a1 = post("alpha", "a-one").await.unwrap();
        assert_eq!(a1.borrowed_since, None, "within alpha's share");
        let a2 = post("alpha", "a-two").await.unwrap();
        assert!(a2.borrowed_since.is_some(), "beyond alpha's share: {a2:?}");
        assert!(a2.scheduled_events.iter().any(|e| e.kind == "borrowed"
            && e.action == kumo_api_types::ScheduledAction::Reclaimable), "{:?}", a2.scheduled_events);
        assert!(events_of(s, "alpha", &a2).await.contains(&"borrowed".to_string()));
        for a in agents.iter_mut() {
            a.converge().await;
        }
        // Its host tells the guest (`/run/kumo/events`).
        let host = a2.host.clone().unwrap();
        let agent = &agents[usize::from(host == "gpu-1")];
        let d = agent.desired(None).await;
        let told = d.vms.iter().find(|v| v.id == a2.id).unwrap();
        assert!(told.events.iter().any(|e| e.kind == "borrowed"), "{:?}", told.events);
        // Its GPUs run at the borrow rate class (priced as a GPU unless set).
        use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
        let runs = kumo_server::entity::meter_runs::Entity::find()
            .filter(kumo_server::entity::meter_runs::Column::VmId.eq(a2.id))
            .all(s.db()).await.unwrap();
        assert!(runs.iter().any(|r| r.class == format!("borrowed_gpu:{H100}") && r.ended_at.is_none()), "{runs:?}");

        // No share, or beyond it: no room.
        for (tenant, name) in [("gamma", "g-one")] {
            let e = post(tenant, name).await.unwrap_err();
            assert_eq!(e.problem().unwrap().kind, "/problems/insufficient-capacity");
        }
        // Within beta's share: alpha's borrowed VM is reclaimed for it.
        let asked = Instant::now();
        let b1 = post("beta", "b-one").await.unwrap();
        assert_eq!(b1.state, VmState::Pending);
        let a2_now = vm_of(s, "alpha", "a-two").await;
        assert_eq!(a2_now.state, VmState::Preempting);
        assert!(a2_now.preempt_deadline.is_some());
        assert_eq!(vm_of(s, "alpha", "a-one").await.state, VmState::Running);
        // Beyond its share now: it waits (on the room being freed, behind
        // b-one) and reclaims nothing more.
        let b2 = post("beta", "b-two").await.unwrap();
        assert_eq!(b2.state, VmState::Pending);
        assert_eq!(vm_of(s, "alpha", "a-one").await.state, VmState::Running);
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            for a in agents.iter_mut() {
                a.converge().await;
            }
            let b1_now = vm_of(s, "beta", "b-one").await;
            if b1_now.state == VmState::Running {
                break;
            }
            // Seen once in CI (1 of 662, not again in 12 runs under load):
            // say what b-one waits on and where the VM it waits for is.
            if Instant::now() >= until {
                let a2_now = vm_of(s, "alpha", "a-two").await;
                panic!(
                    "b1 still {:?} ({:?}, host {:?}); a-two {:?} ({:?}, host {:?}, deadline {:?})",
                    b1_now.state, b1_now.reason, b1_now.host,
                    a2_now.state, a2_now.reason, a2_now.host, a2_now.preempt_deadline
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(asked.elapsed() >= Duration::from_secs(2), "placed before the grace ended");
        let a2_now = vm_of(s, "alpha", "a-two").await;
        assert_eq!(a2_now.state, VmState::Preempted);
        assert_eq!(a2_now.borrowed_since, None, "reclaimed: it borrows nothing now");
        let a1_now = vm_of(s, "alpha", "a-one").await;
        assert_eq!(a1_now.state, VmState::Running, "alpha's VM within its share untouched");
        assert!(!events_of(s, "alpha", &a1).await.iter().any(|k| k == "preempting"));
        let b1 = vm_of(s, "beta", "b-one").await;
        assert_eq!(b1.borrowed_since, None);
        assert_eq!(b1.host, a2.host, "in the room the borrowed VM gave back");
        // b-two is beyond beta's share: it waits, and alpha keeps its share.
        for a in agents.iter_mut() {
            a.converge().await;
        }
        assert_eq!(vm_of(s, "beta", "b-two").await.state, VmState::Pending);
        assert_eq!(vm_of(s, "alpha", "a-one").await.state, VmState::Running);
        // A GPU leaves service: the promise of 16 can no longer be kept,
        // and the fleet says so (API, metric).
        let bdf = b1.placement.as_ref().unwrap().gpus[0].host_bdf.clone();
        let _: kumo_api_types::Device = s.admin.post(
            &format!("/api/v1/hosts/{}/devices/{bdf}/quarantine", b1.host.as_deref().unwrap()),
            &kumo_api_types::DeviceAction { reason: Some("test".into()) },
        ).await.unwrap();
        let standing: Vec<kumo_api_types::GuaranteeStanding> = s.admin.get("/api/v1/guarantees").await.unwrap();
        assert_eq!((standing[0].promised, standing[0].in_service), (16, 15), "{standing:?}");
        let metric = format!("kumo_gpu_guarantees_overpromised_gpus{{model=\"{H100}\"}} 1");
        let until = Instant::now() + Duration::from_secs(5);
        while !s.server.state.metrics.encode().contains(&metric) {
            assert!(Instant::now() < until, "{metric} not in {}", s.server.state.metrics.encode());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Nobody may raise a guarantee now; lowering one is fine.
        let e = s.admin.set_quota("alpha", &share_quota(9)).await.unwrap_err();
        assert_eq!(e.status(), Some(409));
        s.quota("alpha", &share_quota(7)).await;
    }

    /// Marks follow the shares, level-triggered: the VM within alpha's
    /// share deleted, its borrowed one is within the share again at the
    /// reaper's next pass — event, API, and its GPUs back at the GPU rate.
    async fn a_borrowed_vm_is_within_the_share_again_when_room_in_it_frees(s: &TestServer) {
        s.bare_tenant("alpha").await;
        let mut agents = [
            s.sim_agent("gpu-0", "hgx-h100").await,
            s.sim_agent("gpu-1", "hgx-h100").await,
        ];
        s.quota("alpha", &share_quota(8)).await;
        let post = async |name: &str| {
            s.admin.post::<_, Vm>("/api/v1/tenants/alpha/vms", &vm(name, 8, ServiceLevel::Guaranteed)).await.unwrap()
        };
        let first = post("first").await;
        let second = post("second").await;
        assert!(first.borrowed_since.is_none() && second.borrowed_since.is_some());
        for a in agents.iter_mut() {
            a.converge().await;
        }
        s.admin.delete_vm("alpha", "first").await.unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while vm_of(s, "alpha", "second").await.borrowed_since.is_some() {
            assert!(Instant::now() < until, "still borrowed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(events_of(s, "alpha", &second).await.contains(&"within-share".to_string()));
        use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
        let runs = kumo_server::entity::meter_runs::Entity::find()
            .filter(kumo_server::entity::meter_runs::Column::VmId.eq(second.id))
            .all(s.db()).await.unwrap();
        let open: Vec<&str> = runs.iter().filter(|r| r.ended_at.is_none()).map(|r| r.class.as_str()).collect();
        assert!(open.contains(&format!("gpu:{H100}").as_str()), "{runs:?}");
        assert!(runs.iter().any(|r| r.class == format!("borrowed_gpu:{H100}") && r.ended_at.is_some()), "{runs:?}");
        assert!(vm_of(s, "alpha", "second").await.scheduled_events.iter().all(|e| e.kind != "borrowed"));
    }
}

/// Every simulated host reports what it was asked for, then the queue
/// takes one pass (the reaper takes them too, each second).
async fn settle_queue(s: &TestServer, agents: &mut [crate::harness::SimAgent]) {
    for a in agents.iter_mut() {
        a.converge().await;
    }
    kumo_server::app::queue::pass(&s.server.state)
        .await
        .unwrap();
    for a in agents.iter_mut() {
        a.converge().await;
    }
}

fn queued(mut v: VmCreate) -> VmCreate {
    v.queue = true;
    v
}

async fn standing(s: &TestServer, tenant: &str, name: &str) -> (VmState, Option<u32>) {
    let v = vm_of(s, tenant, name).await;
    (v.state, v.queue.map(|q| q.position))
}

/// A queued VM's standing once the passes agree: the reaper's own pass
/// (each second) may write what it read a moment before the test's.
async fn settled(s: &TestServer, tenant: &str, name: &str, want: (VmState, Option<u32>)) {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let got = standing(s, tenant, name).await;
        if got == want {
            return;
        }
        assert!(
            Instant::now() < until,
            "{tenant}/{name}: {got:?}, not {want:?}"
        );
        kumo_server::app::queue::pass(&s.server.state)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

on_both_backends! {
    config = |c| {
        c.queue.max_per_project = 3;
        c.clock = kumo_server::clock::Clock::manual(
            chrono::TimeZone::with_ymd_and_hms(&chrono::Utc, 2026, 11, 2, 9, 0, 0).unwrap(),
        );
    };

    /// Issue 42, the fair queue: on a full fleet of three 8-GPU hosts,
    /// requests made with `queue` wait as `queued` in fair order (the
    /// project using least first, first come first served within one),
    /// with positions, reasons and estimates; as room frees in steps they
    /// are admitted in that order, a cluster whole; a request that would
    /// take room the head waits for is held back (queued, or refused
    /// without `queue`), one that delays no one backfills; queued requests
    /// are free, cancelled by deleting them, bounded per project, and
    /// expire.
    async fn queued_requests_are_admitted_in_fair_order_as_room_frees(s: &TestServer) {
        let clock = s.server.state.config.clock.clone();
        let t0 = clock.now();
        let runtime = chrono::Duration::from_std(s.server.state.config.queue.assumed_runtime).unwrap();
        for t in ["alpha", "beta", "gamma"] {
            s.tenant(t).await;
        }
        let mut agents = vec![
            s.sim_agent("gpu-0", "hgx-h100").await,
            s.sim_agent("gpu-1", "hgx-h100").await,
            s.sim_agent("gpu-2", "hgx-h100").await,
        ];
        let post = async |tenant: &str, body: VmCreate| {
            s.admin.post::<_, Vm>(&format!("/api/v1/tenants/{tenant}/vms"), &body).await
        };
        let g = ServiceLevel::Guaranteed;
        // Alpha's two halves share host X (best fit) from t0; an hour later
        // alpha fills Y and gamma Z.
        let a1a = post("alpha", vm("a-half-1", 4, g)).await.unwrap();
        let a1b = post("alpha", vm("a-half-2", 4, g)).await.unwrap();
        assert_eq!(a1a.host, a1b.host);
        let x = a1a.host.clone().unwrap();
        clock.advance(chrono::Duration::hours(1));
        for (tenant, name) in [("alpha", "a-two"), ("gamma", "g-one")] {
            assert_ne!(post(tenant, vm(name, 8, g)).await.unwrap().host.as_deref(), Some(x.as_str()));
        }
        settle_queue(s, &mut agents).await;
        let e = post("beta", vm("b-now", 8, g)).await.unwrap_err();
        assert_eq!(e.problem().unwrap().kind, "/problems/insufficient-capacity", "full, and not asked to queue");

        // Queued a minute apart: alpha, gamma, beta, then beta's cluster.
        for (tenant, name) in [("alpha", "a-q1"), ("gamma", "g-q1"), ("beta", "b-q1")] {
            clock.advance(chrono::Duration::minutes(1));
            let v = post(tenant, queued(vm(name, 8, g))).await.unwrap();
            assert_eq!(v.state, VmState::Queued, "{name}");
            let q = v.queue.expect("a queued VM shows its standing");
            assert_eq!(q.queued_at, clock.now());
            assert_eq!(q.expires_at, clock.now() + chrono::Duration::days(7));
        }
        clock.advance(chrono::Duration::minutes(1));
        let mut train = cluster("b-train", 2, 8, g);
        train.queue = true;
        let c: Cluster = s.admin.post("/api/v1/tenants/beta/clusters", &train).await.unwrap();
        assert_eq!(c.state, "queued");
        assert!(c.members.iter().all(|m| m.state == VmState::Queued), "{:?}", c.members);
        // Fair order: beta uses nothing, so its VM goes first; gamma (8 in
        // use) and beta (8 once b-q1 runs) tie, and gamma asked first;
        // then beta's cluster, then alpha (16 in use).
        settle_queue(s, &mut agents).await;
        settled(s, "beta", "b-q1", (VmState::Queued, Some(1))).await;
        settled(s, "gamma", "g-q1", (VmState::Queued, Some(2))).await;
        settled(s, "beta", "b-train-0", (VmState::Queued, Some(3))).await;
        settled(s, "alpha", "a-q1", (VmState::Queued, Some(4))).await;
        let c: Cluster = s.admin.get("/api/v1/tenants/beta/clusters/b-train").await.unwrap();
        assert_eq!(c.queue.as_ref().map(|q| q.position), Some(3));
        // The head's estimate: when X's VMs have run the assumed run time.
        let head = vm_of(s, "beta", "b-q1").await.queue.unwrap();
        assert_eq!(head.estimate, Some(t0 + runtime), "{head:?}");
        assert!(head.reason.starts_with("first in line"), "{}", head.reason);
        let third = vm_of(s, "alpha", "a-q1").await.queue.unwrap();
        assert!(third.reason.contains("3 request(s) ahead"), "{}", third.reason);

        // Half of X frees. The head needs all of X: a 4-GPU request that
        // would take the other half is held back, queued or not.
        s.admin.delete_vm("alpha", "a-half-1").await.unwrap();
        settle_queue(s, &mut agents).await;
        settled(s, "beta", "b-q1", (VmState::Queued, Some(1))).await;
        let e = post("gamma", vm("g-small", 4, g)).await.unwrap_err();
        assert_eq!(e.problem().unwrap().kind, "/problems/insufficient-capacity", "X's free half is held for the head");
        let small = post("gamma", queued(vm("g-small", 4, g))).await.unwrap();
        assert_eq!(small.state, VmState::Queued, "others wait: it queues behind them");
        settle_queue(s, &mut agents).await;
        settled(s, "gamma", "g-small", (VmState::Queued, Some(5))).await;
        assert_eq!(vm_of(s, "beta", "b-q1").await.queue.unwrap().estimate, Some(t0 + runtime), "the head's estimate did not move");
        // A CPU-only request behind them all delays no one: it backfills.
        let cpu = post("alpha", queued(vm("a-cpu", 0, g))).await.unwrap();
        assert_eq!(cpu.state, VmState::Queued);
        settle_queue(s, &mut agents).await;
        let cpu = vm_of(s, "alpha", "a-cpu").await;
        assert_eq!(cpu.state, VmState::Running, "{cpu:?}");
        assert_ne!(cpu.host.as_deref(), Some(x.as_str()), "kept off the head's host");

        // All of X frees: the head is admitted there. Alpha now uses no
        // more than the others (8 GPUs each) and asked first: it moves up.
        clock.advance(chrono::Duration::minutes(1));
        let admitted_at = clock.now();
        s.admin.delete_vm("alpha", "a-half-2").await.unwrap();
        settle_queue(s, &mut agents).await;
        let b = vm_of(s, "beta", "b-q1").await;
        assert_eq!((b.state, b.host.as_deref(), b.queue.is_some()), (VmState::Running, Some(x.as_str()), false));
        settled(s, "alpha", "a-q1", (VmState::Queued, Some(1))).await;
        settled(s, "gamma", "g-q1", (VmState::Queued, Some(2))).await;
        settled(s, "beta", "b-train-0", (VmState::Queued, Some(3))).await;
        settled(s, "gamma", "g-small", (VmState::Queued, Some(4))).await;
        // Free while queued: its charges open when it is admitted.
        use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
        let runs = kumo_server::entity::meter_runs::Entity::find()
            .filter(kumo_server::entity::meter_runs::Column::VmId.eq(b.id))
            .all(s.db()).await.unwrap();
        assert!(!runs.is_empty() && runs.iter().all(|r| r.started_at >= admitted_at), "{runs:?}");
        let runs = kumo_server::entity::meter_runs::Entity::find()
            .filter(kumo_server::entity::meter_runs::Column::VmId.eq(small.id))
            .all(s.db()).await.unwrap();
        assert!(runs.is_empty(), "a queued VM is charged nothing: {runs:?}");

        // Y and Z free together: the two VMs ahead are admitted.
        s.admin.delete_vm("alpha", "a-two").await.unwrap();
        s.admin.delete_vm("gamma", "g-one").await.unwrap();
        settle_queue(s, &mut agents).await;
        assert_eq!(vm_of(s, "alpha", "a-q1").await.state, VmState::Running);
        assert_eq!(vm_of(s, "gamma", "g-q1").await.state, VmState::Running);
        settled(s, "beta", "b-train-1", (VmState::Queued, Some(1))).await;
        settled(s, "gamma", "g-small", (VmState::Queued, Some(2))).await;
        // An hour on, X frees: the cluster needs two hosts at once and
        // waits whole, expected when Y's VM has run its day; the 4-GPU VM
        // behind it would still hold X then: held back.
        clock.advance(chrono::Duration::hours(1));
        s.admin.delete_vm("beta", "b-q1").await.unwrap();
        settle_queue(s, &mut agents).await;
        let estimate = vm_of(s, "beta", "b-train-0").await.queue.unwrap().estimate.unwrap();
        assert!(estimate < clock.now() + runtime, "{estimate}");
        let c: Cluster = s.admin.get("/api/v1/tenants/beta/clusters/b-train").await.unwrap();
        assert_eq!(c.state, "queued");
        assert!(c.members.iter().all(|m| m.state == VmState::Queued && m.host.is_none()), "never half placed: {:?}", c.members);
        settled(s, "gamma", "g-small", (VmState::Queued, Some(2))).await;
        // A second host frees: the cluster is admitted whole.
        s.admin.delete_vm("alpha", "a-q1").await.unwrap();
        settle_queue(s, &mut agents).await;
        let c: Cluster = s.admin.get("/api/v1/tenants/beta/clusters/b-train").await.unwrap();
        assert_eq!(c.state, "placed");
        assert!(c.members.iter().all(|m| m.state == VmState::Running), "{:?}", c.members);
        assert_eq!(c.queue, None);
        settled(s, "gamma", "g-small", (VmState::Queued, Some(1))).await;

        // Cancelled by deleting it: gone at once, never charged.
        s.admin.delete_vm("gamma", "g-small").await.unwrap();
        let e = s.admin.get::<Vm>("/api/v1/tenants/gamma/vms/g-small").await.unwrap_err();
        assert_eq!(e.status(), Some(404));
        // At most three queued per project.
        for n in 1..=3 {
            let v = post("gamma", queued(vm(&format!("g-w{n}"), 8, g))).await.unwrap();
            assert_eq!(v.state, VmState::Queued);
        }
        let e = post("gamma", queued(vm("g-w4", 8, g))).await.unwrap_err();
        assert_eq!(e.problem().unwrap().kind, "/problems/quota-exceeded", "{e}");
        assert!(e.to_string().contains("max_per_project"), "{e}");
        assert!(s.admin.get::<Vm>("/api/v1/tenants/gamma/vms/g-w4").await.is_err(), "refused: not made");
        // Only what could ever run waits: a GPU request naming no model
        // waits for (and is counted against) the one that could take it;
        // more GPUs than any host has is refused; an address is not held
        // while waiting.
        let any = post("beta", queued(VmCreate { gpu_model: None, ..vm("b-any", 8, g) })).await.unwrap();
        assert_eq!((any.state, any.spec.gpu_model.as_deref()), (VmState::Queued, Some(H100)));
        let e = post("beta", queued(vm("b-huge", 16, g))).await.unwrap_err();
        assert_eq!(e.problem().unwrap().kind, "/problems/insufficient-capacity", "{e}");
        assert!(e.to_string().contains("not queued"), "{e}");
        let e = post("beta", VmCreate { public_ip: true, ..queued(vm("b-addr", 8, g)) }).await.unwrap_err();
        assert_eq!(e.problem().unwrap().errors[0].field, "queue", "{e}");
        // A week later, still unplaced: they leave the queue.
        clock.advance(chrono::Duration::days(7));
        settle_queue(s, &mut agents).await;
        for n in 1..=3 {
            let e = s.admin.get::<Vm>(&format!("/api/v1/tenants/gamma/vms/g-w{n}")).await.unwrap_err();
            assert_eq!(e.status(), Some(404), "g-w{n} expired");
        }
        assert_eq!(s.admin.get::<Vm>("/api/v1/tenants/beta/vms/b-any").await.unwrap_err().status(), Some(404));
        assert!(!kumo_server::store::queue::any(s.db()).await.unwrap());
    }
}
