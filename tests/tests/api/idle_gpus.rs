//! Idle GPUs on the test's clock: a host reports a VM's GPU minute by
//! minute through the agent protocol, the idle pass runs after each
//! minute, and the project hears of it (VM events, audit entries, its
//! webhook, a loopback receiver here) at half the window and near its end;
//! busy or unknown minutes end the spell, an owner's exemption holds it
//! off and restarts the count, and at the end the VM is shelved.

use chrono::Duration;
use kumo_api_types::{
    AuditEntry, IdleAction, IdlePolicyView, IdleReport, IdleVm, Page, Role, ServiceLevel, Vm,
    VmState,
};
use kumo_server::clock::Clock;
use serde_json::json;

use crate::harness::{events_of, on_both_backends, TestServer};

fn manual_clock(c: &mut kumo_server::config::Config) {
    c.clock = Clock::manual(chrono::DateTime::from_timestamp(1_900_000_000, 0).unwrap());
    c.idle.allow_loopback_webhooks = true;
    // The test runs the passes itself.
    c.idle.check_every = std::time::Duration::from_secs(3600);
}

struct Guest<'a> {
    s: &'a TestServer,
    /// The host's agent protocol address and credential.
    agent: (String, String),
    vm: Vm,
    gpu: String,
    clock: Clock,
}

impl Guest<'_> {
    /// One minute of the guest: a reading (`None`: the GPU cannot say),
    /// the clock moved on, the idle pass.
    async fn minutes(&self, n: usize, util: Option<f64>) {
        for _ in 0..n {
            let body = json!({"vms": [{"vm": self.vm.id, "gpus": [{"host_bdf": self.gpu, "sample": {
                "bus_id": "0000:11:00.0", "utilization_pct": util, "memory_used_mib": 1000,
                "memory_total_mib": 81559}}]}]});
            let r = reqwest::Client::new()
                .post(format!("{}/agent/v1/telemetry", self.agent.0))
                .bearer_auth(&self.agent.1)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 204);
            self.clock.advance(Duration::seconds(60));
            kumo_server::app::idle_gpus::pass(&self.s.server.state)
                .await
                .unwrap();
        }
    }

    async fn state(&self) -> IdleVm {
        let r: IdleReport = self
            .s
            .admin
            .get("/api/v1/tenants/lab/idle-vms")
            .await
            .unwrap();
        r.vms.into_iter().find(|v| v.vm == self.vm.id).unwrap()
    }

    async fn events(&self) -> Vec<String> {
        events_of(self.s, "lab", &self.vm)
            .await
            .into_iter()
            .filter(|e| e.starts_with("idle."))
            .collect()
    }
}

