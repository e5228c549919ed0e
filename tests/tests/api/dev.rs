//! `kumo-server dev`, then the README's commands with the real `kumo`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::harness::{bin, scratch};

#[test]
fn dev_fleet_runs_an_8_gpu_vm_from_the_cli() {
    let data = scratch();
    let mut server = Command::new(bin("kumo-server"))
        .args([
            "dev",
            "--hosts",
            "3",
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "text",
        ])
        .arg("--data-dir")
        .arg(data.path())
        .env("KUMO_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(server.stdout.take().unwrap());
    let mut url = String::new();
    for _ in 0..20 {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if let Some(rest) = line.strip_prefix("Kumo API listening on ") {
            url = rest.split_whitespace().next().unwrap().to_owned();
            break;
        }
    }
    assert!(!url.is_empty(), "dev server did not start");
    let home = tempfile::tempdir().unwrap();
    let kumo = |args: &[&str]| {
        let o = Command::new(bin("kumo"))
            .args(args)
            .env("HOME", home.path())
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "kumo {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    };
    let token = std::fs::read_to_string(data.path().join("admin-token")).unwrap();
    kumo(&["login", "--server", &url, "--token", token.trim()]);
    let hosts = kumo(&["host", "list"]);
    assert_eq!(
        hosts.lines().filter(|l| l.contains(" ready ")).count(),
        3,
        "{hosts}"
    );
    let created = kumo(&[
        "vm", "create", "demo", "--tenant", "demo", "--gpus", "8", "--wait",
    ]);
    assert!(created.contains("State:   running"), "{created}");
    let topo = kumo(&["vm", "topology", "demo", "--tenant", "demo"]);
    assert!(
        topo.starts_with("<system version=\"1\">") && topo.contains("<nvlink"),
        "{topo}"
    );
    let shown: serde_json::Value = serde_json::from_str(&kumo(&[
        "vm", "show", "demo", "--tenant", "demo", "-o", "json",
    ]))
    .unwrap();
    assert_eq!(shown["placement"]["gpus"].as_array().unwrap().len(), 8);
    // The demo has prices and points: the VM's first minute is charged.
    let points: serde_json::Value =
        serde_json::from_str(&kumo(&["points", "show", "--tenant", "demo", "-o", "json"])).unwrap();
    assert_eq!(points["grants"][0]["amount"], "1000000", "{points}");
    kumo(&["vm", "delete", "demo", "--tenant", "demo"]);
    // As root each dev host has a network namespace and an underlay
    // address: a VM on a segment runs, its bridge in its host's namespace.
    kumo(&[
        "segment",
        "create",
        "lab-net",
        "--tenant",
        "demo",
        "--cidr",
        "10.1.0.0/24",
    ]);
    let web: serde_json::Value = serde_json::from_str(&kumo(&[
        "vm",
        "create",
        "web",
        "--tenant",
        "demo",
        "--network",
        "lab-net=10.1.0.9",
        "--vcpus",
        "2",
        "--wait",
        "-o",
        "json",
    ]))
    .unwrap();
    assert_eq!(web["state"], "running", "{web}");
    assert_eq!(web["networks"][0]["ip"], "10.1.0.9");
    let prefix = format!("kumo-dev-{}-", server.id());
    let namespaces = || -> Vec<String> {
        std::fs::read_dir("/run/netns")
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&prefix))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(namespaces().len(), 3, "{:?}", namespaces());

    // SIGTERM takes the fleet down with the server.
    Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    assert!(server.wait().unwrap().success());
    let left = Command::new("pgrep")
        .args(["-f", data.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "agents left running: {}",
        String::from_utf8_lossy(&left.stdout)
    );
    assert!(namespaces().is_empty(), "{:?}", namespaces());
}
