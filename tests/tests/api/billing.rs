//! Metering and points on an injected clock: per-second charges with a
//! 60-second minimum, spot and guaranteed prices, disks charged while the
//! VM exists, a month boundary, grants spent oldest-expiring first (and
//! one expiring), statements that equal the ledger to the last decimal,
//! and no charge posted twice — by a restarted server or by replicas
//! posting at once.

use chrono::{Duration, TimeZone, Utc};
use kumo_api_types::{Points, Rates, Statement, Vm, VmState};
use kumo_server::clock::Clock;
use serde_json::json;

use crate::harness::{Backend, TestServer};

fn d(s: &str) -> kumo_billing::Decimal {
    s.parse().unwrap()
}

async fn points(s: &TestServer) -> Points {
    s.admin.get("/api/v1/tenants/lab/points").await.unwrap()
}

/// Points enough for any of these tests: a tenant without a grant starts
/// nothing priced.
async fn grant_plenty(admin: &kumo_cli::Client, tenant: &str, t0: chrono::DateTime<Utc>) {
    let _: kumo_api_types::PointGrant = admin
        .post(
            &format!("/api/v1/tenants/{tenant}/points/grants"),
            &json!({"amount": "1000000000", "expires_at": t0 + Duration::days(3650)}),
        )
        .await
        .unwrap();
}

async fn month(s: &TestServer, m: &str) -> Statement {
    s.admin
        .get(&format!("/api/v1/tenants/lab/statements/{m}"))
        .await
        .unwrap()
}