on_both_backends! {
    config = manual_clock;
    async fn idle_gpu_vms_are_told_exempted_and_shelved(s: &TestServer) {
        s.tenant("lab").await;
        let (owner, owner_token) = s.user("olga").await;
        let (member, _) = s.user("mika").await;
        s.add("lab", "olga", Role::Owner).await;
        s.add("lab", "mika", Role::Member).await;
        let mut agent = s.sim_agent("gpu-001", "hgx-h100").await;
        let clock = s.server.state.config.clock.clone();
        let (hook, got) = crate::harness::webhook_receiver("vm.idle").await;

        // The platform's policy stands until the project sets its own;
        // an owner may only tighten it, an administrator may set any.
        let p: IdlePolicyView = member.get("/api/v1/tenants/lab/idle-policy").await.unwrap();
        assert_eq!((p.effective.utilization_pct, p.effective.hours, p.effective.action), (5.0, 24, IdleAction::Notice));
        assert!(p.own.is_none() && p.webhook.is_none());
        for (body, field) in [
            (json!({"utilization_pct": 1.0}), "lower threshold"),
            (json!({"hours": 48}), "longer window"),
            (json!({"hours": 1, "webhook_url": "https://169.254.169.254/latest"}), "metadata service"),
            (json!({"hours": 1, "webhook_url": "http://hooks.example.org/x"}), "plain http off loopback"),
        ] {
            let e = owner.put::<_, IdlePolicyView>("/api/v1/tenants/lab/idle-policy", &body).await.unwrap_err();
            assert_eq!(e.status(), Some(400), "{field}");
        }
        let e = member.put::<_, IdlePolicyView>("/api/v1/tenants/lab/idle-policy", &json!({"hours": 1})).await.unwrap_err();
        assert_eq!(e.status(), Some(403));
        let p: IdlePolicyView = s.admin.put("/api/v1/tenants/lab/idle-policy", &json!({"hours": 48})).await.unwrap();
        assert_eq!(p.effective.hours, 48, "administrators may loosen");
        let p: IdlePolicyView = owner
            .put("/api/v1/tenants/lab/idle-policy", &json!({"hours": 1, "action": "shelve", "webhook_url": hook}))
            .await
            .unwrap();
        assert_eq!((p.effective.utilization_pct, p.effective.hours, p.effective.action), (5.0, 1, IdleAction::Shelve));
        assert_eq!(p.set_by.as_deref(), Some("olga"));
        // The webhook's address is shown as scheme and host, and is not
        // stored readably.
        let shown = serde_json::to_string(&p).unwrap();
        assert!(!shown.contains("secret-path"), "{shown}");
        assert_eq!(p.webhook.as_ref().unwrap().target, "http://127.0.0.1");
        let row = kumo_server::store::idle_gpus::policy(s.db(), p_tenant(s).await).await.unwrap().unwrap();
        assert!(!row.webhook_sealed.as_deref().unwrap().contains("secret-path"));

        // A one-GPU VM, running.
        let v: Vm = s.admin.post("/api/v1/tenants/lab/vms", &crate::device_health::vm("train", 1, ServiceLevel::Guaranteed)).await.unwrap();
        agent.converge().await;
        let v: Vm = s.admin.get(&format!("/api/v1/tenants/lab/vms/{}", v.id)).await.unwrap();
        assert_eq!(v.state, VmState::Running);
        let gpu = v.placement.as_ref().unwrap().gpus[0].host_bdf.clone();
        let g = Guest { s, agent: (agent.url.clone(), agent.credential.clone()), vm: v, gpu, clock: clock.clone() };

        // Busy, then a guest that cannot say: never idle.
        g.minutes(3, Some(50.0)).await;
        g.minutes(40, None).await;
        let st = g.state().await;
        assert_eq!((st.idle_since, st.notices), (None, 0), "unknown is not idle");

        // Idle: nothing for 29 minutes, the first notice at half the window.
        g.minutes(29, Some(1.0)).await;
        let st = g.state().await;
        assert_eq!((st.idle_minutes, st.notices), (29, 0));
        assert!(st.idle_since.is_some());
        g.minutes(1, Some(1.0)).await;
        assert_eq!(g.state().await.notices, 1);
        assert_eq!(g.events().await, vec!["idle.notice"]);
        let h = crate::harness::webhook_posts(&got, 1).await;
        assert_eq!(h[0]["event"], "idle.notice");
        assert_eq!(h[0]["vm"], "train");
        assert!(h[0]["text"].as_str().unwrap().contains("will be shelved"), "{}", h[0]["text"]);

        // One busy minute ends the spell; the next one starts from zero.
        g.minutes(1, Some(80.0)).await;
        let st = g.state().await;
        assert_eq!((st.idle_since, st.notices), (None, 0));
        assert_eq!(g.events().await, vec!["idle.notice", "idle.ended"]);
        g.minutes(45, Some(2.0)).await;
        let st = g.state().await;
        assert_eq!(st.notices, 2, "half and near the end");
        let at = st.action_at.unwrap();
        // An hour from the spell's first minute, and at least 15 minutes
        // (the final notice's lead) after the final notice.
        let end = st.idle_since.unwrap() + Duration::hours(1);
        assert!(at >= end && at - end < Duration::minutes(1), "{at} vs {end}");
        assert_eq!(g.events().await, vec!["idle.notice", "idle.ended", "idle.notice", "idle.warning"]);
        crate::harness::webhook_posts(&got, 3).await;

        // The portal: the dashboard flags the VM, its page warns and
        // charts the GPU's day (busy, silent, then idle).
        let portal = s.portal_as(&owner_token).await;
        let board = s.page(&portal, "/").await;
        let flag = board.find("<li data-vm=\"train\">").map(|i| &board[i..]).unwrap_or_else(|| panic!("{board}"));
        assert!(flag.contains("lab / train") && flag.contains("will be shelved at"), "{flag}");
        let page = s.page(&portal, "/t/lab/vms/train").await;
        assert!(page.contains("class=\"banner idle\"") && page.contains("idle for 0 h 45 min"), "{page}");
        assert!(page.contains("GPUs over the last 24 hours (UTC)"), "{page}");
        let chart = &page[page.find("Utilisation (%)").unwrap()..];
        let chart = &chart[..chart.find("</svg>").unwrap()];
        assert!(chart.contains(">100 %</text>") && chart.contains(">0 %</text>"), "axes: {chart}");
        assert_eq!(chart.matches("<polyline").count() + chart.matches("<circle").count(), 2,
            "busy, then (after the silent minutes) idle: {chart}");
        assert!(page.contains("Memory in use (GiB)") && page.contains(">80 GiB</text>"), "{page}");
        assert!(page.contains(&format!("{}</li>", g.gpu)), "the legend names the GPU: {page}");

        // An owner exempts it (a member may not; not for longer than the
        // platform allows); nothing happens while it lasts.
        let until = clock.now() + Duration::minutes(10);
        let e = member.put::<_, IdleVm>("/api/v1/tenants/lab/vms/train/idle-exemption", &json!({"reason": "x", "until": until})).await.unwrap_err();
        assert_eq!(e.status(), Some(403));
        let e = owner.put::<_, IdleVm>("/api/v1/tenants/lab/vms/train/idle-exemption",
            &json!({"reason": "x", "until": clock.now() + Duration::days(15)})).await.unwrap_err();
        assert_eq!(e.status(), Some(400));
        // The owner does it with the CLI, after reading where the VM stands.
        let (url, token) = (s.url.clone(), owner_token.clone());
        let until_text = until.to_rfc3339();
        let ex = tokio::task::spawn_blocking(move || {
            let k = crate::cli::Kumo::new();
            let t = Some(token.as_str());
            let list = k.ok(&["--server", &url, "idle", "list", "-t", "lab"], t);
            assert!(list.contains("Policy: idle below 5 % for 1 h, then shelve."), "{list}");
            let row = list.lines().find(|l| l.starts_with("train")).unwrap_or_else(|| panic!("{list}"));
            assert!(row.contains("0h45m") && row.contains(" 2 "), "{row}");
            let policy = k.ok(&["--server", &url, "idle", "policy", "-t", "lab"], t);
            assert!(policy.contains("(the project's own)") && policy.contains("Webhook: http://127.0.0.1"), "{policy}");
            assert!(!policy.contains("secret-path"), "{policy}");
            k.json(&["--server", &url, "idle", "exempt", "train", "-t", "lab",
                "--reason", "checkpoint upload waits on the archive", "--until", &until_text], t)
        })
        .await
        .unwrap();
        let ex: IdleVm = serde_json::from_value(ex).unwrap();
        assert_eq!(ex.exempt_until, Some(until));
        assert_eq!(ex.exempt_by.as_deref(), Some("olga"));
        assert_eq!((ex.notices, ex.action_at), (0, None));
        g.minutes(15, Some(1.0)).await;
        let st = g.state().await;
        assert_eq!(st.notices, 0, "the exemption ended 5 minutes ago: the count restarted");
        assert_eq!(st.idle_minutes, 5);
        assert_eq!(st.exempt_until, None, "no longer in force");
        let vm_now: Vm = s.admin.get("/api/v1/tenants/lab/vms/train").await.unwrap();
        assert_eq!(vm_now.state, VmState::Running);

        // After it: both notices again, then shelving an hour in.
        g.minutes(25, Some(1.0)).await;
        assert_eq!(g.state().await.notices, 1);
        g.minutes(15, Some(1.0)).await;
        assert_eq!(g.state().await.notices, 2);
        g.minutes(14, Some(1.0)).await;
        let vm_now: Vm = s.admin.get("/api/v1/tenants/lab/vms/train").await.unwrap();
        assert_eq!(vm_now.state, VmState::Running, "not before the hour");
        g.minutes(1, Some(1.0)).await;
        let vm_now: Vm = s.admin.get("/api/v1/tenants/lab/vms/train").await.unwrap();
        assert_eq!(vm_now.state, VmState::Shelving, "{:?}", vm_now.reason);
        agent.converge().await;
        let vm_now: Vm = s.admin.get("/api/v1/tenants/lab/vms/train").await.unwrap();
        assert_eq!(vm_now.state, VmState::Shelved);
        let ev = g.events().await;
        assert_eq!(ev[4..], ["idle.exempted", "idle.notice", "idle.warning", "idle.shelved"]);
        let h = crate::harness::webhook_posts(&got, 6).await;
        assert_eq!(h[5]["event"], "idle.shelved");
        // Once shelved, the pass leaves it alone.
        assert_eq!(kumo_server::app::idle_gpus::pass(&s.server.state).await.unwrap(), 0);

        // The project reads every step in its audit log, and sees the
        // webhook's last delivery.
        let audit: Page<AuditEntry> = owner.get("/api/v1/audit?tenant=lab&limit=100").await.unwrap();
        let count = |a: &str| audit.items.iter().filter(|e| e.action == a).count();
        assert_eq!(count("vm.idle_notice"), 5);
        assert_eq!(count("vm.idle_shelve"), 1);
        assert_eq!(count("vm.idle_exempt"), 1);
        assert_eq!(count("tenant.idle_policy"), 2);
        assert!(audit.items.iter().any(|e| e.action == "vm.idle_exempt" && e.target.contains("checkpoint upload")));
        let p: IdlePolicyView = owner.get("/api/v1/tenants/lab/idle-policy").await.unwrap();
        assert_eq!(p.webhook.unwrap().last_result.as_deref(), Some("delivered (HTTP 200)"));

        // Back to the platform's policy: the webhook goes with it.
        owner.delete("/api/v1/tenants/lab/idle-policy").await.unwrap();
        let p: IdlePolicyView = owner.get("/api/v1/tenants/lab/idle-policy").await.unwrap();
        assert!(p.own.is_none() && p.webhook.is_none());
        assert_eq!(p.effective.hours, 24);
    }
}

