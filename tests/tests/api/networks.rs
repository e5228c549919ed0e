//! Tenant networks end to end on real kernel networking: three hosts as
//! network namespaces on an underlay bridge, a real `kumo-agent` process
//! per host (libvirt `test:///`, tenant networks programmed in its host's
//! namespace), segments and VMs made with the `kumo` CLI. Each host's
//! kernel must carry exactly what the design says for the VMs the API
//! shows — no more, no less — through creation, deletion and an agent
//! restart over stray state; and "VMs" (namespaces on the bridges with the
//! API's MACs and addresses) reach each other only within their segment.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use kumo_api_types::{Segment, Vm};
use vxlan_manager::testbed::{ip, ping, tcp_hello, Fabric};
use vxlan_manager::{DesiredState, Endpoint, Kernel};

use crate::cli::Kumo;
use crate::harness::{Backend, TestServer};

pub(crate) struct Host {
    child: Child,
    args: Vec<String>,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn start_agent(
    s: &TestServer,
    fab: &Fabric,
    h: usize,
    machine: &str,
    join: &str,
    root: &std::path::Path,
    extra: &[&str],
) -> Host {
    let dir = root.join(format!("h{h}"));
    let sysfs = dir.join("sysfs");
    kumo_topology::fixtures::write(&kumo_topology::fixtures::machine(machine).unwrap(), &sysfs)
        .unwrap();
    let args: Vec<String> = [
        "run",
        "--server",
        &s.url,
        "--libvirt-uri",
        "test:///default",
        "--virt-type",
        "qemu",
        "--heartbeat-secs",
        "1",
        "--name",
        &format!("net-{h}"),
        "--sysfs-root",
        &sysfs.display().to_string(),
        "--state-dir",
        &dir.join("state").display().to_string(),
        "--underlay-ip",
        &Fabric::underlay(h).to_string(),
        "--netns",
        &fab.host_ns(h),
        "--join-token",
        join,
    ]
    .iter()
    .chain(extra)
    .map(|a| a.to_string())
    .collect();
    let child = Command::new(crate::harness::bin("kumo-agent"))
        .args(&args)
        // KUMO_AGENT_LOG=debug shows each pass when a test here hangs.
        .env(
            "KUMO_LOG",
            std::env::var("KUMO_AGENT_LOG").unwrap_or("warn".into()),
        )
        .spawn()
        .unwrap();
    Host { child, args }
}

/// What every host's kernel should hold, from what the API shows: per host,
/// each segment with a VM there, the other hosts with VMs on it, and
/// those VMs.
fn expected(
    vms: &[Vm],
    segments: &BTreeMap<(String, String), Segment>,
    hosts: usize,
) -> Vec<DesiredState> {
    let host_of = |v: &Vm| -> usize {
        v.host
            .as_deref()
            .and_then(|h| h.strip_prefix("net-"))
            .and_then(|n| n.parse().ok())
            .unwrap()
    };
    (0..hosts)
        .map(|h| {
            let mut by_vni: BTreeMap<u32, (u32, BTreeSet<Ipv4Addr>, Vec<Endpoint>)> =
                BTreeMap::new();
            for v in vms {
                for n in &v.networks {
                    let seg = &segments[&(v.tenant.clone(), n.segment.clone())];
                    if host_of(v) == h {
                        by_vni
                            .entry(seg.vni)
                            .or_insert((seg.mtu, Default::default(), vec![]));
                    }
                }
            }
            for v in vms {
                for n in &v.networks {
                    let seg = &segments[&(v.tenant.clone(), n.segment.clone())];
                    let (there, vtep) = (host_of(v), Fabric::underlay(host_of(v)));
                    if let (Some(e), true) = (by_vni.get_mut(&seg.vni), there != h) {
                        e.1.insert(vtep);
                        e.2.push(Endpoint {
                            mac: n.mac.parse().unwrap(),
                            ip: IpAddr::V4(n.ip.parse().unwrap()),
                            vtep,
                        });
                    }
                }
            }
            DesiredState {
                underlay_ip: Fabric::underlay(h),
                segments: by_vni
                    .into_iter()
                    .map(|(vni, (mtu, vteps, mut eps))| {
                        eps.sort();
                        vxlan_manager::Segment {
                            vni,
                            mtu,
                            remote_vteps: vteps.into_iter().collect(),
                            remote_endpoints: eps,
                            filter: None,
                        }
                    })
                    .collect(),
                edges: Vec::new(),
            }
        })
        .collect()
}

/// Waits until every host's kernel matches: nothing to add, change or remove.
async fn kernels_match(fab: &Fabric, want: &[DesiredState]) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut left = Vec::new();
        for (h, w) in want.iter().enumerate() {
            let k = Kernel::connect(Some(&fab.host_ns(h))).unwrap();
            let changes = vxlan_manager::plan(w, &k.observe().await.unwrap());
            if !changes.is_empty() {
                left.push((h, changes));
            }
        }
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "hosts' kernels still differ from the design: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_networks_on_three_hosts_from_the_cli() {
    let fab = Fabric::new(3);
    let s = TestServer::start(Backend::Sqlite).await;
    s.tenant("lab").await;
    s.tenant("other").await;
    let root = crate::harness::scratch();
    let mut hosts: Vec<Host> = Vec::new();
    for h in 0..3 {
        let join = s.join_token().await;
        hosts.push(start_agent(
            &s,
            &fab,
            h,
            "cpu-only",
            &join,
            root.path(),
            &[],
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.admin.list_hosts().await.unwrap().len() < 3 {
        assert!(Instant::now() < deadline, "agents did not register");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let (url, token) = (s.url.clone(), s.admin_token.clone());
    // Segments and VMs from the CLI; each VM steered to its host by
    // draining the others.
    let plan: [(&str, &str, usize); 5] = [
        ("lab", "vm-a0", 0),
        ("lab", "vm-a1", 1),
        ("lab", "vm-a2", 2),
        ("other", "vm-b0", 0),
        ("other", "vm-b1", 1),
    ];
    tokio::task::spawn_blocking(move || {
        let k = Kumo::new();
        k.ok(&["login", "--server", &url, "--token", &token], None);
        for t in ["lab", "other"] {
            k.ok(
                &[
                    "segment",
                    "create",
                    "eth",
                    "--tenant",
                    t,
                    "--cidr",
                    "10.1.0.0/24",
                    "--mtu",
                    "1450",
                ],
                None,
            );
        }
        for (tenant, vm, h) in plan {
            for other in (0..3).filter(|o| *o != h) {
                k.ok(&["host", "drain", &format!("net-{other}")], None);
            }
            k.ok(&["host", "undrain", &format!("net-{h}")], None);
            let v = k.json(
                &[
                    "vm",
                    "create",
                    vm,
                    "--tenant",
                    tenant,
                    "--vcpus",
                    "1",
                    "--memory",
                    "1",
                    "--network",
                    "eth",
                    "--wait",
                ],
                None,
            );
            assert_eq!(v["host"], format!("net-{h}"), "{v}");
            assert_eq!(v["state"], "running", "{v}");
        }
        for h in 0..3 {
            k.ok(&["host", "undrain", &format!("net-{h}")], None);
        }
    })
    .await
    .unwrap();

    let mut segments = BTreeMap::new();
    for t in ["lab", "other"] {
        let seg = s.admin.segment(t, "eth").await.unwrap();
        segments.insert((t.to_owned(), "eth".to_owned()), seg);
    }
    let (lab_vni, other_vni) = (
        segments[&("lab".to_owned(), "eth".to_owned())].vni,
        segments[&("other".to_owned(), "eth".to_owned())].vni,
    );
    assert_ne!(lab_vni, other_vni);
    let all_vms = |s: &TestServer| {
        let c = s.admin.clone();
        async move {
            let mut v = c.list_vms("lab").await.unwrap();
            v.extend(c.list_vms("other").await.unwrap());
            v
        }
    };
    let vms = all_vms(&s).await;
    kernels_match(&fab, &expected(&vms, &segments, 3)).await;
    let h0 = Kernel::connect(Some(&fab.host_ns(0)))
        .unwrap()
        .observe()
        .await
        .unwrap();
    let flood: Vec<String> = h0
        .fdb
        .iter()
        .filter(|f| f.vni == lab_vni && f.mac == vxlan_manager::Mac::ZERO)
        .map(|f| f.dst.to_string())
        .collect();
    assert_eq!(flood, ["10.99.0.2", "10.99.0.3"], "lab's flood list on h0");

    // The VMs' NICs, with the API's MACs and addresses, on their bridges.
    let by_name: BTreeMap<String, Vm> = vms.iter().map(|v| (v.name.clone(), v.clone())).collect();
    for (_, name, h) in plan {
        let v = &by_name[name];
        let n = &v.networks[0];
        let vni = if v.tenant == "lab" {
            lab_vni
        } else {
            other_vni
        };
        fab.add_vm(
            name,
            h,
            &n.mac,
            &format!("{}/24", n.ip),
            1450,
            &format!("kbr{vni}"),
        );
    }
    let addr = |name: &str| -> Ipv4Addr { by_name[name].networks[0].ip.parse().unwrap() };
    for a in ["vm-a0", "vm-a1", "vm-a2"] {
        for b in ["vm-a0", "vm-a1", "vm-a2"] {
            if a != b {
                assert!(ping(&fab.ns(a), addr(b)), "{a} → {b} (ICMP)");
                assert_eq!(
                    tcp_hello(&fab.ns(a), addr(b)).as_deref(),
                    Some(b),
                    "{a} → {b}"
                );
            }
        }
    }
    assert!(ping(&fab.ns("vm-b0"), addr("vm-b1")), "b0 → b1");
    // Both tenants use the same addresses: each reaches only its own VM.
    assert_eq!(addr("vm-a1"), addr("vm-b1"));
    assert_eq!(
        tcp_hello(&fab.ns("vm-b0"), addr("vm-b1")).as_deref(),
        Some("vm-b1")
    );
    assert_eq!(
        tcp_hello(&fab.ns("vm-a0"), addr("vm-a1")).as_deref(),
        Some("vm-a1")
    );
    assert!(
        !ping(&fab.ns("vm-b0"), addr("vm-a2")),
        "no other tenant's VM answers"
    );

    // From outside the segment's network nothing gets in, until a rule
    // set with the CLI allows it.
    fab.add_vm(
        "outsider",
        0,
        "02:0f:00:00:00:05",
        "10.9.0.5/24",
        1450,
        &format!("kbr{lab_vni}"),
    );
    ip(&[
        "-n",
        &fab.ns("outsider"),
        "route",
        "add",
        "10.1.0.0/24",
        "dev",
        "eth0",
    ]);
    ip(&[
        "-n",
        &fab.ns("vm-a0"),
        "route",
        "add",
        "10.9.0.0/24",
        "dev",
        "eth0",
    ]);
    assert!(
        !ping(&fab.ns("outsider"), addr("vm-a0")),
        "outsiders are kept out"
    );
    let (url, token) = (s.url.clone(), s.admin_token.clone());
    let shown = tokio::task::spawn_blocking(move || {
        let k = Kumo::new();
        k.ok(&["login", "--server", &url, "--token", &token], None);
        k.ok(
            &[
                "segment",
                "ingress",
                "eth",
                "--tenant",
                "lab",
                "--allow",
                "icmp:10.9.0.0/24",
            ],
            None,
        );
        k.ok(&["segment", "show", "eth", "--tenant", "lab"], None)
    })
    .await
    .unwrap();
    assert!(shown.contains("icmp:10.9.0.0/24"), "{shown}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ping(&fab.ns("outsider"), addr("vm-a0")) {
        assert!(Instant::now() < deadline, "the rule did not reach host 0");
    }
    assert_eq!(
        tcp_hello(&fab.ns("outsider"), addr("vm-a0")),
        None,
        "ICMP only"
    );

    // A VM deleted: its entries leave every other host, and its host keeps
    // nothing of a segment it no longer has.
    let deleted = Instant::now();
    s.admin.delete_vm("lab", "vm-a1").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while s.admin.vm("lab", "vm-a1").await.is_ok() {
        assert!(Instant::now() < deadline, "a1 was not deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fab.remove_vm("vm-a1");
    let vms = all_vms(&s).await;
    kernels_match(&fab, &expected(&vms, &segments, 3)).await;
    println!(
        "VM deleted → every host's kernel updated: {:?}",
        deleted.elapsed()
    );
    let h1 = Kernel::connect(Some(&fab.host_ns(1)))
        .unwrap()
        .observe()
        .await
        .unwrap();
    assert!(
        !h1.links.contains_key(&format!("kbr{lab_vni}")),
        "{:?}",
        h1.links.keys()
    );
    assert!(h1.links.contains_key(&format!("kbr{other_vni}")));
    assert!(
        ping(&fab.ns("vm-a0"), addr("vm-a2")),
        "a0 → a2 after a1 left"
    );

    // An agent restarted over stray state (an entry to a host that is not
    // there, a bridge of a VNI nobody has) removes it and nothing else.
    let h0 = hosts.remove(0);
    let args = h0.args.clone();
    drop(h0);
    let ns0 = fab.host_ns(0);
    let kvx = format!("kvx{lab_vni}");
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns0,
            "bridge",
            "fdb",
            "append",
            "00:00:00:00:00:00",
        ])
        .args(["dev", &kvx, "dst", "10.99.0.77"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ip(&["-n", &ns0, "link", "add", "kbr4999", "type", "bridge"]);
    let restarted = Command::new(crate::harness::bin("kumo-agent"))
        .args(&args)
        // KUMO_AGENT_LOG=debug shows each pass when a test here hangs.
        .env(
            "KUMO_LOG",
            std::env::var("KUMO_AGENT_LOG").unwrap_or("warn".into()),
        )
        .spawn()
        .unwrap();
    hosts.insert(
        0,
        Host {
            child: restarted,
            args,
        },
    );
    kernels_match(&fab, &expected(&vms, &segments, 3)).await;
    assert!(
        ping(&fab.ns("vm-a0"), addr("vm-a2")),
        "a0 → a2 after the restart"
    );

    drop(hosts);
    s.stop().await;
}

/// A RoCE VM from the CLI on a real agent whose NICs exist only in its
/// fixture: the VM runs with its VFs, and the host's page shows each port's
/// QoS and the VM's VFs as unsupported here, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roce_vm_and_its_port_report_from_a_real_agent() {
    let fab = Fabric::new(1);
    let s = TestServer::start(Backend::Sqlite).await;
    s.tenant("lab").await;
    let root = crate::harness::scratch();
    let join = s.join_token().await;
    // A drift-repair pass every 5 ms: passes must never wait on each other.
    // (They did: a pass begun on a tick waited forever for the netlink
    // connection held by a pass suspended inside the long poll, and the VM
    // stayed `scheduled`.)
    let host = start_agent(
        &s,
        &fab,
        0,
        "hgx-h100-roce",
        &join,
        root.path(),
        &["--resync-ms", "5"],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.admin.list_hosts().await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the agent did not register");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (url, token) = (s.url.clone(), s.admin_token.clone());
    let vm = tokio::task::spawn_blocking(move || {
        let k = Kumo::new();
        k.ok(&["login", "--server", &url, "--token", &token], None);
        let seg = k.json(
            &[
                "segment",
                "create",
                "fast",
                "--tenant",
                "lab",
                "--kind",
                "roce",
                "--cidr",
                "10.2.0.0/24",
            ],
            None,
        );
        assert_eq!(seg["vlan"], 100, "{seg}");
        k.json(
            &[
                "vm",
                "create",
                "train",
                "--tenant",
                "lab",
                "--gpus",
                "8",
                "--network",
                "fast",
                "--wait",
            ],
            None,
        )
    })
    .await
    .unwrap();
    assert_eq!(vm["state"], "running", "{vm}");
    let deadline = Instant::now() + Duration::from_secs(15);
    let fabric = loop {
        let h = s.admin.host("net-0").await.unwrap();
        if h.fabric.iter().map(|p| p.vfs.len()).sum::<usize>() == 8 {
            break h.fabric;
        }
        assert!(Instant::now() < deadline, "no port report: {:?}", h.fabric);
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(fabric.len(), 8);
    for p in &fabric {
        assert!(
            matches!(&p.qos, vxlan_manager::roce::Outcome::Unsupported(why) if why.contains(&p.netdev)),
            "{p:?}"
        );
        let (vf, outcome) = &p.vfs[0];
        assert_eq!(*vf, 0);
        assert!(
            matches!(outcome, vxlan_manager::roce::Outcome::Unsupported(why) if why.contains("no netdev")),
            "{p:?}"
        );
    }
    // The agent's long poll would hold the server's shutdown.
    drop(host);
    s.stop().await;
}