async fn charges_follow_the_lifecycle(backend: Backend) {
    // Three minutes before December: pieces on both sides of the month.
    let t0 = Utc.with_ymd_and_hms(2026, 11, 30, 23, 57, 0).unwrap();
    let clock = Clock::manual(t0);
    let s = TestServer::start_with(backend, |c| c.clock = clock.clone()).await;
    let post = || kumo_server::app::metering::post_due(&s.server.state);
    let rates: Rates = s
        .admin
        .put(
            "/api/v1/rates",
            &json!({"prices": {
                "gpu:H100-SXM5-80GB": {"guaranteed": "3600", "spot": "1200"},
                "vcpu": {"guaranteed": "36", "spot": "12"},
                "memory_gib": {"guaranteed": "3.6", "spot": "1.2"},
                "disk_gib": {"guaranteed": "0.36", "spot": "0.36"},
            }}),
        )
        .await
        .unwrap();
    assert_eq!(rates.current.unwrap().effective_from, t0);
    s.tenant("lab").await;
    for (amount, expires) in [
        ("1000", t0 + Duration::days(1)),
        ("5", t0 + Duration::minutes(2)),
    ] {
        let _: kumo_api_types::PointGrant = s
            .admin
            .post(
                "/api/v1/tenants/lab/points/grants",
                &json!({"amount": amount, "expires_at": expires, "note": "test"}),
            )
            .await
            .unwrap();
    }
    let mut agent = s.sim_agent("gpu-1", "hgx-h100").await;
    for (name, level) in [("g", "guaranteed"), ("s", "spot")] {
        let _: Vm = s
            .admin
            .post(
                "/api/v1/tenants/lab/vms",
                &json!({"name": format!("vm-{name}"), "gpus": 1, "vcpus": 8, "memory_gib": 16,
                        "disk_gib": 10, "service_level": level}),
            )
            .await
            .unwrap();
    }
    agent.converge().await; // both running at t0
    clock.advance(Duration::seconds(10));
    s.admin.vm_action("lab", "vm-g", "stop").await.unwrap();
    agent.converge().await; // vm-g stopped at t0 + 10 s: its minute is charged
    clock.advance(Duration::seconds(50));
    // t0 + 1 min: every run's minimum, while the 5-point grant still holds.
    assert!(post().await.unwrap() > 0);
    assert_eq!(post().await.unwrap(), 0, "posting again posts nothing");
    clock.advance(Duration::minutes(4)); // 00:02 on December 1st
    post().await.unwrap();

    // vm-g: 60 s guaranteed = 60 + 4.8 + 0.96; vm-s: 300 s spot =
    // 100 + 8 + 1.6; two disks of 10 GiB for 300 s = 0.3 each.
    let p = points(&s).await;
    assert_eq!(d(&p.charged), d("175.96"), "{p:?}");
    let nov = month(&s, "2026-11").await;
    let dec = month(&s, "2026-12").await;
    assert_eq!(d(&nov.total), d("131.88"), "{nov:?}");
    assert_eq!(d(&dec.total), d("44.08"), "{dec:?}");
    for st in [&nov, &dec] {
        let sum: kumo_billing::Decimal = st.lines.iter().map(|l| d(&l.amount)).sum();
        assert_eq!(sum, d(&st.total), "the total is the sum of the lines");
    }
    assert_eq!(
        d(&nov.total) + d(&dec.total),
        d(&p.charged),
        "statements = ledger"
    );
    let by_day: kumo_api_types::Usage = s
        .admin
        .get("/api/v1/tenants/lab/usage?group_by=day&from=2026-11-01T00:00:00Z&to=2026-12-31T00:00:00Z")
        .await
        .unwrap();
    let days: Vec<(&str, kumo_billing::Decimal)> = by_day
        .rows
        .iter()
        .map(|r| (r.key.as_str(), d(&r.amount)))
        .collect();
    assert_eq!(
        days,
        [("2026-11-30", d(&nov.total)), ("2026-12-01", d(&dec.total))]
    );
    assert_eq!(d(&by_day.total), d(&p.charged));
    let line = |st: &Statement, vm: &str, res: &str| {
        st.lines
            .iter()
            .find(|l| l.vm == vm && l.resource == res)
            .map(|l| (l.seconds, d(&l.amount), d(&l.rate_per_hour)))
    };
    assert_eq!(
        line(&nov, "vm-g", "gpu:H100-SXM5-80GB"),
        Some((60, d("60"), d("3600"))),
        "a 10-second run pays its minute"
    );
    assert_eq!(line(&dec, "vm-g", "gpu:H100-SXM5-80GB"), None);
    assert_eq!(line(&nov, "vm-s", "vcpu"), Some((180, d("4.8"), d("12"))));
    assert_eq!(line(&dec, "vm-s", "vcpu"), Some((120, d("3.2"), d("12"))));
    assert_eq!(
        line(&dec, "vm-g", "disk_gib"),
        Some((120, d("0.12"), d("0.36"))),
        "a stopped VM pays its disk"
    );

    // The first minute's 87.8 points took the 5 expiring ones first; the
    // rest came from the 1000.
    assert_eq!(d(&p.balance), d("1000") - d("82.8") - d("88.16"), "{p:?}");
    let short = p.grants.iter().find(|g| g.amount == "5").unwrap();
    assert!(short.expired && d(&short.remaining).is_zero());
    assert_eq!(p.currency, "JPY");

    // CSV: the same lines and total.
    let csv = s
        .http()
        .get(format!("{}/api/v1/tenants/lab/statements/2026-11", s.url))
        .bearer_auth(&s.admin_token)
        .header("accept", "text/csv")
        .send()
        .await
        .unwrap();
    assert!(csv.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/csv"));
    let text = csv.text().await.unwrap();
    assert!(text.starts_with("vm,resource,service_level,seconds,rate_per_hour,amount\n"));
    assert_eq!(text.lines().count(), nov.lines.len() + 2, "{text}");
    assert!(
        text.ends_with(&format!("total,,,,,{}\n", nov.total)),
        "{text}"
    );

    // A second server on the same database (a restart, or a replica)
    // posts nothing already posted; one more minute is one more minute.
    let replica = kumo_server::RunningServer::start(s.server.state.config.as_ref().clone())
        .await
        .unwrap();
    assert_eq!(
        kumo_server::app::metering::post_due(&replica.state)
            .await
            .unwrap(),
        0
    );
    clock.advance(Duration::minutes(1));
    let (a, b) = tokio::join!(post(), kumo_server::app::metering::post_due(&replica.state));
    assert_eq!(
        a.unwrap() + b.unwrap(),
        5,
        "3 compute + 2 disk pieces, once"
    );
    let p2 = points(&s).await;
    assert_eq!(
        d(&p2.charged) - d(&p.charged),
        d("20") + d("1.6") + d("0.32") + d("0.12")
    );
    replica.stop().await.unwrap();
    s.stop().await;
}

#[tokio::test]
async fn charges_follow_the_lifecycle_sqlite() {
    charges_follow_the_lifecycle(Backend::Sqlite).await;
}

#[tokio::test]
async fn charges_follow_the_lifecycle_postgres() {
    charges_follow_the_lifecycle(Backend::Postgres).await;
}

/// Rates are checked whole and never reach into the past; grants and
/// months are checked; only admins set rates and grant points.
#[tokio::test]
async fn bad_rates_grants_and_months_are_refused() {
    let t0 = Utc.with_ymd_and_hms(2026, 11, 10, 12, 0, 0).unwrap();
    let clock = Clock::manual(t0);
    let s = TestServer::start_with(Backend::Sqlite, |c| c.clock = clock.clone()).await;
    s.tenant("lab").await;
    let price = |g: &str, sp: &str| json!({"guaranteed": g, "spot": sp});
    for (body, field) in [
        (
            json!({"effective_from": t0 - Duration::seconds(1), "prices": {"vcpu": price("1", "1")}}),
            "effective_from",
        ),
        (
            json!({"prices": {"vcpu": price("-1", "0")}}),
            "prices.vcpu.guaranteed",
        ),
        (json!({"prices": {"vcpu": price("1", "2")}}), "prices"),
        (json!({"prices": {"tpu": price("1", "1")}}), "prices"),
        (
            json!({"prices": {"vcpu": price("1.0000001", "1")}}),
            "prices.vcpu.guaranteed",
        ),
        (
            json!({"prices": {"vcpu": price("one", "1")}}),
            "prices.vcpu.guaranteed",
        ),
    ] {
        let e = s
            .admin
            .put::<_, Rates>("/api/v1/rates", &body)
            .await
            .unwrap_err();
        assert_eq!(e.problem().unwrap().errors[0].field, field, "{body}");
    }
    let later = t0 + Duration::days(1);
    let r: Rates = s
        .admin
        .put(
            "/api/v1/rates",
            &json!({"effective_from": later, "prices": {"vcpu": price("2", "1")}}),
        )
        .await
        .unwrap();
    assert!(r.current.is_none(), "not in force yet");
    assert_eq!(r.cards.len(), 1);
    let e = s
        .admin
        .put::<_, Rates>(
            "/api/v1/rates",
            &json!({"effective_from": later, "prices": {}}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(409));
    clock.advance(Duration::days(2));
    let r: Rates = s.admin.get("/api/v1/rates").await.unwrap();
    assert_eq!(r.current.unwrap().prices["vcpu"].guaranteed, "2");
    for (body, field) in [
        (
            json!({"amount": "0", "expires_at": later + Duration::days(9)}),
            "amount",
        ),
        (
            json!({"amount": "x", "expires_at": later + Duration::days(9)}),
            "amount",
        ),
        (json!({"amount": "10", "expires_at": t0}), "expires_at"),
    ] {
        let e = s
            .admin
            .post::<_, kumo_api_types::PointGrant>("/api/v1/tenants/lab/points/grants", &body)
            .await
            .unwrap_err();
        assert_eq!(e.problem().unwrap().errors[0].field, field, "{body}");
    }
    for m in ["2026-13", "2026-1", "latest"] {
        let e = s
            .admin
            .get::<Statement>(&format!("/api/v1/tenants/lab/statements/{m}"))
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(400), "{m}");
    }
    let empty = month(&s, "2026-11").await;
    assert!(empty.lines.is_empty() && d(&empty.total).is_zero());
    s.stop().await;
}

/// Out of points: alerts once each, new VMs and starts refused with a
/// `points-exhausted` problem, spot VMs stopped at once, guaranteed VMs
/// after the grace (or an admin's extension); a grant brings it back.
async fn exhaustion(backend: Backend) {
    let t0 = Utc.with_ymd_and_hms(2026, 11, 10, 9, 0, 0).unwrap();
    let clock = Clock::manual(t0);
    let s = TestServer::start_with(backend, |c| c.clock = clock.clone()).await;
    let state = &s.server.state;
    let pass = || async {
        kumo_server::app::metering::post_due(state).await.unwrap();
        kumo_server::app::budget::enforce(state).await.unwrap();
    };
    let _: Rates = s
        .admin
        .put(
            "/api/v1/rates",
            &json!({"prices": {"vcpu": {"guaranteed": "3600", "spot": "3600"}}}),
        )
        .await
        .unwrap();
    s.tenant("lab").await;
    let grant = |amount: &str| {
        let body = json!({"amount": amount, "expires_at": t0 + Duration::days(300)});
        let c = s.admin.clone();
        async move {
            let _: kumo_api_types::PointGrant = c
                .post("/api/v1/tenants/lab/points/grants", &body)
                .await
                .unwrap();
        }
    };
    grant("100").await;
    let mut agent = s.sim_agent("cpu-1", "cpu-only").await;
    for (name, level) in [("vm-gua", "guaranteed"), ("vm-spot", "spot")] {
        let _: Vm = s
            .admin
            .post(
                "/api/v1/tenants/lab/vms",
                &json!({"name": name, "vcpus": 1, "memory_gib": 1, "service_level": level}),
            )
            .await
            .unwrap();
    }
    agent.converge().await;
    clock.advance(Duration::seconds(40));
    // Two minimum charges of 60 points: 20 more than the grant.
    pass().await;
    pass().await;
    let p = points(&s).await;
    assert_eq!(
        (p.balance.as_str(), p.owed.as_str()),
        ("-20", "20"),
        "{p:?}"
    );
    assert_eq!(p.exhausted_since, Some(t0 + Duration::seconds(40)));
    let mut kinds: Vec<&str> = p.alerts.iter().map(|a| a.kind.as_str()).collect();
    kinds.sort();
    assert_eq!(kinds, ["exhausted", "spent-100", "spent-80"], "each once");
    agent.converge().await;
    let spot = s.admin.vm("lab", "vm-spot").await.unwrap();
    assert_eq!(spot.state, VmState::Stopped, "spot stops at once");
    let events = crate::harness::events_of(&s, "lab", &spot).await;
    assert!(events.iter().any(|e| e == "stop-requested"), "{events:?}");
    let gua = s.admin.vm("lab", "vm-gua").await.unwrap();
    assert_eq!(gua.state, VmState::Running, "guaranteed has its grace");
    for e in [
        s.admin
            .post::<_, Vm>(
                "/api/v1/tenants/lab/vms",
                &json!({"name": "vm-new", "vcpus": 1, "memory_gib": 1}),
            )
            .await
            .unwrap_err(),
        s.admin
            .vm_action("lab", "vm-spot", "start")
            .await
            .unwrap_err(),
    ] {
        assert_eq!(e.status(), Some(402), "{e}");
        assert_eq!(e.problem().unwrap().kind, "/problems/points-exhausted");
    }

    // An admin keeps the guaranteed VM up past the 24 h grace.
    let until = t0 + Duration::hours(30);
    let _: Points = s
        .admin
        .put("/api/v1/tenants/lab/points/grace", &json!({"until": until}))
        .await
        .unwrap();
    clock.advance(Duration::hours(25));
    pass().await;
    agent.converge().await;
    let gua = s.admin.vm("lab", "vm-gua").await.unwrap();
    assert_eq!(gua.state, VmState::Running, "extended");
    clock.advance(Duration::hours(5));
    pass().await;
    agent.converge().await;
    let gua = s.admin.vm("lab", "vm-gua").await.unwrap();
    assert_eq!(gua.state, VmState::Stopped, "grace over");

    // A grant pays what is owed and lifts the limits.
    let owed = d(&points(&s).await.owed);
    grant("1000000").await;
    pass().await;
    let p = points(&s).await;
    assert_eq!(d(&p.balance), d("1000100") - d(&p.charged), "{p:?}");
    assert!(d(&p.owed).is_zero() && owed > d("0"), "{owed} {p:?}");
    assert_eq!(p.exhausted_since, None);
    s.admin.vm_action("lab", "vm-spot", "start").await.unwrap();
    s.stop().await;
}

#[tokio::test]
async fn exhaustion_sqlite() {
    exhaustion(Backend::Sqlite).await;
}

#[tokio::test]
async fn exhaustion_postgres() {
    exhaustion(Backend::Postgres).await;
}

/// Every operation that starts or grows something chargeable checks the
/// budget: a tenant never granted points starts nothing priced (VMs,
/// public addresses, egress, volumes), only what is free; once granted it
/// may; out of points, nothing is started or grown (a volume's growth, a
/// snapshot, an address, egress switched on).
async fn everything_chargeable_is_budgeted(backend: Backend) {
    let t0 = Utc.with_ymd_and_hms(2026, 11, 10, 9, 0, 0).unwrap();
    let clock = Clock::manual(t0);
    let s = TestServer::start_with(backend, |c| c.clock = clock.clone()).await;
    let state = &s.server.state;
    let pass = || async {
        kumo_server::app::metering::post_due(state).await.unwrap();
        kumo_server::app::budget::enforce(state).await.unwrap();
    };
    let p = |price: &str| json!({"guaranteed": price, "spot": price});
    let _: Rates = s
        .admin
        .put(
            "/api/v1/rates",
            &json!({"prices": {"vcpu": p("3600"), "public_ip": p("1"), "volume_gib": p("0.01"),
                               "snapshot_gib": p("0.01")}}),
        )
        .await
        .unwrap();
    let _: kumo_api_types::PublicIpPool = s
        .admin
        .post(
            "/api/v1/public-ip-pools",
            &json!({"name": "dev", "cidr": "203.0.113.0/24", "gateway": "203.0.113.1",
                    "range": "203.0.113.10-203.0.113.99"}),
        )
        .await
        .unwrap();
    s.tenant("lab").await;
    let mut agent = s.sim_agent("cpu-1", "cpu-only").await;
    let refused = |e: kumo_cli::client::ClientError, what: &str| {
        assert_eq!(e.status(), Some(402), "{what}: {e}");
        assert_eq!(
            e.problem().unwrap().kind,
            "/problems/points-exhausted",
            "{what}"
        );
    };
    let vm = |name: &str| json!({"name": name, "vcpus": 1, "memory_gib": 1});
    let seg = |name: &str, cidr: &str, egress: bool| json!({"name": name, "kind": "ethernet", "cidr": cidr, "egress": egress});
    let post = async |path: &str, body: serde_json::Value| {
        s.admin
            .post::<_, serde_json::Value>(&format!("/api/v1/tenants/lab/{path}"), &body)
            .await
    };

    // Never granted points: a quota alone starts nothing priced.
    refused(post("vms", vm("vm-a")).await.unwrap_err(), "a VM");
    refused(
        post("public-ips", json!({})).await.unwrap_err(),
        "an address",
    );
    refused(
        post("volumes", json!({"name": "data", "size_gib": 10}))
            .await
            .unwrap_err(),
        "a volume",
    );
    refused(
        post("segments", seg("out", "10.8.0.0/24", true))
            .await
            .unwrap_err(),
        "egress",
    );
    post("segments", seg("lan", "10.9.0.0/24", false))
        .await
        .expect("a segment without egress is free");

    // Granted: all of it may start.
    let _: kumo_api_types::PointGrant = s
        .admin
        .post(
            "/api/v1/tenants/lab/points/grants",
            &json!({"amount": "50", "expires_at": t0 + Duration::days(300)}),
        )
        .await
        .unwrap();
    post("vms", vm("vm-a")).await.unwrap();
    post("volumes", json!({"name": "data", "size_gib": 10}))
        .await
        .unwrap();
    agent.converge().await;

    // Spent (the VM's first minute is 60 points): nothing more starts or
    // grows.
    clock.advance(Duration::seconds(40));
    pass().await;
    pass().await;
    assert!(points(&s).await.exhausted_since.is_some());
    refused(post("vms", vm("vm-b")).await.unwrap_err(), "a VM");
    refused(
        post("public-ips", json!({})).await.unwrap_err(),
        "an address",
    );
    refused(
        post("volumes", json!({"name": "more", "size_gib": 10}))
            .await
            .unwrap_err(),
        "a volume",
    );
    refused(
        post("volumes/data/snapshots", json!({"name": "snap"}))
            .await
            .unwrap_err(),
        "a snapshot",
    );
    let e = s
        .admin
        .post::<_, serde_json::Value>(
            "/api/v1/tenants/lab/volumes/data/resize",
            &json!({"size_gib": 20}),
        )
        .await
        .unwrap_err();
    refused(e, "a volume's growth");
    let e = s
        .admin
        .patch::<_, serde_json::Value>("/api/v1/tenants/lab/segments/lan", &json!({"egress": true}))
        .await
        .unwrap_err();
    refused(e, "egress switched on");
    s.stop().await;
}

#[tokio::test]
async fn everything_chargeable_is_budgeted_sqlite() {
    everything_chargeable_is_budgeted(Backend::Sqlite).await;
}

#[tokio::test]
async fn everything_chargeable_is_budgeted_postgres() {
    everything_chargeable_is_budgeted(Backend::Postgres).await;
}

/// A card set for later applies from its time: the run's seconds before
/// it keep the old price, those after pay the new one.
#[tokio::test]
async fn a_rate_change_mid_run_applies_from_its_time() {
    let t0 = Utc.with_ymd_and_hms(2026, 11, 10, 9, 0, 0).unwrap();
    let clock = Clock::manual(t0);
    let s = TestServer::start_with(Backend::Sqlite, |c| c.clock = clock.clone()).await;
    let card = |at: chrono::DateTime<Utc>, vcpu: &str| json!({"effective_from": at, "prices": {"vcpu": {"guaranteed": vcpu, "spot": "1"}}});
    let _: Rates = s
        .admin
        .put("/api/v1/rates", &card(t0, "3600"))
        .await
        .unwrap();
    s.tenant("lab").await;
    grant_plenty(&s.admin, "lab", t0).await;
    let mut agent = s.sim_agent("cpu-1", "cpu-only").await;
    let _: Vm = s
        .admin
        .post(
            "/api/v1/tenants/lab/vms",
            &json!({"name": "vm-a", "vcpus": 1, "memory_gib": 1}),
        )
        .await
        .unwrap();
    agent.converge().await;
    let _: Rates = s
        .admin
        .put("/api/v1/rates", &card(t0 + Duration::seconds(90), "7200"))
        .await
        .unwrap();
    clock.advance(Duration::minutes(3));
    kumo_server::app::metering::post_due(&s.server.state)
        .await
        .unwrap();
    let st = month(&s, "2026-11").await;
    let vcpu: Vec<(i64, String, String)> = st
        .lines
        .iter()
        .filter(|l| l.resource == "vcpu")
        .map(|l| (l.seconds, l.rate_per_hour.clone(), l.amount.clone()))
        .collect();
    assert_eq!(
        vcpu,
        [
            (90, "3600".into(), "90".into()),
            (90, "7200".into(), "180".into())
        ]
    );
    s.stop().await;
}

/// A server stopped and started again in the middle of a VM's run (same
/// database, same clock) charges exactly what one that ran throughout does.
#[tokio::test]
async fn a_restart_mid_period_changes_no_total() {
    let t0 = Utc.with_ymd_and_hms(2026, 11, 10, 9, 0, 0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = kumo_server::config::Config::for_data_dir(dir.path(), None);
    config.clock = Clock::manual(t0);
    let clock = config.clock.clone();
    let server = kumo_server::RunningServer::start(config.clone())
        .await
        .unwrap();
    let token = std::fs::read_to_string(dir.path().join("admin-token"))
        .unwrap()
        .trim()
        .to_owned();
    let admin = kumo_cli::Client::new(&server.url(), Some(token.clone())).unwrap();
    let _: Rates = admin
        .put(
            "/api/v1/rates",
            &json!({"prices": {"vcpu": {"guaranteed": "3600", "spot": "1"}}}),
        )
        .await
        .unwrap();
    admin
        .create_tenant(&kumo_api_types::TenantCreate {
            name: "lab".into(),
            display_name: None,
            description: None,
        })
        .await
        .unwrap();
    admin
        .set_quota(
            "lab",
            &kumo_api_types::Quota {
                vcpus: 8,
                memory_gib: 8,
                vms: 2,
                disk_gib: 200,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    grant_plenty(&admin, "lab", t0).await;
    let join: kumo_api_types::JoinTokenCreated = admin
        .post("/api/v1/hosts/join-tokens", &json!({}))
        .await
        .unwrap();
    let mut agent = crate::harness::SimAgent::register(
        &server.url(),
        &join.token,
        "cpu-1",
        crate::harness::fixture_topology("cpu-only"),
    )
    .await;
    let _: Vm = admin
        .post(
            "/api/v1/tenants/lab/vms",
            &json!({"name": "vm-a", "vcpus": 2, "memory_gib": 1}),
        )
        .await
        .unwrap();
    agent.converge().await;
    clock.advance(Duration::seconds(100));
    kumo_server::app::metering::post_due(&server.state)
        .await
        .unwrap();
    server.stop().await.unwrap();

    let server = kumo_server::RunningServer::start(config).await.unwrap();
    clock.advance(Duration::seconds(200));
    kumo_server::app::metering::post_due(&server.state)
        .await
        .unwrap();
    kumo_server::app::metering::post_due(&server.state)
        .await
        .unwrap();
    let admin = kumo_cli::Client::new(&server.url(), Some(token)).unwrap();
    let p: Points = admin.get("/api/v1/tenants/lab/points").await.unwrap();
    // 300 s of 2 vCPUs at 1 point per vCPU-second, complete minutes only.
    assert_eq!(d(&p.charged), d("600"), "{p:?}");
    server.stop().await.unwrap();
}

/// A public address is charged per hour from its allocation to its
/// release, as the address (rate class `public_ip`).
#[tokio::test]
async fn public_addresses_are_charged_while_held() {
    let t0 = Utc.with_ymd_and_hms(2026, 11, 10, 9, 0, 0).unwrap();
    let clock = Clock::manual(t0);
    let s = TestServer::start_with(Backend::Sqlite, |c| c.clock = clock.clone()).await;
    let _: Rates = s
        .admin
        .put(
            "/api/v1/rates",
            &json!({"effective_from": t0, "prices": {"public_ip": {"guaranteed": "36", "spot": "36"}}}),
        )
        .await
        .unwrap();
    s.tenant("lab").await;
    grant_plenty(&s.admin, "lab", t0).await;
    let _: kumo_api_types::PublicIpPool = s
        .admin
        .post(
            "/api/v1/public-ip-pools",
            &json!({"name": "dev", "cidr": "203.0.113.0/24", "gateway": "203.0.113.1"}),
        )
        .await
        .unwrap();
    let ip: kumo_api_types::PublicIp = s
        .admin
        .post("/api/v1/tenants/lab/public-ips", &json!({}))
        .await
        .unwrap();
    clock.advance(Duration::minutes(10));
    s.admin
        .delete(&format!("/api/v1/tenants/lab/public-ips/{}", ip.address))
        .await
        .unwrap();
    clock.advance(Duration::minutes(10));
    kumo_server::app::metering::post_due(&s.server.state)
        .await
        .unwrap();
    let st = month(&s, "2026-11").await;
    let held: Vec<(String, i64, String)> = st
        .lines
        .iter()
        .filter(|l| l.resource == "public_ip")
        .map(|l| (l.vm.clone(), l.seconds, l.amount.clone()))
        .collect();
    // 600 s at 36 points an hour: 6 points, and nothing after the release.
    assert_eq!(held, [(ip.address.clone(), 600, "6".into())]);
    s.stop().await;
}

/// Rows of a tenant's ledger.
async fn ledger_rows(s: &TestServer) -> Vec<kumo_server::entity::charges::Model> {
    use sea_orm::{EntityTrait, QueryOrder};
    kumo_server::entity::charges::Entity::find()
        .order_by_asc(kumo_server::entity::charges::Column::PeriodFrom)
        .all(&s.server.state.db)
        .await
        .unwrap()
}

/// What a tenant reads of its charges: both months' statements, usage by
/// day and the points.
async fn readings(s: &TestServer) -> (Statement, Statement, kumo_api_types::Usage, Points) {
    let by_day: kumo_api_types::Usage = s
        .admin
        .get("/api/v1/tenants/lab/usage?group_by=day&from=2026-11-01T00:00:00Z&to=2026-12-31T00:00:00Z")
        .await
        .unwrap();
    let mut p = points(s).await;
    p.ledger.clear(); // the rows themselves differ; what they add up to may not
    (
        month(s, "2026-11").await,
        month(s, "2026-12").await,
        by_day,
        p,
    )
}

/// A VM run for three hours across midnight and a month's end, posted
/// every minute: the ledger holds an entry per run from each cut (a grant
/// expiring, the day) — nine rows where the minute rating posted 540 —
/// and a ledger an older release kept a row per piece compacts into the
/// same rows, every reading unchanged to the point.
async fn the_ledger_grows_with_changes(backend: Backend) {
    let t0 = Utc.with_ymd_and_hms(2026, 11, 30, 22, 0, 0).unwrap();
    let clock = Clock::manual(t0);
    let s = TestServer::start_with(backend, |c| c.clock = clock.clone()).await;
    let _: Rates = s
        .admin
        .put(
            "/api/v1/rates",
            &json!({"prices": {
                "vcpu": {"guaranteed": "0.77", "spot": "0.1"},
                "memory_gib": {"guaranteed": "0.13", "spot": "0.1"},
                "disk_gib": {"guaranteed": "0.001", "spot": "0.001"},
            }}),
        )
        .await
        .unwrap();
    s.tenant("lab").await;
    grant_plenty(&s.admin, "lab", t0).await;
    let _: kumo_api_types::PointGrant = s
        .admin
        .post(
            "/api/v1/tenants/lab/points/grants",
            &json!({"amount": "7", "expires_at": t0 + Duration::seconds(90 * 60 + 30)}),
        )
        .await
        .unwrap();
    let mut agent = s.sim_agent("cpu-1", "cpu-only").await;
    let _: Vm = s
        .admin
        .post(
            "/api/v1/tenants/lab/vms",
            &json!({"name": "vm-a", "vcpus": 3, "memory_gib": 5, "disk_gib": 10}),
        )
        .await
        .unwrap();
    agent.converge().await;
    let mut pieces = 0;
    for _ in 0..180 {
        clock.advance(Duration::minutes(1));
        pieces += kumo_server::app::metering::post_due(&s.server.state)
            .await
            .unwrap();
    }
    assert_eq!(pieces, 3 * 180, "three runs, a piece a minute");
    let rows = ledger_rows(&s).await;
    let cuts: std::collections::BTreeSet<String> = rows
        .iter()
        .map(|r| r.period_from.format("%m-%d %H:%M").to_string())
        .collect();
    assert_eq!(
        cuts.into_iter().collect::<Vec<_>>(),
        ["11-30 22:00", "11-30 23:30", "12-01 00:00"],
        "cut where the 7-point grant expired (between the postings of 23:30 and 23:31) and at midnight"
    );
    assert_eq!(rows.len(), 9, "{rows:#?}");
    let before = readings(&s).await;
    assert!(d(&before.3.charged) > d("7"));
    let seconds: i64 = before.2.rows.iter().map(|r| r.seconds).sum();
    assert_eq!(seconds, 3 * 180 * 60);

    // The ledger an older release kept: a row per piece, each posted
    // the minute it ended (the postings above were at whole minutes).
    use sea_orm::EntityTrait;
    let db = &s.server.state.db;
    kumo_server::entity::charges::Entity::delete_many()
        .exec(db)
        .await
        .unwrap();
    let book = kumo_server::app::metering::rate_book(db).await.unwrap();
    let mut old = Vec::new();
    for r in kumo_server::entity::meter_runs::Entity::find()
        .all(db)
        .await
        .unwrap()
    {
        let run = kumo_server::app::metering::run_of(&r).unwrap();
        for p in kumo_billing::meter::due(&run, None, clock.now(), &book) {
            old.push(kumo_server::app::metering::charge_row(
                &r,
                &kumo_billing::ledger::Entry {
                    from: p.from,
                    to: p.to,
                    seconds: p.seconds,
                    per_hour: p.per_hour,
                    amount: p.amount,
                    posted_at: p.to,
                },
            ));
        }
    }
    for chunk in old.chunks(200) {
        kumo_server::entity::charges::Entity::insert_many(chunk.to_vec())
            .exec(db)
            .await
            .unwrap();
    }
    assert_eq!(ledger_rows(&s).await.len(), 540);
    assert_eq!(readings(&s).await, before, "the old rows read the same");
    let removed = kumo_server::app::metering::compact_ledger(&s.server.state)
        .await
        .unwrap();
    let rows = ledger_rows(&s).await;
    // Each run's last row is left for the poster to grow: 2 per run more.
    assert_eq!((removed, rows.len()), (540 - 12, 12), "{rows:#?}");
    assert_eq!(
        readings(&s).await,
        before,
        "compacted, every reading is the same"
    );
    assert_eq!(
        kumo_server::app::metering::compact_ledger(&s.server.state)
            .await
            .unwrap(),
        0,
        "compacting again changes nothing"
    );
    // And the poster grows the compacted ledger's last rows on.
    clock.advance(Duration::minutes(1));
    kumo_server::app::metering::post_due(&s.server.state)
        .await
        .unwrap();
    assert_eq!(ledger_rows(&s).await.len(), 12);
    s.stop().await;
}

#[tokio::test]
async fn the_ledger_grows_with_changes_sqlite() {
    the_ledger_grows_with_changes(Backend::Sqlite).await;
}

#[tokio::test]
async fn the_ledger_grows_with_changes_postgres() {
    the_ledger_grows_with_changes(Backend::Postgres).await;
}
