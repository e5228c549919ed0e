//! Two replicas on one database without a write per heartbeat or a
//! re-read of every host (issue 39): heartbeats renew leases in memory
//! and are written in batches, every replica's lost-host detector agrees
//! on liveness, and each replica's capacity index and long polls follow
//! the other's changes within about a second.

use std::time::{Duration, Instant};

use kumo_api_types::{HostState, ServiceLevel, Vm, VmCreate};

use crate::harness::{on_both_backends, TestServer};

/// A second server on the test server's database.
async fn replica(s: &TestServer) -> (kumo_server::RunningServer, kumo_cli::Client) {
    let r = kumo_server::RunningServer::start(s.server.state.config.as_ref().clone())
        .await
        .unwrap();
    let admin = kumo_cli::Client::new(&r.url(), Some(s.admin_token.clone())).unwrap();
    (r, admin)
}

/// An 8-GPU guaranteed VM: a whole simulated HGX host.
fn whole_host(name: &str) -> VmCreate {
    VmCreate {
        name: name.into(),
        gpus: 8,
        gpu_model: None,
        vcpus: Some(16),
        memory_gib: Some(64),
        disk_gib: None,
        template: None,
        service_level: ServiceLevel::Guaranteed,
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

/// A counter's value in the server's Prometheus text.
fn counter(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

async fn state_of(c: &kumo_cli::Client, host: &str) -> HostState {
    let h: kumo_api_types::HostDetail = c.get(&format!("/api/v1/hosts/{host}")).await.unwrap();
    h.host.state
}

async fn within(what: &str, limit: Duration, mut ok: impl AsyncFnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !ok().await {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    t.elapsed()
}

on_both_backends! {
    config = |c| c.heartbeat_timeout = Duration::from_secs(2);

    /// 3 hosts beating every 20 ms at replica A for 3 s: A writes them
    /// in a handful of batches (not one write per beat), replica B never
    /// sees them lost; once they fall silent both see them unreachable,
    /// and a beat brings a host back at once.
    async fn heartbeats_are_written_in_batches_and_replicas_agree_on_liveness(s: &TestServer) {
        let (b, b_admin) = replica(s).await;
        let mut agents = Vec::new();
        for i in 0..3 {
            agents.push(s.sim_agent(&format!("gpu-{i}"), "hgx-h100").await);
        }
        let t = Instant::now();
        let mut beats = 0;
        while t.elapsed() < Duration::from_secs(3) {
            for a in &agents {
                assert_eq!(a.heartbeat().await, 204);
                beats += 1;
            }
            if beats % 30 == 0 {
                for i in 0..3 {
                    assert_eq!(state_of(&b_admin, &format!("gpu-{i}")).await, HostState::Ready);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Every beat is renewed in memory and written within one flush
        // (every 500 ms at a 2 s timeout).
        tokio::time::sleep(Duration::from_millis(600)).await;
        let m = s.server.state.metrics.encode();
        let (renewed, batches) = (
            counter(&m, "kumo_host_lease_renewals_total"),
            counter(&m, "kumo_host_lease_batches_total"),
        );
        assert!(beats >= 60, "{beats} beats");
        assert!(renewed >= 3, "{m}");
        assert!(
            (2..=10).contains(&batches),
            "{beats} beats written in {batches} batches: {m}"
        );
        assert_eq!(s.server.state.leases.pending(), 0);
        // Silent: both replicas see it (the database is the truth).
        within("the hosts to turn unreachable", Duration::from_secs(6), async || {
            state_of(&b_admin, "gpu-0").await == HostState::Unreachable
                && state_of(&s.admin, "gpu-2").await == HostState::Unreachable
        })
        .await;
        // Back from unreachable: written at once, not at the next batch.
        assert_eq!(agents[0].heartbeat().await, 204);
        assert_eq!(state_of(&b_admin, "gpu-0").await, HostState::Ready);
        b.stop().await.unwrap();
    }

    /// Replica A keeps each host's row between its agent's requests (a
    /// beat that changes nothing reads no database), yet a credential
    /// revoked through replica B is refused at A within about a second
    /// (A's reading of the marks forgets the row), and one revoked at A
    /// is refused there at once.
    async fn a_revoked_credential_is_refused_at_a_replica_keeping_rows(s: &TestServer) {
        let (b, _) = replica(s).await;
        let far = s.sim_agent("gpu-0", "hgx-h100").await;
        let near = s.sim_agent("gpu-1", "hgx-h100").await;
        for a in [&far, &near] {
            assert_eq!(a.heartbeat().await, 204);
            assert_eq!(a.heartbeat().await, 204);
        }
        assert_eq!(s.server.state.capacity.host_rows.len(), 2, "rows not kept");
        let rejoin = async |url: &str, host: &str| {
            let r = s
                .http()
                .post(format!("{url}/api/v1/hosts/{host}/rejoin"))
                .bearer_auth(&s.admin_token)
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "{}", r.status());
        };
        rejoin(&b.url(), "gpu-0").await;
        let took = within("B's revocation to reach A", Duration::from_secs(5), async || {
            far.heartbeat().await == 401
        })
        .await;
        eprintln!("a credential revoked at B was refused at A after {took:?}");
        assert_eq!(near.heartbeat().await, 204);
        rejoin(&s.url, "gpu-1").await;
        assert_eq!(near.heartbeat().await, 401, "revoked here, still let in here");
        b.stop().await.unwrap();
    }

    /// A host that came after the follower's last reading and whose
    /// desired state moved before its next is woken by that next reading:
    /// its long poll must not sleep its 25 s out (the cause of this file's
    /// old flake: registered at A just before A's reading, placed on
    /// through B before the next).
    async fn a_host_new_to_the_follower_is_woken_when_its_revision_moved(s: &TestServer) {
        s.tenant("lab").await;
        let follower = kumo_server::store::capacity::Capacity::default();
        let signals = kumo_server::signals::HostSignals::default();
        follower.catch_up(s.db(), &signals).await.unwrap(); // no hosts yet
        let agent = s.sim_agent("gpu-0", "hgx-h100").await;
        let seen = signals.seen(agent.host_id);
        let _: Vm = s.admin.post("/api/v1/tenants/lab/vms", &whole_host("one")).await.unwrap();
        follower.catch_up(s.db(), &signals).await.unwrap();
        assert!(signals.seen(agent.host_id) > seen, "the new host's waiters were not woken");
    }

    /// A VM placed through replica B takes its GPUs out of replica A's
    /// index and wakes the host's long poll held at A, both within about
    /// a second (the full re-read is minutes apart); the VM's deletion
    /// reported to A frees the GPUs in B's index likewise.
    async fn each_replica_follows_the_others_changes(s: &TestServer) {
        s.tenant("lab").await;
        let (b, b_admin) = replica(s).await;
        let mut agent = s.sim_agent("gpu-0", "hgx-h100").await;
        let host = agent.host_id;
        // Alive throughout (the file's timeout is 2 s).
        let beats = {
            let agent = agent.clone();
            tokio::spawn(async move {
                loop {
                    agent.heartbeat().await;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            })
        };
        let free = |st: &kumo_server::AppState| {
            st.capacity.lock().host(host).map(|h| h.gpu_free.count_ones())
        };
        within("both indexes to know the host", Duration::from_secs(3), async || {
            let (a, bf) = (free(&s.server.state), free(&b.state));
            eprintln!("free GPUs: A {a:?}, B {bf:?}");
            a == Some(8) && bf == Some(8)
        })
        .await;
        let revision = agent.desired(None).await.revision;
        let poll = {
            let agent = agent.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                let d = agent.desired(Some(revision)).await;
                (t.elapsed(), d.vms.len())
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _: Vm = b_admin
            .post("/api/v1/tenants/lab/vms", &whole_host("whole"))
            .await
            .unwrap();
        let took = within("A's index to see the GPUs taken", Duration::from_secs(3), async || {
            free(&s.server.state) == Some(0)
        })
        .await;
        eprintln!("A's index followed B's placement in {took:?}");
        let (waited, vms) = poll.await.unwrap();
        assert_eq!(vms, 1);
        assert!(waited < Duration::from_secs(3), "the long poll at A waited {waited:?}");
        agent.converge().await;
        s.admin.delete("/api/v1/tenants/lab/vms/whole").await.unwrap();
        agent.converge().await; // reports it gone, to A
        within("B's index to see the GPUs free", Duration::from_secs(3), async || {
            free(&b.state) == Some(8)
        })
        .await;
        beats.abort();
        b.stop().await.unwrap();
    }
}
