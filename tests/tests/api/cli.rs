//! The real `kumo` binary against a real server: the README's walk-through.

use std::process::Command;

use serde_json::Value;

use crate::harness::{Backend, TestServer};

pub struct Kumo {
    pub home: tempfile::TempDir,
}

impl Kumo {
    pub fn new() -> Kumo {
        Kumo {
            home: tempfile::tempdir().unwrap(),
        }
    }

    /// Runs `kumo ARGS` with a private HOME; returns (success, stdout, stderr).
    pub fn run(&self, args: &[&str], token: Option<&str>) -> (bool, String, String) {
        let mut cmd = Command::new(crate::harness::bin("kumo"));
        cmd.args(args)
            .env_clear()
            .env("HOME", self.home.path())
            .env("PATH", std::env::var("PATH").unwrap_or_default());
        if let Some(t) = token {
            cmd.env("KUMO_TOKEN", t);
        }
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub fn ok(&self, args: &[&str], token: Option<&str>) -> String {
        let (ok, out, err) = self.run(args, token);
        assert!(ok, "kumo {args:?} failed: {err}");
        out
    }

    pub fn json(&self, args: &[&str], token: Option<&str>) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&all, token)).unwrap()
    }
}

#[tokio::test]
async fn readme_walkthrough_with_two_tenants() {
    let s = TestServer::start(Backend::Sqlite).await;
    let url = s.url.clone();
    tokio::task::spawn_blocking(move || walkthrough(&url, &s.admin_token.clone()))
        .await
        .unwrap();
}

fn walkthrough(url: &str, admin_token: &str) {
    let admin = Kumo::new();
    let out = admin.ok(&["login", "--server", url, "--token", admin_token], None);
    assert!(out.contains("as admin"), "{out}");
    let config = admin.home.path().join(".config/kumo/config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains(url));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&config).unwrap().permissions().mode() & 0o777,
        0o600
    );

    admin.ok(
        &["tenant", "create", "vision", "--display-name", "Vision Lab"],
        None,
    );
    admin.ok(&["tenant", "create", "speech"], None);
    let table = admin.ok(&["tenant", "list"], None);
    let lines: Vec<_> = table.lines().collect();
    assert!(lines[0].starts_with("NAME"), "{table}");
    assert!(
        lines[1].starts_with("speech") && lines[2].starts_with("vision"),
        "{table}"
    );

    admin.ok(&["user", "create", "aiko", "--email", "aiko@u.ac.jp"], None);
    admin.ok(&["user", "create", "ben"], None);
    admin.ok(
        &[
            "member", "add", "aiko", "--tenant", "vision", "--role", "owner",
        ],
        None,
    );
    let members = admin.json(&["member", "list", "--tenant", "vision"], None);
    assert_eq!(members[0]["user"], "aiko");
    assert_eq!(members[0]["role"], "owner");

    let minted = admin.json(
        &[
            "token",
            "create",
            "--user",
            "aiko",
            "--description",
            "cli",
            "--expires-in",
            "30d",
        ],
        None,
    );
    let aiko_token = minted["token"].as_str().unwrap().to_owned();
    assert!(minted["expires_at"].is_string());

    // Aiko sees her tenant only, manages its members, but cannot create tenants.
    let aiko = Kumo::new();
    aiko.ok(&["login", "--server", url, "--token", &aiko_token], None);
    let tenants = aiko.json(&["tenant", "list"], None);
    assert_eq!(tenants.as_array().unwrap().len(), 1);
    assert_eq!(tenants[0]["name"], "vision");
    let (ok, _, err) = aiko.run(&["tenant", "show", "speech"], None);
    assert!(!ok);
    assert!(err.contains("Not found (HTTP 404)"), "{err}");
    let (ok, _, err) = aiko.run(&["tenant", "create", "mine"], None);
    assert!(!ok && err.contains("HTTP 403"), "{err}");
    aiko.ok(
        &[
            "member", "add", "ben", "--tenant", "vision", "--role", "viewer",
        ],
        None,
    );
    let me = aiko.json(&["user", "me"], None);
    assert_eq!(me["memberships"][0]["tenant"], "vision");

    // Ben, a viewer, may read but not change.
    let ben_token = admin.json(&["token", "create", "--user", "ben"], None)["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let ben = Kumo::new();
    assert!(ben
        .ok(
            &["--server", url, "quota", "show", "--tenant", "vision"],
            Some(&ben_token)
        )
        .contains("vcpus"));
    let (ok, _, err) = ben.run(
        &[
            "--server",
            url,
            "tenant",
            "update",
            "vision",
            "--description",
            "x",
        ],
        Some(&ben_token),
    );
    assert!(!ok && err.contains("HTTP 403"), "{err}");

    // Quota set changes only what is named.
    admin.ok(
        &[
            "quota",
            "set",
            "--tenant",
            "vision",
            "--gpus",
            "H100-SXM5-80GB=16",
            "--vcpus",
            "512",
        ],
        None,
    );
    admin.ok(&["quota", "set", "--tenant", "vision", "--vms", "8"], None);
    let q = admin.json(&["quota", "show", "--tenant", "vision"], None);
    assert_eq!(q["gpus"]["H100-SXM5-80GB"], 16);
    assert_eq!(q["vcpus"], 512);
    assert_eq!(q["vms"], 8);

    // Tokens: list and revoke.
    let tokens = aiko.json(&["token", "list"], None);
    let id = tokens[0]["id"].as_str().unwrap().to_owned();
    aiko.ok(&["token", "revoke", &id], None);
    let (ok, _, err) = aiko.run(&["tenant", "list"], None);
    assert!(!ok && err.contains("HTTP 401"), "{err}");

    let audit = admin.json(&["audit", "--tenant", "vision"], None);
    assert!(audit
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["action"] == "quota.set"));

    admin.ok(&["tenant", "delete", "speech"], None);
    assert_eq!(
        admin
            .json(&["tenant", "list"], None)
            .as_array()
            .unwrap()
            .len(),
        1
    );

    let completions = admin.ok(&["completions", "bash"], None);
    assert!(
        completions.contains("_kumo()"),
        "bash completion defines its function"
    );

    // No server anywhere: a clear message, not a panic.
    let nobody = Kumo::new();
    let (ok, _, err) = nobody.run(&["tenant", "list"], None);
    assert!(!ok && err.contains("kumo login"), "{err}");
}

