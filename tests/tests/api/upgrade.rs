//! Upgrades. Every release checks in a small database written by its own
//! binaries (`scripts/write-upgrade-fixture.sh`: its migrations, its API, its
//! simulated fleet) under `tests/fixtures/upgrade/VERSION/`, on SQLite and as
//! a PostgreSQL dump. The current code must open every one of them and find
//! every row, and the migrations added since the previous release must be
//! expand-only, so that replicas of adjacent releases can serve from one
//! PostgreSQL database during a rolling upgrade.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kumo_api_types::{Segment, Tenant, User, Vm, VmState};
use kumo_migrations::MigratorTrait;
use kumo_server::config::Config;
use kumo_server::RunningServer;
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseBackend, DatabaseConnection, Statement,
    TransactionTrait,
};

use crate::harness::{pg_base_url, Backend};

/// What a fixture's writer made, by name (`expect.json`).
#[derive(serde::Deserialize, Debug)]
struct Expect {
    version: String,
    commit: String,
    tenants: Vec<String>,
    users: Vec<String>,
    segments: Vec<String>,
    vms: Vec<String>,
    deleted_vms: Vec<String>,
    stopped_vms: Vec<String>,
    /// Each migration's source as released (sha256): never edited after.
    migrations: BTreeMap<String, String>,
}

struct Release {
    dir: PathBuf,
    expect: Expect,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/upgrade")
}

fn version_key(v: &str) -> Vec<u64> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

/// Every release's fixture, oldest first.
fn releases() -> Vec<Release> {
    let mut out: Vec<Release> = std::fs::read_dir(fixtures())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("expect.json").is_file())
        .map(|dir| {
            let expect: Expect =
                serde_json::from_slice(&std::fs::read(dir.join("expect.json")).unwrap()).unwrap();
            assert_eq!(
                dir.file_name().unwrap().to_str(),
                Some(expect.version.as_str())
            );
            Release { dir, expect }
        })
        .collect();
    out.sort_by_key(|r| version_key(&r.expect.version));
    assert!(
        !out.is_empty(),
        "no upgrade fixtures under {}",
        fixtures().display()
    );
    out
}

/// A database of its own, holding a copy of a fixture (or nothing).
struct Scratch {
    url: String,
    pg_database: Option<String>,
    dir: tempfile::TempDir,
}

impl Scratch {
    async fn empty(backend: Backend) -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        match backend {
            Backend::Sqlite => Scratch {
                url: format!("sqlite://{}?mode=rwc", dir.path().join("kumo.db").display()),
                pg_database: None,
                dir,
            },
            Backend::Postgres => {
                let name = fresh_pg_database().await;
                Scratch {
                    url: pg_url_of(&name),
                    pg_database: Some(name),
                    dir,
                }
            }
        }
    }

    async fn of(release: &Release, backend: Backend) -> Scratch {
        let s = Scratch::empty(backend).await;
        match backend {
            Backend::Sqlite => {
                std::fs::copy(release.dir.join("kumo.db"), s.dir.path().join("kumo.db")).unwrap();
            }
            Backend::Postgres => {
                let out = std::process::Command::new("psql")
                    .args(["-q", "-v", "ON_ERROR_STOP=1", "-d", &s.url, "-f"])
                    .arg(release.dir.join("postgres.sql"))
                    .output()
                    .expect("psql (PostgreSQL's client) restores the fixture's dump");
                assert!(
                    out.status.success(),
                    "restoring {}: {out:?}",
                    release.expect.version
                );
            }
        }
        s
    }

    async fn drop(self) {
        if let Some(name) = self.pg_database {
            let db = Database::connect(pg_base_url()).await.unwrap();
            db.execute_unprepared(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .await
                .unwrap();
            db.close().await.unwrap();
        }
    }
}

