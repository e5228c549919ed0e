//! Reaching VMs and the internet through segment edges, on real kernel
//! networking: real `kumo-agent`s (libvirt `test:///`) for one VM host and
//! two edge hosts (`--edge-uplink up0`), VMs as namespaces on their host's
//! bridge with the API's MAC and address and a default route via the
//! gateway, and a `wan` namespace for the provider network (its router,
//! 203.0.113.1, is also the outside client).

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use kumo_api_types::{IngressRule, PublicIp, Segment, SegmentIngress, VmState};
use serde_json::json;
use vxlan_manager::testbed::{in_ns, ip, Fabric, PORT};

use crate::harness::{Backend, TestServer};
use crate::networks::start_agent;
use crate::segments::{seg, vm_on};

const WAN_ROUTER: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
/// Where the wan namespace answers with the address it was reached from.
const ECHO_PORT: u16 = 7001;

/// The provider network: a bridge in `wan` holding the router's address,
/// with a leg `up0` into each edge host.
fn provider_network(fab: &Fabric, edges: &[usize]) -> String {
    let wan = fab.ns("wan");
    ip(&["netns", "add", &wan]);
    ip(&["-n", &wan, "link", "set", "lo", "up"]);
    ip(&["-n", &wan, "link", "add", "pn", "type", "bridge"]);
    ip(&["-n", &wan, "link", "set", "pn", "up"]);
    ip(&[
        "-n",
        &wan,
        "addr",
        "add",
        &format!("{WAN_ROUTER}/24"),
        "dev",
        "pn",
    ]);
    for h in edges {
        let host = fab.host_ns(*h);
        let peer = format!("u{h}");
        ip(&[
            "link", "add", "up0", "netns", &host, "type", "veth", "peer", "name", &peer, "netns",
            &wan,
        ]);
        ip(&["-n", &wan, "link", "set", &peer, "master", "pn", "up"]);
        ip(&["-n", &host, "link", "set", "up0", "up"]);
    }
    // The outside's echo: it answers with the address it saw.
    let (tx, rx) = std::sync::mpsc::channel();
    in_ns(&wan, move || {
        let l = TcpListener::bind(("0.0.0.0", ECHO_PORT)).unwrap();
        tx.send(()).unwrap();
        for mut s in l.incoming().flatten() {
            let peer = s
                .peer_addr()
                .map(|a| a.ip().to_string())
                .unwrap_or_default();
            let _ = s.write_all(peer.as_bytes());
        }
    });
    rx.recv().unwrap();
    wan
}

/// What `to` answers a TCP connection from namespace `from`.
fn hello(from: &str, to: SocketAddr) -> Option<String> {
    vxlan_manager::testbed::hello(from, to, Duration::from_millis(700))
}

