//! Reservations behind the API, on an injected clock: whole hosts held
//! before the start with their spot VMs reclaimed, the reservation's VMs
//! placed there (and only there) from the start, nothing else let in,
//! the held GPUs charged from start to end, and the end policy applied.

use chrono::{Duration, TimeZone, Utc};
use kumo_api_types::{
    Reservation, ReservationState, ServiceLevel, Statement, Vm, VmCreate, VmState,
};
use kumo_server::clock::Clock;
use serde_json::json;

use crate::harness::{Backend, TestServer};

const H100: &str = "H100-SXM5-80GB";

fn vm(name: &str, gpus: u32, level: ServiceLevel, reservation: Option<&str>) -> VmCreate {
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
        reservation: reservation.map(str::to_owned),
    }
}

async fn get_vm(s: &TestServer, tenant: &str, name: &str) -> Vm {
    s.admin
        .get(&format!("/api/v1/tenants/{tenant}/vms/{name}"))
        .await
        .unwrap()
}

async fn reservation(s: &TestServer) -> Reservation {
    s.admin
        .get("/api/v1/tenants/lab/reservations/week")
        .await
        .unwrap()
}

async fn december(s: &TestServer) -> Statement {
    s.admin
        .get("/api/v1/tenants/lab/statements/2026-12")
        .await
        .unwrap()
}

fn d(s: &str) -> kumo_billing::Decimal {
    s.parse().unwrap()
}

