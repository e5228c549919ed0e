//! `kumo-server dev`, then the README's commands with the real `kumo`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::harness::{bin, scratch, DevServer};

/// `kumo-server dev` on `data`, with 3 hosts; answers it and its URL.
fn start_dev(data: &std::path::Path) -> (DevServer, String) {
    start_dev_with(data, 3)
}

/// `kumo-server dev` on `data` with `hosts` hosts.
pub fn start_dev_with(data: &std::path::Path, hosts: usize) -> (DevServer, String) {
    start_dev_args(data, &["--hosts".as_ref(), hosts.to_string().as_ref()])
}

/// `kumo-server dev` on `data` with `args`.
pub fn start_dev_args(data: &std::path::Path, args: &[&std::ffi::OsStr]) -> (DevServer, String) {
    let mut server = Command::new(bin("kumo-server"))
        .arg("dev")
        .args(args)
        .args(["--listen", "127.0.0.1:0", "--log-format", "text"])
        .arg("--data-dir")
        .arg(data)
        .env("KUMO_LOG", "warn")
        .stdout(Stdio::piped())
        // Its log beside the data directory, for a failing test to show.
        .stderr(std::fs::File::create(data.with_file_name("dev.log")).unwrap())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(server.stdout.take().unwrap());
    let (url, said) = crate::harness::announced_url(&mut out);
    let url = url.unwrap_or_else(|| {
        let log = std::fs::read_to_string(data.with_file_name("dev.log")).unwrap_or_default();
        panic!(
            "dev server did not start on {}: {said:?}\n{log}",
            data.display()
        )
    });
    // Keep reading: the banner goes on after the address, and a closed
    // pipe would kill the server at its next line (EPIPE).
    std::thread::spawn(move || {
        let mut sink = String::new();
        while out.read_line(&mut sink).is_ok_and(|n| n > 0) {
            sink.clear();
        }
    });
    (DevServer(server), url)
}

