//! Cluster health and repair (issue 41): a member's host lost makes the
//! cluster `degraded` within the heartbeat timeout; an auto-repairing
//! cluster replaces the member beside the others (same scalable unit,
//! same rails) with the same name, address and MAC, and is `healthy`
//! again; the old host, back, removes what it had and nothing runs twice.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kumo_api_types::{
    AgentRegister, Cluster, ClusterCreate, ClusterEvent, ClusterHealth, ClusterRepair, MemberFault,
    Page, SegmentKind, Vm, VmState,
};
use serde_json::json;

use crate::harness::{
    events_of, fixture_topology, on_both_backends, webhook_posts, webhook_receiver, SimAgent,
    TestServer, SIM_TRANSFER_URL,
};

fn config(c: &mut kumo_server::config::Config) {
    c.heartbeat_timeout = Duration::from_secs(2);
    c.idle.allow_loopback_webhooks = true;
    // No idle passes: the webhook hears only clusters.
    c.idle.check_every = Duration::from_secs(3600);
}

/// A simulated host with an underlay address in a scalable unit.
async fn host(s: &TestServer, name: &str, underlay: &str, su: &str) -> SimAgent {
    SimAgent::register_with(
        &s.url,
        AgentRegister {
            join_token: s.join_token().await,
            name: name.into(),
            topology: fixture_topology("hgx-h100"),
            virt_type: "qemu".into(),
            scalable_unit: Some(su.into()),
            rails: Default::default(),
            underlay_ip: Some(underlay.parse().unwrap()),
            edge_uplink: None,
            transfer_url: Some(SIM_TRANSFER_URL.into()),
        },
    )
    .await
}

async fn cluster(s: &TestServer) -> Cluster {
    s.admin
        .get("/api/v1/tenants/lab/clusters/train")
        .await
        .unwrap()
}

async fn vm(s: &TestServer, name: &str) -> Vm {
    s.admin
        .get(&format!("/api/v1/tenants/lab/vms/{name}"))
        .await
        .unwrap()
}

