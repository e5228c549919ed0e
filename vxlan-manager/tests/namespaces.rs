//! Real kernel networking: three hosts as network namespaces on an
//! underlay bridge, VMs as namespaces whose veth sits on a segment's
//! bridge (as a VM's tap would), and the converger run in each host.
//! Needs root (CAP_NET_ADMIN) and iproute2 and ping, which the README's
//! test command installs. The scaffolding uses `ip`; the product only
//! speaks netlink.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

use vxlan_manager::plan::{Fdb, Neigh};
use vxlan_manager::state::{Allow, Filter, LocalPort, Protocol};
use vxlan_manager::testbed::{ip, ping, tcp_hello, Fabric};
use vxlan_manager::{
    converge, converge_each, DesiredState, Endpoint, Kernel, Mac, NetError, Segment,
};

#[derive(Clone)]
struct Vm {
    name: &'static str,
    host: usize,
    vni: u32,
    mac: Mac,
    ip: Ipv4Addr,
}

/// The test's world: namespaces, and the desired state of each host as
/// the control plane would compute it.
struct World {
    fab: Fabric,
    hosts: usize,
    vms: Vec<Vm>,
    /// Segments with ingress filters (their `local_macs` filled per host).
    filters: BTreeMap<u32, Filter>,
}

impl World {
    fn ns(&self, what: &str) -> String {
        self.fab.ns(what)
    }

    fn host_ns(&self, h: usize) -> String {
        self.fab.host_ns(h)
    }

    fn underlay(h: usize) -> Ipv4Addr {
        Fabric::underlay(h)
    }

    fn new(hosts: usize) -> World {
        let fab = Fabric::new(hosts);
        for h in 0..hosts {
            // Something that is not Kumo's, to prove it is left alone.
            ip(&[
                "-n",
                &fab.host_ns(h),
                "link",
                "add",
                "other0",
                "type",
                "veth",
                "peer",
                "name",
                "other1",
            ]);
        }
        World {
            fab,
            hosts,
            vms: Vec::new(),
            filters: BTreeMap::new(),
        }
    }

    /// A VM: its own namespace, its veth's host end on the segment's
    /// bridge (made by the converger, so call after converging).
    fn add_vm(&mut self, vm: Vm) {
        let bridge = format!("kbr{}", vm.vni);
        let address = format!("{}/24", vm.ip);
        self.fab.add_vm(
            vm.name,
            vm.host,
            &vm.mac.to_string(),
            &address,
            1450,
            &bridge,
        );
        self.vms.push(vm);
    }

    fn remove_vm(&mut self, name: &str) {
        self.vms.retain(|v| v.name != name);
        self.fab.remove_vm(name);
    }

    /// Host `h`'s desired state: each segment it has VMs on, with every
    /// other host that has the segment and every VM there.
    fn desired(&self, h: usize) -> DesiredState {
        let mut by_vni: BTreeMap<u32, Vec<&Vm>> = BTreeMap::new();
        for v in &self.vms {
            by_vni.entry(v.vni).or_default().push(v);
        }
        let mut segments = Vec::new();
        for (vni, vms) in by_vni {
            if !vms.iter().any(|v| v.host == h) {
                continue;
            }
            let remote: Vec<&&Vm> = vms.iter().filter(|v| v.host != h).collect();
            let vteps: BTreeSet<Ipv4Addr> =
                remote.iter().map(|v| World::underlay(v.host)).collect();
            segments.push(Segment {
                vni,
                mtu: 1450,
                remote_vteps: vteps.into_iter().collect(),
                remote_endpoints: remote
                    .iter()
                    .map(|v| Endpoint {
                        mac: v.mac,
                        ip: IpAddr::V4(v.ip),
                        vtep: World::underlay(v.host),
                    })
                    .collect(),
                filter: self.filters.get(&vni).map(|f| Filter {
                    local_macs: vms.iter().filter(|v| v.host == h).map(|v| v.mac).collect(),
                    local_ports: vms
                        .iter()
                        .filter(|v| v.host == h)
                        .map(|v| LocalPort {
                            mac: v.mac,
                            ip: v.ip,
                        })
                        .collect(),
                    ..f.clone()
                }),
            });
        }
        DesiredState {
            underlay_ip: World::underlay(h),
            segments,
            edges: Vec::new(),
        }
    }

