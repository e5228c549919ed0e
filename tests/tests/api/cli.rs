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
        let out = self.run_env(args, token, &[]);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// [`Kumo::run`] with more (or other) environment variables, e.g.
    /// a PATH with a fake `ssh` first; answers the whole output.
    pub fn run_env(
        &self,
        args: &[&str],
        token: Option<&str>,
        env: &[(&str, &str)],
    ) -> std::process::Output {
        let mut cmd = Command::new(crate::harness::bin("kumo"));
        cmd.args(args)
            .env_clear()
            .env("HOME", self.home.path())
            .env("PATH", std::env::var("PATH").unwrap_or_default());
        if let Some(t) = token {
            cmd.env("KUMO_TOKEN", t);
        }
        cmd.envs(env.iter().copied());
        cmd.output().unwrap()
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

/// Every command and argument of `kumo` has help, in words for users:
/// an about for each command, a help line for each argument, and no
/// developer's note among them (clap takes a flattened struct's doc
/// comment as the command's about).
#[test]
fn every_command_and_flag_has_help() {
    use clap::CommandFactory;

    fn walk(cmd: &clap::Command, path: &str, seen: &mut usize, problems: &mut Vec<String>) {
        *seen += 1;
        let mut texts = Vec::new();
        match cmd.get_about().map(ToString::to_string) {
            None => problems.push(format!("{path}: no about")),
            Some(a) if a.trim().is_empty() || a.contains('\n') => {
                problems.push(format!("{path}: about {a:?} is not one line"))
            }
            Some(a) => texts.push(a),
        }
        texts.extend(cmd.get_long_about().map(ToString::to_string));
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            match a.get_help().map(ToString::to_string) {
                None => problems.push(format!("{path} {id}: no help")),
                Some(h) if h.trim().is_empty() => problems.push(format!("{path} {id}: empty help")),
                Some(h) => texts.push(h),
            }
            texts.extend(a.get_long_help().map(ToString::to_string));
            texts.extend(
                a.get_possible_values()
                    .iter()
                    .filter_map(|v| v.get_help().map(ToString::to_string)),
            );
        }
        for t in texts {
            let lower = t.to_lowercase();
            for word in ["shared by", "internal", "todo", "fixme"] {
                if lower.contains(word) {
                    problems.push(format!("{path}: {word:?} in {t:?}"));
                }
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.get_name() != "help" {
                walk(sub, &format!("{path} {}", sub.get_name()), seen, problems);
            }
        }
    }

    let mut cmd = kumo_cli::commands::Cli::command();
    cmd.build();
    let (mut seen, mut problems) = (0, Vec::new());
    walk(&cmd, "kumo", &mut seen, &mut problems);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(seen > 90, "the whole tree is walked: {seen} commands");

    // The binary prints it.
    let k = Kumo::new();
    let help = k.ok(&["vm", "create", "--help"], None);
    assert!(help.starts_with("Create a VM"), "{help}");
    let help = k.ok(&["quota", "set", "-h"], None);
    for flag in ["--vcpus", "--memory-gib", "--vms", "--segments"] {
        let line = help
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{flag} ")))
            .unwrap_or_else(|| panic!("{flag} missing: {help}"));
        assert!(
            line.split_whitespace().count() > 3,
            "{flag} has a help line: {line:?}"
        );
    }
}

/// A stand-in for the system `ssh`, first on PATH: it writes its
/// arguments (one per line) next to itself and exits with 7.
struct FakeSsh {
    dir: tempfile::TempDir,
    path: String,
}

impl FakeSsh {
    fn new() -> FakeSsh {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("ssh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nprintf '%s\\n' \"$@\" > '{}/args'\necho \"fake ssh: $*\"\nexit 7\n",
                dir.path().display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = format!(
            "{}:{}",
            dir.path().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        FakeSsh { dir, path }
    }

    /// The arguments of its last run (and forgets them), if it ran.
    fn took(&self) -> Option<Vec<String>> {
        let file = self.dir.path().join("args");
        let text = std::fs::read_to_string(&file).ok()?;
        std::fs::remove_file(&file).unwrap();
        Some(text.lines().map(str::to_owned).collect())
    }
}

/// `kumo vm show` lists a VM's networks, public addresses and SSH
/// command; `kumo vm ssh` runs that command (with a fake `ssh`): through
/// a floating address, then a port forward to port 22; without either,
/// both say how to get one.
#[tokio::test]
async fn vm_show_and_ssh_reach_the_public_address() {
    let s = TestServer::start(Backend::Sqlite).await;
    s.tenant("lab").await;
    let mut agent = s.sim_agent_at("net-1", "cpu-only", "192.0.2.1").await;
    let k = std::sync::Arc::new(Kumo::new());
    {
        let (k, url, token) = (k.clone(), s.url.clone(), s.admin_token.clone());
        tokio::task::spawn_blocking(move || {
            k.ok(&["login", "--server", &url, "--token", &token], None);
            k.ok(
                &[
                    "public-ip",
                    "pool",
                    "create",
                    "dev",
                    "--cidr",
                    "203.0.113.0/24",
                    "--gateway",
                    "203.0.113.1",
                ],
                None,
            );
            k.ok(
                &[
                    "template",
                    "create",
                    "ubuntu",
                    "--image",
                    "/var/lib/kumo/images/ubuntu.qcow2",
                    "--os",
                    "ubuntu-24.04",
                    "--default-user",
                    "ubuntu",
                ],
                None,
            );
            k.ok(
                &[
                    "segment",
                    "create",
                    "lan",
                    "--tenant",
                    "lab",
                    "--cidr",
                    "10.1.0.0/24",
                ],
                None,
            );
            k.ok(
                &[
                    "vm",
                    "create",
                    "web",
                    "--tenant",
                    "lab",
                    "--vcpus",
                    "1",
                    "--memory",
                    "1",
                    "--template",
                    "ubuntu",
                    "--network",
                    "lan=10.1.0.9",
                ],
                None,
            );
        })
        .await
        .unwrap();
    }
    agent.converge().await;
    tokio::task::spawn_blocking(move || {
        let show = || k.ok(&["vm", "show", "web", "--tenant", "lab"], None);
        let v = k.json(&["vm", "show", "web", "--tenant", "lab"], None);
        assert_eq!(v["state"], "running", "{v}");
        let mac = v["networks"][0]["mac"].as_str().unwrap().to_owned();
        let fake = FakeSsh::new();
        let ssh = |args: &[&str]| {
            let mut all = vec!["vm", "ssh", "web", "--tenant", "lab"];
            all.extend(args);
            k.run_env(&all, None, &[("PATH", fake.path.as_str())])
        };

        // No public address yet: show says how to get one, ssh refuses.
        let shown = show();
        let row = shown
            .lines()
            .find(|l| l.starts_with("lan "))
            .unwrap_or_else(|| panic!("no network row: {shown}"));
        assert!(
            row.contains("10.1.0.9") && row.contains(&mac),
            "segment, address and MAC: {shown}"
        );
        assert!(shown.contains("Public:  none\n"), "{shown}");
        assert!(
            shown.contains(
                "SSH:     no public address; give it a public address: \
                 kumo public-ip allocate --tenant lab, then \
                 kumo public-ip attach ADDRESS --tenant lab --vm web"
            ),
            "{shown}"
        );
        let out = ssh(&[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.starts_with("kumo: web has no public address to reach it at\n"),
            "{err}"
        );
        assert!(
            err.lines().last().unwrap().starts_with(
                "hint: give it a public address: kumo public-ip allocate --tenant lab"
            ),
            "{err}"
        );
        assert_eq!(fake.took(), None, "ssh did not run");

        // A floating address: ssh to it as the template's user.
        let ip = k.json(&["public-ip", "allocate", "--tenant", "lab"], None)["address"]
            .as_str()
            .unwrap()
            .to_owned();
        k.ok(
            &["public-ip", "attach", &ip, "--tenant", "lab", "--vm", "web"],
            None,
        );
        let shown = show();
        let row = shown.lines().find(|l| l.starts_with("lan ")).unwrap();
        assert!(row.contains(&ip), "the public column: {shown}");
        assert!(
            shown.contains(&format!("Public:  {ip} (floating, to 10.1.0.9 on lan)\n")),
            "{shown}"
        );
        assert!(
            shown.contains(&format!("SSH:     ssh ubuntu@{ip}\n")),
            "{shown}"
        );
        let out = ssh(&["--", "-L", "8888:localhost:8888", "nvidia-smi"]);
        assert_eq!(
            out.status.code(),
            Some(7),
            "ssh's exit code is kumo's: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            fake.took().unwrap(),
            [
                format!("ubuntu@{ip}"),
                "-L".into(),
                "8888:localhost:8888".into(),
                "nvidia-smi".into()
            ]
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with("fake ssh: "),
            "ssh has the terminal"
        );

        // A port forward to port 22 instead: -p, and --user wins.
        k.ok(&["public-ip", "detach", &ip, "--tenant", "lab"], None);
        k.ok(
            &[
                "port-forward",
                "create",
                "--tenant",
                "lab",
                "--public",
                &format!("{ip}:2222/tcp"),
                "--to",
                "web:22",
            ],
            None,
        );
        let shown = show();
        assert!(
            shown.contains(&format!(
                "Public:  {ip}:2222/tcp → 22 (forward, to 10.1.0.9 on lan)\n"
            )),
            "{shown}"
        );
        assert!(
            shown.contains(&format!("SSH:     ssh -p 2222 ubuntu@{ip}\n")),
            "{shown}"
        );
        let out = ssh(&["--user", "root"]);
        assert_eq!(out.status.code(), Some(7));
        assert_eq!(
            fake.took().unwrap(),
            ["-p".to_owned(), "2222".into(), format!("root@{ip}")]
        );
    })
    .await
    .unwrap();
    s.stop().await;
}

/// Errors keep the server's problem and end with one line saying what
/// to do about them.
#[tokio::test]
async fn errors_end_with_a_hint() {
    let s = TestServer::start(Backend::Sqlite).await;
    s.tenant("lab").await;
    s.bare_tenant("tight").await;
    let _agent = s.sim_agent("cpu-1", "cpu-only").await;
    let (_, ben_token) = s.user("ben").await;
    s.add("lab", "ben", kumo_api_types::Role::Viewer).await;
    let (url, token) = (s.url.clone(), s.admin_token.clone());
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    tokio::task::spawn_blocking(move || {
        let k = Kumo::new();
        let fails = |args: &[&str], token: &str| -> (String, String) {
            let mut all = vec!["--server", url.as_str()];
            all.extend(args);
            let (ok, _, err) = k.run(&all, Some(token));
            assert!(!ok, "{args:?} failed");
            let hint = err
                .lines()
                .last()
                .and_then(|l| l.strip_prefix("hint: "))
                .unwrap_or_else(|| panic!("{args:?}: no hint last: {err}"))
                .to_owned();
            (err, hint)
        };

        let (err, hint) = fails(&["vm", "show", "nosuch", "--tenant", "lab"], &token);
        assert!(
            err.starts_with("kumo: Not found (HTTP 404)") && err.contains("[request "),
            "the problem's details stay: {err}"
        );
        assert_eq!(hint, "list them: kumo vm list --tenant lab");

        let (_, hint) = fails(&["tenant", "list"], "kumo_not-a-token");
        assert_eq!(hint, format!("sign in again: kumo login --server {url}"));

        let (err, hint) = fails(
            &["vm", "create", "train", "--tenant", "lab", "--vcpus", "1"],
            &ben_token,
        );
        assert!(err.contains("HTTP 403"), "{err}");
        assert!(hint.starts_with("ask a project owner of lab"), "{hint}");

        let (err, hint) = fails(&["vm", "create", "train", "--tenant", "tight"], &token);
        assert!(err.contains("Quota exceeded"), "{err}");
        assert!(
            hint.contains("see kumo quota show --tenant tight"),
            "{hint}"
        );

        let nowhere = format!("http://127.0.0.1:{closed}");
        let (ok, _, err) = k.run(&["--server", &nowhere, "tenant", "list"], Some(&token));
        assert!(!ok && err.contains("cannot reach"), "{err}");
        assert_eq!(
            err.lines().last(),
            Some(
                format!(
                    "hint: is the server running at {nowhere}? \
                     (to use another: kumo login --server URL)"
                )
                .as_str()
            ),
            "{err}"
        );
    })
    .await
    .unwrap();
    s.stop().await;
}

/// `--wait` shows a spinner with the VM's state and the time spent when
/// stderr is a terminal, and draws nothing elsewhere.
#[tokio::test]
async fn waits_show_progress_on_a_terminal_only() {
    use std::io::Read;
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let s = TestServer::start(Backend::Sqlite).await;
    s.tenant("lab").await;
    let mut agent = s.sim_agent("cpu-1", "cpu-only").await;
    let k = std::sync::Arc::new(Kumo::new());
    let args = |name: &'static str| -> Vec<String> {
        [
            "--server",
            s.url.as_str(),
            "vm",
            "create",
            name,
            "--tenant",
            "lab",
            "--vcpus",
            "1",
            "--memory",
            "1",
            "--wait",
            "-o",
            "json",
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect()
    };

    // Not a terminal: nothing drawn, and the answer is the VM as waited for.
    let token = s.admin_token.clone();
    let base = ["--server", s.url.as_str()];
    let with = |more: &[&str]| -> Vec<String> {
        base.iter().chain(more).map(|a| (*a).to_owned()).collect()
    };
    let (ok, out, err) = converging(&k, &token, &mut agent, args("quiet")).await;
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["state"], "running", "{v}");
    assert_eq!(err, "", "nothing drawn without a terminal");
    let stop = with(&["vm", "stop", "quiet", "--tenant", "lab", "--wait"]);
    let (ok, out, err) = converging(&k, &token, &mut agent, stop).await;
    assert!(ok, "{err}");
    assert_eq!((out.as_str(), err.as_str()), ("stop quiet: stopped\n", ""));
    let delete = with(&["vm", "delete", "quiet", "--tenant", "lab", "--wait"]);
    let (ok, out, err) = converging(&k, &token, &mut agent, delete).await;
    assert!(ok, "{err}");
    assert_eq!((out.as_str(), err.as_str()), ("Deleted quiet\n", ""));
    let show = with(&["vm", "show", "quiet", "--tenant", "lab"]);
    let (ok, _, err) = converging(&k, &token, &mut agent, show).await;
    assert!(!ok && err.contains("HTTP 404"), "gone: {err}");

    // A terminal: the spinner says what it waits for, the state, the time.
    let size = nix::pty::Winsize {
        ws_row: 24,
        ws_col: 120,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&size), None).unwrap();
    let mut child = Command::new(crate::harness::bin("kumo"))
        .args(args("loud"))
        .env_clear()
        .env("HOME", k.home.path())
        .env("KUMO_TOKEN", &s.admin_token)
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::from(pty.slave)))
        .spawn()
        .unwrap();
    let mut master = std::fs::File::from(pty.master);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        // EIO once the command has exited.
        while let Ok(n @ 1..) = master.read(&mut buf) {
            if tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    // The host brings the VM up only once the spinner has shown its
    // state and a second spent.
    let mut shown = String::new();
    let spinning = |shown: &str| {
        ["pending", "scheduled", "provisioning"]
            .iter()
            .any(|st| shown.contains(&format!("waiting for loud to run: {st} [")))
            && shown.contains("[1s]")
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !spinning(&shown) && Instant::now() < deadline {
        if let Ok(b) = rx.try_recv() {
            shown.push_str(&String::from_utf8_lossy(&b));
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert!(
        spinning(&shown),
        "the spinner shows the state and the time spent: {shown:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "kumo vm create --wait hangs");
        agent.converge().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(status.success(), "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["state"], "running", "the answer on stdout: {v}");
    s.stop().await;
}

/// `kumo ARGS` (without a terminal) while the simulated host makes what
/// the server wants so, until kumo is done.
async fn converging(
    k: &std::sync::Arc<Kumo>,
    token: &str,
    agent: &mut crate::harness::SimAgent,
    args: Vec<String>,
) -> (bool, String, String) {
    let run = {
        let (k, token) = (k.clone(), token.to_owned());
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            k.run(&args, Some(&token))
        })
    };
    while !run.is_finished() {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        agent.converge().await;
    }
    run.await.unwrap()
}
