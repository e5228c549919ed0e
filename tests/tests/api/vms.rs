//! Hosts, the agent protocol and the VM lifecycle, with simulated agents
//! speaking the real protocol, on both databases.

use std::time::{Duration, Instant};

use kumo_api_types::{
    ActualState, HostDetail, Page, Problem, Role, Vm, VmCreate, VmEvent, VmState, VmStatus,
};
use serde_json::json;

use crate::harness::{on_both_backends, Backend, TestServer};

fn vm(name: &str, gpus: u32) -> VmCreate {
    VmCreate {
        name: name.into(),
        gpus,
        gpu_model: None,
        vcpus: Some(8 * gpus.max(1)),
        memory_gib: Some(16),
        disk_gib: None,
        template: None,
        service_level: Default::default(),
        ssh_keys: vec!["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEfKZKAnUydzsiZEOKuPIAY7Nck1wiFzauveaJjZfhrF user@lab".into()],
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

async fn create(
    s: &TestServer,
    tenant: &str,
    body: &VmCreate,
) -> Result<Vm, kumo_cli::ClientError> {
    s.admin
        .post(&format!("/api/v1/tenants/{tenant}/vms"), body)
        .await
}

async fn get_vm(s: &TestServer, tenant: &str, name: &str) -> Result<Vm, kumo_cli::ClientError> {
    s.admin
        .get(&format!("/api/v1/tenants/{tenant}/vms/{name}"))
        .await
}

async fn act(s: &TestServer, tenant: &str, name: &str, action: &str) -> reqwest::Response {
    s.http()
        .post(format!(
            "{}/api/v1/tenants/{tenant}/vms/{name}/{action}",
            s.url
        ))
        .bearer_auth(&s.admin_token)
        .send()
        .await
        .unwrap()
}

async fn delete(s: &TestServer, tenant: &str, name: &str) -> reqwest::Response {
    s.http()
        .delete(format!("{}/api/v1/tenants/{tenant}/vms/{name}", s.url))
        .bearer_auth(&s.admin_token)
        .send()
        .await
        .unwrap()
}

on_both_backends! {
    async fn hosts_register_with_a_join_token(s: &TestServer) {
        let a = s.sim_agent("gpu-001", "hgx-h100").await;
        let hosts: Page<kumo_api_types::Host> = s.admin.get("/api/v1/hosts").await.unwrap();
        assert_eq!(hosts.items.len(), 1);
        let h = &hosts.items[0];
        assert_eq!((h.name.as_str(), h.gpus, h.gpus_free, h.rdma_nics), ("gpu-001", 8, 8, 8));
        assert_eq!(h.gpu_models, vec!["H100-SXM5-80GB"]);
        let d: HostDetail = s.admin.get("/api/v1/hosts/gpu-001").await.unwrap();
        assert!(d.matrix.contains("NV18") && d.matrix.contains("PIX"));
        assert!(d.allocations.is_empty());
        assert_eq!(a.heartbeat().await, 204);
        // A join token never takes a registered host's name: 409, and the
        // host's credential still works.
        let register = |join: String, current: Option<String>| {
            let url = s.url.clone();
            async move {
                let mut req = reqwest::Client::new().post(format!("{url}/agent/v1/register"));
                if let Some(c) = current {
                    req = req.bearer_auth(c);
                }
                req.json(&kumo_api_types::AgentRegister {
                    join_token: join,
                    name: "gpu-001".into(),
                    topology: crate::harness::fixture_topology("hgx-h100"),
                    virt_type: "kvm".into(),
                    scalable_unit: None,
                    rails: Default::default(),
                    underlay_ip: None,
                    edge_uplink: None,
                    transfer_url: None,
                })
                .send()
                .await
                .unwrap()
            }
        };
        let r = register(s.join_token().await, None).await;
        assert_eq!(r.status(), 409, "a join token took a registered name");
        assert_eq!(a.heartbeat().await, 204);
        // Its own agent (showing its current credential) re-joins: the host
        // stays, the old credential dies.
        let r = register(s.join_token().await, Some(a.credential.clone())).await;
        assert_eq!(r.status(), 201);
        let again: kumo_api_types::AgentRegistered = r.json().await.unwrap();
        assert_eq!(again.host_id, a.host_id);
        assert_eq!(a.heartbeat().await, 401);
        // An administrator lets a reinstalled machine re-join: its
        // credential dies at once, and the next registration is let in, once.
        let hb = |cred: String| {
            let url = s.url.clone();
            async move {
                reqwest::Client::new().post(format!("{url}/agent/v1/heartbeat")).bearer_auth(cred)
                    .json(&json!({})).send().await.unwrap().status().as_u16()
            }
        };
        assert_eq!(hb(again.credential.clone()).await, 204);
        let r = s.http().post(format!("{}/api/v1/hosts/gpu-001/rejoin", s.url)).bearer_auth(&s.admin_token).send().await.unwrap();
        assert_eq!(r.status(), 204);
        assert_eq!(hb(again.credential.clone()).await, 401, "rejoin revokes the credential");
        let r = register(s.join_token().await, None).await;
        assert_eq!(r.status(), 201);
        let third: kumo_api_types::AgentRegistered = r.json().await.unwrap();
        assert_eq!(third.host_id, a.host_id);
        assert_eq!(hb(third.credential).await, 204);
        assert_eq!(register(s.join_token().await, None).await.status(), 409, "once");
        // Every registration is audited, by the join token that made it.
        let audit = s.admin.audit(None, 200).await.unwrap();
        let regs: Vec<_> = audit.iter().filter(|e| e.action.starts_with("host.") && e.action.ends_with("register")).collect();
        assert_eq!(regs.len(), 3, "{regs:?}");
        assert!(regs.iter().all(|e| e.actor.starts_with("join-token:")), "{regs:?}");
        // Bad join tokens and bad credentials.
        let r = reqwest::Client::new()
            .post(format!("{}/agent/v1/register", s.url))
            .json(&json!({"join_token": "kumoj_0123456789abcdef0123456789abcdef_x", "name": "evil", "topology": {"numa_nodes": [], "pci_devices": [], "gpus": [], "nics": [], "nvswitches": []}, "virt_type": "kvm"}))
            .send().await.unwrap();
        assert_eq!(r.status(), 401);
        let r = reqwest::Client::new().get(format!("{}/agent/v1/desired", s.url)).bearer_auth(&s.admin_token).send().await.unwrap();
        assert_eq!(r.status(), 401, "a user token is not a host credential");
    }

    async fn join_tokens_are_counted_listed_and_revoked(s: &TestServer) {
        let made: kumo_api_types::JoinTokenCreated = s.admin.post("/api/v1/hosts/join-tokens", &json!({"description": "rack 7"})).await.unwrap();
        assert_eq!(made.uses, 1, "single-use by default");
        let reg = |name: &'static str, token: String| {
            let url = s.url.clone();
            async move {
                reqwest::Client::new().post(format!("{url}/agent/v1/register"))
                    .json(&kumo_api_types::AgentRegister {
                        join_token: token, name: name.into(),
                        topology: crate::harness::fixture_topology("cpu-only"),
                        virt_type: "kvm".into(), scalable_unit: None, rails: Default::default(), underlay_ip: None,
                        edge_uplink: None,
                        transfer_url: None,
                    })
                    .send().await.unwrap().status().as_u16()
            }
        };
        assert_eq!(reg("cpu-1", made.token.clone()).await, 201);
        assert_eq!(reg("cpu-2", made.token.clone()).await, 401, "its one use is spent");
        // Listed with its uses, never its secret.
        let r = s.http().get(format!("{}/api/v1/hosts/join-tokens", s.url)).bearer_auth(&s.admin_token).send().await.unwrap();
        let body = r.text().await.unwrap();
        // `kumoj_<id>_<secret>`; the secret itself may hold `_`.
        let secret = made.token.splitn(3, '_').nth(2).unwrap().to_owned();
        assert!(secret.len() >= 32, "{secret}");
        assert!(!body.contains(&secret));
        let page: Page<kumo_api_types::JoinTokenInfo> = serde_json::from_str(&body).unwrap();
        let info = page.items.iter().find(|t| t.id == made.id).unwrap();
        assert_eq!((info.uses, info.used, info.description.as_str()), (1, 1, "rack 7"));
        // A token for three, revoked after one: the rest are refused.
        let three: kumo_api_types::JoinTokenCreated = s.admin.post("/api/v1/hosts/join-tokens", &json!({"uses": 3})).await.unwrap();
        assert_eq!(reg("cpu-3", three.token.clone()).await, 201);
        // A failed registration (a bad name) does not spend a use.
        assert_eq!(reg("Not A Name", three.token.clone()).await, 400);
        let r = s.http().delete(format!("{}/api/v1/hosts/join-tokens/{}", s.url, three.id)).bearer_auth(&s.admin_token).send().await.unwrap();
        assert_eq!(r.status(), 204);
        assert_eq!(reg("cpu-4", three.token.clone()).await, 401, "revoked");
        let page: Page<kumo_api_types::JoinTokenInfo> = s.admin.get("/api/v1/hosts/join-tokens").await.unwrap();
        let info = page.items.iter().find(|t| t.id == three.id).unwrap();
        assert_eq!(info.used, 1);
        assert!(info.revoked_at.is_some());
        // Tenants' members see none of it.
        let (_, user) = s.user("mallory").await;
        let r = s.http().get(format!("{}/api/v1/hosts/join-tokens", s.url)).bearer_auth(&user).send().await.unwrap();
        assert_eq!(r.status(), 403);
        let r = s.http().delete(format!("{}/api/v1/hosts/join-tokens/{}", s.url, made.id)).bearer_auth(&user).send().await.unwrap();
        assert_eq!(r.status(), 403);
        let r = s.http().post(format!("{}/api/v1/hosts/cpu-1/rejoin", s.url)).bearer_auth(&user).send().await.unwrap();
        assert_eq!(r.status(), 403);
    }

    async fn a_vm_goes_through_its_whole_life(s: &TestServer) {
        s.tenant("lab").await;
        let mut agent = s.sim_agent("gpu-001", "hgx-h100").await;
        let v = create(s, "lab", &vm("train", 8)).await.unwrap();
        assert_eq!(v.state, VmState::Scheduled);
        assert_eq!(v.host.as_deref(), Some("gpu-001"));
        let p = v.placement.clone().unwrap();
        assert_eq!(p.gpus.len(), 8);
        // On no RoCE segment, no RDMA NIC: never a NIC's physical function.
        assert!(p.gpus.iter().all(|g| g.nic.is_none() && g.nic_guest_bdf.is_none()), "no NIC off RoCE: {p:?}");
        // An H100 guest boots UEFI with an aperture for 8 × 128 GiB BARs.
        assert_eq!(p.firmware, "efi");
        assert!(p.mmio64_bytes.unwrap() >= 8 * (128u64 << 30), "{p:?}");
        assert!(p.phys_bits.unwrap() <= 46, "within the Sapphire Rapids host's width");
        assert_eq!(p.numa.len(), 2);

        agent.converge().await;
        assert_eq!(get_vm(s, "lab", "train").await.unwrap().state, VmState::Running);

        // The NCCL file names the guest addresses the placement shows.
        let xml = s.nccl_topology("lab", "train").await;
        assert!(xml.starts_with("<system version=\"1\">"));
        for g in &p.gpus {
            assert!(xml.contains(&format!("busid=\"{}\"", g.guest_bdf)), "{xml}");
        }

        assert_eq!(act(s, "lab", "train", "start").await.status(), 409, "already running");
        assert_eq!(act(s, "lab", "train", "stop").await.status(), 202);
        assert_eq!(act(s, "lab", "train", "stop").await.status(), 409, "already stopping");
        agent.converge().await;
        assert_eq!(get_vm(s, "lab", "train").await.unwrap().state, VmState::Stopped);
        assert_eq!(act(s, "lab", "train", "reboot").await.status(), 409, "stopped VMs do not reboot");
        assert_eq!(act(s, "lab", "train", "start").await.status(), 202);
        assert_eq!(get_vm(s, "lab", "train").await.unwrap().state, VmState::Provisioning);
        agent.converge().await;
        assert_eq!(get_vm(s, "lab", "train").await.unwrap().state, VmState::Running);
        let before = agent.desired(None).await.vms[0].power_generation;
        assert_eq!(act(s, "lab", "train", "reboot").await.status(), 202);
        assert_eq!(agent.desired(None).await.vms[0].power_generation, before + 1);

        // Delete: devices stay held until the host confirms, then are free.
        assert_eq!(delete(s, "lab", "train").await.status(), 202);
        assert_eq!(get_vm(s, "lab", "train").await.unwrap().state, VmState::Deleting);
        let d: HostDetail = s.admin.get("/api/v1/hosts/gpu-001").await.unwrap();
        assert!(!d.allocations.is_empty());
        agent.converge().await;
        assert_eq!(get_vm(s, "lab", "train").await.unwrap_err().status(), Some(404));
        let d: HostDetail = s.admin.get("/api/v1/hosts/gpu-001").await.unwrap();
        assert!(d.allocations.is_empty(), "{:?}", d.allocations);

        let events: Page<VmEvent> = s.admin.get("/api/v1/tenants/lab/events?limit=100").await.unwrap();
        let kinds: Vec<&str> = events.items.iter().rev().map(|e| e.kind.as_str()).collect();
        for k in ["created", "scheduled", "running", "stop-requested", "stopped", "start-requested", "reboot-requested", "delete-requested", "deleted"] {
            assert!(kinds.contains(&k), "{k} in {kinds:?}");
        }
        assert_eq!(kinds[0], "created");
        assert_eq!(*kinds.last().unwrap(), "deleted");
    }

    async fn capacity_is_held_and_freed(s: &TestServer) {
        s.tenant("lab").await;
        let mut agent = s.sim_agent("gpu-001", "hgx-h100").await;
        create(s, "lab", &vm("vm-a", 4)).await.unwrap();
        create(s, "lab", &vm("vm-b", 4)).await.unwrap();
        let full = create(s, "lab", &vm("vm-c", 1)).await.unwrap_err();
        assert_eq!(full.problem().unwrap().kind, "/problems/insufficient-capacity");
        // No GPU is held twice, and the two VMs got disjoint CPUs.
        let d: HostDetail = s.admin.get("/api/v1/hosts/gpu-001").await.unwrap();
        let gpus: Vec<_> = d.allocations.iter().filter(|a| a.kind == "gpu").collect();
        assert_eq!(gpus.len(), 8);
        let a = get_vm(s, "lab", "vm-a").await.unwrap().placement.unwrap();
        let b = get_vm(s, "lab", "vm-b").await.unwrap().placement.unwrap();
        assert!(a.gpus.iter().all(|g| b.gpus.iter().all(|h| h.host_bdf != g.host_bdf)));
        assert!(a.numa.iter().all(|x| b.numa.iter().all(|y| x.host_cpus != y.host_cpus)));
        // A CPU-only VM is a normal VM.
        let cpu = create(s, "lab", &vm("small", 0)).await.unwrap();
        assert!(cpu.placement.unwrap().gpus.is_empty());
        // Deleting frees GPUs for the next VM.
        delete(s, "lab", "vm-a").await;
        agent.converge().await;
        let c = create(s, "lab", &vm("vm-c", 4)).await.unwrap();
        let c_gpus: Vec<_> = c.placement.unwrap().gpus.into_iter().map(|g| g.host_bdf).collect();
        assert_eq!(c_gpus, a.gpus.iter().map(|g| g.host_bdf.clone()).collect::<Vec<_>>());
    }

    async fn concurrent_creates_for_the_last_gpus_have_one_winner(s: &TestServer) {
        s.tenant("lab").await;
        let _agent = s.sim_agent("gpu-001", "hgx-h100").await;
        let mut tasks = Vec::new();
        for i in 0..4 {
            let c = s.admin.clone();
            tasks.push(tokio::spawn(async move {
                c.post::<_, Vm>("/api/v1/tenants/lab/vms", &vm(&format!("race-{i}"), 8)).await
            }));
        }
        let mut won = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(_) => won += 1,
                Err(e) => assert_eq!(e.problem().unwrap().kind, "/problems/insufficient-capacity"),
            }
        }
        assert_eq!(won, 1);
        let d: HostDetail = s.admin.get("/api/v1/hosts/gpu-001").await.unwrap();
        assert_eq!(d.allocations.iter().filter(|a| a.kind == "gpu").count(), 8);
    }

    async fn bad_vm_requests_are_problems(s: &TestServer) {
        s.tenant("lab").await;
        let _agent = s.sim_agent("gpu-001", "hgx-h100").await;
        create(s, "lab", &vm("one", 1)).await.unwrap();
        let e = create(s, "lab", &vm("one", 1)).await.unwrap_err();
        assert_eq!(e.problem().unwrap().kind, "/problems/conflict");
        let mut t = vm("two", 1);
        t.template = Some("nope".into());
        let e = create(s, "lab", &t).await.unwrap_err();
        assert_eq!(e.problem().unwrap().errors[0].field, "template");
        assert_eq!(create(s, "lab", &vm("three", 65)).await.unwrap_err().status(), Some(400));
        let e = create(s, "lab", &vm("four", 9)).await.unwrap_err();
        assert_eq!(e.problem().unwrap().kind, "/problems/insufficient-capacity");
        let mut k = vm("five", 1);
        k.ssh_keys = vec!["not a key".into()];
        assert_eq!(create(s, "lab", &k).await.unwrap_err().status(), Some(400));
        // A NUL in the comment would cut the guest's authorized_keys; a key
        // that only looks like one (the old prefix check took it) is refused.
        let good = vm("x", 0).ssh_keys[0].clone();
        for bad in [good.replace("user@lab", "user\0lab"), "ssh-ed25519 AAAAC3Nz user@lab".into()] {
            k.ssh_keys = vec![bad];
            let e = create(s, "lab", &k).await.unwrap_err();
            assert_eq!(e.problem().unwrap().errors[0].field, "ssh_keys[0]", "{e:?}");
        }
        let mut m = vm("six", 1);
        m.gpu_model = Some("A100-SXM4-40GB".into());
        assert_eq!(create(s, "lab", &m).await.unwrap_err().status(), Some(409));
        // A tenant with VMs cannot be deleted out from under them.
        assert_eq!(s.admin.delete_tenant("lab").await.unwrap_err().status(), Some(409));
        // Templates exist once created, and then VMs may name them.
        let tpl: kumo_api_types::Template = s.admin.post("/api/v1/templates", &json!({"name": "ubuntu-24-04", "image_path": "/var/lib/kumo/images/ubuntu-24.04.qcow2", "os": "Ubuntu 24.04", "default_user": "ubuntu"})).await.unwrap();
        assert_eq!(tpl.name, "ubuntu-24-04");
        let mut t = vm("seven", 1);
        t.template = Some("ubuntu-24-04".into());
        let v = create(s, "lab", &t).await.unwrap();
        // The host path reaches the agent, never the tenant.
        assert_eq!(v.spec.template.as_deref(), Some("ubuntu-24-04"));
        assert_eq!(v.spec.image_path, None);
        let raw: serde_json::Value = s.admin.get(&format!("/api/v1/tenants/lab/vms/{}", v.name)).await.unwrap();
        assert!(!raw.to_string().contains("/var/lib/kumo/images"), "{raw}");
        let (member, _) = s.user("tpl-reader").await;
        let seen: kumo_api_types::Page<kumo_api_types::Template> = member.get("/api/v1/templates").await.unwrap();
        assert!(!seen.items.is_empty());
        assert!(seen.items.iter().all(|t| t.image_path.is_none() && t.kernel_path.is_none()), "{:?}", seen.items);
        let as_admin: kumo_api_types::Page<kumo_api_types::Template> = s.admin.get("/api/v1/templates").await.unwrap();
        assert!(as_admin.items.iter().any(|t| t.image_path.as_deref() == Some("/var/lib/kumo/images/ubuntu-24.04.qcow2")));
        let bad: Result<kumo_api_types::Template, _> = s.admin.post("/api/v1/templates", &json!({"name": "x-evil", "image_path": "relative/../x", "os": "x", "default_user": "root"})).await;
        assert_eq!(bad.unwrap_err().status(), Some(400));
    }

    async fn agents_cannot_speak_for_other_hosts(s: &TestServer) {
        s.tenant("lab").await;
        let mut mine = s.sim_agent("gpu-001", "hgx-h100").await;
        let other = s.sim_agent("gpu-002", "cpu-only").await;
        let v = create(s, "lab", &vm("train", 2)).await.unwrap();
        assert_eq!(v.host.as_deref(), Some("gpu-001"));
        let r = other.report(vec![VmStatus { id: v.id, state: ActualState::Failed, reason: Some("forged".into()), guest: None, notice: None, mounts: vec![] }]).await;
        assert_eq!(r.status(), 400);
        let p: Problem = r.json().await.unwrap();
        assert!(p.detail.unwrap().contains("does not belong"));
        assert_eq!(get_vm(s, "lab", "train").await.unwrap().state, VmState::Scheduled, "nothing applied");
        assert!(other.desired(None).await.vms.is_empty(), "a host sees only its own VMs");
        // Malformed reports are refused whole.
        let r = reqwest::Client::new().post(format!("{}/agent/v1/status", s.url)).bearer_auth(&mine.credential)
            .header("content-type", "application/json").body(r#"{"vms":[{"id":"x","state":"melted"}]}"#).send().await.unwrap();
        assert_eq!(r.status(), 400);
        mine.converge().await;
        assert_eq!(get_vm(s, "lab", "train").await.unwrap().state, VmState::Running);
        // A failure report puts the VM in error with the reason.
        let r = mine.report(vec![VmStatus { id: v.id, state: ActualState::Failed, reason: Some("qemu: vfio error".into()), guest: None, notice: None, mounts: vec![] }]).await;
        assert_eq!(r.status(), 204);
        let e = get_vm(s, "lab", "train").await.unwrap();
        assert_eq!((e.state, e.reason.as_deref()), (VmState::Error, Some("qemu: vfio error")));
    }

    async fn one_guests_garbage_costs_only_its_own_entry(s: &TestServer) {
        s.tenant("lab").await;
        let mut agent = s.sim_agent("gpu-001", "hgx-h100").await;
        let bad = create(s, "lab", &vm("noisy", 1)).await.unwrap();
        let good = create(s, "lab", &vm("quiet", 1)).await.unwrap();
        // A guest (through the guest agent) controls these texts: a control
        // character in one, far too much in another.
        let r = agent
            .report(vec![
                VmStatus { id: bad.id, state: ActualState::Running, reason: None, guest: Some("nccl\u{1b}[2J\u{0}".into()), notice: None, mounts: vec![] },
                VmStatus { id: good.id, state: ActualState::Running, reason: None, guest: Some("nccl topology written".into()), notice: None, mounts: vec![] },
            ])
            .await;
        assert_eq!(r.status(), 204, "the report is taken");
        assert_eq!(get_vm(s, "lab", "quiet").await.unwrap().state, VmState::Running, "the good entry applied");
        assert_eq!(get_vm(s, "lab", "noisy").await.unwrap().state, VmState::Scheduled, "the bad entry dropped");
        let r = agent
            .report(vec![VmStatus { id: bad.id, state: ActualState::Failed, reason: Some("x".repeat(kumo_api_types::REPORT_TEXT_MAX + 1)), guest: None, notice: None, mounts: vec![] }])
            .await;
        assert_eq!(r.status(), 204);
        assert_eq!(get_vm(s, "lab", "noisy").await.unwrap().state, VmState::Scheduled);
        // What the real agent sends is bounded first, so it always fits.
        let cleaned = VmStatus { id: bad.id, state: ActualState::Running, reason: None, guest: Some("a\u{0}b".repeat(600)), notice: None, mounts: vec![] }.bounded();
        assert!(cleaned.texts_fit());
        assert_eq!(agent.report(vec![cleaned]).await.status(), 204);
        assert_eq!(get_vm(s, "lab", "noisy").await.unwrap().state, VmState::Running);
        agent.converge().await;
    }

    async fn changes_reach_a_long_polling_agent_at_once(s: &TestServer) {
        s.tenant("lab").await;
        let agent = s.sim_agent("gpu-001", "hgx-h100").await;
        let rev = agent.desired(None).await.revision;
        let started = Instant::now();
        let poll = tokio::spawn(async move {
            let d = agent.desired(Some(rev)).await;
            (d, Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let created_at = Instant::now();
        create(s, "lab", &vm("train", 1)).await.unwrap();
        let (d, woke) = poll.await.unwrap();
        assert!(d.revision > rev);
        assert_eq!(d.vms.len(), 1);
        assert!(woke.duration_since(created_at) < Duration::from_secs(2), "took {:?}", woke.duration_since(created_at));
        assert!(woke.duration_since(started) < Duration::from_secs(20), "did not wait for the poll's timeout");
    }
}

/// A silent agent's host becomes unreachable and its VMs `unknown` (not
/// deleted); a heartbeat brings both back.
#[tokio::test]
async fn silent_hosts_become_unreachable_and_come_back() {
    let s = TestServer::start_with(Backend::Sqlite, |c| {
        c.heartbeat_timeout = Duration::from_secs(2)
    })
    .await;
    s.tenant("lab").await;
    let mut agent = s.sim_agent("gpu-001", "hgx-h100").await;
    create(&s, "lab", &vm("train", 1)).await.unwrap();
    agent.converge().await;
    assert_eq!(
        get_vm(&s, "lab", "train").await.unwrap().state,
        VmState::Running
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = get_vm(&s, "lab", "train").await.unwrap();
        if v.state == VmState::Unknown {
            break;
        }
        assert!(Instant::now() < deadline, "host never became unreachable");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let hosts: Page<kumo_api_types::Host> = s.admin.get("/api/v1/hosts").await.unwrap();
    assert_eq!(hosts.items[0].state, kumo_api_types::HostState::Unreachable);
    // Unreachable hosts take no new VMs.
    assert_eq!(
        create(&s, "lab", &vm("more", 1))
            .await
            .unwrap_err()
            .status(),
        Some(409)
    );
    assert_eq!(agent.heartbeat().await, 204);
    assert_eq!(
        get_vm(&s, "lab", "train").await.unwrap().state,
        VmState::Running
    );
    s.stop().await;
}

#[tokio::test]
async fn viewers_read_vms_and_members_run_them() {
    let s = TestServer::start(Backend::Sqlite).await;
    s.tenant("lab").await;
    let (viewer, _) = s.user("vera").await;
    let (member, _) = s.user("mika").await;
    s.add("lab", "vera", Role::Viewer).await;
    s.add("lab", "mika", Role::Member).await;
    let _agent = s.sim_agent("gpu-001", "hgx-h100").await;
    let v: Vm = member
        .post("/api/v1/tenants/lab/vms", &vm("mine", 1))
        .await
        .unwrap();
    assert_eq!(v.state, VmState::Scheduled);
    let seen: Vm = viewer.get("/api/v1/tenants/lab/vms/mine").await.unwrap();
    assert_eq!(seen.id, v.id);
    let denied: Result<Vm, _> = viewer
        .post("/api/v1/tenants/lab/vms", &vm("theirs", 1))
        .await;
    assert_eq!(denied.unwrap_err().status(), Some(403));
    s.stop().await;
}

/// Everything lives in the database: a restarted server (same SQLite file)
/// knows every tenant, host and VM, and the host's agent carries on.
#[tokio::test]
async fn a_restarted_server_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = kumo_server::config::Config::for_data_dir(dir.path(), None);
    let server = kumo_server::RunningServer::start(config.clone())
        .await
        .unwrap();
    let token = std::fs::read_to_string(dir.path().join("admin-token"))
        .unwrap()
        .trim()
        .to_owned();
    let admin = kumo_cli::Client::new(&server.url(), Some(token.clone())).unwrap();
    admin
        .create_tenant(&kumo_api_types::TenantCreate {
            name: "lab".into(),
            display_name: None,
            description: None,
        })
        .await
        .unwrap();
    let mut q = kumo_api_types::Quota {
        vcpus: 64,
        memory_gib: 1024,
        vms: 4,
        disk_gib: 1000,
        ..Default::default()
    };
    q.gpus.insert("H100-SXM5-80GB".into(), 8);
    admin.set_quota("lab", &q).await.unwrap();
    let join: kumo_api_types::JoinTokenCreated = admin
        .post("/api/v1/hosts/join-tokens", &serde_json::json!({}))
        .await
        .unwrap();
    let mut agent = crate::harness::SimAgent::register(
        &server.url(),
        &join.token,
        "gpu-001",
        crate::harness::fixture_topology("hgx-h100"),
    )
    .await;
    let v: Vm = admin
        .post("/api/v1/tenants/lab/vms", &vm("train", 4))
        .await
        .unwrap();
    agent.converge().await;
    server.stop().await.unwrap();

    let server = kumo_server::RunningServer::start(config).await.unwrap();
    assert!(server.admin_token_file.is_none(), "no second bootstrap");
    let admin = kumo_cli::Client::new(&server.url(), Some(token)).unwrap();
    let again: Vm = admin.get("/api/v1/tenants/lab/vms/train").await.unwrap();
    assert_eq!((again.id, again.state), (v.id, VmState::Running));
    assert_eq!(
        again.placement,
        v.placement.map(|mut p| {
            p.gpus.sort_by(|a, b| a.host_bdf.cmp(&b.host_bdf));
            p
        })
    );
    let d: HostDetail = admin.get("/api/v1/hosts/gpu-001").await.unwrap();
    assert_eq!(d.allocations.iter().filter(|a| a.kind == "gpu").count(), 4);
    // The agent's credential still works against the new process.
    agent.url = server.url();
    assert_eq!(agent.heartbeat().await, 204);
    server.stop().await.unwrap();
}

on_both_backends! {
    /// Consoles are authorised like everything else, tickets open once,
    /// and an agent cannot answer for a console it was not asked to dial.
    async fn console_tickets_are_authorised_and_open_once(s: &TestServer) {
        s.tenant("lab").await;
        let (_, viewer) = s.user("vera").await;
        s.add("lab", "vera", Role::Viewer).await;
        let (_, outsider) = s.user("oscar").await;
        let mut agent = s.sim_agent("con-001", "cpu-only").await;
        s.admin.create_vm("lab", &vm("web", 0)).await.unwrap();
        let ticket = async |token: &str, mode: &str| {
            s.http()
                .post(format!("{}/api/v1/tenants/lab/vms/web/console?mode={mode}", s.url))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
        };
        assert_eq!(ticket(&s.admin_token, "write").await.status(), 409, "not running yet");
        agent.converge().await;
        assert_eq!(ticket(&viewer, "write").await.status(), 403, "viewers watch only");
        assert_eq!(ticket(&outsider, "read").await.status(), 404, "another tenant's VM");
        assert_eq!(ticket(&s.admin_token, "scribble").await.status(), 400);
        let r = ticket(&viewer, "read").await;
        assert_eq!(r.status(), 201);
        let t: kumo_api_types::ConsoleTicket = r.json().await.unwrap();
        assert!(!t.write && t.url.starts_with("/api/v1/consoles/"), "{t:?}");

        // A made-up ticket opens nothing.
        let ws = |path: String| {
            tokio_tungstenite::connect_async(format!("{}{path}", s.url.replace("http://", "ws://")))
        };
        let refused = |e: tokio_tungstenite::tungstenite::Error| match e {
            tokio_tungstenite::tungstenite::Error::Http(r) => r.status().as_u16(),
            other => panic!("{other}"),
        };
        let e = ws(format!("/api/v1/consoles/{}", "0".repeat(64))).await.unwrap_err();
        assert_eq!(refused(e), 404);

        // An agent dialling a session it was not given is refused, and so
        // is a caller without the host's credential.
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let dial = |credential: &str| {
            let url = format!(
                "{}/agent/v1/console/{}",
                s.url.replace("http://", "ws://"),
                uuid::Uuid::new_v4()
            );
            let mut req = url.into_client_request().unwrap();
            req.headers_mut()
                .insert("authorization", format!("Bearer {credential}").parse().unwrap());
            tokio_tungstenite::connect_async(req)
        };
        assert_eq!(refused(dial(&agent.credential).await.unwrap_err()), 404);
        assert_eq!(refused(dial("kumo_host_nope").await.unwrap_err()), 401);

        // Opened, the ticket asks the agent to dial (its desired state
        // lists the console); the test driver's agent never answers here,
        // so a second open of the same ticket finds it used.
        let opening = tokio::spawn(ws(t.url.clone()));
        let listed = Instant::now();
        loop {
            let d = agent.desired(None).await;
            if let Some(c) = d.consoles.first() {
                assert_eq!(c.vm, s.admin.vm("lab", "web").await.unwrap().id);
                break;
            }
            assert!(listed.elapsed() < Duration::from_secs(10), "the agent was never asked");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let e = ws(t.url.clone()).await.unwrap_err();
        assert_eq!(refused(e), 404, "a ticket opens once");
        opening.abort();

        // A ticket is a secret shown once: a retry with the same
        // Idempotency-Key is not answered with it again.
        let keyed = || {
            s.http()
                .post(format!("{}/api/v1/tenants/lab/vms/web/console?mode=read", s.url))
                .bearer_auth(&s.admin_token)
                .header("Idempotency-Key", "console-once")
                .send()
        };
        let first: kumo_api_types::ConsoleTicket = keyed().await.unwrap().json().await.unwrap();
        assert!(first.ticket.starts_with("kumoc_") && first.url.ends_with(&first.ticket), "{first:?}");
        let again = keyed().await.unwrap();
        assert_eq!(again.status(), 409);
        assert!(!again.text().await.unwrap().contains(&first.ticket), "not kept, not replayed");

        // The portal's console page asks for its ticket with the session
        // (and its CSRF token); the page says so when the VM has no
        // console.
        let portal = s.portal_admin().await;
        let page = s.page(&portal, "/t/lab/vms/web/console").await;
        assert!(page.contains("id=\"console\"") && page.contains("/static/console.js"), "{page}");
        let csrf = page
            .split("data-csrf=\"")
            .nth(1)
            .and_then(|v| v.split('"').next())
            .unwrap()
            .to_owned();
        let portal_ticket = async |csrf: &str| {
            portal
                .post(format!("{}/t/lab/vms/web/console", s.url))
                .form(&[("csrf", csrf), ("mode", "read")])
                .send()
                .await
                .unwrap()
        };
        assert_eq!(portal_ticket("forged").await.status(), 403, "CSRF");
        let r = portal_ticket(&csrf).await;
        assert_eq!(r.status(), 201);
        let pt: kumo_api_types::ConsoleTicket = r.json().await.unwrap();
        assert!(pt.url.starts_with("/api/v1/consoles/kumoc_"), "{pt:?}");
        // Signing out ends the session, and a ticket minted with it opens
        // nothing.
        let out = portal
            .post(format!("{}/auth/logout", s.url))
            .form(&[("csrf", csrf.as_str())])
            .send()
            .await
            .unwrap();
        assert!(out.status().is_redirection(), "{}", out.status());
        let e = ws(pt.url.clone()).await.unwrap_err();
        assert_eq!(refused(e), 401, "the session it was minted with ended");
        let vera_portal = s.http();
        let r = vera_portal
            .post(format!("{}/t/lab/vms/web/console", s.url))
            .form(&[("csrf", csrf.as_str())])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "no session, no ticket");
        // xterm.js is served from the build (npm-installed, not committed).
        let xterm = s.http().get(format!("{}/static/xterm.js", s.url)).send().await.unwrap();
        assert_eq!(xterm.status(), 200, "the portal's build has xterm.js (./x test installs it)");
        assert!(xterm.text().await.unwrap().contains("Terminal"));
        assert!(page.contains("/static/xterm.js"));

        // Tickets are kept in the server's memory: one tenant cannot pile
        // them up.
        let mut last = 0;
        for _ in 0..40 {
            last = ticket(&s.admin_token, "read").await.status().as_u16();
            if last != 201 {
                break;
            }
        }
        assert_eq!(last, 409, "a tenant's waiting tickets are capped");
    }

    /// An open console follows its holder's standing in the project, not
    /// only their credential: demoted to viewer, it turns read-only (typing
    /// and Ctrl-Alt-Del are dropped); removed, it closes.
    async fn an_open_console_follows_membership_and_role(s: &TestServer) {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        use tokio_tungstenite::tungstenite::Message;
        s.tenant("lab").await;
        let (_, mia) = s.user("mia").await;
        s.add("lab", "mia", Role::Member).await;
        let mut agent = s.sim_agent("con-002", "cpu-only").await;
        s.admin.create_vm("lab", &vm("web", 0)).await.unwrap();
        agent.converge().await;
        let ws_url = s.url.replace("http://", "ws://");
        let ticket = async |token: &str| -> kumo_api_types::ConsoleTicket {
            let r = s
                .http()
                .post(format!("{}/api/v1/tenants/lab/vms/web/console?mode=write", s.url))
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201);
            r.json().await.unwrap()
        };
        let t = ticket(&mia).await;
        let opening = tokio::spawn(tokio_tungstenite::connect_async(format!("{ws_url}{}", t.url)));
        // The test stands in for the host's agent: it dials the session it
        // is given and records what the person's side sends to the VM.
        let asked = Instant::now();
        let session = loop {
            if let Some(c) = agent.desired(None).await.consoles.first() {
                break c.session;
            }
            assert!(asked.elapsed() < Duration::from_secs(10), "the agent was never asked");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let mut req = format!("{ws_url}/agent/v1/console/{session}").into_client_request().unwrap();
        req.headers_mut()
            .insert("authorization", format!("Bearer {}", agent.credential).parse().unwrap());
        let (host_end, _) = tokio_tungstenite::connect_async(req).await.unwrap();
        let (_host_tx, mut host_rx) = host_end.split();
        let (typed_tx, mut typed) = tokio::sync::mpsc::unbounded_channel::<String>();
        tokio::spawn(async move {
            while let Some(Ok(m)) = host_rx.next().await {
                let text = match m {
                    Message::Binary(b) => String::from_utf8_lossy(&b).into_owned(),
                    Message::Text(t) => t.to_string(),
                    _ => continue,
                };
                if typed_tx.send(text).is_err() {
                    break;
                }
            }
        });
        let (person, _) = opening.await.unwrap().unwrap();
        let (mut to_vm, mut from_vm) = person.split();
        let next_event = async |from_vm: &mut futures_util::stream::SplitStream<_>| -> serde_json::Value {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left, from_vm.next()).await {
                    Ok(Some(Ok(Message::Text(t)))) => {
                        let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
                        if v["event"] != "live" {
                            return v;
                        }
                    }
                    Ok(Some(Ok(_))) => {}
                    other => panic!("no event within 5 s: {other:?}"),
                }
            }
        };
        let ctrl_alt_del = json!({"type": "keys", "keys": "ctrl-alt-del"}).to_string();

        // A member types.
        to_vm.send(Message::Binary(b"as-member".to_vec().into())).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), typed.recv()).await;
        assert_eq!(got.ok().flatten().as_deref(), Some("as-member"));

        // Demoted to viewer: told within the re-check, and what they send
        // after never reaches the VM.
        s.add("lab", "mia", Role::Viewer).await;
        let demoted = Instant::now();
        let ev = next_event(&mut from_vm).await;
        println!("console: demoted → read-only {:?}", demoted.elapsed());
        assert_eq!(ev["event"], "read_only", "{ev}");
        to_vm.send(Message::Binary(b"as-viewer".to_vec().into())).await.unwrap();
        to_vm.send(Message::Text(ctrl_alt_del.clone().into())).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(2), typed.recv()).await;
        assert!(got.is_err(), "a viewer's keys reached the VM: {got:?}");

        // Removed from the project: the console closes and says why.
        s.admin.remove_member("lab", "mia").await.unwrap();
        let removed = Instant::now();
        let ev = next_event(&mut from_vm).await;
        println!("console: removed → closed {:?}", removed.elapsed());
        assert_eq!(ev["event"], "closed", "{ev}");
        assert!(ev["reason"].as_str().unwrap_or("").contains("no longer a member"), "{ev}");

        // A write ticket minted while a member opens read-only once its
        // holder is a viewer.
        s.add("lab", "mia", Role::Member).await;
        let t = ticket(&mia).await;
        s.add("lab", "mia", Role::Viewer).await;
        let (person, _) = tokio_tungstenite::connect_async(format!("{ws_url}{}", t.url)).await.unwrap();
        let (mut to_vm, _from_vm) = person.split();
        to_vm.send(Message::Binary(b"late-writer".to_vec().into())).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(2), typed.recv()).await;
        assert!(got.is_err(), "a demoted ticket typed: {got:?}");
    }
}