    /// Converges every host; the number of netlink changes per host.
    async fn converge_all(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for h in 0..self.hosts {
            let k = Kernel::connect(Some(&self.host_ns(h))).unwrap();
            out.push(converge(&k, &self.desired(h)).await.unwrap().len());
        }
        out
    }

    /// Converges every host's ingress filters; the rules written per host.
    fn filters_all(&self) -> Vec<usize> {
        (0..self.hosts)
            .map(|h| {
                vxlan_manager::nft::converge_filters(Some(&self.host_ns(h)), &self.desired(h))
                    .unwrap()
            })
            .collect()
    }

    fn vm(&self, name: &str) -> &Vm {
        self.vms.iter().find(|v| v.name == name).unwrap()
    }
}

fn vm(name: &'static str, host: usize, vni: u32, n: u8) -> Vm {
    let tenant = if vni == 1001 { 0xa0 } else { 0xb0 };
    Vm {
        name,
        host,
        vni,
        mac: Mac([0x02, tenant, 0, 0, 0, n]),
        ip: Ipv4Addr::new(10, 1, 0, n),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_segments_across_three_hosts() {
    let mut w = World::new(3);
    // Tenant A on three hosts, tenant B on two, both on 10.1.0.0/24 with
    // the same addresses: isolation shows in who answers.
    let plan = [
        vm("a1", 0, 1001, 1),
        vm("a2", 1, 1001, 2),
        vm("a3", 2, 1001, 3),
        vm("b1", 0, 1002, 1),
        vm("b2", 1, 1002, 2),
        vm("b9", 1, 1002, 9),
    ];
    // The control plane knows the VMs before their taps exist.
    w.vms = plan.to_vec();
    let first = w.converge_all().await;
    assert!(first.iter().all(|n| *n > 0), "{first:?}");
    w.vms.clear();
    for v in plan {
        w.add_vm(v);
    }
    assert_eq!(
        w.converge_all().await,
        vec![0, 0, 0],
        "the same state twice changes nothing"
    );

    // Every pair within a segment, ICMP and TCP.
    for seg in [1001, 1002] {
        let members: Vec<Vm> = w.vms.iter().filter(|v| v.vni == seg).cloned().collect();
        for a in &members {
            for b in &members {
                if a.name == b.name {
                    continue;
                }
                assert!(ping(&w.ns(a.name), b.ip), "{} → {} (ICMP)", a.name, b.name);
                assert_eq!(
                    tcp_hello(&w.ns(a.name), b.ip).as_deref(),
                    Some(b.name),
                    "{} → {} (TCP)",
                    a.name,
                    b.name
                );
            }
        }
    }
    // Nothing crosses tenants: B's 10.1.0.9 is not reachable from A, and
    // 10.1.0.2 is a2 for A and b2 for B.
    assert!(!ping(&w.ns("a1"), Ipv4Addr::new(10, 1, 0, 9)));
    assert_eq!(tcp_hello(&w.ns("a1"), Ipv4Addr::new(10, 1, 0, 9)), None);
    assert_eq!(
        tcp_hello(&w.ns("b1"), Ipv4Addr::new(10, 1, 0, 3)),
        None,
        "b has no .3"
    );

    // The kernel of host 0 holds exactly what the design says.
    let k0 = Kernel::connect(Some(&w.host_ns(0))).unwrap();
    let o = k0.observe().await.unwrap();
    assert_eq!(
        o.links.keys().collect::<Vec<_>>(),
        ["kbr1001", "kbr1002", "kvx1001", "kvx1002"]
    );
    let port = o.links["kvx1001"].port.unwrap();
    assert!(!port.learning && port.neigh_suppress);
    let fdb_1001: BTreeSet<Fdb> = o.fdb.iter().filter(|f| f.vni == 1001).copied().collect();
    let a2 = w.vm("a2").clone();
    let a3 = w.vm("a3").clone();
    let expect: BTreeSet<Fdb> = [
        Fdb {
            vni: 1001,
            mac: Mac::ZERO,
            dst: World::underlay(1),
        },
        Fdb {
            vni: 1001,
            mac: Mac::ZERO,
            dst: World::underlay(2),
        },
        Fdb {
            vni: 1001,
            mac: a2.mac,
            dst: World::underlay(1),
        },
        Fdb {
            vni: 1001,
            mac: a3.mac,
            dst: World::underlay(2),
        },
    ]
    .into();
    assert_eq!(fdb_1001, expect);
    assert!(o.neigh.contains(&Neigh {
        vni: 1001,
        ip: IpAddr::V4(a3.ip),
        mac: a3.mac
    }));

    // A VM leaves: host 2 has nothing of segment A left, and nobody keeps
    // an entry for it.
    w.remove_vm("a3");
    let changes = w.converge_all().await;
    assert!(changes.iter().all(|n| *n > 0), "{changes:?}");
    let o2 = Kernel::connect(Some(&w.host_ns(2)))
        .unwrap()
        .observe()
        .await
        .unwrap();
    assert!(o2.links.is_empty(), "{:?}", o2.links.keys());
    for h in 0..2 {
        let o = Kernel::connect(Some(&w.host_ns(h)))
            .unwrap()
            .observe()
            .await
            .unwrap();
        assert!(
            !o.fdb
                .iter()
                .any(|f| f.mac == a3.mac || f.dst == World::underlay(2)),
            "host {h}: {:?}",
            o.fdb
        );
        assert!(!o.neigh.iter().any(|n| n.mac == a3.mac));
        assert!(!o.bridge_fdb.iter().any(|(_, m)| *m == a3.mac));
    }
    assert!(ping(&w.ns("a1"), a2.ip));

    // A VM arrives on host 1: host 0 learns of it at once.
    w.vms.push(vm("a4", 1, 1001, 4));
    w.converge_all().await;
    let a4 = w.vms.pop().unwrap();
    w.add_vm(a4.clone());
    assert_eq!(w.converge_all().await, vec![0, 0, 0]);
    assert!(ping(&w.ns("a1"), a4.ip));
    assert_eq!(tcp_hello(&w.ns("a1"), a4.ip).as_deref(), Some("a4"));

    // An agent restart (a new connection, nothing remembered) finds
    // nothing to do; stray entries of our shape are removed, foreign
    // devices are not touched.
    ip(&[
        "-n",
        &w.host_ns(0),
        "neigh",
        "add",
        "10.1.0.77",
        "lladdr",
        "02:00:00:00:00:77",
        "dev",
        "kbr1001",
        "nud",
        "permanent",
    ]);
    Command::new("bridge")
        .args([
            "-n",
            &w.host_ns(0),
            "fdb",
            "append",
            "00:00:00:00:00:00",
            "dev",
            "kvx1001",
            "dst",
            "10.99.0.77",
            "self",
            "permanent",
        ])
        .status()
        .unwrap();
    ip(&[
        "-n",
        &w.host_ns(0),
        "link",
        "add",
        "kvx4242",
        "type",
        "veth",
        "peer",
        "name",
        "zz0",
    ]);
    let k = Kernel::connect(Some(&w.host_ns(0))).unwrap();
    let fixed = converge(&k, &w.desired(0)).await.unwrap();
    assert_eq!(fixed.len(), 3, "{fixed:?}");
    assert_eq!(
        converge(&k, &w.desired(0)).await.unwrap(),
        vec![],
        "after {fixed:?}"
    );
    let links = Command::new("ip")
        .args(["-n", &w.host_ns(0), "-o", "link"])
        .output()
        .unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(links.contains("other0"), "{links}");
    assert!(!links.contains("kvx4242"), "{links}");

    // A bad state changes nothing.
    let before = k.observe().await.unwrap();
    let mut bad = w.desired(0);
    bad.segments[0].remote_endpoints[0].vtep = Ipv4Addr::new(10, 99, 0, 200);
    let e = converge(&k, &bad).await.unwrap_err();
    assert!(matches!(e, NetError::Invalid(_)), "{e}");
    assert!(e.to_string().contains("remote_endpoints[0].vtep"), "{e}");
    assert_eq!(k.observe().await.unwrap(), before);
}

/// The binary, as operators use it: apply a state file in a namespace,
/// apply it again (no changes), show, and refuse a bad file.
fn nft_in(ns: &str, script: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(script.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap_or_else(|e| panic!("nft (nftables) is required: {e}"));
    assert!(out.status.success(), "nft {script}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Ingress filters: IPv4 from the segment's own network always gets in,
/// from elsewhere only what a rule allows; ARP and other hosts' tables are
/// untouched; applying twice writes nothing.
/// One tenant's segment that cannot be set up (its document is bad, or
/// the kernel refuses its device) stays that segment's failure: the
/// host's other segments converge in the same pass, and the failed one
/// converges once what stood in its way is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_that_fails_never_stops_the_others() {
    let fab = Fabric::new(1);
    let ns = fab.host_ns(0);
    let underlay = Fabric::underlay(0).to_string();
    // Something holds VNI 1001 on this host: the kernel refuses a second
    // device with it.
    ip(&[
        "-n", &ns, "link", "add", "squat", "type", "vxlan", "id", "1001", "local", &underlay,
        "dstport", "4789",
    ]);
    let segment = |vni: u32, remote: &str| Segment {
        vni,
        mtu: 1450,
        remote_vteps: vec![remote.parse().unwrap()],
        remote_endpoints: vec![],
        filter: None,
    };
    let want = DesiredState {
        underlay_ip: Fabric::underlay(0),
        segments: vec![
            segment(1001, "10.99.0.2"),
            segment(1002, "10.99.0.2"),
            // A multicast "host": a document the converger refuses.
            segment(1003, "224.0.0.1"),
        ],
        edges: Vec::new(),
    };
    assert!(converge(&Kernel::connect(Some(&ns)).unwrap(), &want)
        .await
        .is_err());
    let k = Kernel::connect(Some(&ns)).unwrap();
    let done = converge_each(&k, &want).await.unwrap();
    assert_eq!(
        done.failed.keys().copied().collect::<Vec<_>>(),
        [1001, 1003],
        "{:?}",
        done.failed
    );
    assert!(done.failed[&1001].contains("VXLAN"), "{:?}", done.failed);
    assert!(
        done.failed[&1003].contains("remote_vteps"),
        "{:?}",
        done.failed
    );
    let links = k.observe().await.unwrap().links;
    assert!(links.contains_key("kvx1002") && links.contains_key("kbr1002"));
    assert!(!links.contains_key("kvx1001") && !links.contains_key("kvx1003"));
    let again = converge_each(&k, &want).await.unwrap();
    assert!(
        again.changes.iter().all(|c| c.vni() == Some(1001)),
        "only the failed segment is tried again: {:?}",
        again.changes
    );
    // What stood in the way is gone: the segment converges.
    ip(&["-n", &ns, "link", "del", "squat"]);
    let done = converge_each(&k, &want).await.unwrap();
    assert_eq!(done.failed.keys().copied().collect::<Vec<_>>(), [1003]);
    assert!(k.observe().await.unwrap().links.contains_key("kvx1001"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segment_ingress_filters() {
    let mut w = World::new(2);
    let cidr = "10.1.0.0/24".parse().unwrap();
    w.filters.insert(
        1001,
        Filter {
            cidr,
            local_macs: vec![],
            allow: vec![],
            edge_mac: None,
            local_ports: vec![],
        },
    );
    let plan = [vm("a1", 0, 1001, 1), vm("a2", 1, 1001, 2)];
    w.vms = plan.to_vec();
    w.converge_all().await;
    w.vms.clear();
    for v in plan {
        w.add_vm(v);
    }
    // Someone else's table in host 0, to prove it is left alone.
    let h0 = w.host_ns(0);
    nft_in(&h0, "table bridge other {\nchain c {\n}\n}\n");
    assert_eq!(w.filters_all().iter().filter(|n| **n > 0).count(), 2);
    assert_eq!(
        w.filters_all(),
        vec![0, 0],
        "the same filters twice write nothing"
    );

    // An outside address on a1's bridge (as a router's would be), on-link both ways.
    let out_mac = "02:0f:00:00:00:05";
    w.fab
        .add_vm("out", 0, out_mac, "10.9.0.5/24", 1450, "kbr1001");
    ip(&[
        "-n",
        &w.ns("out"),
        "route",
        "add",
        "10.1.0.0/24",
        "dev",
        "eth0",
    ]);
    ip(&[
        "-n",
        &w.ns("a1"),
        "route",
        "add",
        "10.9.0.0/24",
        "dev",
        "eth0",
    ]);
    let a1 = w.vm("a1").ip;
    let outsider = w.ns("out");
    assert!(ping(&w.ns("a2"), a1), "within the segment, across hosts");
    assert!(!ping(&outsider, a1), "from elsewhere: dropped");
    assert_eq!(tcp_hello(&outsider, a1), None);

    // Allow TCP 7000 from 10.9.0.0/24: TCP gets in, ICMP still does not.
    w.filters.get_mut(&1001).unwrap().allow = vec![Allow {
        protocol: Protocol::Tcp,
        ports: Some("7000".parse().unwrap()),
        source: "10.9.0.0/24".parse().unwrap(),
    }];
    assert!(w.filters_all()[0] > 0);
    assert_eq!(w.filters_all(), vec![0, 0]);
    assert_eq!(tcp_hello(&outsider, a1).as_deref(), Some("a1"));
    assert!(!ping(&outsider, a1));
    assert!(ping(&w.ns("a2"), a1));

    // No filter any more: the table goes, everything gets in.
    w.filters.clear();
    assert!(w.filters_all()[0] > 0);
    assert_eq!(w.filters_all(), vec![0, 0]);
    assert!(ping(&outsider, a1));
    let tables = nft_in(&h0, "list tables\n");
    assert!(tables.contains("table bridge other"), "{tables}");
    assert!(!tables.contains("table bridge kumo"), "{tables}");
}

/// The provider network for the edge tests: a namespace `wan` with the
/// router's address, a leg `up0` into host `h`, and a UDP listener on
/// [`SINK_PORT`] that keeps what it receives (source address, payload).
const SINK_PORT: u16 = 7002;
type Received = std::sync::Arc<std::sync::Mutex<Vec<(IpAddr, String)>>>;

fn provider_network(fab: &Fabric, h: usize) -> (String, Received) {
    let wan = fab.ns("wan");
    ip(&["netns", "add", &wan]);
    ip(&["-n", &wan, "link", "set", "lo", "up"]);
    ip(&["-n", &wan, "link", "add", "pn", "type", "bridge"]);
    ip(&["-n", &wan, "link", "set", "pn", "up"]);
    ip(&["-n", &wan, "addr", "add", "203.0.113.1/24", "dev", "pn"]);
    let host = fab.host_ns(h);
    ip(&[
        "link", "add", "up0", "netns", &host, "type", "veth", "peer", "name", "u0", "netns", &wan,
    ]);
    ip(&["-n", &wan, "link", "set", "u0", "master", "pn", "up"]);
    ip(&["-n", &host, "link", "set", "up0", "up"]);
    let got: Received = Default::default();
    let keep = got.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    vxlan_manager::testbed::in_ns(&wan, move || {
        let sock = std::net::UdpSocket::bind(("0.0.0.0", SINK_PORT)).unwrap();
        tx.send(()).unwrap();
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = sock.recv_from(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            keep.lock().unwrap().push((from.ip(), text));
        }
    });
    rx.recv().unwrap();
    (wan, got)
}

/// Sends one UDP datagram `text` from namespace `ns`, from address `src`.
fn send_udp(ns: &str, src: Ipv4Addr, to: std::net::SocketAddr, text: &str) {
    let text = text.to_owned();
    vxlan_manager::testbed::in_ns(ns, move || {
        let sock = std::net::UdpSocket::bind((src, 0)).unwrap();
        let _ = sock.send_to(text.as_bytes(), to);
    })
    .join()
    .unwrap();
}

/// Sends `text` until the outside has it (answering the source it saw),
/// or for `wait` (answering `None`).
fn reaches_outside(
    ns: &str,
    src: Ipv4Addr,
    got: &Received,
    text: &str,
    wait: std::time::Duration,
) -> Option<IpAddr> {
    let to = std::net::SocketAddr::from(([203, 0, 113, 1], SINK_PORT));
    let start = std::time::Instant::now();
    loop {
        send_udp(ns, src, to, text);
        std::thread::sleep(std::time::Duration::from_millis(150));
        if let Some((from, _)) = got.lock().unwrap().iter().find(|(_, t)| t == text) {
            return Some(*from);
        }
        if start.elapsed() > wait {
            return None;
        }
    }
}

/// Asks `server` for the A record of `name` from namespace `ns`: the
/// answer's addresses, or `None` without an answer within a second.
fn dns_a(ns: &str, server: Ipv4Addr, name: &str) -> Option<Vec<Ipv4Addr>> {
    let mut q = vec![0x4b, 0x55, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    let qlen = q.len();
    vxlan_manager::testbed::in_ns(ns, move || {
        let sock = std::net::UdpSocket::bind(("0.0.0.0", 0)).unwrap();
        sock.set_read_timeout(Some(std::time::Duration::from_secs(1)))
            .unwrap();
        sock.send_to(&q, (server, 53)).ok()?;
        let mut buf = [0u8; 512];
        let n = sock.recv(&mut buf).ok()?;
        let a = &buf[..n];
        if n < qlen || a[..2] != q[..2] {
            return None;
        }
        // Answers follow the question: name (a pointer), type, class,
        // TTL, length 4 and the address.
        let mut out = Vec::new();
        let mut at = qlen;
        while at + 16 <= n {
            if a[at + 2..at + 4] == [0, 1] && a[at + 10..at + 12] == [0, 4] {
                out.push(Ipv4Addr::new(
                    a[at + 12],
                    a[at + 13],
                    a[at + 14],
                    a[at + 15],
                ));
            }
            at += 12 + usize::from(u16::from_be_bytes([a[at + 10], a[at + 11]]));
        }
        Some(out)
    })
    .join()
    .unwrap()
}

fn sysctl_in(ns: &str, knob: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "sysctl", "-n", knob])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A guest forging another tenant's public address, or any address or
/// MAC not its own: the edge forwards to the outside only what comes from
/// the segment's own addresses, the host's bridge lets a VM's port send
/// only its own MAC and address, and both count what they drop. The
/// edge's DNS answers the segment, never the provider network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_forges_no_address_through_its_host_or_its_edge() {
    use vxlan_manager::state::{gateway_mac, DnsHost, Edge, PublicAddr};
    let fab = Fabric::new(1);
    let h0 = fab.host_ns(0);
    let (wan, got) = provider_network(&fab, 0);
    let vni = 1001;
    let a1_mac: Mac = "02:a0:00:00:00:05".parse().unwrap();
    let a1_ip = Ipv4Addr::new(10, 1, 0, 5);
    let filter = Filter {
        cidr: "10.1.0.0/24".parse().unwrap(),
        local_macs: vec![a1_mac],
        allow: vec![],
        edge_mac: Some(gateway_mac(vni)),
        local_ports: vec![LocalPort {
            mac: a1_mac,
            ip: a1_ip,
        }],
    };
    let state = |filter: Option<Filter>| DesiredState {
        underlay_ip: Fabric::underlay(0),
        segments: vec![Segment {
            vni,
            mtu: 1450,
            remote_vteps: vec![],
            remote_endpoints: vec![],
            filter,
        }],
        edges: Vec::new(),
    };
    let edge = Edge {
        vni,
        cidr: "10.1.0.0/24".parse().unwrap(),
        gateway: Ipv4Addr::new(10, 1, 0, 1),
        mtu: 1450,
        uplink_gateway: Some(Ipv4Addr::new(203, 0, 113, 1)),
        public: vec![PublicAddr {
            addr: Ipv4Addr::new(203, 0, 113, 10),
            prefix: 24,
        }],
        snat: Some(Ipv4Addr::new(203, 0, 113, 10)),
        floating: vec![],
        forwards: vec![],
        allow: vec![],
        hosts: vec![DnsHost {
            name: "a1".into(),
            addr: a1_ip,
        }],
    };
    // First the edge alone: no filter on the host's bridge.
    let k = Kernel::connect(Some(&h0)).unwrap();
    converge(&k, &state(None)).await.unwrap();
    let done = vxlan_manager::edge::converge(Some(&h0), "up0", std::slice::from_ref(&edge));
    assert!(done.failed.is_empty(), "{:?}", done.failed);
    let edge_ns = vxlan_manager::edge::namespace(Some(&h0), vni);
    fab.add_vm("a1", 0, &a1_mac.to_string(), "10.1.0.5/24", 1450, "kbr1001");
    let a1 = fab.ns("a1");
    ip(&["-n", &a1, "route", "add", "default", "via", "10.1.0.1"]);
    let secs = std::time::Duration::from_secs;
    let egress: IpAddr = "203.0.113.10".parse().unwrap();
    assert_eq!(
        reaches_outside(&a1, a1_ip, &got, "genuine 1", secs(10)),
        Some(egress),
        "the VM's own address goes out, from the egress address"
    );
    // Another tenant's floating address, as the guest's own.
    let forged = Ipv4Addr::new(203, 0, 113, 77);
    ip(&["-n", &a1, "addr", "add", "203.0.113.77/32", "dev", "eth0"]);
    assert_eq!(
        reaches_outside(&a1, forged, &got, "forged at the edge", secs(1)),
        None,
        "a forged source never leaves the edge"
    );
    let at_edge = vxlan_manager::edge::spoofed(&edge_ns).unwrap().unwrap();
    assert!(at_edge > 0, "the edge counts what it drops");
    for knob in ["all", "lan", "wan"] {
        assert_eq!(
            sysctl_in(&edge_ns, &format!("net.ipv4.conf.{knob}.rp_filter")),
            "1",
            "{knob}"
        );
    }

    // The edge's DNS answers the segment, never the provider network:
    // neither at the edge's public address nor at the gateway's, routed
    // to the edge over the provider network.
    assert_eq!(
        dns_a(&a1, Ipv4Addr::new(10, 1, 0, 1), "a1"),
        Some(vec![a1_ip]),
        "the segment asks its gateway"
    );
    assert_eq!(dns_a(&wan, Ipv4Addr::new(203, 0, 113, 10), "a1"), None);
    ip(&[
        "-n",
        &wan,
        "route",
        "add",
        "10.1.0.0/24",
        "via",
        "203.0.113.10",
    ]);
    assert_eq!(
        dns_a(&wan, Ipv4Addr::new(10, 1, 0, 1), "a1"),
        None,
        "no open resolver on the provider network"
    );

    // The host's bridge: a VM's port sends only its own MAC and address.
    assert!(
        vxlan_manager::nft::converge_filters(Some(&h0), &state(Some(filter.clone()))).unwrap() > 0
    );
    assert_eq!(
        vxlan_manager::nft::spoofed(Some(&h0), vni).unwrap(),
        Some(0)
    );
    assert_eq!(
        reaches_outside(&a1, a1_ip, &got, "genuine 2", secs(10)),
        Some(egress)
    );
    assert_eq!(
        reaches_outside(&a1, forged, &got, "forged at the host", secs(1)),
        None
    );
    let at_host = vxlan_manager::nft::spoofed(Some(&h0), vni)
        .unwrap()
        .unwrap();
    assert!(at_host > 0, "the host counts what it drops");
    assert_eq!(
        vxlan_manager::edge::spoofed(&edge_ns).unwrap(),
        Some(at_edge),
        "dropped at the host, it never reached the edge"
    );
    // An ARP claiming another address: the edge never learns it.
    ip(&["-n", &a1, "addr", "add", "10.1.0.66/32", "dev", "eth0"]);
    ip(&["-n", &a1, "neigh", "flush", "dev", "eth0"]);
    assert!(!Command::new("ip")
        .args(["netns", "exec", &a1, "ping", "-c1", "-W1", "-q", "-I"])
        .args(["10.1.0.66", "10.1.0.1"])
        .output()
        .unwrap()
        .status
        .success());
    let neigh = Command::new("ip")
        .args(["-n", &edge_ns, "neigh", "show", "10.1.0.66"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&neigh.stdout).trim(),
        "",
        "forged ARP reached the edge"
    );
    // The gateway's MAC, or one no VM has, with the VM's own address.
    for (mac, what) in [
        (gateway_mac(vni).to_string(), "the gateway's MAC"),
        ("02:a0:00:00:00:99".to_owned(), "a MAC no VM has"),
    ] {
        let before = vxlan_manager::nft::spoofed(Some(&h0), vni)
            .unwrap()
            .unwrap();
        ip(&["-n", &a1, "link", "set", "eth0", "address", &mac]);
        assert_eq!(
            reaches_outside(&a1, a1_ip, &got, what, secs(1)),
            None,
            "{what}"
        );
        assert!(
            vxlan_manager::nft::spoofed(Some(&h0), vni)
                .unwrap()
                .unwrap()
                > before,
            "{what} is counted"
        );
    }
    ip(&[
        "-n",
        &a1,
        "link",
        "set",
        "eth0",
        "address",
        &a1_mac.to_string(),
    ]);
    assert_eq!(
        reaches_outside(&a1, a1_ip, &got, "genuine 3", secs(10)),
        Some(egress),
        "its own MAC and address still go out"
    );
    assert_eq!(
        dns_a(&a1, Ipv4Addr::new(10, 1, 0, 1), "a1"),
        Some(vec![a1_ip])
    );
    // The counts outlive a change of the filter (the table is replaced).
    let counted = vxlan_manager::nft::spoofed(Some(&h0), vni)
        .unwrap()
        .unwrap();
    let mut wider = filter;
    wider.allow = vec![Allow {
        protocol: Protocol::Tcp,
        ports: Some("22".parse().unwrap()),
        source: "0.0.0.0/0".parse().unwrap(),
    }];
    assert!(vxlan_manager::nft::converge_filters(Some(&h0), &state(Some(wider))).unwrap() > 0);
    assert!(
        vxlan_manager::nft::spoofed(Some(&h0), vni)
            .unwrap()
            .unwrap()
            >= counted
    );
    // Nothing of the provider network's reaches the host's namespaces
    // either way: the genuine answers came from the egress address only.
    assert!(got.lock().unwrap().iter().all(|(from, _)| *from == egress));
}

/// The leaf-VLAN RoCE fabric on ports that cannot do it (a veth has no VFs
/// and no DCB; a missing port is missing): every step is reported as
/// unsupported with the kernel's reason, nothing fails silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roce_fabric_reports_what_the_ports_cannot_do() {
    use vxlan_manager::roce::{Outcome, RoceFabric, VfConfig, LOSSLESS};
    let w = World::new(1);
    let ns = w.host_ns(0);
    ip(&[
        "-n", &ns, "link", "add", "pf0", "type", "veth", "peer", "name", "pf0-peer",
    ]);
    let kernel = Kernel::connect(Some(&ns)).unwrap();
    let fabric = vxlan_manager::fabric::LeafVlan {
        kernel: &kernel,
        netns: Some(&ns),
    };
    let vf = |pf: &str| VfConfig {
        pf: pf.into(),
        vf: 0,
        vlan: 100,
        mac: "02:6b:00:00:00:01".parse().unwrap(),
    };
    let reports = fabric
        .configure(
            &["pf0".to_owned(), "gone0".to_owned()],
            &[vf("pf0"), vf("gone0")],
            &LOSSLESS,
        )
        .await;
    assert_eq!(reports.len(), 2);
    for r in &reports {
        assert!(matches!(r.qos, Outcome::Unsupported(_)), "{r:?}");
        assert_eq!(r.vfs.len(), 1, "{r:?}");
        assert!(matches!(r.vfs[0].1, Outcome::Unsupported(_)), "{r:?}");
    }
    let Outcome::Unsupported(why) = &reports[1].vfs[0].1 else {
        unreachable!()
    };
    assert!(why.contains("no netdev gone0"), "{why}");
}

#[tokio::test]
async fn kumo_vxlan_binary() {
    let w = World::new(1);
    let dir = tempfile_dir();
    let state = dir.join("state.json");
    std::fs::write(
        &state,
        r#"{"underlay_ip": "10.99.0.1", "segments": [{"vni": 77, "mtu": 8950,
            "remote_vteps": ["10.99.0.2"],
            "remote_endpoints": [{"mac": "02:00:00:00:00:05", "ip": "10.7.0.5", "vtep": "10.99.0.2"}]}]}"#,
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_kumo-vxlan"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let ns = w.host_ns(0);
    let st = state.to_str().unwrap();
    let (ok, out, err) = run(&["apply", "--state", st, "--netns", &ns]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["changes"], 10, "{out}");
    let (_, out, _) = run(&["apply", "--state", st, "--netns", &ns]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["changes"], 0);
    let (ok, out, _) = run(&["show", "--netns", &ns]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["links"]["kvx77"]["mtu"], 8950);
    assert_eq!(v["links"]["kvx77"]["kind"]["port"], 4789);

    std::fs::write(
        &state,
        r#"{"underlay_ip": "10.99.0.1", "segments": [{"vni": 16777216, "mtu": 1450}]}"#,
    )
    .unwrap();
    let (ok, _, err) = run(&["apply", "--state", st, "--netns", &ns]);
    assert!(!ok);
    assert!(err.contains("segments[0].vni"), "{err}");
    let (ok, _, err) = run(&["show", "--netns", "no-such-namespace"]);
    assert!(!ok && err.contains("no-such-namespace"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("kumo-vxlan-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