/// The base URL with another database.
fn pg_url_of(database: &str) -> String {
    let base = pg_base_url();
    let (head, query) = base
        .split_once('?')
        .map_or((base.as_str(), None), |(h, q)| (h, Some(q)));
    let (server, _) = head.rsplit_once('/').unwrap();
    match query {
        Some(q) => format!("{server}/{database}?{q}"),
        None => format!("{server}/{database}"),
    }
}

/// A fresh database (a dump restores into a database, not a schema),
/// dropping those of runs older than an hour.
async fn fresh_pg_database() -> String {
    let db = Database::connect(pg_base_url()).await.unwrap();
    let rows = db
        .query_all(Statement::from_string(
            DatabaseBackend::Postgres,
            "SELECT datname FROM pg_database WHERE datname LIKE 'kumo_up_%'".to_owned(),
        ))
        .await
        .unwrap();
    let now = chrono::Utc::now().timestamp();
    for row in rows {
        let name: String = row.try_get("", "datname").unwrap();
        if name
            .split('_')
            .nth(2)
            .and_then(|t| t.parse::<i64>().ok())
            .is_some_and(|t| t < now - 3600)
        {
            let _ = db
                .execute_unprepared(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .await;
        }
    }
    let name = format!("kumo_up_{now}_{}", uuid::Uuid::new_v4().simple());
    db.execute_unprepared(&format!("CREATE DATABASE \"{name}\""))
        .await
        .unwrap();
    db.close().await.unwrap();
    name
}

/// A plain connection: no migrations run.
async fn connect(url: &str) -> DatabaseConnection {
    let mut o = ConnectOptions::new(url.to_owned());
    o.max_connections(1).sqlx_logging(false);
    Database::connect(o).await.unwrap()
}

async fn strings(db: &DatabaseConnection, sql: &str) -> Vec<String> {
    db.query_all(Statement::from_string(
        db.get_database_backend(),
        sql.to_owned(),
    ))
    .await
    .unwrap_or_else(|e| panic!("{sql}: {e}"))
    .iter()
    .map(|r| r.try_get_by_index::<String>(0).unwrap())
    .collect()
}

async fn tables(db: &DatabaseConnection) -> Vec<String> {
    strings(
        db,
        match db.get_database_backend() {
            DatabaseBackend::Sqlite => {
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
            }
            _ => "SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY 1",
        },
    )
    .await
}

async fn columns(db: &DatabaseConnection, table: &str) -> Vec<String> {
    strings(
        db,
        &match db.get_database_backend() {
            DatabaseBackend::Sqlite => format!("SELECT name FROM pragma_table_info('{table}') ORDER BY cid"),
            _ => format!(
                "SELECT column_name::text FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = '{table}' ORDER BY ordinal_position"
            ),
        },
    )
    .await
}

/// Every row of `table`, the given columns as text, in a stable order.
async fn rows(db: &DatabaseConnection, table: &str, cols: &[String]) -> Vec<Vec<Option<String>>> {
    let cast = |c: &String| match db.get_database_backend() {
        // UUIDs are blobs in SQLite: compared as hex.
        DatabaseBackend::Sqlite => {
            format!(
                "CASE typeof(\"{c}\") WHEN 'blob' THEN hex(\"{c}\") ELSE CAST(\"{c}\" AS TEXT) END"
            )
        }
        _ => format!("\"{c}\"::text"),
    };
    let sql = format!(
        "SELECT {} FROM \"{table}\"",
        cols.iter().map(cast).collect::<Vec<_>>().join(", ")
    );
    let mut out: Vec<Vec<Option<String>>> = db
        .query_all(Statement::from_string(
            db.get_database_backend(),
            sql.clone(),
        ))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|r| {
            (0..cols.len())
                .map(|i| r.try_get_by_index::<Option<String>>(i).unwrap())
                .collect()
        })
        .collect();
    out.sort();
    out
}

/// Tables, their columns and rows, as a release left them.
type Snapshot = BTreeMap<String, (Vec<String>, Vec<Vec<Option<String>>>)>;

