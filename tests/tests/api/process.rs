//! The real `kumo-server` binary: configuration, JSON logs with request ids,
//! no token in any output, graceful shutdown.

use std::io::{BufRead, BufReader};
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
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "server exited early: {lines:?}"
        );
        lines.push(line.trim_end().to_owned());
        if let Some(rest) = line.strip_prefix("Kumo API listening on ") {
            let url = rest.split_whitespace().next().unwrap().to_owned();
            return (child, url, lines);
        }
    }
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