#[test]
fn dev_fleet_runs_an_8_gpu_vm_from_the_cli() {
    let data = scratch();
    let (mut server, url) = start_dev(data.path());

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
    // Three hosts, their underlay, the provider network, and the VM's
    // stand-in guest; no edge yet counted (it may or may not be made).
    let fixed = |ns: &Vec<String>| {
        ns.iter()
            .filter(|n| !n.contains("-kedge") && !n.contains("-g"))
            .count()
    };
    assert_eq!(fixed(&namespaces()), 5, "{:?}", namespaces());

    // The fleet's network, for people and scripts.
    let net: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(data.path().join("fleet/network.json")).unwrap(),
    )
    .unwrap();
    let hosts = net["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 3, "{net}");
    for h in hosts {
        assert!(h["namespace"].as_str().unwrap().starts_with(&prefix), "{h}");
        assert!(h["underlay_ip"].as_str().unwrap().starts_with("198.18."));
    }
    assert_eq!(hosts[0]["edge_uplink"], "up0", "{net}");
    assert_eq!(net["pool"]["name"], "dev");
    assert_eq!(net["pool"]["cidr"], "203.0.113.0/24");
    let wan = net["wan"]["namespace"].as_str().unwrap().to_owned();
    let client = net["wan"]["client_address"].as_str().unwrap().to_owned();

    // The README's walk-through: a public address on the VM, port 22
    // opened, and the VM answers the outside through it.
    kumo(&[
        "segment",
        "ingress",
        "lab-net",
        "--tenant",
        "demo",
        "--allow",
        "tcp:22:0.0.0.0/0",
    ]);
    let allocate = || -> String {
        let ip: serde_json::Value = serde_json::from_str(&kumo(&[
            "public-ip",
            "allocate",
            "--tenant",
            "demo",
            "-o",
            "json",
        ]))
        .unwrap();
        ip["address"].as_str().unwrap().to_owned()
    };
    let fip = allocate();
    assert!(fip.starts_with("203.0.113."), "{fip}");
    kumo(&[
        "public-ip",
        "attach",
        &fip,
        "--tenant",
        "demo",
        "--vm",
        "web",
    ]);
    let reach = |addr: &str, port: u16| {
        let to = std::net::SocketAddr::from((addr.parse::<std::net::Ipv4Addr>().unwrap(), port));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let got =
                vxlan_manager::testbed::hello(&wan, to, std::time::Duration::from_millis(700));
            if let Some(said) = got.filter(|s| s.contains("demo/web")) {
                return said;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{addr}:{port} does not answer from {wan}; network.json: {}",
                std::fs::read_to_string(data.path().join("fleet/network.json")).unwrap()
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    };
    let said = reach(&fip, 22);
    assert!(said.contains("10.1.0.9"), "{said}");
    // A port forward on a second address reaches the same port.
    let second = allocate();
    kumo(&[
        "port-forward",
        "create",
        "--tenant",
        "demo",
        "--public",
        &format!("{second}:2222/tcp"),
        "--to",
        "web:22",
    ]);
    reach(&second, 2222);
    // The guest is listed with its namespace, the client address is the
    // wan namespace's own.
    let net: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(data.path().join("fleet/network.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(net["guests"][0]["vm"], "web", "{net}");
    assert_eq!(client, "203.0.113.200");

    maintenance_moves_a_vm_with_its_disk_and_repairs_a_member_away(&kumo);
    // The demo project may make volumes without a quota line first.
    kumo(&[
        "volume",
        "create",
        "scratch",
        "--tenant",
        "demo",
        "--size-gib",
        "10",
    ]);
    kumo(&["volume", "delete", "scratch", "--tenant", "demo"]);

    // SIGTERM takes the fleet down with the server.
    assert!(server.stop().success());
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

    // The same data directory starts again (its pool and tenant are
    // there already), with a network of its own.
    let (mut again, _) = start_dev(data.path());
    let net: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(data.path().join("fleet/network.json")).unwrap(),
    )
    .unwrap();
    assert!(
        net["wan"]["namespace"]
            .as_str()
            .unwrap()
            .starts_with(&format!("kumo-dev-{}-", again.id())),
        "{net}"
    );
    assert!(again.stop().success());
}

/// Issue 41 on the dev fleet: a window on the host of a shelvable VM and
/// a cluster member; when it opens the VM runs on another host with its
/// disk, the member is replaced elsewhere, and the host is `maintenance`
/// until it is done.
fn maintenance_moves_a_vm_with_its_disk_and_repairs_a_member_away(
    kumo: &dyn Fn(&[&str]) -> String,
) {
    let json = |args: &[&str]| -> serde_json::Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&kumo(&a)).unwrap()
    };
    let until = |what: &str, f: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !f() {
            assert!(std::time::Instant::now() < deadline, "timed out: {what}");
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
    };
    // CPU-only members and a CPU-only VM: best fit packs them onto the
    // fullest host, beside `web` (the dev hosts' GPU designs differ in
    // their NICs, so an 8-GPU cluster could not be rail-aligned over two).
    kumo(&[
        "cluster", "create", "pair", "--tenant", "demo", "--size", "2", "--vcpus", "2",
    ]);
    let cluster = || json(&["cluster", "show", "pair", "--tenant", "demo"]);
    let running = |c: &serde_json::Value| {
        c["members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["state"] == "running")
    };
    until("the cluster running", &|| running(&cluster()));
    let mover = json(&[
        "vm", "create", "mover", "--tenant", "demo", "--vcpus", "2", "--wait",
    ]);
    assert_eq!(mover["state"], "running", "{mover}");
    let target = mover["host"].as_str().unwrap().to_owned();
    let members_on = |c: &serde_json::Value, h: &str| -> Vec<String> {
        c["members"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["host"] == h)
            .map(|m| m["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let moved_member = members_on(&cluster(), &target);
    assert!(
        !moved_member.is_empty(),
        "mover went beside a member: {}",
        cluster()
    );
    let at = (chrono::Utc::now() + chrono::Duration::seconds(3))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    kumo(&[
        "host",
        "maintenance",
        &target,
        "--at",
        &at,
        "--reason",
        "dev walk",
    ]);
    let told = json(&["vm", "show", "mover", "--tenant", "demo"]);
    assert_eq!(told["scheduled_events"][0]["action"], "evacuate", "{told}");
    until("the mover running elsewhere with its disk", &|| {
        let v = json(&["vm", "show", "mover", "--tenant", "demo"]);
        v["state"] == "running" && v["host"].as_str().is_some_and(|h| h != target)
    });
    until("the member replaced elsewhere", &|| {
        let c = cluster();
        running(&c) && c["health"] == "healthy" && members_on(&c, &target).is_empty()
    });
    let hosts = json(&["host", "list"]);
    let host = hosts
        .as_array()
        .or(hosts["items"].as_array())
        .unwrap()
        .iter()
        .find(|h| h["name"] == target.as_str())
        .unwrap()
        .clone();
    assert_eq!(host["state"], "maintenance", "{host}");
    kumo(&["host", "maintenance", &target, "--done"]);
    kumo(&["cluster", "delete", "pair", "--tenant", "demo"]);
    kumo(&["vm", "delete", "mover", "--tenant", "demo"]);
}

/// Whether `pid` still runs (a zombie waiting for its reaper does not).
fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

fn namespaces_of(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("{prefix}-")))
                .collect()
        })
        .unwrap_or_default()
}