/// `kumo cluster …` and `kumo host drain|undrain` against simulated hosts.
#[tokio::test]
async fn cluster_and_host_commands() {
    let s = TestServer::start(Backend::Sqlite).await;
    s.tenant("lab").await;
    for name in ["gpu-1", "gpu-2"] {
        let _ = s.sim_agent_in(name, "hgx-h100", Some("su-1")).await;
    }
    let url = s.url.clone();
    let token = s.admin_token.clone();
    tokio::task::spawn_blocking(move || {
        let k = Kumo::new();
        let t = Some(token.as_str());
        let base = ["--server", url.as_str()];
        let with = |args: &[&'static str]| -> Vec<&str> {
            base.iter().copied().chain(args.iter().copied()).collect()
        };
        let created = k.json(
            &with(&[
                "cluster", "create", "train", "--tenant", "lab", "--size", "2", "--gpus", "8",
                "--memory", "64",
            ]),
            t,
        );
        assert_eq!(created["state"], "placed");
        assert_eq!(created["members"].as_array().unwrap().len(), 2);
        let hostfile = k.ok(
            &with(&["cluster", "hostfile", "train", "--tenant", "lab"]),
            t,
        );
        assert_eq!(hostfile, "train-0 slots=8\ntrain-1 slots=8\n");
        let table = k.ok(&with(&["cluster", "show", "train", "--tenant", "lab"]), t);
        assert!(table.contains("0,1,2,3,4,5,6,7"), "rails: {table}");
        assert!(table.contains("su-1"), "{table}");
        let list = k.ok(&with(&["cluster", "list", "--tenant", "lab"]), t);
        assert!(list.lines().nth(1).unwrap().starts_with("train"), "{list}");

        let drained = k.json(&with(&["host", "drain", "gpu-1"]), t);
        assert_eq!(drained["state"], "draining");
        let hosts = k.ok(&with(&["host", "list"]), t);
        assert!(
            hosts
                .lines()
                .any(|l| l.starts_with("gpu-1") && l.contains("draining")),
            "{hosts}"
        );
        let back = k.json(&with(&["host", "undrain", "gpu-1"]), t);
        assert_eq!(back["state"], "ready");

        let gone = k.ok(&with(&["cluster", "delete", "train", "--tenant", "lab"]), t);
        assert!(gone.contains("Deleting train (2 members)"), "{gone}");
        let (ok, _, err) = k.run(&with(&["cluster", "create", "x", "--tenant", "lab"]), t);
        assert!(!ok && err.contains("--size"), "{err}");
    })
    .await
    .unwrap();
    s.stop().await;
}