async fn reservations_hold_hosts_reclaim_spot_vms_and_charge(backend: Backend) {
    let t0 = Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap();
    let clock = Clock::manual(t0);
    let s = TestServer::start_with(backend, |c| {
        c.clock = clock.clone();
        c.preemption_grace = std::time::Duration::from_secs(30);
    })
    .await;
    let st = &s.server.state;
    let pass = || kumo_server::app::jobs::reclaimer::pass(st);
    let _: serde_json::Value = s
        .admin
        .put(
            "/api/v1/rates",
            &json!({"prices": {format!("reserved_gpu:{H100}"): {"guaranteed": "60", "spot": "60"}}}),
        )
        .await
        .unwrap();
    for t in ["lab", "other"] {
        s.tenant(t).await;
        let _: serde_json::Value = s
            .admin
            .post(
                &format!("/api/v1/tenants/{t}/points/grants"),
                &json!({"amount": "100000", "expires_at": t0 + Duration::days(60), "note": "test"}),
            )
            .await
            .unwrap();
    }
    let mut a = s.sim_agent("gpu-1", "hgx-h100").await;
    let mut b = s.sim_agent("gpu-2", "hgx-h100").await;
    // gpu-1: one spot VM on all 8 GPUs; gpu-2: two spot VMs on 4 each.
    let post = |body: VmCreate, tenant: &'static str| {
        let c = s.admin.clone();
        async move {
            c.post::<_, Vm>(&format!("/api/v1/tenants/{tenant}/vms"), &body)
                .await
        }
    };
    let big = post(vm("big", 8, ServiceLevel::Spot, None), "other")
        .await
        .unwrap();
    assert_eq!(big.host.as_deref(), Some("gpu-1"));
    for i in 0..2 {
        let v = post(
            vm(&format!("small-{i}"), 4, ServiceLevel::Spot, None),
            "other",
        )
        .await
        .unwrap();
        assert_eq!(v.host.as_deref(), Some("gpu-2"));
    }
    a.converge().await;
    b.converge().await;

    // Promises: no more than the GPUs in service, and owners only within
    // their share.
    let (from, to) = (t0 + Duration::hours(2), t0 + Duration::hours(4));
    let ask = |gpus: u32| {
        json!({"name": "week", "gpus": gpus, "gpu_model": H100, "starts_at": from,
               "ends_at": to, "end_policy": "stop"})
    };
    let e = s
        .admin
        .post::<_, Reservation>("/api/v1/tenants/lab/reservations", &ask(24))
        .await
        .unwrap_err();
    assert_eq!(
        e.problem().unwrap().kind,
        "/problems/insufficient-capacity",
        "{e:?}"
    );
    // Whole hosts are held, and charged: 8-GPU hosts are reserved by 8s.
    let e = s
        .admin
        .post::<_, Reservation>("/api/v1/tenants/lab/reservations", &ask(4))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(400), "{e:?}");
    let (owner, _) = s.user("olive").await;
    s.add("lab", "olive", kumo_api_types::Role::Owner).await;
    let e = owner
        .post::<_, Reservation>("/api/v1/tenants/lab/reservations", &ask(8))
        .await
        .unwrap_err();
    assert_eq!(
        e.problem().unwrap().kind,
        "/problems/quota-exceeded",
        "{e:?}"
    );
    let (member, _) = s.user("mo").await;
    s.add("other", "mo", kumo_api_types::Role::Member).await;
    let e = member
        .post::<_, Reservation>("/api/v1/tenants/other/reservations", &ask(8))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(403), "members do not reserve");
    let r: Reservation = s
        .admin
        .post("/api/v1/tenants/lab/reservations", &ask(8))
        .await
        .unwrap();
    assert_eq!(r.state, ReservationState::Scheduled);
    // Another 16 overlapping the first's window would promise 24 of 16.
    let e = s
        .admin
        .post::<_, Reservation>(
            "/api/v1/tenants/other/reservations",
            &json!({"name": "xmas", "gpus": 16, "gpu_model": H100, "starts_at": from + Duration::hours(1),
                    "ends_at": to + Duration::hours(1)}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.problem().unwrap().kind, "/problems/insufficient-capacity");

    // Long before the start nothing is held and nothing reclaimed.
    pass().await.unwrap();
    assert!(st.capacity.lock().reserved().is_empty());
    assert_eq!(get_vm(&s, "other", "big").await.state, VmState::Running);
    let e = post(
        vm("early", 8, ServiceLevel::Guaranteed, Some("week")),
        "lab",
    )
    .await
    .unwrap_err();
    assert_eq!(e.status(), Some(409), "not active yet: {e:?}");

    // Its lead before the start (the longest notice, 30 min, and a
    // minute): the host with the fewest VMs to move is held, its spot VM
    // has notice, the other host's are untouched.
    clock.advance(Duration::hours(2) - Duration::minutes(31));
    pass().await.unwrap();
    let r = reservation(&s).await;
    assert_eq!(r.state, ReservationState::Preparing);
    assert_eq!((r.held_gpus, r.used_gpus, r.short.as_deref()), (8, 0, None));
    let big = get_vm(&s, "other", "big").await;
    assert_eq!(big.state, VmState::Preempting);
    assert_eq!(
        big.preempt_deadline,
        Some(clock.now() + Duration::seconds(30))
    );
    for i in 0..2 {
        assert_eq!(
            get_vm(&s, "other", &format!("small-{i}")).await.state,
            VmState::Running
        );
    }
    // After the grace the spot VM is gone, and the empty host takes
    // nothing that does not name the reservation.
    clock.advance(Duration::seconds(31));
    pass().await.unwrap();
    a.converge().await;
    assert_eq!(get_vm(&s, "other", "big").await.state, VmState::Preempted);
    s.refresh_capacity().await;
    let e = post(vm("sneak", 1, ServiceLevel::Spot, None), "other")
        .await
        .unwrap_err();
    assert_eq!(
        e.problem().unwrap().kind,
        "/problems/insufficient-capacity",
        "gpu-1 is empty but held: {e:?}"
    );

    // From the start its VMs go there, within its GPUs, for its tenant.
    clock.advance(Duration::minutes(31));
    pass().await.unwrap();
    assert_eq!(reservation(&s).await.state, ReservationState::Active);
    let train = post(
        vm("train", 8, ServiceLevel::Guaranteed, Some("week")),
        "lab",
    )
    .await
    .unwrap();
    assert_eq!(train.host.as_deref(), Some("gpu-1"));
    assert_eq!(train.spec.reservation, Some(r.id));
    let e = post(vm("more", 1, ServiceLevel::Guaranteed, Some("week")), "lab")
        .await
        .unwrap_err();
    assert_eq!(
        e.status(),
        Some(409),
        "the reservation's 8 GPUs are used: {e:?}"
    );
    let e = post(
        vm("theirs", 1, ServiceLevel::Guaranteed, Some("week")),
        "other",
    )
    .await
    .unwrap_err();
    assert_eq!(
        e.status(),
        Some(400),
        "another tenant's reservation is not there: {e:?}"
    );
    let e = post(vm("spotty", 1, ServiceLevel::Spot, Some("week")), "lab")
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(400), "a reservation's VMs are guaranteed");
    a.converge().await;
    assert_eq!(get_vm(&s, "lab", "train").await.state, VmState::Running);
    let r = reservation(&s).await;
    assert_eq!((r.held_gpus, r.used_gpus), (8, 8));

    // Charged for the held GPUs from the start: 8 GPUs × 60/h.
    clock.advance(Duration::hours(1));
    kumo_server::app::metering::post_due(st).await.unwrap();
    let line = |st: &Statement| {
        st.lines
            .iter()
            .find(|l| l.vm == "week" && l.resource == format!("reserved_gpu:{H100}"))
            .map(|l| (l.seconds, d(&l.amount)))
    };
    let dec = december(&s).await;
    assert_eq!(line(&dec), Some((3600, d("480"))), "{dec:?}");

    // At its end: hosts let go, the charge closed at the end, its VM
    // stopped (the reservation's policy) and ordinary again.
    clock.advance(Duration::hours(1) + Duration::minutes(5));
    pass().await.unwrap();
    let r = reservation(&s).await;
    assert_eq!(r.state, ReservationState::Ended);
    assert_eq!(r.ended_at, Some(to));
    assert!(st.capacity.lock().reserved().is_empty());
    a.converge().await;
    let train = get_vm(&s, "lab", "train").await;
    assert_eq!(train.spec.reservation, None);
    assert_eq!(
        train.state,
        VmState::Stopped,
        "stopped at the end (its policy)"
    );
    kumo_server::app::metering::post_due(st).await.unwrap();
    let dec = december(&s).await;
    assert_eq!(
        line(&dec),
        Some((7200, d("960"))),
        "charged to its end, not after: {dec:?}"
    );
    // One cancelled while active: its hosts let go at once, charged from
    // its start to the cancel.
    let now = clock.now();
    let _: Reservation = s
        .admin
        .post(
            "/api/v1/tenants/lab/reservations",
            &json!({"name": "again", "gpus": 8, "gpu_model": H100, "starts_at": now,
                    "ends_at": now + Duration::hours(1)}),
        )
        .await
        .unwrap();
    pass().await.unwrap();
    let again: Reservation = s
        .admin
        .get("/api/v1/tenants/lab/reservations/again")
        .await
        .unwrap();
    assert_eq!(
        (again.state, again.held_gpus),
        (ReservationState::Active, 8)
    );
    assert_eq!(st.capacity.lock().reserved().len(), 1);
    clock.advance(Duration::minutes(10));
    s.admin
        .delete("/api/v1/tenants/lab/reservations/again")
        .await
        .unwrap();
    let again: Reservation = s
        .admin
        .get("/api/v1/tenants/lab/reservations/again")
        .await
        .unwrap();
    assert_eq!(
        (again.state, again.ended_at),
        (ReservationState::Ended, Some(clock.now()))
    );
    assert!(st.capacity.lock().reserved().is_empty());
    kumo_server::app::metering::post_due(st).await.unwrap();
    let dec = december(&s).await;
    let again_line = dec
        .lines
        .iter()
        .find(|l| l.vm == "again")
        .map(|l| (l.seconds, d(&l.amount)));
    assert_eq!(again_line, Some((600, d("80"))), "{dec:?}");
    // One cancelled after its hosts were held but before its start pays
    // for the time they were held.
    let now = clock.now();
    let _: Reservation = s
        .admin
        .post(
            "/api/v1/tenants/lab/reservations",
            &json!({"name": "soon", "gpus": 8, "gpu_model": H100,
                    "starts_at": now + Duration::minutes(10), "ends_at": now + Duration::hours(1)}),
        )
        .await
        .unwrap();
    pass().await.unwrap();
    let soon: Reservation = s
        .admin
        .get("/api/v1/tenants/lab/reservations/soon")
        .await
        .unwrap();
    assert_eq!(
        (soon.state, soon.held_gpus),
        (ReservationState::Preparing, 8)
    );
    clock.advance(Duration::minutes(5));
    s.admin
        .delete("/api/v1/tenants/lab/reservations/soon")
        .await
        .unwrap();
    kumo_server::app::metering::post_due(st).await.unwrap();
    let dec = december(&s).await;
    let soon_line = dec
        .lines
        .iter()
        .find(|l| l.vm == "soon")
        .map(|l| (l.seconds, d(&l.amount)));
    assert_eq!(soon_line, Some((300, d("40"))), "{dec:?}");
    // An ended reservation is forgotten when deleted; its name is free.
    s.admin
        .delete("/api/v1/tenants/lab/reservations/week")
        .await
        .unwrap();
    let left: kumo_api_types::Page<Reservation> = s
        .admin
        .get("/api/v1/tenants/lab/reservations")
        .await
        .unwrap();
    let names: Vec<&str> = left.items.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["again", "soon"]);
    s.stop().await;
}

#[tokio::test]
async fn reservations_hold_hosts_reclaim_spot_vms_and_charge_sqlite() {
    reservations_hold_hosts_reclaim_spot_vms_and_charge(Backend::Sqlite).await;
}

#[tokio::test]
async fn reservations_hold_hosts_reclaim_spot_vms_and_charge_postgres() {
    reservations_hold_hosts_reclaim_spot_vms_and_charge(Backend::Postgres).await;
}