on_both_backends! {
    config = manual_clock;

    /// A VM's exemptions, renewals included, add up to at most `[idle]
    /// max_exempt_days_total` (30 days): an owner cannot keep idle GPUs
    /// from everyone by renewing, and a refusal says how much is left.
    /// What an exemption ended early did not use does not count.
    async fn idle_exemptions_are_capped_in_total_renewals_included(s: &TestServer) {
        s.tenant("lab").await;
        let (owner, _) = s.user("olga").await;
        s.add("lab", "olga", Role::Owner).await;
        let _agent = s.sim_agent("gpu-001", "hgx-h100").await;
        let _: Vm = s
            .admin
            .post("/api/v1/tenants/lab/vms", &crate::device_health::vm("train", 1, ServiceLevel::Guaranteed))
            .await
            .unwrap();
        let clock = s.server.state.config.clock.clone();
        let days = Duration::days;
        let path = "/api/v1/tenants/lab/vms/train/idle-exemption";
        let exempt = |who: &kumo_cli::Client, d: i64| {
            let body = json!({"reason": "a long run", "until": clock.now() + days(d)});
            let who = who.clone();
            async move { who.put::<_, IdleVm>(path, &body).await }
        };
        // 14 days, renewed after 10 for 14 more: 24 in all.
        exempt(&owner, 14).await.unwrap();
        clock.advance(days(10));
        exempt(&owner, 14).await.unwrap();
        // 10 days later (20 used, 4 held), another 14 would make 34.
        clock.advance(days(10));
        let e = exempt(&owner, 14).await.unwrap_err();
        assert_eq!(e.status(), Some(400));
        let detail = e.problem().unwrap().detail.clone().unwrap_or_default();
        assert!(detail.contains("at most 30 days in all") && detail.contains("10 days left"), "{detail}");
        // Up to the cap is fine.
        let ex = exempt(&owner, 10).await.unwrap();
        assert_eq!(ex.exempt_until, Some(clock.now() + days(10)));
        // Ended after 2 days: the 8 not used are left.
        clock.advance(days(2));
        owner.delete(path).await.unwrap();
        let e = exempt(&owner, 9).await.unwrap_err();
        let detail = e.problem().unwrap().detail.clone().unwrap_or_default();
        assert!(detail.contains("8 days left"), "{detail}");
        exempt(&owner, 8).await.unwrap();
        let e = exempt(&owner, 9).await.unwrap_err();
        assert_eq!(e.status(), Some(400), "a renewal replaces, it does not add: 8 held, 9 asked");
        // Administrators may go past it.
        let ex = exempt(&s.admin, 20).await.unwrap();
        assert_eq!(ex.exempt_by.as_deref(), Some("admin"));
    }
}