/// Waits until `from` gets `want` from `to`; answers how long that took.
async fn until_answer(from: &str, to: SocketAddr, want: Option<&str>, what: &str) -> Duration {
    let start = Instant::now();
    loop {
        let (f, t) = (from.to_owned(), to);
        let got = tokio::task::spawn_blocking(move || hello(&f, t))
            .await
            .unwrap();
        if got.as_deref() == want {
            return start.elapsed();
        }
        if start.elapsed() > Duration::from_secs(30) {
            panic!(
                "{what}: {from} → {to} answered {got:?}, not {want:?}\n{}",
                diagnosis(from)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the kernels hold, for a failure's message.
fn diagnosis(from: &str) -> String {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("ip")
            .args(args)
            .output()
            .unwrap();
        format!(
            "$ ip {}\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let mut out = run(&["-n", from, "neigh"]);
    out += &run(&["-n", from, "addr"]);
    let prefix = from.rsplit_once('-').map(|p| p.0).unwrap_or(from);
    let fab = Fabric {
        prefix: prefix.to_owned(),
        hosts: 0,
    };
    for h in 0..3 {
        let host = fab.host_ns(h);
        let fdb = std::process::Command::new("bridge")
            .args(["-n", &host, "fdb", "show"])
            .output()
            .unwrap();
        out += &format!(
            "$ bridge -n {host} fdb show\n{}",
            String::from_utf8_lossy(&fdb.stdout)
        );
    }
    for ns in edge_namespaces(&fab) {
        out += &run(&["-n", &ns, "addr"]);
        out += &run(&["-n", &ns, "route"]);
        out += &edge_rules(&ns);
    }
    std::mem::forget(fab);
    out
}

fn at(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::from((ip.parse::<Ipv4Addr>().unwrap(), port))
}

/// Waits until the tenant's VM runs, then puts its stand-in on its
/// host's bridge (the API's MAC and address, a default route via the
/// gateway); answers its address.
async fn plug_vm(s: &TestServer, fab: &Fabric, tenant: &str, name: &str, seg: &Segment) -> String {
    let v = loop {
        let v = s.admin.vm(tenant, name).await.unwrap();
        if v.state == VmState::Running {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let host: usize = v
        .host
        .as_deref()
        .unwrap()
        .trim_start_matches("net-")
        .parse()
        .unwrap();
    let nic = &v.networks[0];
    let bridge = format!("kbr{}", seg.vni);
    fab.add_vm(
        name,
        host,
        &nic.mac,
        &format!("{}/24", nic.ip),
        seg.mtu,
        &bridge,
    );
    ip(&[
        "-n",
        &fab.ns(name),
        "route",
        "add",
        "default",
        "via",
        &seg.gateway,
    ]);
    nic.ip.clone()
}

/// Edge namespaces and the rules in them, as the kernels hold them.
fn edge_namespaces(fab: &Fabric) -> Vec<String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&fab.prefix) && n.contains("-kedge"))
        .map(str::to_owned)
        .collect()
}

fn edge_rules(ns: &str) -> String {
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "nft",
            "list",
            "table",
            "ip",
            "kumo_edge",
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vms_reach_out_and_are_reached_through_their_edge() {
    let fab = Fabric::new(3);
    let wan = provider_network(&fab, &[1, 2]);
    let s = TestServer::start_with(Backend::Sqlite, |c| {
        c.heartbeat_timeout = Duration::from_secs(3);
    })
    .await;
    s.tenant("lab").await;
    let root = crate::harness::scratch();
    let join = s.join_token().await;
    let _vm_host = start_agent(&s, &fab, 0, "cpu-only", &join, root.path(), &[]);
    let mut edge_hosts: Vec<Option<crate::networks::Host>> = [1, 2]
        .into_iter()
        .map(|h| {
            Some(start_agent(
                &s,
                &fab,
                h,
                "cpu-only",
                &join,
                root.path(),
                &["--edge-uplink", "up0"],
            ))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.admin.list_hosts().await.unwrap().len() < 3 {
        assert!(Instant::now() < deadline, "agents did not register");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The VMs go to the VM host: the edge hosts are drained (which keeps
    // them carrying edges), so cutting an edge host cuts no VM.
    for h in ["net-1", "net-2"] {
        let _: serde_json::Value = s
            .admin
            .post(&format!("/api/v1/hosts/{h}/drain"), &json!({}))
            .await
            .unwrap();
    }
    // Bad pools change nothing: a tenant range, an overlap, a gateway
    // outside, a range outside.
    for bad in [
        json!({"name": "p1", "cidr": "10.200.0.0/24", "gateway": "10.200.0.1"}),
        json!({"name": "p2", "cidr": "203.0.113.0/24", "gateway": "198.51.100.1"}),
        json!({"name": "p3", "cidr": "203.0.113.0/24", "gateway": "203.0.113.1", "range": "203.0.114.1-203.0.114.9"}),
    ] {
        let e = s
            .admin
            .post::<_, serde_json::Value>("/api/v1/public-ip-pools", &bad)
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(400), "{bad}");
    }
    let _: kumo_api_types::PublicIpPool = s
        .admin
        .post(
            "/api/v1/public-ip-pools",
            &json!({"name": "dev", "cidr": "203.0.113.0/24", "gateway": "203.0.113.1",
                    "range": "203.0.113.10-203.0.113.99"}),
        )
        .await
        .unwrap();
    let e = s
        .admin
        .post::<_, serde_json::Value>(
            "/api/v1/public-ip-pools",
            &json!({"name": "dev2", "cidr": "203.0.113.128/25", "gateway": "203.0.113.129"}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(400), "pools never overlap");

    // A segment (egress on by default) and two VMs on the VM host.
    let lan: Segment = s
        .admin
        .post(
            "/api/v1/tenants/lab/segments",
            &seg("lan", kumo_api_types::SegmentKind::Ethernet, "10.1.0.0/24"),
        )
        .await
        .unwrap();
    assert!(lan.egress);
    let mut names = Vec::new();
    for name in ["vm-a", "vm-b"] {
        let v = s
            .admin
            .create_vm("lab", &vm_on(name, &[("lan", None)]))
            .await
            .unwrap();
        names.push(v.name.clone());
    }
    let mut addr = std::collections::BTreeMap::new();
    for name in &names {
        addr.insert(name.clone(), plug_vm(&s, &fab, "lab", name, &lan).await);
    }
    // Its edge is placed on an edge host with an egress address.
    let edge = loop {
        let seg = s.admin.segment("lab", "lan").await.unwrap();
        if let Some(e) = seg.edge.filter(|e| e.snat_address.is_some()) {
            break e;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let snat = edge.snat_address.clone().unwrap();
    let (vm_a, vm_b) = (fab.ns("vm-a"), fab.ns("vm-b"));

    // Egress: the outside sees the pool's egress address.
    let took = until_answer(
        &vm_a,
        SocketAddr::from((WAN_ROUTER, ECHO_PORT)),
        Some(&snat),
        "egress",
    )
    .await;
    eprintln!("egress flowing {took:?} after the edge was placed");

    // DNS at the gateway: a VM finds its neighbour by name.
    let etc = std::path::PathBuf::from("/etc/netns").join(&vm_b);
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::write(
        etc.join("resolv.conf"),
        format!("nameserver {}\n", lan.gateway),
    )
    .unwrap();
    let start = Instant::now();
    loop {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &vm_b, "getent", "hosts", "vm-a"])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        if said.split_whitespace().next() == Some(addr["vm-a"].as_str()) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "vm-a does not resolve: {said:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A floating address: reached from outside as the ingress rules allow
    // (none at first: nothing), and the VM leaves from it.
    let fip: PublicIp = s
        .admin
        .post("/api/v1/tenants/lab/public-ips", &json!({}))
        .await
        .unwrap();
    let attached: PublicIp = s
        .admin
        .post(
            &format!("/api/v1/tenants/lab/public-ips/{}/attach", fip.address),
            &json!({"vm": "vm-a"}),
        )
        .await
        .unwrap();
    assert_eq!(
        attached.attached.as_ref().map(|n| n.ip.as_str()),
        Some(addr["vm-a"].as_str())
    );
    until_answer(
        &vm_a,
        SocketAddr::from((WAN_ROUTER, ECHO_PORT)),
        Some(&fip.address),
        "floating egress",
    )
    .await;
    assert_eq!(
        hello(&wan, at(&fip.address, PORT)),
        None,
        "no ingress rule: nothing comes in"
    );
    let allow: IngressRule = format!("tcp:{PORT}:0.0.0.0/0").parse().unwrap();
    s.admin
        .set_segment_ingress("lab", "lan", &SegmentIngress { rules: vec![allow] })
        .await
        .unwrap();
    until_answer(
        &wan,
        at(&fip.address, PORT),
        Some("vm-a"),
        "floating address",
    )
    .await;
    // Hairpin: a neighbour reaches the VM through its public address.
    until_answer(&vm_b, at(&fip.address, PORT), Some("vm-a"), "hairpin").await;
    // A port the rules do not open stays shut from outside.
    assert_eq!(hello(&wan, at(&fip.address, PORT + 5)), None);

    // A port forward to the other VM; a second forward of the same port
    // and another tenant's address are refused.
    let pip: PublicIp = s
        .admin
        .post("/api/v1/tenants/lab/public-ips", &json!({}))
        .await
        .unwrap();
    let fwd = json!({"public_ip": pip.address, "protocol": "tcp", "public_port": 2222, "vm": "vm-b", "private_port": PORT});
    let _: kumo_api_types::PortForward = s
        .admin
        .post("/api/v1/tenants/lab/port-forwards", &fwd)
        .await
        .unwrap();
    let e = s
        .admin
        .post::<_, serde_json::Value>("/api/v1/tenants/lab/port-forwards", &fwd)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(409));
    s.tenant("other").await;
    let e = s
        .admin
        .post::<_, serde_json::Value>("/api/v1/tenants/other/port-forwards", &fwd)
        .await
        .unwrap_err();
    assert_eq!(
        e.status(),
        Some(404),
        "another tenant's address is not found"
    );
    let e = s
        .admin
        .post::<_, serde_json::Value>(
            &format!("/api/v1/tenants/lab/public-ips/{}/attach", pip.address),
            &json!({"vm": "vm-a"}),
        )
        .await
        .unwrap_err();
    assert_eq!(
        e.status(),
        Some(409),
        "an address with forwards is not a floating one"
    );
    until_answer(&wan, at(&pip.address, 2222), Some("vm-b"), "port forward").await;
    // The VMs show their public ways in.
    let a = s.admin.vm("lab", "vm-a").await.unwrap();
    assert_eq!(
        a.networks[0].public_ip.as_deref(),
        Some(fip.address.as_str())
    );
    assert_eq!(
        a.networks[0].ssh_command(Some("root")),
        Some(format!("ssh root@{}", fip.address))
    );
    let b = s.admin.vm("lab", "vm-b").await.unwrap();
    assert_eq!(b.networks[0].forwards.len(), 1);
    assert_eq!(b.networks[0].forwards[0].public_port, 2222);
    // So do the portal's pages: the segments page lists the project's
    // public addresses, what each is attached to, the forwards and each
    // segment's egress address; the VM page its ways in.
    let portal = s.portal_admin().await;
    let page = s.page(&portal, "/t/lab/segments").await;
    for want in [
        fip.address.clone(),
        format!("vm-a ({} on lan)", addr["vm-a"]),
        format!("{}:2222/tcp", pip.address),
        format!("vm-b ({} on lan):{PORT}", addr["vm-b"]),
        snat.clone(),
    ] {
        assert!(page.contains(&want), "{want} not on the page:\n{page}");
    }
    let page = s.page(&portal, "/t/lab/vms/vm-a").await;
    assert!(
        page.contains(&format!("ssh root@{}", fip.address))
            || page.contains(&format!("ssh {}", fip.address)),
        "{page}"
    );

    // Another tenant on the same addresses (10.1.0.0/24) with its own
    // edge and public address: each outside address reaches its own VM.
    let _ = s
        .admin
        .create_segment(
            "other",
            &seg("lan", kumo_api_types::SegmentKind::Ethernet, "10.1.0.0/24"),
        )
        .await
        .unwrap();
    let other = s.admin.segment("other", "lan").await.unwrap();
    let v = s
        .admin
        .create_vm("other", &vm_on("vm-c", &[("lan", None)]))
        .await
        .unwrap();
    assert_eq!(
        v.networks[0].ip, addr["vm-a"],
        "the same private address in both tenants"
    );
    plug_vm(&s, &fab, "other", "vm-c", &other).await;
    s.admin
        .set_segment_ingress(
            "other",
            "lan",
            &SegmentIngress {
                rules: vec![format!("tcp:{PORT}:0.0.0.0/0").parse().unwrap()],
            },
        )
        .await
        .unwrap();
    let cip: PublicIp = s
        .admin
        .post("/api/v1/tenants/other/public-ips", &json!({}))
        .await
        .unwrap();
    let _: PublicIp = s
        .admin
        .post(
            &format!("/api/v1/tenants/other/public-ips/{}/attach", cip.address),
            &json!({"vm": "vm-c"}),
        )
        .await
        .unwrap();
    until_answer(
        &wan,
        at(&cip.address, PORT),
        Some("vm-c"),
        "the other tenant's floating address",
    )
    .await;
    until_answer(
        &wan,
        at(&fip.address, PORT),
        Some("vm-a"),
        "ours, beside it",
    )
    .await;
    until_answer(
        &fab.ns("vm-c"),
        SocketAddr::from((WAN_ROUTER, ECHO_PORT)),
        Some(&cip.address),
        "its own egress",
    )
    .await;
    // A tenant's public address is another tenant's "not found".
    let e = s
        .admin
        .post::<_, serde_json::Value>(
            &format!("/api/v1/tenants/other/public-ips/{}/attach", fip.address),
            &json!({"vm": "vm-c"}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(404));
    s.admin.delete_vm("other", "vm-c").await.unwrap();
    fab.remove_vm("vm-c");

    // Failover: the edge host dies (its agent stops and its edge
    // namespace goes, as a dead host's would); the other takes the edge.
    // Where the edge is now, once it is in one place only: a host that
    // missed heartbeats under load may have lost it once, and the old
    // copy lingers until that host's next pass.
    let start = Instant::now();
    let (edge, first) = loop {
        let edge = s.admin.segment("lab", "lan").await.unwrap().edge.unwrap();
        let first: usize = edge.host.trim_start_matches("net-").parse().unwrap();
        let copies: Vec<String> = edge_namespaces(&fab)
            .into_iter()
            .filter(|n| n.ends_with(&format!("-kedge{}", lan.vni)))
            .collect();
        if copies.len() == 1 && copies[0].starts_with(&fab.host_ns(first)) {
            break (edge, first);
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{copies:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let cut = Instant::now();
    edge_hosts[first - 1] = None;
    for ns in edge_namespaces(&fab) {
        if ns.starts_with(&fab.host_ns(first)) {
            vxlan_manager::edge::stop_dns(&ns);
            // Its legs go first: a namespace outlives `netns del` while
            // any process is still inside (a command the killed agent
            // started), and its `wan` would answer meanwhile.
            let _ = std::process::Command::new("ip")
                .args(["-n", &ns, "link", "del", "wan"])
                .status();
            ip(&["netns", "del", &ns]);
        }
    }
    if hello(&wan, at(&pip.address, 2222)).is_some() {
        // Answered right after the cut: only possible through a copy on
        // the other host, i.e. the edge had moved already (its host missed
        // heartbeats under load between the check above and the cut).
        let now = s.admin.segment("lab", "lan").await.unwrap().edge.unwrap();
        assert_ne!(now.host, edge.host, "answered through the dead host's edge");
        eprintln!("edge failover: it had moved before the cut (not measured)");
    }
    until_answer(&wan, at(&pip.address, 2222), Some("vm-b"), "after failover").await;
    let failover = cut.elapsed();
    let moved = s.admin.segment("lab", "lan").await.unwrap().edge.unwrap();
    assert_ne!(moved.host, edge.host);
    until_answer(
        &wan,
        at(&fip.address, PORT),
        Some("vm-a"),
        "floating after failover",
    )
    .await;
    eprintln!(
        "edge failover: traffic flowing again {failover:?} after the cut (heartbeat timeout 3 s)"
    );

    // Deleting the VM takes its mapping everywhere at once; the address
    // stays the tenant's, unattached, and is reusable.
    s.admin.delete_vm("lab", "vm-a").await.unwrap();
    let start = Instant::now();
    loop {
        let ip: PublicIp = s
            .admin
            .get(&format!("/api/v1/tenants/lab/public-ips/{}", fip.address))
            .await
            .unwrap();
        let rules: String = edge_namespaces(&fab)
            .iter()
            .map(|n| edge_rules(n))
            .collect();
        if ip.attached.is_none() && !rules.contains(&addr["vm-a"]) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "stale: {ip:?}\n{rules}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // One edge per segment with egress (ours and the other tenant's), both
    // on the surviving edge host; none stale.
    let edges = edge_namespaces(&fab);
    assert_eq!(edges.len(), 2, "{edges:?}");
    assert!(
        edges.iter().all(|e| !e.starts_with(&fab.host_ns(first))),
        "{edges:?}"
    );
    let again: PublicIp = s
        .admin
        .post(
            &format!("/api/v1/tenants/lab/public-ips/{}/attach", fip.address),
            &json!({"vm": "vm-b"}),
        )
        .await
        .unwrap();
    assert_eq!(again.attached.map(|n| n.vm), Some("vm-b".to_owned()));
    // Releasing the forward's address takes the forward with it.
    s.admin
        .delete(&format!("/api/v1/tenants/lab/public-ips/{}", pip.address))
        .await
        .unwrap();
    let forwards: kumo_api_types::Page<kumo_api_types::PortForward> = s
        .admin
        .get("/api/v1/tenants/lab/port-forwards")
        .await
        .unwrap();
    assert!(forwards.items.is_empty());
    drop(edge_hosts);
    s.stop().await;
}

/// Every shared pool has a per-tenant limit: public addresses within the
/// `public_ips` quota, forwards per address bounded; what one tenant
/// holds is another's "not found".
#[tokio::test]
async fn public_addresses_hold_their_limits() {
    let s = TestServer::start(Backend::Sqlite).await;
    s.tenant("lab").await;
    s.tenant("other").await;
    let mut q = s.admin.quota("lab").await.unwrap();
    // The segment's egress address is one of the three.
    q.public_ips = 3;
    s.quota("lab", &q).await;
    let _agent = s.sim_agent_at("net-1", "cpu-only", "192.0.2.1").await;
    dev_pool(&s).await;
    let _ = s
        .admin
        .create_segment(
            "lab",
            &seg("lan", kumo_api_types::SegmentKind::Ethernet, "10.1.0.0/24"),
        )
        .await
        .unwrap();
    s.admin
        .create_vm("lab", &vm_on("vm-a", &[("lan", None)]))
        .await
        .unwrap();
    let a: PublicIp = s
        .admin
        .post("/api/v1/tenants/lab/public-ips", &json!({}))
        .await
        .unwrap();
    let _: PublicIp = s
        .admin
        .post("/api/v1/tenants/lab/public-ips", &json!({}))
        .await
        .unwrap();
    let e = s
        .admin
        .post::<_, PublicIp>("/api/v1/tenants/lab/public-ips", &json!({}))
        .await
        .unwrap_err();
    let p = e.problem().unwrap();
    assert_eq!(
        (p.kind.as_str(), p.resource.as_deref()),
        ("/problems/quota-exceeded", Some("public_ips"))
    );
    let limit = kumo_server::app::public_net::MAX_FORWARDS_PER_ADDRESS;
    for port in 0..limit {
        let _: kumo_api_types::PortForward = s
            .admin
            .post(
                "/api/v1/tenants/lab/port-forwards",
                &json!({"public_ip": a.address, "protocol": "tcp", "public_port": 10_000 + port, "vm": "vm-a", "private_port": 22}),
            )
            .await
            .unwrap();
    }
    let e = s
        .admin
        .post::<_, serde_json::Value>(
            "/api/v1/tenants/lab/port-forwards",
            &json!({"public_ip": a.address, "protocol": "udp", "public_port": 53, "vm": "vm-a", "private_port": 53}),
        )
        .await
        .unwrap_err();
    assert_eq!(
        e.problem().unwrap().resource.as_deref(),
        Some("port_forwards")
    );
    // Bad forwards: port 0, an address outside, another tenant's VM.
    for bad in [
        json!({"public_ip": a.address, "protocol": "tcp", "public_port": 0, "vm": "vm-a", "private_port": 22}),
        json!({"public_ip": "not-an-address", "protocol": "tcp", "public_port": 1, "vm": "vm-a", "private_port": 22}),
    ] {
        let e = s
            .admin
            .post::<_, serde_json::Value>("/api/v1/tenants/lab/port-forwards", &bad)
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(400), "{bad}");
    }
    let e = s
        .admin
        .post::<_, serde_json::Value>(
            "/api/v1/tenants/other/public-ips/203.0.113.2/attach",
            &json!({"vm": "vm-a"}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(404));
    // Released addresses go back to the pool, where they rest: the next
    // tenant gets another.
    s.admin
        .delete(&format!("/api/v1/tenants/lab/public-ips/{}", a.address))
        .await
        .unwrap();
    let again: PublicIp = s
        .admin
        .post("/api/v1/tenants/lab/public-ips", &json!({}))
        .await
        .unwrap();
    assert_ne!(again.address, a.address);
    s.stop().await;
}

/// The test's clock, which the tests below move by hand.
fn manual_clock(c: &mut kumo_server::config::Config) {
    c.clock = kumo_server::clock::Clock::manual(
        chrono::DateTime::from_timestamp(1_900_000_000, 0).unwrap(),
    );
}

/// A simulated edge host, so segments' edges (and their egress
/// addresses) show.
async fn sim_edge_host(s: &TestServer) -> crate::harness::SimAgent {
    let join = s.join_token().await;
    crate::harness::SimAgent::register_with(
        &s.url,
        kumo_api_types::AgentRegister {
            join_token: join,
            name: "edge-1".into(),
            topology: crate::harness::fixture_topology("cpu-only"),
            virt_type: "qemu".into(),
            scalable_unit: None,
            rails: Default::default(),
            underlay_ip: Some("192.0.2.9".parse().unwrap()),
            edge_uplink: Some("up0".into()),
            transfer_url: Some(crate::harness::SIM_TRANSFER_URL.into()),
        },
    )
    .await
}

/// The pool `dev`: 203.0.113.0/24 with its router at .1.
async fn dev_pool(s: &TestServer) {
    let _: kumo_api_types::PublicIpPool = s
        .admin
        .post(
            "/api/v1/public-ip-pools",
            &json!({"name": "dev", "cidr": "203.0.113.0/24", "gateway": "203.0.113.1"}),
        )
        .await
        .unwrap();
}

async fn allocate(s: &TestServer, tenant: &str) -> Result<String, kumo_cli::ClientError> {
    s.admin
        .post::<_, PublicIp>(&format!("/api/v1/tenants/{tenant}/public-ips"), &json!({}))
        .await
        .map(|ip| ip.address)
}

async fn release(s: &TestServer, tenant: &str, address: &str) {
    s.admin
        .delete(&format!("/api/v1/tenants/{tenant}/public-ips/{address}"))
        .await
        .unwrap();
}

fn segment(name: &str, cidr: &str, egress: bool) -> kumo_api_types::SegmentCreate {
    kumo_api_types::SegmentCreate {
        egress: Some(egress),
        ..seg(name, kumo_api_types::SegmentKind::Ethernet, cidr)
    }
}

/// A segment's egress address, once the edge shows it.
async fn egress_address(s: &TestServer, tenant: &str, segment: &str) -> Option<String> {
    let seg: Segment = s
        .admin
        .get(&format!("/api/v1/tenants/{tenant}/segments/{segment}"))
        .await
        .unwrap();
    seg.edge.and_then(|e| e.snat_address)
}

crate::harness::on_both_backends! {
    config = manual_clock;

    /// Allocating and releasing in a loop cannot put a pool to rest: a
    /// tenant keeps at most its `public_ips` quota of addresses resting,
    /// its longest-resting ones are free again past that.
    async fn a_tenant_puts_at_most_its_quota_of_addresses_to_rest(s: &TestServer) {
        s.tenant("other").await;
        s.bare_tenant("looper").await;
        s.quota("looper", &kumo_api_types::Quota { public_ips: 2, ..Default::default() }).await;
        let _: kumo_api_types::PublicIpPool = s
            .admin
            .post(
                "/api/v1/public-ip-pools",
                &json!({"name": "dev", "cidr": "203.0.113.0/24", "gateway": "203.0.113.1",
                        "range": "203.0.113.10-203.0.113.19"}),
            )
            .await
            .unwrap();
        for i in 0..25 {
            let a = allocate(s, "looper").await.unwrap_or_else(|e| panic!("round {i}: {e}"));
            release(s, "looper", &a).await;
        }
        // Ten addresses, two of them resting: the next tenant gets eight.
        for i in 0..8 {
            allocate(s, "other").await.unwrap_or_else(|e| panic!("address {i}: {e}"));
        }
        let e = allocate(s, "other").await.unwrap_err();
        let detail = e.problem().unwrap().detail.clone().unwrap_or_default();
        assert!(detail.contains("2 resting"), "{detail}");
    }

    /// A released public address (a tenant's, or a segment's egress
    /// address) rests a day before anyone gets it again, and then the
    /// least recently used goes first: traffic, DNS records and
    /// allowlists meant for its last holder fade before the next.
    async fn released_public_addresses_rest_and_go_least_recently_used(s: &TestServer) {
        let clock = s.server.state.config.clock.clone();
        let hour = chrono::Duration::hours(1);
        s.tenant("lab").await;
        s.tenant("next").await;
        let _edge = sim_edge_host(s).await;
        let _: kumo_api_types::PublicIpPool = s
            .admin
            .post(
                "/api/v1/public-ip-pools",
                &json!({"name": "dev", "cidr": "203.0.113.0/24", "gateway": "203.0.113.1",
                        "range": "203.0.113.10-203.0.113.13"}),
            )
            .await
            .unwrap();
        // A segment's egress address goes back when the segment goes, and
        // rests: the next tenant's address is another.
        let _: Segment = s
            .admin
            .post("/api/v1/tenants/lab/segments", &segment("lan", "10.1.0.0/24", true))
            .await
            .unwrap();
        assert_eq!(egress_address(s, "lab", "lan").await.as_deref(), Some("203.0.113.10"));
        s.admin.delete_segment("lab", "lan").await.unwrap();
        assert_eq!(allocate(s, "next").await.unwrap(), "203.0.113.11");
        // A tenant's address given back rests too (.10 went at 0 h, .11
        // goes at 1 h).
        clock.advance(hour);
        release(s, "next", "203.0.113.11").await;
        assert_eq!(allocate(s, "next").await.unwrap(), "203.0.113.12");
        // So does one a segment's egress switch gives back.
        let _: Segment = s
            .admin
            .post("/api/v1/tenants/lab/segments", &segment("wan", "10.2.0.0/24", true))
            .await
            .unwrap();
        assert_eq!(egress_address(s, "lab", "wan").await.as_deref(), Some("203.0.113.13"));
        clock.advance(hour);
        let off: Segment = s
            .admin
            .patch("/api/v1/tenants/lab/segments/wan", &json!({"egress": false}))
            .await
            .unwrap();
        assert!(!off.egress);
        // Every address is held or resting: none to give, and the
        // refusal says why.
        let e = allocate(s, "next").await.unwrap_err();
        let p = e.problem().unwrap();
        assert_eq!((p.status, p.kind.as_str()), (409, "/problems/insufficient-capacity"));
        let detail = p.detail.clone().unwrap_or_default();
        assert!(detail.contains("\"dev\"") && detail.contains("3 resting"), "{detail}");

        // A day after the first release (at 24 h) only .10 has rested;
        // an hour later .11 too.
        clock.advance(chrono::Duration::hours(22));
        assert_eq!(allocate(s, "next").await.unwrap(), "203.0.113.10");
        assert!(allocate(s, "next").await.is_err(), ".11 rests another hour");
        clock.advance(hour);
        assert_eq!(allocate(s, "next").await.unwrap(), "203.0.113.11");

        // Least recently used, not lowest: given back in the order .12,
        // .10, .11 (at 25, 26 and 27 h), they come back in that order
        // once rested, after .13 (the egress address, given back at 2 h).
        for a in ["203.0.113.12", "203.0.113.10", "203.0.113.11"] {
            release(s, "next", a).await;
            clock.advance(hour);
        }
        clock.advance(chrono::Duration::hours(24));
        let mut order = Vec::new();
        for _ in 0..4 {
            order.push(allocate(s, "lab").await.unwrap());
        }
        assert_eq!(
            order,
            ["203.0.113.13", "203.0.113.12", "203.0.113.10", "203.0.113.11"]
        );
    }

    /// Egress addresses count against the tenant's `public_ips` quota, and
    /// a segment never sits silently without one: where none can be had
    /// its create or egress switch is refused with the reason, and one
    /// whose address comes later says why in its `faults` until it has it.
    async fn a_full_pool_or_quota_refuses_egress_and_says_why(s: &TestServer) {
        let clock = s.server.state.config.clock.clone();
        for t in ["alpha", "beta", "gamma"] {
            s.tenant(t).await;
        }
        let mut q = s.admin.quota("alpha").await.unwrap();
        q.public_ips = 2;
        s.quota("alpha", &q).await;
        q.public_ips = 0;
        s.quota("gamma", &q).await;
        let _edge = sim_edge_host(s).await;
        // Before any pool exists the platform offers no egress: a segment
        // is made (as ever), and gets an address once a pool comes,
        // within its quota.
        let _: Segment = s
            .admin
            .post("/api/v1/tenants/gamma/segments", &segment("net-c1", "10.3.0.0/24", true))
            .await
            .unwrap();
        let _: kumo_api_types::PublicIpPool = s
            .admin
            .post(
                "/api/v1/public-ip-pools",
                &json!({"name": "small", "cidr": "203.0.113.0/24", "gateway": "203.0.113.1",
                        "range": "203.0.113.10-203.0.113.12"}),
            )
            .await
            .unwrap();

        // Tenant alpha, quota 2: a segment's egress address and a floating
        // address, and nothing more of either kind.
        let _: Segment = s
            .admin
            .post("/api/v1/tenants/alpha/segments", &segment("net-a1", "10.1.0.0/24", true))
            .await
            .unwrap();
        assert!(egress_address(s, "alpha", "net-a1").await.is_some());
        allocate(s, "alpha").await.unwrap();
        let quota = |e: kumo_cli::ClientError| {
            let p = e.problem().unwrap().clone();
            assert_eq!(
                (p.status, p.kind.as_str(), p.resource.as_deref()),
                (409, "/problems/quota-exceeded", Some("public_ips")),
                "{p:?}"
            );
        };
        quota(allocate(s, "alpha").await.unwrap_err());
        quota(
            s.admin
                .post::<_, Segment>("/api/v1/tenants/alpha/segments", &segment("net-a2", "10.1.1.0/24", true))
                .await
                .unwrap_err(),
        );
        let _: Segment = s
            .admin
            .post("/api/v1/tenants/alpha/segments", &segment("net-a2", "10.1.1.0/24", false))
            .await
            .unwrap();
        quota(
            s.admin
                .patch::<_, Segment>("/api/v1/tenants/alpha/segments/net-a2", &json!({"egress": true}))
                .await
                .unwrap_err(),
        );
        let a2: Segment = s.admin.get("/api/v1/tenants/alpha/segments/net-a2").await.unwrap();
        assert!(!a2.egress && a2.faults.is_empty(), "refused: nothing changed");
        let held = kumo_server::store::public_net::count_of_tenant(s.db(), tenant_id(s, "alpha").await)
            .await
            .unwrap();
        assert_eq!(held, 2, "never more than its quota");

        // Tenant gamma, quota 0: its segment from before the pool has no
        // address, and says why.
        let c1: Segment = s.admin.get("/api/v1/tenants/gamma/segments/net-c1").await.unwrap();
        assert_eq!(c1.edge.as_ref().and_then(|e| e.snat_address.clone()), None);
        let fault = c1.faults.first().map(|f| f.message.clone()).unwrap_or_default();
        assert!(fault.contains("egress has no public address") && fault.contains("quota is 0"), "{fault}");

        // Tenant beta takes the pool's last address; then the pool is empty.
        let _: Segment = s
            .admin
            .post("/api/v1/tenants/beta/segments", &segment("net-b1", "10.2.0.0/24", true))
            .await
            .unwrap();
        assert_eq!(egress_address(s, "beta", "net-b1").await.as_deref(), Some("203.0.113.12"));
        let full = |e: kumo_cli::ClientError| {
            let p = e.problem().unwrap().clone();
            assert_eq!((p.status, p.kind.as_str()), (409, "/problems/insufficient-capacity"), "{p:?}");
            let detail = p.detail.unwrap_or_default();
            assert!(detail.contains("\"small\"") && detail.contains("out of addresses"), "{detail}");
        };
        full(
            s.admin
                .post::<_, Segment>("/api/v1/tenants/beta/segments", &segment("net-b2", "10.2.1.0/24", true))
                .await
                .unwrap_err(),
        );
        let e = s.admin.segment("beta", "net-b2").await.unwrap_err();
        assert_eq!(e.status(), Some(404), "a refused create leaves nothing");
        let _: Segment = s
            .admin
            .post("/api/v1/tenants/beta/segments", &segment("net-b2", "10.2.1.0/24", false))
            .await
            .unwrap();
        full(
            s.admin
                .patch::<_, Segment>("/api/v1/tenants/beta/segments/net-b2", &json!({"egress": true}))
                .await
                .unwrap_err(),
        );
        full(allocate(s, "beta").await.unwrap_err());

        // With room in gamma's quota, c1's fault names the empty pool; an
        // address alpha gives back rests, so it stays empty for a day.
        q.public_ips = 5;
        s.quota("gamma", &q).await;
        let ip: kumo_api_types::Page<PublicIp> = s.admin.get("/api/v1/tenants/alpha/public-ips").await.unwrap();
        release(s, "alpha", &ip.items[0].address).await;
        let c1: Segment = s.admin.get("/api/v1/tenants/gamma/segments/net-c1").await.unwrap();
        let fault = c1.faults.first().map(|f| f.message.clone()).unwrap_or_default();
        assert!(
            fault.contains("\"small\"") && fault.contains("out of addresses") && fault.contains("1 resting"),
            "{fault}"
        );
        assert_eq!(c1.faults[0].host, "edge-1", "named by its edge host");
        // Once rested, the edge keeper gives it to c1 and the fault goes.
        clock.advance(chrono::Duration::hours(24));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let c1 = loop {
            let c1: Segment = s.admin.get("/api/v1/tenants/gamma/segments/net-c1").await.unwrap();
            if c1.edge.as_ref().is_some_and(|e| e.snat_address.is_some()) {
                break c1;
            }
            assert!(std::time::Instant::now() < deadline, "c1 was never given its address: {c1:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(c1.faults.is_empty(), "{:?}", c1.faults);
    }
}

async fn tenant_id(s: &TestServer, name: &str) -> uuid::Uuid {
    let t: kumo_api_types::Tenant = s
        .admin
        .get(&format!("/api/v1/tenants/{name}"))
        .await
        .unwrap();
    t.id
}

crate::harness::on_both_backends! {
    config = |_| {};
    /// `public_ip: true` (`kumo vm create --public-ip`): one request makes
    /// the VM, attaches a fresh floating address to its NIC and opens SSH
    /// on its segment (once: a rule already opening 22 is kept as it is).
    /// Without a network it is refused; with no address left it is refused
    /// before anything is made, and the VM's own failure gives the address
    /// back.
    async fn one_request_makes_a_vm_reachable_by_ssh(s: &TestServer) {
        s.tenant("lab").await;
        let mut q = s.admin.quota("lab").await.unwrap();
        // The segment's egress address and one floating address.
        q.public_ips = 2;
        s.quota("lab", &q).await;
        let _edge = sim_edge_host(s).await;
        dev_pool(s).await;
        let _: Segment = s.admin.post("/api/v1/tenants/lab/segments", &segment("lan", "10.1.0.0/24", true)).await.unwrap();
        // No network: nothing to attach to.
        let bare = kumo_api_types::VmCreate { public_ip: true, ..vm_on("bare", &[]) };
        let e = s.admin.create_vm("lab", &bare).await.unwrap_err();
        let p = e.problem().unwrap();
        assert_eq!((p.status, p.errors[0].field.as_str()), (400, "public_ip"), "{p:?}");

        let req = kumo_api_types::VmCreate { public_ip: true, ..vm_on("reachable", &[("lan", None)]) };
        let v = s.admin.create_vm("lab", &req).await.unwrap();
        let nic = &v.networks[0];
        let address = nic.public_ip.clone().expect("a floating address on its NIC");
        let ip: PublicIp = s.admin.get(&format!("/api/v1/tenants/lab/public-ips/{address}")).await.unwrap();
        assert_eq!(ip.attached.as_ref().map(|n| n.vm.as_str()), Some("reachable"));
        let lan: Segment = s.admin.get("/api/v1/tenants/lab/segments/lan").await.unwrap();
        let ssh: IngressRule = "tcp:22:0.0.0.0/0".parse().unwrap();
        assert_eq!(lan.ingress, vec![ssh.clone()]);

        // The quota is used up: refused before the VM is made.
        let again = kumo_api_types::VmCreate { public_ip: true, ..vm_on("second", &[("lan", None)]) };
        let e = s.admin.create_vm("lab", &again).await.unwrap_err();
        assert_eq!(e.problem().unwrap().resource.as_deref(), Some("public_ips"), "{e}");
        assert!(s.admin.get::<kumo_api_types::Vm>("/api/v1/tenants/lab/vms/second").await.is_err(), "no VM made");

        // The VM's own failure (its name is taken) gives the address back.
        s.admin.post::<_, serde_json::Value>(&format!("/api/v1/tenants/lab/public-ips/{address}/detach"), &json!({})).await.unwrap();
        release(s, "lab", &address).await;
        let dup = kumo_api_types::VmCreate { public_ip: true, ..vm_on("reachable", &[("lan", None)]) };
        let e = s.admin.create_vm("lab", &dup).await.unwrap_err();
        assert_eq!(e.status(), Some(409), "{e}");
        let held: kumo_api_types::Page<PublicIp> = s.admin.get("/api/v1/tenants/lab/public-ips").await.unwrap();
        assert!(held.items.is_empty(), "the address went back: {:?}", held.items);
        // A rule opening 22 already: kept, not doubled.
        let other = kumo_api_types::VmCreate { public_ip: true, ..vm_on("third", &[("lan", None)]) };
        let v = s.admin.create_vm("lab", &other).await.unwrap();
        assert!(v.networks[0].public_ip.is_some());
        let lan: Segment = s.admin.get("/api/v1/tenants/lab/segments/lan").await.unwrap();
        assert_eq!(lan.ingress, vec![ssh]);
    }
}

crate::harness::on_both_backends! {
    config = |c| {
        c.network.default_segment = Some(kumo_server::config::DefaultSegment {
            cidr: "10.0.0.0/24".into(),
            egress: true,
        });
    };
    /// Each new project gets a segment to be reached on, and `kumo vm
    /// create` uses it unless told otherwise: from nothing to an address
    /// in one command.
    async fn a_new_project_has_a_default_segment_that_vm_create_uses(s: &TestServer) {
        let _edge = sim_edge_host(s).await;
        dev_pool(s).await;
        s.bare_tenant("fresh").await;
        let d: Segment = s.admin.get("/api/v1/tenants/fresh/segments/default").await.unwrap();
        assert_eq!((d.kind, d.cidr.as_str(), d.egress), (kumo_api_types::SegmentKind::Ethernet, "10.0.0.0/24", true));
        let q = s.admin.quota("fresh").await.unwrap();
        assert_eq!((q.segments, q.public_ips, q.vms), (1, 1, 0), "the quota holds the segment and its address, nothing more");
        // Deleting the project takes its unused default segment along, and
        // a deletion refused (an address still held) leaves it as it was.
        let mut q = s.admin.quota("fresh").await.unwrap();
        q.public_ips = 2;
        s.quota("fresh", &q).await;
        let held = allocate(s, "fresh").await.unwrap();
        let e = s.admin.delete("/api/v1/tenants/fresh").await.unwrap_err();
        assert_eq!(e.status(), Some(409), "{e}");
        let d: Segment = s.admin.get("/api/v1/tenants/fresh/segments/default").await.unwrap();
        assert!(d.egress, "untouched: {d:?}");
        s.admin.delete(&format!("/api/v1/tenants/fresh/public-ips/{held}")).await.unwrap();
        s.admin.delete("/api/v1/tenants/fresh").await.unwrap();
        assert!(s.admin.get::<Segment>("/api/v1/tenants/fresh/segments/default").await.is_err());

        s.tenant("lab").await;
        let (url, token) = (s.url.clone(), s.admin_token.clone());
        let (on_default, bare, public) = tokio::task::spawn_blocking(move || {
            let k = crate::cli::Kumo::new();
            k.ok(&["login", "--server", &url, "--token", &token], None);
            let (ok, out, err) = k.run(&["vm", "create", "web", "--tenant", "lab", "--vcpus", "2", "-o", "json"], None);
            assert!(ok, "{err}");
            assert!(err.contains("\"default\""), "it says which segment: {err}");
            let web: kumo_api_types::Vm = serde_json::from_str(&out).unwrap();
            let (ok, out, err) = k.run(
                &["vm", "create", "quiet", "--tenant", "lab", "--vcpus", "2", "--no-network", "-o", "json"],
                None,
            );
            assert!(ok, "{err}");
            let quiet: kumo_api_types::Vm = serde_json::from_str(&out).unwrap();
            let (ok, _, err) = k.run(&["vm", "create", "x", "--tenant", "lab", "--no-network", "--network", "default"], None);
            assert!(!ok && err.contains("cannot be used with"), "{err}");
            // A cluster's members reach each other on it too.
            let (ok, _, err) = k.run(&["cluster", "create", "pair", "--tenant", "lab", "--size", "2", "--vcpus", "1"], None);
            assert!(ok && err.contains("\"default\""), "{err}");
            let public = k.json(&["vm", "create", "reach", "--tenant", "lab", "--vcpus", "2", "--public-ip"], None);
            let public: kumo_api_types::Vm = serde_json::from_value(public).unwrap();
            (web, quiet, public)
        })
        .await
        .unwrap();
        assert_eq!(on_default.networks.len(), 1);
        assert_eq!(on_default.networks[0].segment, "default");
        assert!(on_default.networks[0].ip.starts_with("10.0.0."), "{:?}", on_default.networks);
        assert!(bare.networks.is_empty(), "--no-network: {:?}", bare.networks);
        for member in ["pair-0", "pair-1"] {
            let m = s.admin.vm("lab", member).await.unwrap();
            assert_eq!(m.networks.first().map(|n| n.segment.as_str()), Some("default"), "{m:?}");
        }
        let nic = &public.networks[0];
        assert_eq!(nic.segment, "default");
        assert!(nic.public_ip.is_some(), "one command from nothing to an address: {nic:?}");
        let d: Segment = s.admin.get("/api/v1/tenants/lab/segments/default").await.unwrap();
        let ssh: IngressRule = "tcp:22:0.0.0.0/0".parse().unwrap();
        assert_eq!(d.ingress, vec![ssh], "and SSH let in");

        // A project that cannot hold the egress address (public addresses
        // priced, no points) still gets the segment, without egress.
        let _: kumo_api_types::Rates = s
            .admin
            .put("/api/v1/rates", &json!({"prices": {"public_ip": {"guaranteed": "1", "spot": "1"}}}))
            .await
            .unwrap();
        s.bare_tenant("broke").await;
        let d: Segment = s.admin.get("/api/v1/tenants/broke/segments/default").await.unwrap();
        assert!(!d.egress, "{d:?}");
        let q = s.admin.quota("broke").await.unwrap();
        assert_eq!((q.segments, q.public_ips), (1, 0), "the quota holds what was made");
    }
}

#[tokio::test]
async fn without_the_setting_a_new_project_has_no_segment() {
    let s = TestServer::start(Backend::Sqlite).await;
    s.bare_tenant("fresh").await;
    let segments: kumo_api_types::Page<Segment> =
        s.admin.get("/api/v1/tenants/fresh/segments").await.unwrap();
    assert!(segments.items.is_empty());
    s.stop().await;
}