/// Heartbeats every 300 ms for each host until its switch is off (the
/// heartbeat timeout is 2 s).
fn beat(hosts: &[SimAgent]) -> (Beats, Vec<Arc<AtomicBool>>) {
    let alive: Vec<Arc<AtomicBool>> = hosts
        .iter()
        .map(|_| Arc::new(AtomicBool::new(true)))
        .collect();
    let creds: Vec<(String, String)> = hosts
        .iter()
        .map(|h| (h.url.clone(), h.credential.clone()))
        .collect();
    let switches = alive.clone();
    let task = tokio::spawn(async move {
        let http = reqwest::Client::new();
        loop {
            for ((url, cred), on) in creds.iter().zip(&switches) {
                if on.load(Ordering::SeqCst) {
                    let _ = http
                        .post(format!("{url}/agent/v1/heartbeat"))
                        .bearer_auth(cred)
                        .json(&json!({}))
                        .send()
                        .await;
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    (Beats(task), alive)
}

struct Beats(tokio::task::JoinHandle<()>);

impl Drop for Beats {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Waits up to `limit` for the cluster to satisfy `f`.
async fn until(
    s: &TestServer,
    what: &str,
    limit: Duration,
    f: impl Fn(&Cluster) -> bool,
) -> Cluster {
    let deadline = Instant::now() + limit;
    loop {
        let c = cluster(s).await;
        if f(&c) {
            return c;
        }
        assert!(Instant::now() < deadline, "{what}: {c:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

on_both_backends! {
    config = config;

    async fn a_lost_member_is_replaced_beside_the_others_with_its_name_and_address(s: &TestServer) {
        s.tenant("lab").await;
        let (hook, posts) = webhook_receiver("cluster.health").await;
        let _: serde_json::Value = s.admin
            .put("/api/v1/tenants/lab/idle-policy", &json!({"hours": 1, "action": "notice", "webhook_url": hook}))
            .await
            .unwrap();
        // Four hosts in su-a (three members and room for one more), one in
        // su-b: the replacement must stay in su-a.
        let mut hosts = Vec::new();
        for (i, su) in ["su-a", "su-a", "su-a", "su-a", "su-b"].iter().enumerate() {
            hosts.push(host(s, &format!("gpu{i}"), &format!("192.0.2.{}", i + 1), su).await);
        }
        let (beats, alive) = beat(&hosts);
        let _: kumo_api_types::Segment = s.admin
            .post("/api/v1/tenants/lab/segments", &crate::segments::seg("eth", SegmentKind::Ethernet, "10.1.0.0/24"))
            .await
            .unwrap();
        // Out-of-range delays are refused.
        let mut body = ClusterCreate {
            name: "train".into(),
            size: 3,
            gpus: 8,
            gpu_model: None,
            vcpus: Some(16),
            memory_gib: Some(32),
            disk_gib: Some(10),
            template: None,
            service_level: Default::default(),
            ssh_keys: vec![],
            networks: vec!["eth".into()],
            shares: vec![],
            auto_repair: true,
            repair_delay_seconds: Some(86_401),
            spares: 0,
            single_su: Default::default(),
            queue: false,
            reservation: None,
        };
        let e = s.admin.post::<_, Cluster>("/api/v1/tenants/lab/clusters", &body).await.unwrap_err();
        assert_eq!(e.status(), Some(400), "{e}");
        body.repair_delay_seconds = Some(1);
        let made: Cluster = s.admin.post("/api/v1/tenants/lab/clusters", &body).await.unwrap();
        assert!(made.auto_repair && made.repair_delay_seconds == 1);
        for h in &mut hosts {
            h.converge().await;
        }
        let before = until(s, "running", Duration::from_secs(10), |c| {
            c.members.iter().all(|m| m.state == VmState::Running) && c.health == ClusterHealth::Healthy
        })
        .await;
        assert!(before.members.iter().all(|m| m.scalable_unit.as_deref() == Some("su-a")), "{before:#?}");
        let victim = before.members[1].clone();
        let old = vm(s, &victim.name).await;
        let old_host = host_id(s, &old).await;
        let lost = hosts.iter().position(|h| Some(h.host_id) == old_host).unwrap();
        let used: Vec<String> = before.members.iter().filter_map(|m| m.host.clone()).collect();
        let spare = (0..4).find(|i| !used.contains(&format!("gpu{i}"))).unwrap();

        // The victim's host falls silent.
        let cut = Instant::now();
        alive[lost].store(false, Ordering::SeqCst);
        let degraded = until(s, "degraded", Duration::from_secs(6), |c| c.health == ClusterHealth::Degraded).await;
        let to_degraded = cut.elapsed();
        assert_eq!(degraded.problems.len(), 1, "{degraded:#?}");
        assert_eq!((degraded.problems[0].member.as_str(), degraded.problems[0].fault), (victim.name.as_str(), MemberFault::HostLost));
        assert!(degraded.problems[0].detail.contains(&format!("gpu{lost}")), "{degraded:#?}");
        // A second later it repairs itself: the member waits to be started
        // on the spare host in su-a.
        let repairing = until(s, "repairing", Duration::from_secs(6), |c| c.health == ClusterHealth::Repairing).await;
        let m = repairing.members.iter().find(|m| m.name == victim.name).unwrap();
        assert_eq!(m.host.as_deref(), Some(format!("gpu{spare}").as_str()), "{repairing:#?}");
        for (i, h) in hosts.iter_mut().enumerate() {
            if i != lost {
                h.converge().await;
            }
        }
        let healthy = until(s, "healthy", Duration::from_secs(10), |c| c.health == ClusterHealth::Healthy).await;
        let to_healthy = cut.elapsed();
        println!("member's host lost → cluster degraded in {to_degraded:?}, healthy again in {to_healthy:?} (heartbeat timeout 2 s, repair delay 1 s)");
        let now = healthy.members.iter().find(|m| m.name == victim.name).unwrap();
        assert_eq!(now.scalable_unit.as_deref(), Some("su-a"));
        assert_eq!(now.rails, victim.rails, "same rails");
        assert_eq!(now.address, victim.address, "same address");
        assert!(victim.address.is_some());
        assert_eq!(healthy.hostfile, before.hostfile, "the hostfile's names stay valid");
        let new = vm(s, &victim.name).await;
        assert_eq!(new.id, old.id);
        assert_eq!(new.networks[0].mac, old.networks[0].mac, "same MAC");
        assert_eq!(new.networks[0].ip, old.networks[0].ip);
        assert_eq!(new.host.as_deref(), Some(format!("gpu{spare}").as_str()));
        let ev = events_of(s, "lab", &new).await;
        assert!(ev.iter().any(|e| e.starts_with("replacing")), "{ev:?}");
        // Its guest is given the hostfile and its siblings for /etc/hosts.
        let d = hosts[spare].desired(None).await;
        let dv = d.vms.iter().find(|v| v.id == old.id).unwrap();
        assert_eq!(dv.hostfile.as_deref(), Some(healthy.hostfile.as_str()));
        let members = dv.members.clone().unwrap_or_default();
        for m in &healthy.members {
            let line = format!("{}\t{}", m.address.as_deref().unwrap(), m.name);
            assert!(members.lines().any(|l| l == line), "{members}");
        }

        // The cluster's events and the project's webhook tell the story.
        let events: Page<ClusterEvent> = s.admin.get("/api/v1/tenants/lab/clusters/train/events").await.unwrap();
        let kinds: Vec<&str> = events.items.iter().rev().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["degraded", "repair", "repair-placed", "repairing", "healthy"], "{events:#?}");
        let placed = events.items.iter().find(|e| e.kind == "repair-placed").unwrap();
        assert!(placed.message.contains("in scalable unit su-a"), "{placed:?}");
        let hooks = webhook_posts(&posts, 3).await;
        let healths: Vec<&str> = hooks.iter().map(|h| h["health"].as_str().unwrap()).collect();
        assert_eq!(healths, ["degraded", "repairing", "healthy"]);
        assert_eq!(hooks[0]["problems"][0]["member"], victim.name.as_str());

        // The old host comes back: it is told the VM is no longer its own,
        // reports it gone (accepted) and drops its disk; the member runs
        // once, on the spare.
        alive[lost].store(true, Ordering::SeqCst);
        let d = hosts[lost].desired(None).await;
        assert!(d.vms.iter().all(|v| v.id != old.id), "no longer the old host's");
        assert!(d.drop_disks.contains(&old.id), "its old disk goes: {:?}", d.drop_disks);
        hosts[lost].converge().await;
        assert!(hosts[lost].desired(None).await.drop_disks.is_empty());
        let back = vm(s, &victim.name).await;
        assert_eq!((back.state, back.host.as_deref()), (VmState::Running, Some(format!("gpu{spare}").as_str())));

        // Nothing left to repair: a repair by hand replaces nobody.
        let r: ClusterRepair = s.admin.post("/api/v1/tenants/lab/clusters/train/repair", &json!({})).await.unwrap();
        assert!(r.replaced.is_empty() && r.left.is_empty(), "{r:#?}");
        assert_eq!(r.cluster.health, ClusterHealth::Healthy);
        drop(beats);
    }

    /// A cluster that must keep to one scalable unit is repaired in it or
    /// not at all: with no room left in its unit, the replacement waits
    /// although another unit has a free host.
    async fn a_strict_cluster_waits_for_room_in_its_unit(s: &TestServer) {
        s.tenant("lab").await;
        let mut hosts = Vec::new();
        for (i, su) in ["su-a", "su-a", "su-a", "su-b", "su-b"].iter().enumerate() {
            hosts.push(host(s, &format!("gpu{i}"), &format!("192.0.2.{}", i + 1), su).await);
        }
        let (beats, alive) = beat(&hosts);
        let body = json!({"name": "train", "size": 2, "gpus": 8, "vcpus": 16, "memory_gib": 32, "disk_gib": 10,
                          "auto_repair": true, "repair_delay_seconds": 1, "single_su": "required"});
        let made: Cluster = s.admin.post("/api/v1/tenants/lab/clusters", &body).await.unwrap();
        // Best fit: the fullest unit that holds both, su-b.
        assert!(made.members.iter().all(|m| m.scalable_unit.as_deref() == Some("su-b")), "{made:#?}");
        for h in &mut hosts {
            h.converge().await;
        }
        until(s, "running", Duration::from_secs(10), |c| c.health == ClusterHealth::Healthy).await;
        let victim = made.members[0].clone();
        let lost = (3..5).find(|i| victim.host.as_deref() == Some(format!("gpu{i}").as_str())).unwrap();
        alive[lost].store(false, Ordering::SeqCst);
        until(s, "repairing", Duration::from_secs(8), |c| c.health == ClusterHealth::Repairing).await;
        // Several passes later the member still waits: su-a's three free
        // hosts are not its unit.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let v = vm(s, &victim.name).await;
        assert_eq!((v.state, v.host.as_deref()), (VmState::Pending, None), "{v:#?}");
        // Its unit's host back: the host answers again, but it is not the
        // member's (it was replaced); with room there the member returns.
        alive[lost].store(true, Ordering::SeqCst);
        converge_until(s, &mut hosts, "the member placed in su-b again", async |s: &TestServer| {
            let c = cluster(s).await;
            c.members.iter().all(|m| m.state == VmState::Running && m.scalable_unit.as_deref() == Some("su-b"))
        })
        .await;
        drop(beats);
    }

    async fn a_repair_by_hand_mends_what_only_replacing_mends(s: &TestServer) {
        s.tenant("lab").await;
        let mut hosts = Vec::new();
        for i in 0..3 {
            hosts.push(s.sim_agent_in(&format!("node{i}"), "hgx-h100", Some("su-a")).await);
        }
        let body = json!({"name": "train", "size": 2, "gpus": 8, "vcpus": 16, "memory_gib": 32, "disk_gib": 10});
        let _: Cluster = s.admin.post("/api/v1/tenants/lab/clusters", &body).await.unwrap();
        let _beats = beat(&hosts);
        for h in &mut hosts {
            h.converge().await;
        }
        let c = until(s, "running", Duration::from_secs(10), |c| c.members.iter().all(|m| m.state == VmState::Running)).await;
        assert!(!c.auto_repair);
        // One member stopped (its owner's choice), the other in error.
        let _: Vm = s.admin.post("/api/v1/tenants/lab/vms/train-0/stop", &json!({})).await.unwrap();
        for h in &mut hosts {
            h.converge().await;
        }
        let failed = vm(s, "train-1").await;
        let on: HashMap<String, usize> = (0..3).map(|i| (format!("node{i}"), i)).collect();
        let h = on[failed.host.as_deref().unwrap()];
        let r = hosts[h]
            .report(vec![kumo_api_types::VmStatus {
                id: failed.id,
                state: kumo_api_types::ActualState::Failed,
                reason: Some("qemu exited".into()),
                guest: None,
                notice: None,
                mounts: vec![],
            }])
            .await;
        assert_eq!(r.status(), 204);
        let degraded = until(s, "degraded", Duration::from_secs(10), |c| c.problems.len() == 2).await;
        assert_eq!(degraded.health, ClusterHealth::Degraded);
        // Not auto-repairing: it stays degraded until asked.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(vm(s, "train-1").await.state, VmState::Error);
        // A viewer may not repair.
        let (viewer, _) = s.user("vera").await;
        s.add("lab", "vera", kumo_api_types::Role::Viewer).await;
        let e = viewer.post::<_, ClusterRepair>("/api/v1/tenants/lab/clusters/train/repair", &json!({})).await.unwrap_err();
        assert_eq!(e.status(), Some(403));
        let r: ClusterRepair = s.admin.post("/api/v1/tenants/lab/clusters/train/repair", &json!({})).await.unwrap();
        assert_eq!(r.replaced, ["train-1"]);
        assert_eq!(r.left.len(), 1);
        assert_eq!((r.left[0].member.as_str(), r.left[0].fault), ("train-0", MemberFault::NotRunning));
        let again = vm(s, "train-1").await;
        assert_eq!(again.id, failed.id);
        assert!(matches!(again.state, VmState::Scheduled | VmState::Pending), "{again:?}");
        assert!(again.reason.as_deref().unwrap_or("").contains("qemu exited"), "{again:?}");
        // Never back on the host it left (its old domain is there until
        // that host learns it is no longer its own), though it is free.
        assert!(again.host.is_some() && again.host != failed.host, "{again:?} left {:?}", failed.host);
        // That host, not yet knowing, reports it once more: ignored, and
        // the rest of its report stands.
        let r = hosts[h]
            .report(vec![kumo_api_types::VmStatus {
                id: failed.id,
                state: kumo_api_types::ActualState::Running,
                reason: None,
                guest: None,
                notice: None,
                mounts: vec![],
            }])
            .await;
        assert_eq!(r.status(), 204);
        assert_ne!(vm(s, "train-1").await.state, VmState::Running);
    }
}

async fn host_id(s: &TestServer, v: &Vm) -> Option<uuid::Uuid> {
    let hosts: Page<kumo_api_types::Host> = s.admin.get("/api/v1/hosts").await.unwrap();
    hosts
        .items
        .into_iter()
        .find(|h| Some(&h.name) == v.host.as_ref())
        .map(|h| h.id)
}

fn lost_after_ten_minutes(c: &mut kumo_server::config::Config) {
    config(c);
    c.clock = kumo_server::clock::Clock::manual(
        chrono::DateTime::from_timestamp(1_900_000_000, 0).unwrap(),
    );
    c.lost_after = Duration::from_secs(600);
}

/// Open charge runs of a VM.
async fn open_runs(s: &TestServer, vm: uuid::Uuid) -> usize {
    use kumo_server::entity::meter_runs;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    meter_runs::Entity::find()
        .filter(meter_runs::Column::VmId.eq(vm))
        .filter(meter_runs::Column::EndedAt.is_null())
        .all(s.db())
        .await
        .unwrap()
        .len()
}

fn one_gpu(name: &str, on_host_loss: Option<kumo_api_types::HostLossAction>) -> serde_json::Value {
    let mut body = json!({"name": name, "gpus": 1, "gpu_model": "H100-SXM5-80GB", "vcpus": 4, "memory_gib": 8, "disk_gib": 10});
    if let Some(a) = on_host_loss {
        body["on_host_loss"] = json!(a);
    }
    body
}

on_both_backends! {
    config = lost_after_ten_minutes;

    async fn a_host_lost_for_good_loses_its_vms_or_has_them_recreated_and_none_runs_twice(s: &TestServer) {
        let clock = s.server.state.config.clock.clone();
        s.tenant("lab").await;
        let mut q: kumo_api_types::Quota = s.admin.get("/api/v1/tenants/lab/quota").await.unwrap();
        q.gpus.insert("H100-SXM5-80GB".into(), 2);
        s.quota("lab", &q).await;
        let (hook, posts) = webhook_receiver("vm.host_lost").await;
        let _: serde_json::Value = s.admin
            .put("/api/v1/tenants/lab/idle-policy", &json!({"hours": 1, "action": "notice", "webhook_url": hook}))
            .await
            .unwrap();
        // Both VMs on the first host: the second registers after.
        let mut hosts = vec![host(s, "gpua", "192.0.2.1", "su-a").await];
        let (_b1, alive_a) = beat(&hosts);
        let keep: Vm = s.admin.post("/api/v1/tenants/lab/vms", &one_gpu("keep", None)).await.unwrap();
        let again: Vm = s.admin
            .post("/api/v1/tenants/lab/vms", &one_gpu("again", Some(kumo_api_types::HostLossAction::Recreate)))
            .await
            .unwrap();
        assert_eq!(again.spec.on_host_loss, kumo_api_types::HostLossAction::Recreate);
        hosts.push(host(s, "gpub", "192.0.2.2", "su-a").await);
        let (_b2, _) = beat(&hosts[1..]);
        for h in &mut hosts {
            h.converge().await;
        }
        assert_eq!(vm(s, "keep").await.state, VmState::Running);
        assert_eq!(vm(s, "again").await.host.as_deref(), Some("gpua"));
        assert!(open_runs(s, keep.id).await >= 2, "disk and compute charged");
        // The quota is full: two H100s.
        let e = s.admin.post::<_, Vm>("/api/v1/tenants/lab/vms", &one_gpu("third", None)).await.unwrap_err();
        assert_eq!(e.status(), Some(409), "{e}");
        assert!(e.to_string().contains("quota"), "{e}");

        // gpua falls silent: its VMs are `unknown`, not yet lost.
        alive_a[0].store(false, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(6);
        while vm(s, "keep").await.state != VmState::Unknown {
            assert!(Instant::now() < deadline, "never unknown");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        clock.advance(chrono::Duration::seconds(599));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(vm(s, "keep").await.state, VmState::Unknown, "not lost before its time");
        assert_eq!(vm(s, "again").await.host.as_deref(), Some("gpua"));

        // Ten minutes after it was found silent, it is lost for good.
        clock.advance(chrono::Duration::seconds(2));
        let deadline = Instant::now() + Duration::from_secs(6);
        loop {
            let (k, a) = (vm(s, "keep").await, vm(s, "again").await);
            if k.state == VmState::Lost && a.host.as_deref() == Some("gpub") {
                break;
            }
            assert!(Instant::now() < deadline, "{k:?} {a:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let k = vm(s, "keep").await;
        assert!(k.reason.as_deref().unwrap_or("").contains("gpua"), "{k:?}");
        assert!(events_of(s, "lab", &k).await.iter().any(|e| e.starts_with("lost")));
        assert_eq!(open_runs(s, keep.id).await, 0, "a lost VM is charged nothing");
        let a = vm(s, "again").await;
        assert_eq!(a.id, again.id);
        assert!(events_of(s, "lab", &a).await.iter().any(|e| e.starts_with("replacing")));
        let hooks = webhook_posts(&posts, 2).await;
        let mut said: Vec<(String, String)> = hooks
            .iter()
            .map(|h| (h["vm"].as_str().unwrap().to_owned(), h["action"].as_str().unwrap().to_owned()))
            .collect();
        said.sort();
        assert_eq!(said, [("again".to_owned(), "recreate".to_owned()), ("keep".to_owned(), "wait".to_owned())]);
        // Its quota is free: a third H100 VM fits beside the recreated one.
        let _: Vm = s.admin.post("/api/v1/tenants/lab/vms", &one_gpu("third", None)).await.unwrap();
        hosts[1].converge().await;
        assert_eq!(vm(s, "again").await.state, VmState::Running);
        // A lost VM can only be deleted (tried on a second one below).
        let e = s.admin.post::<_, Vm>("/api/v1/tenants/lab/vms/keep/start", &json!({})).await.unwrap_err();
        assert_eq!(e.status(), Some(409));

        // gpua returns: `keep` resumes there and is charged again; the
        // recreated VM is no longer gpua's, which removes it and drops its
        // disk: it runs once, on gpub.
        alive_a[0].store(true, Ordering::SeqCst);
        assert_eq!(hosts[0].heartbeat().await, 204);
        let d = hosts[0].desired(None).await;
        assert!(d.vms.iter().any(|v| v.id == keep.id));
        assert!(d.vms.iter().all(|v| v.id != again.id), "no longer gpua's");
        assert!(d.drop_disks.contains(&again.id));
        hosts[0].converge().await;
        let k = vm(s, "keep").await;
        assert_eq!((k.state, k.host.as_deref()), (VmState::Running, Some("gpua")));
        assert!(open_runs(s, keep.id).await >= 2, "charged again");
        let a = vm(s, "again").await;
        assert_eq!((a.state, a.host.as_deref()), (VmState::Running, Some("gpub")));
        assert!(hosts[0].desired(None).await.drop_disks.is_empty());
        // The host lost again, `keep` lost again: deleting it forgets it at
        // once, and the host drops it when it is back.
        alive_a[0].store(false, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(6);
        while vm(s, "keep").await.state != VmState::Unknown {
            assert!(Instant::now() < deadline, "never unknown again");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        clock.advance(chrono::Duration::seconds(601));
        let deadline = Instant::now() + Duration::from_secs(6);
        while vm(s, "keep").await.state != VmState::Lost {
            assert!(Instant::now() < deadline, "never lost again");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let r = s.http().delete(format!("{}/api/v1/tenants/lab/vms/keep", s.url)).bearer_auth(&s.admin_token).send().await.unwrap();
        assert!(r.status().is_success(), "{}", r.status());
        let e = s.admin.get::<Vm>("/api/v1/tenants/lab/vms/keep").await.unwrap_err();
        assert_eq!(e.status(), Some(404));
        alive_a[0].store(true, Ordering::SeqCst);
        assert_eq!(hosts[0].heartbeat().await, 204);
        let d = hosts[0].desired(None).await;
        assert!(d.vms.iter().all(|v| v.id != keep.id));
        assert!(d.drop_disks.contains(&keep.id));
        hosts[0].converge().await;
    }
}

fn manual_clock(c: &mut kumo_server::config::Config) {
    config(c);
    c.clock = kumo_server::clock::Clock::manual(
        chrono::DateTime::from_timestamp(1_900_000_000, 0).unwrap(),
    );
}

fn cpu_vm(name: &str) -> serde_json::Value {
    json!({"name": name, "gpus": 0, "vcpus": 2, "memory_gib": 4, "disk_gib": 10})
}

/// Passes of every host but `skip` until `done` holds (each pass is a
/// report of what the host was told).
async fn converge_until(
    s: &TestServer,
    hosts: &mut [SimAgent],
    what: &str,
    done: impl AsyncFn(&TestServer) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done(s).await {
        assert!(Instant::now() < deadline, "{what}");
        for h in hosts.iter_mut() {
            let _ = h.try_converge().await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

on_both_backends! {
    config = manual_clock;

    async fn a_maintenance_window_tells_then_moves_every_vm_off_its_host(s: &TestServer) {
        let clock = s.server.state.config.clock.clone();
        s.tenant("lab").await;
        let (hook, posts) = webhook_receiver("vm.scheduled_event").await;
        let _: serde_json::Value = s.admin
            .put("/api/v1/tenants/lab/idle-policy", &json!({"hours": 1, "action": "notice", "webhook_url": hook}))
            .await
            .unwrap();
        let mut hosts = vec![
            host(s, "gpua", "192.0.2.1", "su-a").await,
            host(s, "gpub", "192.0.2.2", "su-a").await,
        ];
        let (_b1, _) = beat(&hosts);
        let web: Vm = s.admin.post("/api/v1/tenants/lab/vms", &cpu_vm("web")).await.unwrap();
        let target = web.host.clone().unwrap();
        let early: Vm = s.admin.post("/api/v1/tenants/lab/vms", &cpu_vm("early")).await.unwrap();
        assert_eq!(early.host.as_deref(), Some(target.as_str()), "best fit: beside web");
        let body = json!({"name": "train", "size": 2, "gpus": 8, "vcpus": 16, "memory_gib": 32, "disk_gib": 10});
        let _: Cluster = s.admin.post("/api/v1/tenants/lab/clusters", &body).await.unwrap();
        // A third host, for the member that moves.
        hosts.push(host(s, "gpuc", "192.0.2.3", "su-a").await);
        let (_b2, _) = beat(&hosts[2..]);
        converge_until(s, &mut hosts, "all running", async |s| {
            let c = cluster(s).await;
            c.members.iter().all(|m| m.state == VmState::Running)
                && vm(s, "web").await.state == VmState::Running
                && vm(s, "early").await.state == VmState::Running
        })
        .await;
        let member = cluster(s).await.members.into_iter().find(|m| m.host.as_deref() == Some(target.as_str())).unwrap();
        let target_id = host_id_named(s, &target).await;
        let t = hosts.iter().position(|h| h.host_id == target_id).unwrap();

        // A member may not schedule maintenance; an admin may.
        let (member_client, _) = s.user("mia").await;
        s.add("lab", "mia", kumo_api_types::Role::Member).await;
        let at = clock.now() + chrono::Duration::hours(1);
        let window = json!({"at": at, "reason": "BMC firmware"});
        let e = member_client.post::<_, kumo_api_types::Host>(&format!("/api/v1/hosts/{target}/maintenance"), &window).await.unwrap_err();
        assert_eq!(e.status(), Some(403));
        let bad = json!({"at": at, "reason": "x\u{7}"});
        let e = s.admin.post::<_, kumo_api_types::Host>(&format!("/api/v1/hosts/{target}/maintenance"), &bad).await.unwrap_err();
        assert_eq!(e.status(), Some(400));
        let h: kumo_api_types::Host = s.admin.post(&format!("/api/v1/hosts/{target}/maintenance"), &window).await.unwrap();
        assert_eq!(h.maintenance.as_ref().map(|w| w.at), Some(at));
        // Every VM on it is told what will happen, and when.
        let w = vm(s, "web").await;
        assert_eq!(w.scheduled_events.len(), 1, "{w:?}");
        let ev = &w.scheduled_events[0];
        assert_eq!((ev.kind.as_str(), ev.at, ev.action, ev.host.as_str(), ev.reason.as_deref()),
            ("maintenance", at, kumo_api_types::ScheduledAction::Evacuate, target.as_str(), Some("BMC firmware")));
        let m = vm(s, &member.name).await;
        assert_eq!(m.scheduled_events[0].action, kumo_api_types::ScheduledAction::Replace);
        assert!(events_of(s, "lab", &w).await.iter().any(|e| e.starts_with("maintenance-scheduled")));
        let hooks = webhook_posts(&posts, 3).await;
        let mut told: Vec<&str> = hooks.iter().map(|h| h["vm"].as_str().unwrap()).collect();
        told.sort();
        let mut want = vec!["early", "web", member.name.as_str()];
        want.sort();
        assert_eq!(told, want);
        // The guest is told too: the host's desired state carries it.
        let d = hosts[t].desired(None).await;
        let dw = d.vms.iter().find(|v| v.id == web.id).unwrap();
        assert_eq!(dw.events, w.scheduled_events);
        // Nothing new goes there meanwhile.
        let late: Vm = s.admin.post("/api/v1/tenants/lab/vms", &cpu_vm("late")).await.unwrap();
        assert_ne!(late.host.as_deref(), Some(target.as_str()));
        let e = s.admin.post::<_, Vm>("/api/v1/tenants/lab/vms/late/evacuate", &json!({})).await.unwrap_err();
        assert_eq!(e.status(), Some(409), "no window on its host");
        // The window moves: everyone is told the new time.
        let at = at + chrono::Duration::hours(1);
        let _: kumo_api_types::Host = s.admin.post(&format!("/api/v1/hosts/{target}/maintenance"), &json!({"at": at, "reason": "BMC firmware"})).await.unwrap();
        assert_eq!(vm(s, "web").await.scheduled_events[0].at, at);
        assert!(events_of(s, "lab", &w).await.iter().any(|e| e.starts_with("maintenance-moved")));
        let d = hosts[t].desired(None).await;
        assert_eq!(d.vms.iter().find(|v| v.id == web.id).unwrap().events[0].at, at);

        // The tenant moves one early.
        let v: Vm = s.admin.post("/api/v1/tenants/lab/vms/early/evacuate", &json!({})).await.unwrap();
        assert_eq!(v.state, VmState::Shelving);
        // Charges run from instants: it starts again a second later.
        clock.advance(chrono::Duration::seconds(1));
        converge_until(s, &mut hosts, "early moved", async |s| {
            let v = vm(s, "early").await;
            v.state == VmState::Running && v.host.is_some() && v.host != Some(target.clone())
        })
        .await;
        assert!(events_of(s, "lab", &vm(s, "early").await).await.iter().any(|e| e.starts_with("evacuating")));

        // The window opens: web moves with its disk, the member is replaced
        // elsewhere, and the host is in maintenance.
        clock.advance(chrono::Duration::hours(2) + chrono::Duration::seconds(1));
        converge_until(s, &mut hosts, "window opened and everyone moved", async |s| {
            let w = vm(s, "web").await;
            let c = cluster(s).await;
            w.state == VmState::Running
                && w.host.is_some() && w.host != Some(target.clone())
                && c.health == ClusterHealth::Healthy
                && c.members.iter().all(|m| m.state == VmState::Running && m.host != Some(target.clone()))
        })
        .await;
        let hosts_now: Page<kumo_api_types::Host> = s.admin.get("/api/v1/hosts").await.unwrap();
        let h = hosts_now.items.iter().find(|h| h.name == target).unwrap();
        assert_eq!(h.state, kumo_api_types::HostState::Maintenance);
        assert!(hosts[t].desired(None).await.vms.is_empty(), "nothing left on it");
        let moved = vm(s, &member.name).await;
        assert_eq!(moved.id, m.id);
        // Done: it takes VMs again.
        let h: kumo_api_types::Host = s.http()
            .delete(format!("{}/api/v1/hosts/{target}/maintenance", s.url))
            .bearer_auth(&s.admin_token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!((h.state, h.maintenance), (kumo_api_types::HostState::Ready, None));
        assert!(vm(s, "web").await.scheduled_events.is_empty());
    }

    /// A VM's own notice holds against a window announced at short notice:
    /// the window acts on it that long after the announcement, and says so
    /// (API and guest), while the others move at the window.
    async fn a_maintenance_window_gives_each_vm_the_notice_it_asked_for(s: &TestServer) {
        let clock = s.server.state.config.clock.clone();
        s.tenant("lab").await;
        let mut hosts = vec![host(s, "gpua", "192.0.2.1", "su-a").await];
        let (_b1, _) = beat(&hosts);
        let quick: Vm = s.admin.post("/api/v1/tenants/lab/vms", &cpu_vm("quick")).await.unwrap();
        let mut ckpt = cpu_vm("ckpt");
        ckpt["notice_seconds"] = json!(600);
        let ckpt: Vm = s.admin.post("/api/v1/tenants/lab/vms", &ckpt).await.unwrap();
        assert_eq!(ckpt.spec.notice_seconds, Some(600), "guaranteed VMs may ask for notice too");
        converge_until(s, &mut hosts, "both running", async |s| {
            vm(s, "quick").await.state == VmState::Running && vm(s, "ckpt").await.state == VmState::Running
        })
        .await;
        hosts.push(host(s, "gpub", "192.0.2.2", "su-a").await);
        let (_b2, _) = beat(&hosts[1..]);
        // Five minutes' warning.
        let told = clock.now();
        let at = told + chrono::Duration::minutes(5);
        let _: kumo_api_types::Host = s.admin.post("/api/v1/hosts/gpua/maintenance", &json!({"at": at})).await.unwrap();
        let own = told + chrono::Duration::minutes(10);
        assert_eq!(vm(s, "quick").await.scheduled_events[0].at, at);
        assert_eq!(vm(s, "ckpt").await.scheduled_events[0].at, own, "its own ten minutes");
        let d = hosts[0].desired(None).await;
        assert_eq!(d.vms.iter().find(|v| v.id == ckpt.id).unwrap().events[0].at, own, "the guest is told its own time");
        // The window opens: quick moves, ckpt stays on until its notice is up.
        clock.advance(chrono::Duration::minutes(5) + chrono::Duration::seconds(1));
        converge_until(s, &mut hosts, "quick moved", async |s| {
            let q = vm(s, "quick").await;
            q.state == VmState::Running && q.host.as_deref() == Some("gpub")
        })
        .await;
        let c = vm(s, "ckpt").await;
        assert_eq!((c.state, c.host.as_deref()), (VmState::Running, Some("gpua")));
        let h: kumo_api_types::Host = s.admin.get("/api/v1/hosts/gpua").await.unwrap();
        assert_eq!(h.state, kumo_api_types::HostState::Maintenance, "takes nothing new meanwhile");
        clock.advance(chrono::Duration::minutes(5));
        converge_until(s, &mut hosts, "ckpt moved at its own time", async |s| {
            let c = vm(s, "ckpt").await;
            c.state == VmState::Running && c.host.as_deref() == Some("gpub")
        })
        .await;
        assert_eq!(quick.id, vm(s, "quick").await.id);
    }

    async fn a_spot_vm_gets_the_reclaim_notice_it_asked_for(s: &TestServer) {
        let clock = s.server.state.config.clock.clone();
        s.tenant("lab").await;
        let mut hosts = vec![host(s, "gpua", "192.0.2.1", "su-a").await];
        let (_b, _) = beat(&hosts);
        let spot = |name: &str, notice: Option<u32>| {
            let mut b = json!({"name": name, "gpus": 4, "vcpus": 8, "memory_gib": 16, "disk_gib": 10, "service_level": "spot"});
            if let Some(n) = notice {
                b["notice_seconds"] = json!(n);
            }
            b
        };
        // Within the platform's bound (30 min).
        let e = s.admin.post::<_, Vm>("/api/v1/tenants/lab/vms", &spot("long", Some(1801))).await.unwrap_err();
        assert_eq!(e.status(), Some(400), "{e}");
        let ckpt: Vm = s.admin.post("/api/v1/tenants/lab/vms", &spot("ckpt", Some(600))).await.unwrap();
        assert_eq!(ckpt.spec.notice_seconds, Some(600));
        let _: Vm = s.admin.post("/api/v1/tenants/lab/vms", &spot("plain", None)).await.unwrap();
        hosts[0].converge().await;
        // A guaranteed 8-GPU VM takes the host: both are reclaimed, each
        // with its own notice.
        let now = clock.now();
        let _: Vm = s.admin.post("/api/v1/tenants/lab/vms", &json!({"name": "urgent", "gpus": 8, "vcpus": 16, "memory_gib": 32, "disk_gib": 10})).await.unwrap();
        let c = vm(s, "ckpt").await;
        let p = vm(s, "plain").await;
        assert_eq!((c.state, p.state), (VmState::Preempting, VmState::Preempting));
        assert_eq!(c.preempt_deadline, Some(now + chrono::Duration::seconds(600)));
        assert_eq!(p.preempt_deadline, Some(now + chrono::Duration::seconds(30)), "the platform's grace");
        // The guest is told the same deadline.
        let d = hosts[0].desired(None).await;
        let n = d.vms.iter().find(|v| v.id == ckpt.id).and_then(|v| v.preemption.clone()).unwrap();
        assert_eq!(n.deadline, now + chrono::Duration::seconds(600));
    }
}

async fn host_id_named(s: &TestServer, name: &str) -> uuid::Uuid {
    let hosts: Page<kumo_api_types::Host> = s.admin.get("/api/v1/hosts").await.unwrap();
    hosts.items.into_iter().find(|h| h.name == name).unwrap().id
}

fn spares_config(c: &mut kumo_server::config::Config) {
    config(c);
    c.preemption_grace = Duration::from_secs(1);
}

/// Open charge runs of a cluster's spares: `(class, quantity)`.
async fn spare_runs(s: &TestServer, cluster: uuid::Uuid) -> Vec<(String, String)> {
    use kumo_server::entity::meter_runs;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    meter_runs::Entity::find()
        .filter(meter_runs::Column::VmId.eq(cluster))
        .filter(meter_runs::Column::EndedAt.is_null())
        .all(s.db())
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.class, r.quantity))
        .collect()
}

on_both_backends! {
    config = spares_config;

    /// Issue 41's spares: a cluster keeps one member's worth of room in
    /// its unit; another tenant's guaranteed VM may not take it, a spot
    /// VM may, and is reclaimed with notice when a member's host is lost
    /// and the repair needs the room.
    async fn a_cluster_repairs_onto_its_spare_reclaiming_the_spot_vm_lent_it(s: &TestServer) {
        s.tenant("lab").await;
        s.tenant("other").await;
        // su-a: three members and one spare; su-b: one host for others.
        let mut hosts = Vec::new();
        for (i, su) in ["su-a", "su-a", "su-a", "su-a", "su-b"].iter().enumerate() {
            hosts.push(host(s, &format!("gpu{i}"), &format!("192.0.2.{}", i + 1), su).await);
        }
        let (beats, alive) = beat(&hosts);
        let mut body = ClusterCreate {
            name: "train".into(),
            size: 3,
            gpus: 8,
            gpu_model: None,
            vcpus: Some(16),
            memory_gib: Some(32),
            disk_gib: Some(10),
            template: None,
            service_level: Default::default(),
            ssh_keys: vec![],
            networks: vec![],
            shares: vec![],
            auto_repair: true,
            repair_delay_seconds: Some(1),
            spares: 4,
            single_su: Default::default(),
            queue: false,
            reservation: None,
        };
        // More spares than members, or spares no unit has room for, are
        // refused.
        let e = s.admin.post::<_, Cluster>("/api/v1/tenants/lab/clusters", &body).await.unwrap_err();
        assert_eq!(e.status(), Some(400), "{e}");
        body.spares = 2;
        let e = s.admin.post::<_, Cluster>("/api/v1/tenants/lab/clusters", &body).await.unwrap_err();
        assert_eq!(e.status(), Some(409), "{e}");
        assert!(e.to_string().contains("spare"), "{e}");
        body.spares = 1;
        // Spares count against the quota as members do: 3 + 1 members' 8
        // GPUs need 32.
        let gpus = |n: u32| {
            let mut q = kumo_api_types::Quota { vcpus: 1_000, memory_gib: 10_000, vms: 100, disk_gib: 10_000, ..Default::default() };
            q.gpus.insert("H100-SXM5-80GB".into(), n);
            q
        };
        s.quota("lab", &gpus(31)).await;
        let e = s.admin.post::<_, Cluster>("/api/v1/tenants/lab/clusters", &body).await.unwrap_err();
        assert!(e.to_string().contains("quota"), "{e}");
        s.quota("lab", &gpus(32)).await;
        let made: Cluster = s.admin.post("/api/v1/tenants/lab/clusters", &body).await.unwrap();
        assert_eq!((made.spares, made.spare_unit.as_deref(), made.spares_ready), (1, Some("su-a"), 1));
        assert!(made.members.iter().all(|m| m.scalable_unit.as_deref() == Some("su-a")), "{made:#?}");
        // Charged for 8 spare GPUs of the model the members got.
        assert_eq!(spare_runs(s, made.id).await, [("spare_gpu:H100-SXM5-80GB".to_owned(), "8".to_owned())]);
        let used: Vec<String> = made.members.iter().filter_map(|m| m.host.clone()).collect();
        let spare = (0..4).find(|i| !used.contains(&format!("gpu{i}"))).unwrap();

        // Another tenant's guaranteed 8-GPU VMs: the first goes to su-b,
        // the second finds only the spare and is refused.
        let big = |name: &str, level: &str| json!({"name": name, "gpus": 8, "vcpus": 16, "memory_gib": 32, "disk_gib": 10, "service_level": level});
        let g1: Vm = s.admin.post("/api/v1/tenants/other/vms", &big("gua-1", "guaranteed")).await.unwrap();
        assert_eq!(g1.host.as_deref(), Some("gpu4"));
        let e = s.admin.post::<_, Vm>("/api/v1/tenants/other/vms", &big("gua-2", "guaranteed")).await.unwrap_err();
        assert_eq!(e.status(), Some(409), "the spare is not for others' guaranteed VMs: {e}");
        // A spot VM may use it.
        let lent: Vm = s.admin.post("/api/v1/tenants/other/vms", &big("lent", "spot")).await.unwrap();
        assert_eq!(lent.host.as_deref(), Some(format!("gpu{spare}").as_str()));
        // su-b's host free again: room elsewhere, which the repair must not
        // prefer to its own spare.
        s.admin.delete("/api/v1/tenants/other/vms/gua-1").await.unwrap();
        converge_until(s, &mut hosts, "all running, gua-1 gone", async |s: &TestServer| {
            let c = cluster(s).await;
            let gone = s.admin.get::<Vm>("/api/v1/tenants/other/vms/gua-1").await.is_err();
            c.health == ClusterHealth::Healthy
                && c.members.iter().all(|m| m.state == VmState::Running)
                && vm_of(s, "other", "lent").await.state == VmState::Running
                && gone
        })
        .await;
        assert_eq!(cluster(s).await.spares_ready, 1, "spot VMs on the spare count as gone");

        // A member's host falls silent: the repair reclaims the spot VM
        // (with notice) and places the member on the spare, same unit,
        // same rails, same address.
        let victim = made.members[0].clone();
        let lost = (0..4).find(|i| victim.host.as_deref() == Some(format!("gpu{i}").as_str())).unwrap();
        alive[lost].store(false, Ordering::SeqCst);
        let reclaimed = {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let v = vm_of(s, "other", "lent").await;
                if v.state != VmState::Running {
                    break v;
                }
                assert!(Instant::now() < deadline, "the spot VM was never reclaimed: {v:#?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        assert_eq!(reclaimed.state, VmState::Preempting, "{reclaimed:#?}");
        assert!(reclaimed.preempt_deadline.is_some());
        let ev = events_of(s, "other", &reclaimed).await;
        assert!(ev.iter().any(|e| e.starts_with("preempting")), "{ev:?}");
        let mut others: Vec<SimAgent> = hosts.drain(..).enumerate().filter(|(i, _)| *i != lost).map(|(_, h)| h).collect();
        converge_until(s, &mut others, "healthy on the spare", async |s: &TestServer| {
            let c = cluster(s).await;
            c.health == ClusterHealth::Healthy && c.members.iter().all(|m| m.state == VmState::Running)
        })
        .await;
        let healthy = cluster(s).await;
        let now = healthy.members.iter().find(|m| m.name == victim.name).unwrap();
        assert_eq!(now.host.as_deref(), Some(format!("gpu{spare}").as_str()), "{healthy:#?}");
        assert_eq!((now.scalable_unit.as_deref(), &now.rails, &now.address), (Some("su-a"), &victim.rails, &victim.address));
        assert_ne!(vm_of(s, "other", "lent").await.state, VmState::Running);
        // The spare was used: none has room now (the lost host is out).
        assert_eq!((healthy.spares, healthy.spares_ready), (1, 0));

        // A member deleted gives the cluster's spare up: its charge ends.
        s.admin.delete(&format!("/api/v1/tenants/lab/vms/{}", victim.name)).await.unwrap();
        assert!(spare_runs(s, made.id).await.is_empty());
        assert_eq!(cluster(s).await.spares, 0);
        let _: Cluster = s.admin.delete_json("/api/v1/tenants/lab/clusters/train").await.unwrap();
        drop(beats);
    }
}

async fn vm_of(s: &TestServer, tenant: &str, name: &str) -> Vm {
    s.admin
        .get(&format!("/api/v1/tenants/{tenant}/vms/{name}"))
        .await
        .unwrap()
}