#[tokio::test]
async fn rate_points_and_statement_commands() {
    use chrono::{Duration, TimeZone, Utc};
    let t0 = Utc.with_ymd_and_hms(2026, 11, 20, 12, 0, 0).unwrap();
    let clock = kumo_server::clock::Clock::manual(t0);
    let s = TestServer::start_with(Backend::Sqlite, |c| c.clock = clock.clone()).await;
    s.tenant("lab").await;
    let mut agent = s.sim_agent("cpu-1", "cpu-only").await;
    let url = s.url.clone();
    let token = s.admin_token.clone();
    let k = std::sync::Arc::new(Kumo::new());
    {
        let (k, url, token) = (k.clone(), url.clone(), token.clone());
        tokio::task::spawn_blocking(move || {
            k.ok(&["login", "--server", &url, "--token", &token], None);
            let rates = k.json(
                &[
                    "rate",
                    "set",
                    "--price",
                    "vcpu=36/12",
                    "--price",
                    "memory_gib=3.6/1.2",
                    "--price",
                    "disk_gib=0/0",
                ],
                None,
            );
            assert_eq!(rates["current"]["prices"]["vcpu"]["spot"], "12", "{rates}");
            let table = k.ok(&["rate", "list"], None);
            assert!(
                table.contains("in force") && table.contains("memory_gib"),
                "{table}"
            );
            let bad = k.run(&["rate", "set", "--price", "vcpu=1"], None);
            assert!(!bad.0 && bad.2.contains("GUARANTEED/SPOT"), "{}", bad.2);
            k.ok(
                &[
                    "points",
                    "grant",
                    "--tenant",
                    "lab",
                    "--amount",
                    "500",
                    "--expires",
                    "2027-03-31",
                ],
                None,
            );
            k.ok(
                &[
                    "vm", "create", "web", "--tenant", "lab", "--vcpus", "2", "--memory", "4",
                ],
                None,
            );
        })
        .await
        .unwrap();
    }
    agent.converge().await;
    clock.advance(Duration::minutes(10));
    kumo_server::app::metering::post_due(&s.server.state)
        .await
        .unwrap();
    tokio::task::spawn_blocking(move || {
        // 10 minutes of 2 vCPUs (36/h) and 4 GiB (3.6/h): 12 + 2.4.
        let p = k.json(&["points", "show", "--tenant", "lab"], None);
        assert_eq!(p["charged"], "14.4", "{p}");
        assert_eq!(p["balance"], "485.6", "{p}");
        let shown = k.ok(&["points", "show", "--tenant", "lab"], None);
        assert!(shown.contains("Balance: 485.6 JPY"), "{shown}");
        // Unshelving elsewhere asks the API for it; a running VM says no.
        let (ok, _, err) = k.run(
            &["vm", "unshelve", "web", "--tenant", "lab", "--anywhere"],
            None,
        );
        assert!(
            !ok && err.contains("cannot unshelve a VM that is running"),
            "{err}"
        );
        let st = k.ok(&["statement", "get", "2026-11", "--tenant", "lab"], None);
        assert!(st.contains("Total: 14.4"), "{st}");
        let u = k.json(
            &[
                "usage",
                "show",
                "--tenant",
                "lab",
                "--by",
                "resource",
                "--from",
                "2026-11-01",
            ],
            None,
        );
        assert_eq!(u["total"], "14.4", "{u}");
        assert_eq!(
            u["rows"].as_array().unwrap().len(),
            3,
            "disk, memory, vCPU: {u}"
        );
        let csv = k.ok(
            &["statement", "get", "2026-11", "--tenant", "lab", "--csv"],
            None,
        );
        assert!(csv.ends_with("total,,,,,14.4\n"), "{csv}");
    })
    .await
    .unwrap();
    s.stop().await;
}