async fn p_tenant(s: &TestServer) -> uuid::Uuid {
    let t: kumo_api_types::Tenant = s.admin.get("/api/v1/tenants/lab").await.unwrap();
    t.id
}

/// The idle pass's cost: `VMS` one-GPU VMs, each with a day of minutes
/// (written straight into `gpu_minutes`), one pass timed three times.
/// A benchmark, run by hand (BENCHMARKS.md, "Idle GPUs").
async fn idle_pass_bench(backend: crate::harness::Backend) {
    use sea_orm::EntityTrait;
    const VMS: usize = 128;
    let s = TestServer::start_with(backend, |c| {
        manual_clock(c);
        // 128 creates at once: the change allowance is not what is measured.
        c.network.tenant_changes = kumo_server::domain::churn::Allowance {
            per_minute: 10_000,
            burst: 10_000,
        };
    })
    .await;
    s.tenant("lab").await;
    let mut ids = Vec::new();
    for h in 0..VMS / 8 {
        let mut a = s.sim_agent(&format!("gpu-{h:03}"), "hgx-h100").await;
        for i in 0..8 {
            let v: Vm = s
                .admin
                .post(
                    "/api/v1/tenants/lab/vms",
                    &crate::device_health::vm(&format!("vm-{h}-{i}"), 1, ServiceLevel::Guaranteed),
                )
                .await
                .unwrap();
            ids.push(v.id);
        }
        a.converge().await;
    }
    let now = s.server.state.config.clock.now();
    let tenant = p_tenant(&s).await;
    for id in &ids {
        let v: Vm = s
            .admin
            .get(&format!("/api/v1/tenants/lab/vms/{id}"))
            .await
            .unwrap();
        assert_eq!(v.state, VmState::Running);
        let bdf = v.placement.unwrap().gpus[0].host_bdf.clone();
        let rows: Vec<_> = (1..=1440)
            .map(|m| kumo_server::entity::gpu_minutes::ActiveModel {
                vm_id: sea_orm::Set(*id),
                host_bdf: sea_orm::Set(bdf.clone()),
                minute: sea_orm::Set(
                    kumo_server::domain::gpu_telemetry::minute_of(now) - Duration::minutes(m),
                ),
                tenant_id: sea_orm::Set(tenant),
                samples: sea_orm::Set(4),
                util_n: sea_orm::Set(4),
                util_sum: sea_orm::Set(Some(4.0)),
                util_max: sea_orm::Set(Some(1.0)),
                mem_used_max: sea_orm::Set(None),
                mem_total: sea_orm::Set(None),
                temp_max: sea_orm::Set(None),
                power_n: sea_orm::Set(0),
                power_sum: sea_orm::Set(None),
                ecc_max: sea_orm::Set(None),
                throttle: sea_orm::Set(None),
            })
            .collect();
        for chunk in rows.chunks(500) {
            kumo_server::entity::gpu_minutes::Entity::insert_many(chunk.to_vec())
                .exec(s.db())
                .await
                .unwrap();
        }
    }
    let mut times = Vec::new();
    for _ in 0..3 {
        let t = std::time::Instant::now();
        kumo_server::app::idle_gpus::pass(&s.server.state)
            .await
            .unwrap();
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    println!(
        "{}",
        json!({"backend": format!("{backend:?}"), "vms": VMS, "minutes_per_vm": 1440, "pass_ms": times})
    );
    s.stop().await;
}

#[tokio::test]
#[ignore = "benchmark"]
async fn idle_pass_bench_sqlite() {
    idle_pass_bench(crate::harness::Backend::Sqlite).await;
}

#[tokio::test]
#[ignore = "benchmark"]
async fn idle_pass_bench_postgres() {
    idle_pass_bench(crate::harness::Backend::Postgres).await;
}
