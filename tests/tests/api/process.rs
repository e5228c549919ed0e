//! The real `kumo-server` binary: configuration, JSON logs with request ids,
//! no token in any output, graceful shutdown.

use std::io::BufReader;
use std::process::{Child, Command, Stdio};

use crate::harness::{on_both_backends, TestServer};

/// Starts the server and reads stdout until it says where it listens.
/// (A failed assertion here leaves the child to the test process's exit.)
#[allow(clippy::zombie_processes)]
fn start(args: &[&str], env: &[(&str, &str)]) -> (Child, String, Vec<String>) {
    let mut child = Command::new(crate::harness::bin("kumo-server"))
        .arg("serve")
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let (url, lines) = crate::harness::announced_url(&mut stdout);
    let url = url.unwrap_or_else(|| panic!("server exited early: {lines:?}"));
    (child, url, lines)
}

fn terminate(mut child: Child) -> String {
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = child.wait().unwrap();
    assert!(status.success(), "SIGTERM is a clean shutdown: {status}");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    err
}

#[tokio::test]
async fn binary_logs_json_with_request_ids_and_never_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kumo.toml");
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:0\"\nlog_format = \"json\"\n[http]\nrequest_timeout_secs = 10\n",
    )
    .unwrap();
    let data = dir.path().join("data");
    let data_s = data.to_str().unwrap();
    // The data dir comes from the environment, the rest from the file.
    let (child, url, stdout) = start(
        &["--config", config.to_str().unwrap()],
        &[("KUMO_DATA_DIR", data_s)],
    );
    let token = std::fs::read_to_string(data.join("admin-token"))
        .unwrap()
        .trim()
        .to_owned();
    // The data directory and the database are the server's user's alone.
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&data), 0o700, "the data directory");
        assert_eq!(mode(&data.join("kumo.db")), 0o600, "the database");
        for journal in ["kumo.db-wal", "kumo.db-shm"] {
            if data.join(journal).exists() {
                assert_eq!(mode(&data.join(journal)), 0o600, "{journal}");
            }
        }
    }
    assert!(
        stdout[0].contains(&data.join("admin-token").display().to_string()),
        "{stdout:?}"
    );

    let resp = reqwest::Client::new()
        .get(format!("{url}/api/v1/users/me"))
        .bearer_auth(&token)
        .header("x-request-id", "proc-req-1")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let stderr = tokio::task::spawn_blocking(move || terminate(child))
        .await
        .unwrap();

    let secret = kumo_server::app::auth::parse(&token).unwrap().1.to_owned();
    for output in stdout.iter().map(String::as_str).chain(stderr.lines()) {
        assert!(
            !output.contains(&secret),
            "a token leaked into the output: {output}"
        );
    }
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}"))
        })
        .collect();
    let access = lines
        .iter()
        .find(|l| l["span"]["client_request_id"] == "proc-req-1")
        .unwrap_or_else(|| panic!("no log line carries the request id: {stderr}"));
    assert_eq!(access["level"], "INFO");

    // A second start finds its admin and bootstraps nothing.
    let (child, _, stdout) = start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data_s,
            "--log-format",
            "text",
        ],
        &[],
    );
    assert!(
        !stdout
            .iter()
            .any(|l| l.contains("Created the platform admin")),
        "{stdout:?}"
    );
    tokio::task::spawn_blocking(move || terminate(child))
        .await
        .unwrap();
}