/// A dev fleet's agents die with its server even when it is killed; a
/// second `dev` on the same data directory refuses while the first runs
/// and, once it is gone, removes the namespaces it left before starting.
#[test]
fn a_killed_dev_fleet_takes_its_agents_along_and_the_next_clears_the_rest() {
    let data = scratch();
    let (mut first, _) = start_dev(data.path());
    let owner: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.path().join("fleet/owner.json")).unwrap())
            .unwrap();
    assert_eq!(owner["server_pid"].as_u64(), Some(u64::from(first.id())));
    let agents: Vec<u64> = owner["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    assert_eq!(agents.len(), 3);
    assert!(agents.iter().all(|p| alive(*p)));
    let prefix = owner["prefix"].as_str().unwrap().to_owned();

    let second = Command::new(bin("kumo-server"))
        .args(["dev", "--hosts", "1", "--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(data.path())
        .env("KUMO_LOG", "error")
        .output()
        .unwrap();
    assert!(!second.status.success());
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(
        said.contains(&format!(
            "another kumo-server dev (pid {}) runs",
            first.id()
        )),
        "{said}"
    );

    first.0.kill().unwrap();
    first.0.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while agents.iter().any(|p| alive(*p)) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        agents.iter().all(|p| !alive(*p)),
        "the agents outlived their server"
    );
    let root = is_root();
    if root {
        assert!(
            !namespaces_of(&prefix).is_empty(),
            "a killed server leaves its namespaces"
        );
    }

    let (mut next, _) = start_dev(data.path());
    assert!(
        namespaces_of(&prefix).is_empty(),
        "{:?}",
        namespaces_of(&prefix)
    );
    assert!(next.stop().success());
}

pub(crate) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// `./x start`'s terminal at its defaults (human lines, no `-v`): the
/// start-up, the banner, a user's action and 10 s of a running fleet fit an
/// 80×24 terminal — no line over 80 columns, at most 24 lines before the
/// action, heartbeats and polls not shown, the action's one line shown.
#[tokio::test]
async fn the_dev_terminal_fits_80_by_24() {
    let data = scratch();
    let log_path = data.path().join("terminal.txt");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut server = crate::harness::DevServer(
        Command::new(bin("kumo-server"))
            .args(["dev", "--hosts", "4", "--listen", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(data.path().join("kumo"))
            .env_remove("KUMO_LOG")
            .env_remove("KUMO_LOG_FORMAT")
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap(),
    );
    let read = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !read().contains("Ctrl-C stops.") {
        assert!(
            std::time::Instant::now() < deadline,
            "no banner: {}",
            read()
        );
        assert!(
            server.0.try_wait().unwrap().is_none(),
            "dev exited: {}",
            read()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let started = read();
    let url = started
        .lines()
        .find_map(|l| l.split("listening on ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address: {started}"))
        .to_owned();
    let token = std::fs::read_to_string(data.path().join("kumo/admin-token")).unwrap();
    let made = reqwest::Client::new()
        .post(format!("{url}/api/v1/tenants/demo/vms"))
        .bearer_auth(token.trim())
        .json(&serde_json::json!({"name": "seen", "gpus": 1}))
        .send()
        .await
        .unwrap();
    let status = made.status();
    assert_eq!(status, 201, "{}", made.text().await.unwrap_or_default());
    tokio::time::sleep(std::time::Duration::from_secs(10)).await;
    let all = read();
    let before_action = started.lines().count();
    assert!(
        before_action <= 24,
        "{before_action} lines before the first action:\n{started}"
    );
    let wide: Vec<&str> = all.lines().filter(|l| l.chars().count() > 80).collect();
    assert!(wide.is_empty(), "lines over 80 columns: {wide:#?}");
    let after: Vec<&str> = all.lines().skip(before_action).collect();
    assert!(
        after.iter().any(|l| l.contains("admin vm.create seen")),
        "the action's line: {after:#?}"
    );
    assert!(
        after.len() <= 3,
        "10 s of a running fleet and one action should say little: {after:#?}"
    );
    assert!(
        !all.contains("heartbeat") && !all.contains("/agent/v1/"),
        "heartbeats and polls only with -v: {all}"
    );
}