async fn snapshot(db: &DatabaseConnection) -> Snapshot {
    let mut s = Snapshot::new();
    for t in tables(db).await {
        let cols = columns(db, &t).await;
        let r = rows(db, &t, &cols).await;
        s.insert(t, (cols, r));
    }
    s
}

/// The same tables and columns read again (after an upgrade): every row is
/// still there, unchanged.
async fn assert_rows_kept(db: &DatabaseConnection, before: &Snapshot, what: &str) {
    let now = tables(db).await;
    for (t, (cols, r)) in before {
        assert!(
            now.contains(t),
            "{what}: table {t} is gone (contract it a release later)"
        );
        let have = columns(db, t).await;
        for c in cols {
            assert!(
                have.contains(c),
                "{what}: column {t}.{c} is gone (contract it a release later)"
            );
        }
        // Every earlier row, unchanged (migrations may add rows, e.g.
        // their own record).
        let mut now = rows(db, t, cols).await;
        for row in r {
            let at = now.iter().position(|x| x == row);
            assert!(
                at.is_some(),
                "{what}: a row of {t} is gone or changed: {row:?}"
            );
            now.swap_remove(at.unwrap_or_default());
        }
    }
}

/// The previous code writes as it did into the new schema: each table's
/// rows, given only the columns the previous release knew, go back in
/// (new columns must be nullable or have defaults; new constraints must
/// hold for old rows). Rolled back: nothing is changed.
async fn assert_old_shaped_writes_fit(db: &DatabaseConnection, before: &Snapshot, what: &str) {
    let backend = db.get_database_backend();
    if backend == DatabaseBackend::Sqlite {
        // Foreign keys are checked per statement; a whole table's rows
        // re-inserted are checked as the rows, not as their order.
        db.execute_unprepared("PRAGMA foreign_keys = OFF")
            .await
            .unwrap();
    }
    for (t, (cols, r)) in before {
        if r.is_empty() || t == "seaql_migrations" {
            continue;
        }
        let list = cols
            .iter()
            .map(|c| format!("\"{c}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let txn = db.begin().await.unwrap();
        if backend == DatabaseBackend::Postgres {
            txn.execute_unprepared("SET LOCAL session_replication_role = replica")
                .await
                .unwrap();
        }
        for sql in [
            format!("CREATE TEMP TABLE kumo_old AS SELECT {list} FROM \"{t}\""),
            format!("DELETE FROM \"{t}\""),
            format!("INSERT INTO \"{t}\" ({list}) SELECT {list} FROM kumo_old"),
        ] {
            txn.execute_unprepared(&sql).await.unwrap_or_else(|e| {
                panic!("{what}: the previous release's rows of {t} no longer fit ({sql}): {e}")
            });
        }
        txn.rollback().await.unwrap();
    }
    if backend == DatabaseBackend::Sqlite {
        db.execute_unprepared("PRAGMA foreign_keys = ON")
            .await
            .unwrap();
    }
}

/// The current code on a migrated fixture: a server started on it and an
/// administrator's token from break-glass (the fixture's own token is not
/// kept anywhere).
async fn serve(scratch: &Scratch) -> (RunningServer, kumo_cli::Client) {
    let config = Config::for_data_dir(scratch.dir.path(), Some(scratch.url.clone()));
    let server = RunningServer::start(config).await.unwrap();
    let file = scratch.dir.path().join("recovery-token");
    kumo_server::app::bootstrap::recover(&server.state.db, "admin", &file, chrono::Utc::now())
        .await
        .unwrap();
    let token = std::fs::read_to_string(&file).unwrap().trim().to_owned();
    let client = kumo_cli::Client::new(&server.url(), Some(token)).unwrap();
    (server, client)
}

/// What the fixture's writer made, through the current API.
async fn assert_named_things_served(c: &kumo_cli::Client, e: &Expect) {
    let v = &e.version;
    let names =
        |xs: Vec<String>| -> std::collections::BTreeSet<String> { xs.into_iter().collect() };
    let tenants: Vec<Tenant> = c.list_all("/api/v1/tenants").await.unwrap();
    let have = names(tenants.into_iter().map(|t| t.name).collect());
    assert!(
        e.tenants.iter().all(|t| have.contains(t)),
        "{v}: tenants {have:?}"
    );
    let users: Vec<User> = c.list_all("/api/v1/users").await.unwrap();
    let have = names(users.into_iter().map(|u| u.name).collect());
    assert!(
        e.users.iter().all(|u| have.contains(u)),
        "{v}: users {have:?}"
    );
    let segs: Vec<Segment> = c.list_all("/api/v1/tenants/lab/segments").await.unwrap();
    let have = names(segs.into_iter().map(|s| s.name).collect());
    assert_eq!(have, names(e.segments.clone()), "{v}: segments");
    let vms: Vec<Vm> = c.list_all("/api/v1/tenants/lab/vms").await.unwrap();
    for name in &e.vms {
        let vm = vms
            .iter()
            .find(|x| &x.name == name)
            .unwrap_or_else(|| panic!("{v}: VM {name}"));
        // The fixture's hosts are silent now: its VMs read `unknown` until
        // their hosts report (what each was asked to be is checked in the
        // rows). A cluster whose members were still pending stays so.
        if e.stopped_vms.contains(name) {
            assert_ne!(vm.state, VmState::Running, "{v}: {name}");
        }
        if vm.cluster.is_none() {
            assert!(
                vm.host.is_some() && vm.placement.is_some(),
                "{v}: {name} placed: {vm:?}"
            );
        }
    }
    let train = vms.iter().find(|x| x.name == "train").unwrap();
    assert_eq!(
        train
            .networks
            .iter()
            .map(|n| n.segment.as_str())
            .collect::<Vec<_>>(),
        ["lab-net"],
        "{v}"
    );
    assert_eq!(
        vms.iter()
            .filter(|x| x.cluster.as_deref() == Some("ddp"))
            .count(),
        2,
        "{v}"
    );
    for name in &e.deleted_vms {
        assert!(
            vms.iter().all(|x| &x.name != name),
            "{v}: deleted VM {name} is back"
        );
    }
    // Metering ran while the fixture was written: charges were taken from
    // the grant.
    let points: serde_json::Value = c.get("/api/v1/tenants/lab/points").await.unwrap();
    let balance: f64 = points["balance"].as_str().unwrap().parse().unwrap();
    assert!(
        balance > 0.0 && balance < 100_000.0,
        "{v}: balance {points}"
    );
}

async fn opens_with_every_row(backend: Backend) {
    let current: Vec<String> = kumo_migrations::Migrator::migrations()
        .iter()
        .map(|m| m.name().to_owned())
        .collect();
    for release in releases() {
        let v = release.expect.version.clone();
        let scratch = Scratch::of(&release, backend).await;
        let plain = connect(&scratch.url).await;
        let before = snapshot(&plain).await;
        // The fixture is representative, and its migrations are the start
        // of ours: released migrations are never edited away or reordered.
        let applied = rows(&plain, "seaql_migrations", &["version".to_owned()]).await;
        let applied: Vec<String> = applied.into_iter().map(|r| r[0].clone().unwrap()).collect();
        assert!(applied.len() >= 12, "{v}: {applied:?}");
        assert_eq!(applied[..], current[..applied.len()], "{v}: migrations");
        for (t, at_least) in [
            ("tenants", 2),
            ("vms", 5),
            ("allocations", 4),
            ("charges", 1),
            ("meter_runs", 1),
            ("audit_log", 20),
        ] {
            let n = before.get(t).map_or(0, |(_, r)| r.len());
            assert!(n >= at_least, "{v}: {t} has {n} rows");
        }
        plain.close().await.unwrap();

        // The current migrations, as the server runs them on start: every
        // row is still there, and the previous release's rows fit.
        let migrated = kumo_server::db::open(&scratch.url).await.unwrap();
        migrated.close().await.unwrap();
        let plain = connect(&scratch.url).await;
        assert_rows_kept(&plain, &before, &v).await;
        assert_old_shaped_writes_fit(&plain, &before, &v).await;

        let (server, client) = serve(&scratch).await;
        assert_named_things_served(&client, &release.expect).await;
        // The current entities read every VM row the previous release
        // wrote, with the power it was asked for.
        use sea_orm::EntityTrait;
        let vm_rows = kumo_server::entity::vms::Entity::find()
            .all(&server.state.db)
            .await
            .unwrap();
        for name in &release.expect.vms {
            let vm = vm_rows.iter().find(|r| &r.name == name).unwrap();
            let want = if release.expect.stopped_vms.contains(name) {
                "stopped"
            } else {
                "running"
            };
            assert_eq!(vm.desired_power, want, "{v}: {name}");
        }
        // The current code writes; the previous release's columns read it.
        let _: Tenant = client
            .post(
                "/api/v1/tenants",
                &serde_json::json!({"name": "after-upgrade"}),
            )
            .await
            .unwrap();
        let (cols, _) = &before["tenants"];
        let names: Vec<String> = rows(&plain, "tenants", cols)
            .await
            .into_iter()
            .filter_map(|r| r[cols.iter().position(|c| c == "name").unwrap()].clone())
            .collect();
        assert!(
            names.contains(&"after-upgrade".to_owned()),
            "{v}: {names:?}"
        );
        plain.close().await.unwrap();
        server.stop().await.unwrap();
        scratch.drop().await;
    }
}

#[tokio::test]
async fn every_release_fixture_opens_with_every_row_sqlite() {
    opens_with_every_row(Backend::Sqlite).await;
}

#[tokio::test]
async fn every_release_fixture_opens_with_every_row_postgres() {
    opens_with_every_row(Backend::Postgres).await;
}

/// A released migration is never edited: a database that ran it must be
/// what the next release expects. (Fix forward with a new migration.)
#[test]
fn released_migrations_are_never_edited() {
    use sha2::{Digest, Sha256};
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations/src");
    for release in releases() {
        assert!(!release.expect.migrations.is_empty());
        for (name, want) in &release.expect.migrations {
            let text = std::fs::read(src.join(format!("{name}.rs"))).unwrap_or_else(|e| {
                panic!("{name} of release {} is gone: {e}", release.expect.version)
            });
            let have = format!("{:x}", Sha256::digest(&text));
            assert_eq!(
                &have, want,
                "{name} was edited after release {}",
                release.expect.version
            );
        }
    }
}

/// A JSON client for the previous release's API (its types are not ours).
struct OldApi {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl OldApi {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> serde_json::Value {
        let mut r = self
            .http
            .request(method.clone(), format!("{}{path}", self.url))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r.send().await.unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        assert!(
            status.is_success(),
            "previous release: {method} {path}: {status} {text}"
        );
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
    }

    async fn names(&self, path: &str) -> Vec<String> {
        let v = self
            .call(reqwest::Method::GET, &format!("{path}?limit=500"), None)
            .await;
        let items = v.get("items").unwrap_or(&v);
        items
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["name"].as_str().unwrap().to_owned())
            .collect()
    }
}

/// A rolling upgrade on PostgreSQL: the previous release serves; the
/// current one starts on the same database (running its new migrations)
/// while the previous one goes on serving; each writes and each reads what
/// the other wrote. The previous release's binaries are built from the
/// commit its fixture names (`cargo xtask previous-release`; `./x test`
/// passes them in `KUMO_PREVIOUS_RELEASE_BIN`).
#[tokio::test]
async fn adjacent_releases_serve_one_postgres_database() {
    let this = env!("CARGO_PKG_VERSION");
    let previous = releases()
        .into_iter()
        .rfind(|r| version_key(&r.expect.version) < version_key(this))
        .unwrap_or_else(|| panic!("no upgrade fixture older than {this}"));
    let bin = std::env::var_os("KUMO_PREVIOUS_RELEASE_BIN").map(PathBuf::from).unwrap_or_else(|| {
        panic!(
            "KUMO_PREVIOUS_RELEASE_BIN: the binaries of release {} (commit {}); `cargo xtask previous-release` builds them and prints where",
            previous.expect.version, previous.expect.commit
        )
    });
    let scratch = Scratch::empty(Backend::Postgres).await;
    let old_dir = tempfile::tempdir().unwrap();
    let mut old = crate::harness::KillOnDrop(
        std::process::Command::new(bin.join("kumo-server"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--database-url",
                &scratch.url,
                "--data-dir",
            ])
            .arg(old_dir.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(old_dir.path().join("server.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let (url, said) =
        crate::harness::announced_url(&mut std::io::BufReader::new(old.0.stdout.take().unwrap()));
    let url = url.unwrap_or_else(|| panic!("the previous release says where it listens: {said:?}"));
    let token = std::fs::read_to_string(old_dir.path().join("admin-token"))
        .unwrap()
        .trim()
        .to_owned();
    let prev = OldApi {
        http: reqwest::Client::new(),
        url,
        token: token.clone(),
    };
    let post = |path: &'static str, body: serde_json::Value| {
        let prev = &prev;
        async move { prev.call(reqwest::Method::POST, path, Some(body)).await }
    };
    post("/api/v1/tenants", serde_json::json!({"name": "early"})).await;
    post("/api/v1/users", serde_json::json!({"name": "olduser"})).await;
    prev.call(
        reqwest::Method::PUT,
        "/api/v1/tenants/early/members/olduser",
        Some(serde_json::json!({"role": "owner"})),
    )
    .await;
    post(
        "/api/v1/tenants/early/segments",
        serde_json::json!({"name": "seg-old", "kind": "ethernet", "cidr": "10.5.0.0/24"}),
    )
    .await;

    // The current release joins, and migrates while the previous one serves.
    let new_dir = tempfile::tempdir().unwrap();
    let current = RunningServer::start(Config::for_data_dir(
        new_dir.path(),
        Some(scratch.url.clone()),
    ))
    .await
    .unwrap();
    assert!(
        current.admin_token_file.is_none(),
        "the admin exists: no second bootstrap"
    );
    let cur = kumo_cli::Client::new(&current.url(), Some(token)).unwrap();
    let tenants: Vec<Tenant> = cur.list_all("/api/v1/tenants").await.unwrap();
    assert!(tenants.iter().any(|t| t.name == "early"));
    let segs: Vec<Segment> = cur
        .list_all("/api/v1/tenants/early/segments")
        .await
        .unwrap();
    assert_eq!(
        segs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["seg-old"]
    );
    let _: Tenant = cur
        .post("/api/v1/tenants", &serde_json::json!({"name": "late"}))
        .await
        .unwrap();
    let _: serde_json::Value = cur
        .put(
            "/api/v1/tenants/late/quota",
            &serde_json::json!({"segments": 2}),
        )
        .await
        .unwrap();
    let _: Segment = cur
        .post(
            "/api/v1/tenants/late/segments",
            &serde_json::json!({"name": "seg-new", "kind": "ethernet", "cidr": "10.6.0.0/24"}),
        )
        .await
        .unwrap();

    // The previous release reads what the current one wrote, and writes on.
    assert!(prev
        .names("/api/v1/tenants")
        .await
        .contains(&"late".to_owned()));
    assert_eq!(
        prev.names("/api/v1/tenants/late/segments").await,
        ["seg-new"]
    );
    post("/api/v1/tenants", serde_json::json!({"name": "early-2"})).await;
    post(
        "/api/v1/tenants/early-2/segments",
        serde_json::json!({"name": "seg-old-2", "kind": "ethernet", "cidr": "10.7.0.0/24"}),
    )
    .await;
    prev.call(reqwest::Method::GET, "/api/v1/users/me", None)
        .await;
    let segs: Vec<Segment> = cur
        .list_all("/api/v1/tenants/early-2/segments")
        .await
        .unwrap();
    assert_eq!(
        segs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["seg-old-2"]
    );
    let r = reqwest::get(format!("{}/readyz", prev.url)).await.unwrap();
    assert_eq!(r.status(), 200, "the previous release still ready");

    current.stop().await.unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    old.0.wait().unwrap();
    let log = std::fs::read_to_string(old_dir.path().join("server.log")).unwrap();
    assert!(
        !log.contains("\"level\":\"ERROR\""),
        "the previous release's errors: {log}"
    );
    scratch.drop().await;
}

/// Release 0.2.0 gave GPU VMs their NICs' physical functions. Such a VM
/// keeps them while it runs and lets them go, with their allocations, at
/// its next start; its GPUs stay where they are.
#[tokio::test]
async fn a_vm_holding_nic_physical_functions_lets_them_go_at_its_next_start() {
    use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};
    let release = releases()
        .into_iter()
        .find(|r| r.expect.version == "0.2.0")
        .expect("the 0.2.0 fixture");
    let scratch = Scratch::of(&release, Backend::Sqlite).await;
    let (server, client) = serve(&scratch).await;
    let db = &server.state.db;
    let placement_of = async |name: &str| {
        let row = kumo_server::entity::vms::Entity::find()
            .filter(kumo_server::entity::vms::Column::Name.eq(name))
            .one(db)
            .await
            .unwrap()
            .unwrap();
        let p: kumo_topology::guest_layout::Placement =
            serde_json::from_str(row.placement.as_deref().unwrap()).unwrap();
        (row.id, p)
    };
    let nic_rows = async |vm: uuid::Uuid| {
        kumo_server::entity::allocations::Entity::find()
            .filter(kumo_server::entity::allocations::Column::VmId.eq(vm))
            .filter(kumo_server::entity::allocations::Column::Kind.eq("nic"))
            .all(db)
            .await
            .unwrap()
            .len()
    };
    let (id, before) = placement_of("notebook").await;
    assert!(
        !before.nics.is_empty() && before.nics.iter().all(|n| n.pf.is_none()),
        "the fixture's notebook holds a PF: {:?}",
        before.nics
    );
    assert_eq!(nic_rows(id).await, before.nics.len());
    // Its host reported it stopped (the fixture's hosts are silent).
    let stopped = db
        .execute_unprepared(
            "UPDATE vms SET state = 'stopped', desired_power = 'stopped' WHERE name = 'notebook'",
        )
        .await
        .unwrap();
    assert_eq!(stopped.rows_affected(), 1);
    let _: Vm = client
        .post(
            "/api/v1/tenants/lab/vms/notebook/start",
            &serde_json::json!({}),
        )
        .await
        .unwrap();
    let (_, after) = placement_of("notebook").await;
    assert!(after.nics.is_empty(), "{:?}", after.nics);
    assert_eq!(after.gpus, before.gpus, "its GPUs stay");
    assert_eq!(nic_rows(id).await, 0, "the PFs' allocations went with them");
    let events: kumo_api_types::Page<kumo_api_types::VmEvent> =
        client.get("/api/v1/tenants/lab/events").await.unwrap();
    assert!(
        events.items.iter().any(|e| e.vm_id == id
            && e.kind == "re-planned"
            && e.message.contains("physical functions")),
        "{:?}",
        events.items
    );
    // A VM that keeps running keeps what it has until its own next start.
    let (train, kept) = placement_of("train").await;
    assert!(kept.nics.iter().all(|n| n.pf.is_none()) && !kept.nics.is_empty());
    assert_eq!(nic_rows(train).await, kept.nics.len());
    server.stop().await.unwrap();
    scratch.drop().await;
}
