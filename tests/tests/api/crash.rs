//! Crash safety: a real `kumo-server` process, killed with SIGKILL at
//! random moments and started again on the same database, while clients
//! churn VMs and clusters (create, stop, start, delete; spot VMs reclaimed
//! when guaranteed ones need their GPUs) and simulated hosts keep
//! reconciling. Afterwards:
//! - every VM settles (nothing left scheduled, provisioning, deleting or
//!   preempting);
//! - every answer a client got with a 2xx is reflected: created VMs and
//!   clusters exist unless a 2xx deleted them, and 2xx-deleted ones are gone;
//! - no device is held twice, and every allocation belongs to a VM that
//!   is on that host and holds its devices;
//! - the points ledger is exactly the rating of every run up to where it
//!   was posted (no piece twice, none missing);
//! - deleting everything frees every device;
//! - with two replicas behind one address, nothing their background loops
//!   do happens twice.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kumo_api_types::{Vm, VmState};
use rand::Rng;
use sea_orm::{
    ConnectionTrait, Database, DatabaseConnection, EntityTrait, Statement, TransactionTrait,
};
use serde_json::{json, Value};
use tokio::sync::Mutex;

use crate::harness::{bin, fresh_pg_url, Backend, SimAgent};

/// One replica: a `kumo-server serve` process on its own port.
struct Server {
    child: Option<Child>,
    args: Vec<String>,
    url: String,
}