#[test]
fn bad_configuration_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kumo.toml");
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:0\"\ndatabase = \"sqlite://x\"\n",
    )
    .unwrap();
    let out = Command::new(crate::harness::bin("kumo-server"))
        .args(["serve", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown field `database`") && err.contains("kumo.toml"),
        "{err}"
    );

    let out = Command::new(crate::harness::bin("kumo-server"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.path().to_str().unwrap(),
            "--database-url",
            "sqlite:///proc/no-such-dir/kumo.db?mode=rwc",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot connect to the database"), "{err}");
}

/// `kumo-server admin recover` with the server's database.
fn recover(s: &TestServer, args: &[&str]) -> std::process::Output {
    let config = &s.server.state.config;
    Command::new(crate::harness::bin("kumo-server"))
        .args([
            "admin",
            "recover",
            "--database-url",
            &config.database_url,
            "--data-dir",
        ])
        .arg(&config.data_dir)
        .args(args)
        .output()
        .unwrap()
}

on_both_backends! {
    /// An administrator who revoked every admin token gets back in with
    /// the break-glass command (local access to the database): a 24-hour
    /// token in a 0600 file, never printed, audited; a disabled admin is
    /// re-enabled; nobody is made an administrator by it.
    async fn admin_recover_lets_an_administrator_back_in(s: &TestServer) {
        use kumo_api_types::{AuditEntry, Me, Page, TokenInfo, User};
        let (_, mika) = s.user("mika").await;
        let _: User = s.admin.post("/api/v1/users", &serde_json::json!({"name": "ops", "is_admin": true})).await.unwrap();
        s.admin.post::<_, serde_json::Value>("/api/v1/users/ops/disable", &serde_json::json!({})).await.ok();
        // Every admin token revoked: locked out.
        let tokens: Vec<TokenInfo> = s.admin.list_all("/api/v1/tokens").await.unwrap();
        for t in tokens.iter().filter(|t| t.user == "admin") {
            s.admin.delete(&format!("/api/v1/tokens/{}", t.id)).await.unwrap();
        }
        assert_eq!(s.admin.get::<Me>("/api/v1/users/me").await.unwrap_err().status(), Some(401));

        // Break-glass never makes an administrator.
        let out = recover(s, &["--user", "mika"]);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("not an administrator"), "{out:?}");

        let out = recover(s, &[]);
        assert!(out.status.success(), "{out:?}");
        let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        let file = s.server.state.config.data_dir.join("recovery-token");
        assert!(said.contains(&file.display().to_string()), "{said}");
        let token = std::fs::read_to_string(&file).unwrap().trim().to_owned();
        assert!(token.starts_with("kumo_") && !said.contains(&token), "the token is never printed: {said}");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        assert_ne!(token, mika);
        let admin = kumo_cli::Client::new(&s.url, Some(token)).unwrap();
        let me: Me = admin.get("/api/v1/users/me").await.unwrap();
        assert_eq!(me.user.name, "admin");
        let mine: Vec<TokenInfo> = admin.list_all("/api/v1/tokens").await.unwrap();
        let t = mine.iter().find(|t| t.description.contains("break-glass")).unwrap();
        let hours = (t.expires_at.unwrap() - t.created_at).num_hours();
        assert_eq!(hours, 24);

        // A disabled administrator is enabled again.
        let ops_file = s.server.state.config.data_dir.join("ops-token");
        let out = Command::new(crate::harness::bin("kumo-server"))
            .args(["admin", "recover", "--database-url", &s.server.state.config.database_url, "--user", "ops", "--to"])
            .arg(&ops_file)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let ops = kumo_cli::Client::new(&s.url, Some(std::fs::read_to_string(&ops_file).unwrap().trim().to_owned())).unwrap();
        let me: Me = ops.get("/api/v1/users/me").await.unwrap();
        assert_eq!(me.user.name, "ops");

        let audit: Page<AuditEntry> = admin.get("/api/v1/audit?limit=50").await.unwrap();
        let by = |a: &str| audit.items.iter().filter(|e| e.action == a && e.actor == "kumo-server admin recover").count();
        assert_eq!(by("token.recover"), 2);
        assert_eq!(by("user.enable"), 1);
    }
}

/// `kumo-server backup` under VM churn, `restore` into a fresh data
/// directory, a server started on it: every tenant, VM, allocation, ledger
/// line and audit entry the backup's moment held is there, and nothing
/// made after the backup finished.
#[tokio::test]
async fn a_backup_under_churn_restores_into_a_fresh_data_directory() {
    use kumo_api_types::{Me, Vm};
    use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter, QuerySelect};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let s = TestServer::start_with(crate::harness::Backend::Sqlite, |_| {}).await;
    s.tenant("lab").await;
    let _: serde_json::Value = s
        .admin
        .post(
            "/api/v1/tenants/lab/points/grants",
            &serde_json::json!({"amount": "1000", "expires_at": chrono::Utc::now() + chrono::Duration::days(30)}),
        )
        .await
        .unwrap();
    let mut agent = s.sim_agent("gpu-001", "hgx-h100").await;
    let mut agent2 = s.sim_agent("gpu-002", "hgx-h100").await;
    // Churn: VMs made and placed one after another, each noted (with when
    // it was asked for) once placed.
    let made: Arc<Mutex<Vec<(uuid::Uuid, std::time::Instant)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (made, stop, admin) = (made.clone(), stop.clone(), s.admin.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) && i < 40 {
                let asked = std::time::Instant::now();
                let v: Vm = admin
                    .post(
                        "/api/v1/tenants/lab/vms",
                        &crate::device_health::vm(
                            &format!("churn-{i}"),
                            0,
                            kumo_api_types::ServiceLevel::Spot,
                        ),
                    )
                    .await
                    .unwrap();
                agent.converge().await;
                agent2.converge().await;
                made.lock().unwrap().push((v.id, asked));
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                i += 1;
            }
        })
    };
    while made.lock().unwrap().len() < 5 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let started = std::time::Instant::now();
    let before: Vec<uuid::Uuid> = made.lock().unwrap().iter().map(|(v, _)| *v).collect();
    let audit_before: Option<i64> = kumo_server::entity::audit_log::Entity::find()
        .select_only()
        .column_as(kumo_server::entity::audit_log::Column::Id.max(), "m")
        .into_tuple()
        .one(s.db())
        .await
        .unwrap()
        .flatten();
    let dir = crate::harness::scratch();
    let file = dir.path().join("kumo-backup.db");
    let config = &s.server.state.config;
    let out = Command::new(crate::harness::bin("kumo-server"))
        .args(["backup", "--database-url", &config.database_url, "--to"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let finished = std::time::Instant::now();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    churn.await.unwrap();
    let after: Vec<uuid::Uuid> = made
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, at)| *at > finished)
        .map(|(v, _)| *v)
        .collect();
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        summary["vms"].as_i64().unwrap() >= before.len() as i64,
        "{summary}"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // A backup never overwrites.
    let again = Command::new(crate::harness::bin("kumo-server"))
        .args(["backup", "--database-url", &config.database_url, "--to"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!again.status.success());

    // Restored into a fresh data directory, and never over a database.
    let fresh = dir.path().join("restored");
    let restore = |data: &std::path::Path| {
        Command::new(crate::harness::bin("kumo-server"))
            .args(["restore", "--from"])
            .arg(&file)
            .arg("--data-dir")
            .arg(data)
            .output()
            .unwrap()
    };
    let out = restore(&fresh);
    assert!(out.status.success(), "{out:?}");
    assert!(!restore(&fresh).status.success(), "not over a database");
    let restored = sea_orm::Database::connect(format!(
        "sqlite://{}?mode=ro",
        fresh.join("kumo.db").display()
    ))
    .await
    .unwrap();
    use kumo_server::entity::{allocations, audit_log, point_grants, tenants, vms};
    for id in &before {
        assert!(
            vms::Entity::find_by_id(*id)
                .one(&restored)
                .await
                .unwrap()
                .is_some(),
            "VM {id} made before the backup"
        );
    }
    for id in &after {
        assert!(
            vms::Entity::find_by_id(*id)
                .one(&restored)
                .await
                .unwrap()
                .is_none(),
            "VM {id} made after the backup"
        );
    }
    let placed = vms::Entity::find()
        .filter(vms::Column::HostId.is_not_null())
        .all(&restored)
        .await
        .unwrap();
    assert!(placed.len() >= before.len());
    for v in &placed {
        let n = allocations::Entity::find()
            .filter(allocations::Column::VmId.eq(v.id))
            .count(&restored)
            .await
            .unwrap();
        assert!(n > 0, "VM {} has its allocations", v.name);
    }
    assert_eq!(
        tenants::Entity::find()
            .filter(tenants::Column::Name.eq("lab"))
            .count(&restored)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        point_grants::Entity::find().count(&restored).await.unwrap(),
        1
    );
    let ids: Vec<i64> = audit_log::Entity::find()
        .select_only()
        .column(audit_log::Column::Id)
        .into_tuple()
        .all(&restored)
        .await
        .unwrap();
    let upto = audit_before.unwrap();
    let live: Vec<i64> = audit_log::Entity::find()
        .select_only()
        .column(audit_log::Column::Id)
        .filter(audit_log::Column::Id.lte(upto))
        .into_tuple()
        .all(s.db())
        .await
        .unwrap();
    for id in live {
        assert!(ids.contains(&id), "audit entry {id} from before the backup");
    }
    restored.close().await.unwrap();

    // A server on the restored directory serves it, and the admin's token
    // works there.
    let (child, url, _) = start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            fresh.to_str().unwrap(),
        ],
        &[],
    );
    let c = kumo_cli::Client::new(&url, Some(s.admin_token.clone())).unwrap();
    let me: Me = c.get("/api/v1/users/me").await.unwrap();
    assert_eq!(me.user.name, "admin");
    let listed: Vec<Vm> = c.list_all("/api/v1/tenants/lab/vms").await.unwrap();
    assert!(before.iter().all(|id| listed.iter().any(|v| v.id == *id)));
    terminate(child);
    println!(
        "backup: {} VMs, taken in {:?}",
        summary["vms"],
        finished - started
    );
    s.stop().await;
}