/// One address for several replicas: each connection goes to the next
/// replica that accepts it, as a load balancer would.
async fn balancer(backends: Vec<u16>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut next = 0usize;
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                continue;
            };
            next += 1;
            let order: Vec<u16> = (0..backends.len())
                .map(|i| backends[(next + i) % backends.len()])
                .collect();
            tokio::spawn(async move {
                for b in order {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(("127.0.0.1", b)).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                        return;
                    }
                }
            });
        }
    });
    port
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Server {
    fn spawn(&mut self) {
        let child = Command::new(bin("kumo-server"))
            .arg("serve")
            .args(&self.args)
            .env("KUMO_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SIGKILL: no shutdown, no draining, mid-transaction.
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    async fn ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = reqwest::get(format!("{}/readyz", self.url)).await {
                if r.status().is_success() {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "the server did not come back");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What clients were told with a 2xx.
#[derive(Default)]
struct Told {
    created: BTreeSet<String>,
    deleted: BTreeSet<String>,
    /// Deletions whose answer a crash swallowed: they may have happened.
    maybe_deleted: BTreeSet<String>,
    clusters_created: BTreeSet<String>,
    clusters_deleted: BTreeSet<String>,
    /// Cluster deletions whose answer a crash swallowed.
    clusters_maybe_deleted: BTreeSet<String>,
    answers_2xx: u64,
    refused_4xx: u64,
    failed: u64,
}

async fn churn(
    client: usize,
    base: String,
    token: String,
    told: Arc<Mutex<Told>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let api = format!("{base}/api/v1/tenants/churn");
    let mut mine: Vec<String> = Vec::new();
    let mut clusters: Vec<String> = Vec::new();
    let mut n = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        n += 1;
        let roll = rand::thread_rng().gen_range(0..100);
        let (req, what) = if roll < 35 || mine.is_empty() {
            let name = format!("c{client}-{n}");
            let spot = rand::thread_rng().gen_bool(0.4);
            let gpus = rand::thread_rng().gen_range(1..=4);
            (
                http.post(format!("{api}/vms")).json(&json!({
                    "name": name, "gpus": gpus, "vcpus": 2, "memory_gib": 2,
                    "service_level": if spot { "spot" } else { "guaranteed" },
                })),
                ("create", name),
            )
        } else if roll < 45 {
            let name = format!("k{client}-{n}");
            (
                http.post(format!("{api}/clusters")).json(
                    &json!({"name": name, "size": 2, "gpus": 2, "vcpus": 2, "memory_gib": 2}),
                ),
                ("cluster-create", name),
            )
        } else if roll < 50 && !clusters.is_empty() {
            let name = clusters.swap_remove(rand::thread_rng().gen_range(0..clusters.len()));
            (
                http.delete(format!("{api}/clusters/{name}")),
                ("cluster-delete", name),
            )
        } else {
            let name = mine[rand::thread_rng().gen_range(0..mine.len())].clone();
            match roll % 3 {
                0 => (http.post(format!("{api}/vms/{name}/stop")), ("stop", name)),
                1 => (
                    http.post(format!("{api}/vms/{name}/start")),
                    ("start", name),
                ),
                _ => {
                    mine.retain(|m| *m != name);
                    (http.delete(format!("{api}/vms/{name}")), ("delete", name))
                }
            }
        };
        let r = req.bearer_auth(&token).send().await;
        let mut t = told.lock().await;
        match r {
            Ok(r) if r.status().is_success() => {
                t.answers_2xx += 1;
                match what.0 {
                    "create" => {
                        t.created.insert(what.1.clone());
                        mine.push(what.1);
                    }
                    "delete" => {
                        t.deleted.insert(what.1);
                    }
                    "cluster-create" => {
                        t.clusters_created.insert(what.1.clone());
                        clusters.push(what.1);
                    }
                    "cluster-delete" => {
                        t.clusters_deleted.insert(what.1);
                    }
                    _ => {}
                }
            }
            // Starting a running VM, a create over capacity, a tenant's
            // changes past its allowance (429): refused, fine. A refused
            // deletion leaves its VM or cluster there: the client keeps the
            // name and deletes it later, as a user would.
            Ok(r) if r.status().is_client_error() => {
                t.refused_4xx += 1;
                match what.0 {
                    "delete" => mine.push(what.1),
                    "cluster-delete" => clusters.push(what.1),
                    _ => {}
                }
            }
            // The server died under the request: its outcome is unknown,
            // and nothing is asserted of it but that it settles.
            // The client keeps the name either way, as a user would look
            // again: a VM or cluster made or kept unbeknown to it would
            // otherwise hold its GPUs for good, until every create is
            // refused for capacity and the churn stops (100 kills left
            // 131 answers 2xx of 6240, and "too little churn" on a loaded
            // machine).
            _ => {
                t.failed += 1;
                match what.0 {
                    "create" => mine.push(what.1),
                    "delete" => {
                        t.maybe_deleted.insert(what.1.clone());
                        mine.push(what.1);
                    }
                    "cluster-create" => clusters.push(what.1),
                    "cluster-delete" => {
                        t.clusters_maybe_deleted.insert(what.1.clone());
                        clusters.push(what.1);
                    }
                    _ => {}
                }
            }
        }
        drop(t);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn transitional(s: &VmState) -> bool {
    matches!(
        s,
        VmState::Scheduled | VmState::Provisioning | VmState::Deleting | VmState::Preempting
    )
}

async fn all_vms(http: &reqwest::Client, base: &str, token: &str) -> Vec<Vm> {
    let r = http
        .get(format!("{base}/api/v1/tenants/churn/vms?limit=500"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let page: kumo_api_types::Page<Vm> = r.json().await.unwrap();
    page.items
}

async fn rows(db: &DatabaseConnection, sql: &str) -> Vec<sea_orm::QueryResult> {
    db.query_all(Statement::from_string(
        db.get_database_backend(),
        sql.to_owned(),
    ))
    .await
    .unwrap()
}

async fn scenario(backend: Backend, kills: usize, replicas: usize) {
    let dir = crate::harness::scratch();
    let data = dir.path().join("data");
    // Charges posted every second, so crashes land amid posting too.
    let config = dir.path().join("kumo.toml");
    std::fs::write(&config, "[billing]\npost_interval_secs = 1\n").unwrap();
    let mut common = vec![
        "--config".to_owned(),
        config.display().to_string(),
        "--data-dir".to_owned(),
        data.display().to_string(),
    ];
    let db_url = match backend {
        Backend::Sqlite => format!("sqlite://{}?mode=rwc", data.join("kumo.db").display()),
        Backend::Postgres => {
            let (url, _) = fresh_pg_url().await;
            common.extend(["--database-url".to_owned(), url.clone()]);
            url
        }
    };
    let mut servers: Vec<Server> = Vec::new();
    for _ in 0..replicas {
        let port = free_port();
        let mut args = vec!["--listen".to_owned(), format!("127.0.0.1:{port}")];
        args.extend(common.iter().cloned());
        servers.push(Server {
            child: None,
            args,
            url: format!("http://127.0.0.1:{port}"),
        });
    }
    // The first bootstraps the database; the others join it.
    for s in servers.iter_mut() {
        s.spawn();
        s.ready().await;
    }
    let base = if replicas == 1 {
        servers[0].url.clone()
    } else {
        let ports = servers
            .iter()
            .map(|s| s.url.rsplit(':').next().unwrap().parse().unwrap())
            .collect();
        format!("http://127.0.0.1:{}", balancer(ports).await)
    };
    let token = std::fs::read_to_string(data.join("admin-token"))
        .unwrap()
        .trim()
        .to_owned();
    let admin = kumo_cli::Client::new(&base, Some(token.clone())).unwrap();
    let _: Value = admin
        .post("/api/v1/tenants", &json!({"name": "churn"}))
        .await
        .unwrap();
    let _: Value = admin
        .put(
            "/api/v1/tenants/churn/quota",
            &json!({"gpus": {"H100-SXM5-80GB": 1000}, "vcpus": 10000, "memory_gib": 10000, "vms": 1000, "disk_gib": 1000000}),
        )
        .await
        .unwrap();
    let _: Value = admin
        .put(
            "/api/v1/rates",
            &json!({"prices": {
                "gpu:H100-SXM5-80GB": {"guaranteed": "3600", "spot": "1200"},
                "vcpu": {"guaranteed": "10", "spot": "3"},
                "memory_gib": {"guaranteed": "1", "spot": "0.5"},
                "disk_gib": {"guaranteed": "0.01", "spot": "0.01"},
            }}),
        )
        .await
        .unwrap();
    let _: Value = admin
        .post(
            "/api/v1/tenants/churn/points/grants",
            &json!({"amount": "100000000", "expires_at": chrono::Utc::now() + chrono::Duration::days(30)}),
        )
        .await
        .unwrap();
    let join: kumo_api_types::JoinTokenCreated = admin
        .post("/api/v1/hosts/join-tokens", &json!({"uses": 3}))
        .await
        .unwrap();
    let mut agents = Vec::new();
    for h in 0..3 {
        agents.push(
            SimAgent::register(
                &base,
                &join.token,
                &format!("crash-{h}"),
                crate::harness::fixture_topology("hgx-h100"),
            )
            .await,
        );
    }
    // The hosts reconcile all along, through every crash.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_agents = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hosts = {
        let stop = stop_agents.clone();
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for a in agents.iter_mut() {
                    let _ = a.try_converge().await;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let told = Arc::new(Mutex::new(Told::default()));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            tokio::spawn(churn(
                c,
                base.clone(),
                token.clone(),
                told.clone(),
                stop.clone(),
            ))
        })
        .collect();
    for _ in 0..kills {
        let pause = rand::thread_rng().gen_range(200..1200);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let victim = rand::thread_rng().gen_range(0..servers.len());
        servers[victim].kill();
        servers[victim].spawn();
        servers[victim].ready().await;
    }
    // Enough churn to check, however slowly a loaded machine served it:
    // the clients go on (no more kills) until 50 answers were 2xx.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if told.lock().await.answers_2xx > 50 || Instant::now() > deadline {
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }

    // Everything settles.
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    let vms = loop {
        let vms = all_vms(&http, &base, &token).await;
        if vms.iter().all(|v| !transitional(&v.state)) {
            break vms;
        }
        assert!(
            Instant::now() < deadline,
            "VMs did not settle: {:?}",
            vms.iter()
                .filter(|v| transitional(&v.state))
                .map(|v| (&v.name, &v.state))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let told = std::mem::take(&mut *told.lock().await);
    assert!(
        told.answers_2xx > 50,
        "too little churn: {}",
        told.answers_2xx
    );
    assert!(told.failed > 0, "no request ever met a crash");
    let names: BTreeSet<&str> = vms.iter().map(|v| v.name.as_str()).collect();
    for c in told.created.difference(&told.deleted) {
        if told.maybe_deleted.contains(c) {
            continue;
        }
        assert!(
            names.contains(c.as_str()),
            "{c} was created (2xx) and is gone"
        );
    }
    for d in &told.deleted {
        if let Some(v) = vms.iter().find(|v| &v.name == d) {
            let events: Value = admin
                .get("/api/v1/tenants/churn/events?limit=500")
                .await
                .unwrap();
            let mine: Vec<&Value> = events["items"]
                .as_array()
                .map(|a| a.iter().filter(|e| e["vm_id"] == json!(v.id)).collect())
                .unwrap_or_default();
            panic!("{d} was deleted (2xx) and is still here: {v:?}\n{mine:#?}");
        }
    }
    let clusters: kumo_api_types::Page<kumo_api_types::Cluster> = admin
        .get("/api/v1/tenants/churn/clusters?limit=500")
        .await
        .unwrap();
    let cluster_names: BTreeSet<&str> = clusters.items.iter().map(|c| c.name.as_str()).collect();
    for c in told.clusters_created.difference(&told.clusters_deleted) {
        if told.clusters_maybe_deleted.contains(c) {
            continue; // its deletion may have happened before the crash
        }
        assert!(
            cluster_names.contains(c.as_str()),
            "cluster {c} was created (2xx) and is gone"
        );
    }
    for c in &told.clusters_deleted {
        if let Some(k) = clusters.items.iter().find(|k| &k.name == c) {
            assert!(
                k.members.iter().all(|m| m.state != VmState::Running),
                "cluster {c} was deleted (2xx) and still runs: {k:?}"
            );
        }
    }

    let db = Database::connect(&db_url).await.unwrap();
    // No device held twice.
    let twice = rows(
        &db,
        "SELECT host_id, kind, key FROM allocations GROUP BY host_id, kind, key HAVING COUNT(*) > 1",
    )
    .await;
    assert!(twice.is_empty(), "{} devices held twice", twice.len());
    // Every allocation belongs to a VM on that host that holds devices.
    let orphans = rows(
        &db,
        "SELECT a.vm_id FROM allocations a LEFT JOIN vms v ON v.id = a.vm_id \
         WHERE v.id IS NULL OR v.host_id IS NULL OR v.host_id <> a.host_id \
         OR v.state IN ('preempted', 'suspended', 'pending')",
    )
    .await;
    assert!(
        orphans.is_empty(),
        "{} allocations without a live VM",
        orphans.len()
    );
    // A placed, running VM holds its GPUs.
    let mut by_vm: BTreeMap<uuid::Uuid, i64> = BTreeMap::new();
    for a in kumo_server::entity::allocations::Entity::find()
        .all(&db)
        .await
        .unwrap()
        .iter()
        .filter(|a| a.kind == "gpu")
    {
        *by_vm.entry(a.vm_id).or_default() += 1;
    }
    for v in vms.iter().filter(|v| v.state == VmState::Running) {
        let held = by_vm.get(&v.id).copied().unwrap_or(0);
        assert_eq!(
            held,
            i64::from(v.spec.gpus),
            "{} runs on {held} GPUs",
            v.name
        );
    }

    // The ledger is the rating of every run, up to where it was posted.
    // The poster runs every second but a server killed often may not have
    // lived that long; it now serves undisturbed, so wait for it to post.
    let deadline = Instant::now() + Duration::from_secs(60);
    let checked = loop {
        let checked = ledger_checked(&db).await;
        if checked > 0 {
            break checked;
        }
        assert!(Instant::now() < deadline, "nothing was ever posted");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };

    // Deleting everything frees every device. A deletion past the
    // tenant's change allowance (429) is sent again, as a user would.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = all_vms(&http, &base, &token).await;
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "VMs were not deleted: {:?}",
            left.iter().map(|v| (&v.name, v.state)).collect::<Vec<_>>()
        );
        for v in left.iter().filter(|v| v.state != VmState::Deleting) {
            let _ = http
                .delete(format!("{base}/api/v1/tenants/churn/vms/{}", v.name))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let left = rows(&db, "SELECT vm_id FROM allocations").await;
    assert!(left.is_empty(), "{} allocations left", left.len());
    stop_agents.store(true, std::sync::atomic::Ordering::Relaxed);
    hosts.await.unwrap();
    eprintln!(
        "crash safety ({backend:?}, {replicas} replica(s)): {kills} kills; {} answers 2xx, {} refused, {} met a crash ({} of them VM and {} cluster deletions); {} VMs settled; {checked} runs' charges checked",
        told.answers_2xx,
        told.refused_4xx,
        told.failed,
        told.maybe_deleted.len(),
        told.clusters_maybe_deleted.len(),
        vms.len()
    );
    // What every replica's loops do at once happens once: no VM is
    // preempted or deleted twice.
    let twice = rows(
        &db,
        "SELECT vm_id, kind FROM vm_events WHERE kind IN ('preempted', 'deleted') \
         GROUP BY vm_id, kind HAVING COUNT(*) > 1",
    )
    .await;
    assert!(
        twice.is_empty(),
        "{} VMs preempted or deleted twice",
        twice.len()
    );
    db.close().await.unwrap();
    for s in servers.iter_mut() {
        s.kill();
    }
}

/// Checks that every run's charges are exactly its rating up to where it
/// was posted (its entries tile the rating's pieces, each their sum), and answers how many posted runs were checked. Runs and
/// charges are read in one snapshot: the poster keeps running meanwhile,
/// and a post between two plain reads would look like a missing or an
/// extra piece.
async fn ledger_checked(db: &DatabaseConnection) -> usize {
    let book = kumo_server::app::metering::rate_book(db).await.unwrap();
    let snapshot = db
        .begin_with_config(Some(sea_orm::IsolationLevel::RepeatableRead), None)
        .await
        .unwrap();
    let runs = kumo_server::entity::meter_runs::Entity::find()
        .all(&snapshot)
        .await
        .unwrap();
    let charges = kumo_server::entity::charges::Entity::find()
        .all(&snapshot)
        .await
        .unwrap();
    snapshot.commit().await.unwrap();
    let mut posted: BTreeMap<uuid::Uuid, Vec<&kumo_server::entity::charges::Model>> =
        BTreeMap::new();
    for c in &charges {
        posted.entry(c.run_id).or_default().push(c);
    }
    let mut checked = 0;
    for r in &runs {
        let mine = posted.remove(&r.id).unwrap_or_default();
        let Some(until) = r.posted_until else {
            assert!(mine.is_empty(), "charges of a run never posted");
            continue;
        };
        let run = kumo_server::app::metering::run_of(r).unwrap();
        let pieces = kumo_billing::meter::due(&run, None, until, &book);
        // The ledger keeps entries: consecutive pieces folded. They tile
        // the pieces exactly, each the sum of the pieces it covers.
        let mut got: Vec<_> = mine
            .iter()
            .map(|c| {
                (
                    c.period_from,
                    c.period_to,
                    c.seconds,
                    c.amount.parse::<kumo_billing::Decimal>().unwrap(),
                )
            })
            .collect();
        got.sort();
        let mut rest = pieces.iter().peekable();
        for (from, to, seconds, amount) in &got {
            let mut covered = (0i64, kumo_billing::Decimal::ZERO);
            assert_eq!(
                rest.peek().map(|p| p.from),
                Some(*from),
                "run {} ({}): an entry from {from} where the next piece starts elsewhere",
                r.id,
                r.vm_name
            );
            let mut last_to = None;
            while let Some(p) = rest.next_if(|p| p.to <= *to) {
                covered.0 += p.seconds;
                covered.1 += p.amount;
                last_to = Some(p.to);
            }
            assert_eq!(
                last_to,
                Some(*to),
                "run {}: entry [{from}, {to}) ends inside a piece",
                r.id
            );
            assert_eq!(
                covered,
                (*seconds, *amount),
                "run {} ({}): entry [{from}, {to})",
                r.id,
                r.vm_name
            );
        }
        assert_eq!(
            got.last().map(|e| e.1),
            Some(until),
            "run {}: the last entry ends where it is posted",
            r.id
        );
        assert!(
            rest.next().is_none(),
            "run {} ({}): pieces posted past its entries",
            r.id,
            r.vm_name
        );
        checked += 1;
    }
    assert!(posted.is_empty(), "charges without a run");
    checked
}

/// Kills per scenario: as given in the default run, five times as many in
/// the extended run (`./x test --extended` sets `KUMO_EXTENDED`).
fn rounds(default: usize) -> usize {
    if std::env::var_os("KUMO_EXTENDED").is_some() {
        default * 5
    } else {
        default
    }
}

/// 20 SIGKILLs (100 extended) on PostgreSQL, the production database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_under_churn_postgres() {
    scenario(Backend::Postgres, rounds(20), 1).await;
}

/// Fewer rounds on SQLite, the embedded default: 8 (40 extended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_under_churn_sqlite() {
    scenario(Backend::Sqlite, rounds(8), 1).await;
}

/// Two replicas on one PostgreSQL behind one address, each killed now and
/// then while the other serves: the reclaimer, the billing poster and the
/// lost-host detector run on both, and what they do happens once. 20 kills
/// (100 extended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_killed_under_churn_postgres() {
    scenario(Backend::Postgres, rounds(20), 2).await;
}
