//! Tenant segments: VNIs leased from the configured ranges (never shared,
//! resting after release, atomic under concurrent creation), MTUs from the
//! underlay, and VM attachments with unique addresses and MACs.

use std::collections::BTreeSet;

use kumo_api_types::{
    DesiredState, NetworkRequest, Segment, SegmentCreate, SegmentKind, Vm, VmCreate,
};
use serde_json::json;

use kumo_server::config::Config;

use crate::harness::{on_both_backends, Backend, TestServer};

pub(crate) fn seg(name: &str, kind: SegmentKind, cidr: &str) -> SegmentCreate {
    SegmentCreate {
        name: name.into(),
        kind,
        cidr: cidr.into(),
        gateway: None,
        mtu: None,
        ingress: vec![],
        egress: None,
    }
}

pub(crate) fn vm_on(name: &str, networks: &[(&str, Option<&str>)]) -> VmCreate {
    VmCreate {
        name: name.into(),
        gpus: 0,
        gpu_model: None,
        vcpus: Some(1),
        memory_gib: Some(1),
        disk_gib: None,
        template: None,
        service_level: Default::default(),
        ssh_keys: vec![],
        networks: networks
            .iter()
            .map(|(s, ip)| NetworkRequest {
                segment: (*s).into(),
                ip: ip.map(str::to_owned),
            })
            .collect(),
        volumes: Vec::new(),
        on_reclaim: None,
        on_host_loss: None,
        notice_seconds: None,
        shares: Vec::new(),
        public_ip: false,
        queue: false,
        reservation: None,
    }
}

/// Three VNIs, resting two seconds: small enough to run out of.
fn config(c: &mut Config) {
    c.network.vni_ranges = vec![5000..=5002];
    c.network.vni_quarantine = std::time::Duration::from_secs(2);
}

/// `vni mtu [vteps] [mac ip vtep]` of a host's network document.
fn network_of(d: &DesiredState) -> Vec<String> {
    d.network
        .as_ref()
        .map(|n| {
            n.segments
                .iter()
                .map(|s| {
                    let vteps: Vec<String> = s.remote_vteps.iter().map(|v| v.to_string()).collect();
                    let eps: Vec<String> = s
                        .remote_endpoints
                        .iter()
                        .map(|e| format!("{} {} {}", e.mac, e.ip, e.vtep))
                        .collect();
                    format!("{} {} {vteps:?} {eps:?}", s.vni, s.mtu)
                })
                .collect()
        })
        .unwrap_or_default()
}

on_both_backends! {
config = config;

async fn segments_and_vms(s: &TestServer) {
    s.tenant("lab").await;
    s.tenant("other").await;
    let _agent = s.sim_agent_at("gpu-1", "hgx-h100-roce", "192.0.2.1").await;
    let eth: Segment = s
        .admin
        .post(
            "/api/v1/tenants/lab/segments",
            &seg("eth", SegmentKind::Ethernet, "10.1.0.0/24"),
        )
        .await
        .unwrap();
    assert_eq!(
        (eth.vni, eth.mtu, eth.gateway.as_str(), eth.roce_mtu),
        (5000, 8950, "10.1.0.1", None)
    );
    // A name taken in the tenant: 409 at once, and its VNI back in the
    // range (on SQLite the lookup once waited out the pool: 503).
    let e = s
        .admin
        .post::<_, Segment>(
            "/api/v1/tenants/lab/segments",
            &seg("eth", SegmentKind::Ethernet, "10.5.0.0/24"),
        )
        .await
        .unwrap_err();
    let p = e.problem().unwrap();
    assert_eq!(p.status, 409, "{p:?}");
    assert!(p.detail.as_deref().unwrap_or("").contains("already has a segment named"), "{p:?}");
    let mut roce = seg("fast", SegmentKind::Roce, "10.2.0.0/24");
    roce.gateway = Some("10.2.0.254".into());
    let roce: Segment = s
        .admin
        .post("/api/v1/tenants/lab/segments", &roce)
        .await
        .unwrap();
    assert_eq!(
        (roce.vni, roce.roce_mtu),
        (5001, Some(4096)),
        "RoCE keeps 4096 on a 9000 underlay"
    );
    // Another tenant may use the same name and CIDR; never the same VNI.
    let theirs: Segment = s
        .admin
        .post(
            "/api/v1/tenants/other/segments",
            &seg("eth", SegmentKind::Ethernet, "10.1.0.0/24"),
        )
        .await
        .unwrap();
    assert_eq!(theirs.vni, 5002);
    // The ranges are used up.
    let e = s
        .admin
        .post::<_, Segment>(
            "/api/v1/tenants/lab/segments",
            &seg("more", SegmentKind::Ethernet, "10.3.0.0/24"),
        )
        .await
        .unwrap_err();
    assert_eq!(e.problem().unwrap().kind, "/problems/insufficient-capacity");

    // Bad input names its field; nothing is created.
    for (body, field) in [
        (
            json!({"name": "bad-1", "kind": "ethernet", "cidr": "10.0.0.1/24"}),
            "cidr",
        ),
        (
            json!({"name": "bad-2", "kind": "ethernet", "cidr": "10.0.0.0/29", "gateway": "10.9.0.1"}),
            "gateway",
        ),
        (
            json!({"name": "bad-3", "kind": "ethernet", "cidr": "10.0.0.0/24", "mtu": 9000}),
            "mtu",
        ),
        // Special-use blocks (a multicast segment wedged whole hosts) and
        // anything outside the operator's tenant ranges.
        (
            json!({"name": "bad-mc", "kind": "ethernet", "cidr": "224.0.0.0/24"}),
            "cidr",
        ),
        (
            json!({"name": "bad-lo", "kind": "ethernet", "cidr": "127.0.0.0/24"}),
            "cidr",
        ),
        (
            json!({"name": "bad-ll", "kind": "roce", "cidr": "169.254.0.0/24"}),
            "cidr",
        ),
        (
            json!({"name": "bad-bc", "kind": "ethernet", "cidr": "255.255.255.0/24"}),
            "cidr",
        ),
        (
            json!({"name": "bad-pub", "kind": "ethernet", "cidr": "8.8.8.0/24"}),
            "cidr",
        ),
    ] {
        let e = s
            .admin
            .post::<_, Segment>("/api/v1/tenants/lab/segments", &body)
            .await
            .unwrap_err();
        assert_eq!(e.problem().unwrap().errors[0].field, field, "{body}");
    }
    let e = s
        .admin
        .post::<_, Segment>(
            "/api/v1/tenants/lab/segments",
            &json!({"name": "bad-4", "kind": "token-ring", "cidr": "10.0.0.0/24"}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(400));
    let e = s
        .admin
        .post::<_, Segment>(
            "/api/v1/tenants/lab/segments",
            &seg("eth", SegmentKind::Ethernet, "10.9.0.0/24"),
        )
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(409));

    // VMs get the lowest free address (after the gateway), or theirs, and
    // unique MACs; two NICs on two segments.
    // (A RoCE NIC is a GPU's NIC: vm-a has one GPU, so one rail.)
    let mut with_gpu = vm_on("vm-a", &[("eth", None), ("fast", None)]);
    with_gpu.gpus = 1;
    let a: Vm = s
        .admin
        .post("/api/v1/tenants/lab/vms", &with_gpu)
        .await
        .unwrap();
    assert_eq!(a.networks.len(), 2);
    assert_eq!(
        (a.networks[0].segment.as_str(), a.networks[0].ip.as_str()),
        ("eth", "10.1.0.2")
    );
    assert_eq!(
        (a.networks[1].segment.as_str(), a.networks[1].ip.as_str()),
        ("fast", "10.2.0.1")
    );
    let b: Vm = s
        .admin
        .post(
            "/api/v1/tenants/lab/vms",
            &vm_on("vm-b", &[("eth", Some("10.1.0.50"))]),
        )
        .await
        .unwrap();
    assert_eq!(b.networks[0].ip, "10.1.0.50");
    let c: Vm = s
        .admin
        .post("/api/v1/tenants/lab/vms", &vm_on("vm-c", &[("eth", None)]))
        .await
        .unwrap();
    assert_eq!(c.networks[0].ip, "10.1.0.3");
    let macs: BTreeSet<&str> = [&a, &b, &c]
        .iter()
        .flat_map(|v| v.networks.iter().map(|n| n.mac.as_str()))
        .collect();
    assert_eq!(macs.len(), 4);
    assert!(
        macs.iter().all(|m| m.starts_with("02:")),
        "locally administered: {macs:?}"
    );
    // Taken, outside, the gateway, a foreign tenant's segment: refused, no VM made.
    for (net, ip, status) in [
        ("eth", Some("10.1.0.50"), 409),
        ("eth", Some("10.7.0.5"), 400),
        ("eth", Some("10.1.0.1"), 400),
        ("nope", None, 400),
    ] {
        let e = s
            .admin
            .post::<_, Vm>("/api/v1/tenants/lab/vms", &vm_on("vm-x", &[(net, ip)]))
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(status), "{net} {ip:?}");
    }
    assert!(s.admin.vm("lab", "vm-x").await.is_err());
    let listed: Vec<Vm> = s.admin.list_vms("lab").await.unwrap();
    assert_eq!(
        listed.iter().find(|v| v.name == "vm-b").unwrap().networks,
        b.networks
    );
    let shown: Segment = s
        .admin
        .get("/api/v1/tenants/lab/segments/eth")
        .await
        .unwrap();
    assert_eq!(shown.attachments, 3);

    // A segment with VMs cannot go; its VMs gone, it can, and its VNI
    // rests before the next segment gets it.
    let e = s.admin.delete_segment("lab", "fast").await.unwrap_err();
    assert_eq!(e.status(), Some(409));
    s.admin.delete_vm("lab", "vm-a").await.unwrap();
    // Never placed on a host that acts (a SimAgent that never converges
    // still leaves it deleting): finish the deletion as the agent would.
    let mut agent = _agent;
    agent.converge().await;
    assert!(s.admin.vm("lab", "vm-a").await.is_err());
    s.admin.delete_segment("lab", "fast").await.unwrap();
    let e = s
        .admin
        .post::<_, Segment>(
            "/api/v1/tenants/lab/segments",
            &seg("later", SegmentKind::Ethernet, "10.4.0.0/24"),
        )
        .await
        .unwrap_err();
    assert_eq!(
        e.problem().unwrap().kind,
        "/problems/insufficient-capacity",
        "5001 is resting"
    );
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let later: Segment = s
        .admin
        .post(
            "/api/v1/tenants/lab/segments",
            &seg("later", SegmentKind::Ethernet, "10.4.0.0/24"),
        )
        .await
        .unwrap();
    assert_eq!(later.vni, 5001);
    let audit = s.admin.audit(Some("lab"), 200).await.unwrap();
    assert!(audit.iter().any(|e| e.action == "segment.delete"));
}


/// One tenant cannot drain the shared VNI and RoCE VLAN pools: segments,
/// and RoCE segments among them, count against the tenant's quota (zero
/// for a new tenant), and one tenant at its limit leaves the others
/// untouched.
async fn segments_are_within_the_tenant_quota(s: &TestServer) {
    s.bare_tenant("greedy").await;
    s.tenant("neighbour").await;
    let post = |t: &'static str, name: String, kind: SegmentKind| {
        let c = s.admin.clone();
        async move {
            c.post::<_, Segment>(
                &format!("/api/v1/tenants/{t}/segments"),
                &seg(&name, kind, "10.9.0.0/24"),
            )
            .await
        }
    };
    let e = post("greedy", "first-net".into(), SegmentKind::Ethernet).await.unwrap_err();
    assert_eq!(e.problem().unwrap().kind, "/problems/quota-exceeded", "a new tenant has none");
    s.quota("greedy", &kumo_api_types::Quota { segments: 1, ..Default::default() }).await;
    // Room for a segment, but none for a RoCE VLAN.
    let e = post("greedy", "net-r".into(), SegmentKind::Roce).await.unwrap_err();
    let p = e.problem().unwrap();
    assert_eq!((p.kind.as_str(), p.resource.as_deref()), ("/problems/quota-exceeded", Some("roce_segments")));
    s.quota("greedy", &kumo_api_types::Quota { segments: 1, roce_segments: 1, ..Default::default() }).await;
    post("greedy", "net-a".into(), SegmentKind::Roce).await.unwrap();
    for (i, kind) in [SegmentKind::Roce, SegmentKind::Ethernet].into_iter().enumerate() {
        let e = post("greedy", format!("net-c{i}"), kind).await.unwrap_err();
        let p = e.problem().unwrap();
        assert_eq!((p.kind.as_str(), p.resource.as_deref()), ("/problems/quota-exceeded", Some("segments")));
    }
    // The neighbour still gets its Ethernet and RoCE segments (the other
    // two of this server's three VNIs).
    post("neighbour", "net-n1".into(), SegmentKind::Ethernet).await.unwrap();
    post("neighbour", "net-n2".into(), SegmentKind::Roce).await.unwrap();
    // Deleting one makes room again (once its VNI has rested).
    s.admin.delete_segment("greedy", "net-a").await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    post("greedy", "net-d".into(), SegmentKind::Ethernet).await.unwrap();
}

/// Hosts with an underlay address get, in their desired state, every
/// segment with a VM of theirs: the other hosts with VMs on it (flood
/// list) and those VMs (static entries); agents waiting on a long poll
/// hear of VMs arriving and leaving elsewhere.
async fn host_networks(s: &TestServer) {
    s.tenant("lab").await;
    let mut h1 = s.sim_agent_at("net-1", "cpu-only", "192.0.2.1").await;
    let mut h2 = s.sim_agent_at("net-2", "cpu-only", "192.0.2.2").await;
    let plain = s.sim_agent("plain-1", "cpu-only").await;
    let hosts = s.admin.list_hosts().await.unwrap();
    let underlay = |n: &str| {
        hosts
            .iter()
            .find(|h| h.name == n)
            .and_then(|h| h.underlay_ip)
            .map(|u| u.to_string())
    };
    assert_eq!(underlay("net-2").as_deref(), Some("192.0.2.2"));
    assert_eq!(underlay("plain-1"), None);
    assert_eq!(plain.desired(None).await.network, None);

    // An address is one host's; nonsense is refused.
    for (ip, status) in [("192.0.2.1", 409), ("127.0.0.1", 400), ("224.0.0.1", 400)] {
        let r = s
            .http()
            .post(format!("{}/agent/v1/register", s.url))
            .json(&json!({
                "join_token": s.join_token().await, "name": "net-x", "virt_type": "qemu",
                "topology": crate::harness::fixture_topology("cpu-only"), "underlay_ip": ip,
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{ip}");
    }

    let eth: Segment = s
        .admin
        .post(
            "/api/v1/tenants/lab/segments",
            &seg("eth", SegmentKind::Ethernet, "10.1.0.0/24"),
        )
        .await
        .unwrap();
    // Steer by draining: vm-a to net-1, vm-b to net-2. The host without an
    // underlay never takes a VM with networks, though it is free.
    s.admin.host_action("net-2", "drain").await.unwrap();
    let a: Vm = s
        .admin
        .post("/api/v1/tenants/lab/vms", &vm_on("vm-a", &[("eth", None)]))
        .await
        .unwrap();
    assert_eq!(a.host.as_deref(), Some("net-1"));
    s.admin.host_action("net-2", "undrain").await.unwrap();
    s.admin.host_action("net-1", "drain").await.unwrap();
    let rev1 = h1.desired(None).await.revision;
    let waiting = {
        let h1 = h1.clone();
        tokio::spawn(async move {
            let t = std::time::Instant::now();
            (h1.desired(Some(rev1)).await, t.elapsed())
        })
    };
    let b: Vm = s
        .admin
        .post("/api/v1/tenants/lab/vms", &vm_on("vm-b", &[("eth", None)]))
        .await
        .unwrap();
    assert_eq!(b.host.as_deref(), Some("net-2"));
    let (d1, waited) = waiting.await.unwrap();
    assert!(
        waited < std::time::Duration::from_secs(3),
        "net-1 heard of vm-b after {waited:?}"
    );
    let (ma, ia) = (&a.networks[0].mac, &a.networks[0].ip);
    let (mb, ib) = (&b.networks[0].mac, &b.networks[0].ip);
    assert_eq!(
        network_of(&d1),
        [format!(
            "{} 8950 [\"192.0.2.2\"] [\"{mb} {ib} 192.0.2.2\"]",
            eth.vni
        )]
    );
    let nic = &d1.vms.iter().find(|v| v.id == a.id).unwrap().nics[0];
    assert_eq!(
        (
            nic.vni,
            nic.mac.as_str(),
            nic.address.as_str(),
            nic.gateway.as_str(),
            nic.mtu
        ),
        (
            eth.vni,
            ma.as_str(),
            format!("{ia}/24").as_str(),
            "10.1.0.1",
            8950
        )
    );
    let d2 = h2.desired(None).await;
    assert_eq!(
        network_of(&d2),
        [format!(
            "{} 8950 [\"192.0.2.1\"] [\"{ma} {ia} 192.0.2.1\"]",
            eth.vni
        )]
    );

    // Every host with the segment protects its VMs there: the segment's own
    // network gets in, and what the segment's rules allow.
    let filter = |d: &DesiredState| {
        let f = d.network.as_ref().unwrap().segments[0]
            .filter
            .clone()
            .unwrap();
        (
            f.cidr.to_string(),
            f.local_macs
                .iter()
                .map(|m| m.to_string())
                .collect::<Vec<_>>(),
            f.allow.len(),
        )
    };
    assert_eq!(filter(&d1), ("10.1.0.0/24".to_owned(), vec![ma.clone()], 0));
    let rev = h2.desired(None).await.revision;
    let changed: Segment = s
        .admin
        .put(
            "/api/v1/tenants/lab/segments/eth/ingress",
            &json!({"rules": [
                {"protocol": "tcp", "ports": "0022", "source": "0.0.0.0/0"},
                {"protocol": "icmp", "source": "192.0.2.0/24"}
            ]}),
        )
        .await
        .unwrap();
    assert_eq!(
        changed.ingress[0].ports.as_deref(),
        Some("22"),
        "normalised"
    );
    let d2 = h2.desired(Some(rev)).await;
    assert!(d2.revision > rev, "a rule change reaches the hosts");
    assert_eq!(filter(&d2), ("10.1.0.0/24".to_owned(), vec![mb.clone()], 2));
    for (rule, field) in [
        (
            json!({"protocol": "icmp", "ports": "22", "source": "0.0.0.0/0"}),
            "rules[0].ports",
        ),
        (
            json!({"protocol": "tcp", "ports": "9-1", "source": "0.0.0.0/0"}),
            "rules[0].ports",
        ),
        (
            json!({"protocol": "tcp", "source": "10.0.0.1/8"}),
            "rules[0].source",
        ),
    ] {
        let e = s
            .admin
            .put::<_, Segment>(
                "/api/v1/tenants/lab/segments/eth/ingress",
                &json!({ "rules": [rule] }),
            )
            .await
            .unwrap_err();
        assert_eq!(e.problem().unwrap().errors[0].field, field, "{rule}");
    }
    let shown: Segment = s
        .admin
        .get("/api/v1/tenants/lab/segments/eth")
        .await
        .unwrap();
    assert_eq!(
        shown.ingress, changed.ingress,
        "a refused change changes nothing"
    );

    // vm-b goes: net-1 keeps the segment (vm-a) with nobody to flood to;
    // net-2 has no segments left.
    s.admin.delete_vm("lab", "vm-b").await.unwrap();
    h2.converge().await;
    h2.converge().await;
    assert!(s.admin.vm("lab", "vm-b").await.is_err());
    assert_eq!(
        network_of(&h1.desired(None).await),
        [format!("{} 8950 [] []", eth.vni)]
    );
    let d2 = h2.desired(None).await;
    assert_eq!(d2.network.map(|n| n.segments.len()), Some(0));

    // With every networked host drained, a VM with networks has nowhere to go.
    s.admin.host_action("net-2", "drain").await.unwrap();
    let e = s
        .admin
        .post::<_, Vm>("/api/v1/tenants/lab/vms", &vm_on("vm-c", &[("eth", None)]))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(409), "{e}");
    assert!(e.to_string().contains("underlay"), "{e}");
    s.admin.delete_vm("lab", "vm-a").await.unwrap();
    h1.converge().await;
    h1.converge().await;
    assert_eq!(
        h1.desired(None).await.network.map(|n| n.segments.len()),
        Some(0)
    );
}

/// RoCE segments: a VLAN each; a GPU VM on one gets its GPUs' NICs as
/// VFs (on a host whose NICs have them), an address and MAC per rail, and
/// the agent learns VF, VLAN and MAC; the NCCL file names the VFs.
async fn roce_segments(s: &TestServer) {
    s.tenant("lab").await;
    let ib = s.sim_agent_at("ib-1", "hgx-h100", "192.0.2.1").await;
    let fast: Segment = s
        .admin
        .post(
            "/api/v1/tenants/lab/segments",
            &seg("fast", SegmentKind::Roce, "10.2.0.0/24"),
        )
        .await
        .unwrap();
    let other: Segment = s
        .admin
        .post(
            "/api/v1/tenants/lab/segments",
            &seg("fast-2", SegmentKind::Roce, "10.3.0.0/24"),
        )
        .await
        .unwrap();
    assert_eq!((fast.vlan, other.vlan), (Some(100), Some(101)));
    let mut gpu_vm = vm_on("train", &[("fast", None)]);
    gpu_vm.gpus = 8;
    gpu_vm.vcpus = Some(64);
    gpu_vm.memory_gib = Some(256);
    // Only an InfiniBand host: no VFs to give.
    let e = s
        .admin
        .post::<_, Vm>("/api/v1/tenants/lab/vms", &gpu_vm)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(409), "{e}");
    // No GPUs, or two RoCE segments: refused, naming the field.
    for (body, says) in [
        (vm_on("cpu-vm", &[("fast", None)]), "GPUs"),
        (
            {
                let mut v = vm_on("two", &[("fast", None), ("fast-2", None)]);
                v.gpus = 1;
                v
            },
            "one RoCE segment",
        ),
    ] {
        let e = s
            .admin
            .post::<_, Vm>("/api/v1/tenants/lab/vms", &body)
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(400), "{e}");
        assert!(e.to_string().contains(says), "{e}");
    }
    drop(ib);
    let roce = s.sim_agent_at("roce-1", "hgx-h100-roce", "192.0.2.2").await;
    let vm: Vm = s
        .admin
        .post("/api/v1/tenants/lab/vms", &gpu_vm)
        .await
        .unwrap();
    assert_eq!(vm.host.as_deref(), Some("roce-1"));
    assert_eq!(vm.networks.len(), 8, "an address per rail");
    let ips: BTreeSet<&str> = vm.networks.iter().map(|n| n.ip.as_str()).collect();
    assert_eq!(ips.len(), 8);
    let placement = vm.placement.clone().unwrap();
    let topo = crate::harness::fixture_topology("hgx-h100-roce");
    for g in &placement.gpus {
        let vf = g.nic_vf.as_deref().unwrap();
        let n = topo
            .nics
            .iter()
            .find(|n| Some(n.rdma_device.as_str()) == g.nic.as_deref())
            .unwrap();
        assert_eq!(vf, n.vfs[0].to_string(), "the paired NIC's first VF");
        assert!(
            g.nic_guest_bdf.as_deref().unwrap().ends_with(".0"),
            "a VF is function 0"
        );
    }
    let d = roce.desired(None).await;
    let nics = &d.vms[0].nics;
    assert_eq!(nics.len(), 8);
    let vfs: BTreeSet<&str> = nics.iter().filter_map(|n| n.vf.as_deref()).collect();
    let placed: BTreeSet<&str> = placement
        .gpus
        .iter()
        .filter_map(|g| g.nic_vf.as_deref())
        .collect();
    assert_eq!(vfs, placed);
    assert!(nics
        .iter()
        .all(|n| n.vlan == Some(100) && n.kind == SegmentKind::Roce && n.mtu == 8950));
    assert_eq!(
        d.network.map(|n| n.segments.len()),
        Some(0),
        "RoCE is not bridged on the host"
    );
    let nccl = s.admin.vm_nccl_topology("lab", "train").await.unwrap();
    for g in &placement.gpus {
        let bus = g.nic_guest_bdf.as_deref().unwrap();
        assert!(
            nccl.contains(&format!("busid=\"{bus}\"")),
            "{bus} in {nccl}"
        );
    }
    assert_eq!(nccl.matches("<net name=\"mlx5_").count(), 8, "{nccl}");
    let shown: Segment = s
        .admin
        .get("/api/v1/tenants/lab/segments/fast")
        .await
        .unwrap();
    assert_eq!(shown.attachments, 8);
    // The agent's port report reaches the host's page.
    let report = json!([{"netdev": "ens25np0", "qos": {"state": "unsupported", "detail": "no DCB"},
                         "vfs": [[0, {"state": "applied"}]]}]);
    let r = s
        .http()
        .post(format!("{}/agent/v1/heartbeat", s.url))
        .bearer_auth(&roce.credential)
        .json(&json!({ "fabric": report }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let h = s.admin.host("roce-1").await.unwrap();
    assert_eq!(serde_json::to_value(&h.fabric).unwrap(), report);

    // A training cluster on the segment: every member's ranks on every
    // rail, and a hostfile of addresses (rail 0) that MPI can use as is.
    let _r2 = s.sim_agent_at("roce-2", "hgx-h100-roce", "192.0.2.3").await;
    let _r3 = s.sim_agent_at("roce-3", "hgx-h100-roce", "192.0.2.4").await;
    let cl: kumo_api_types::Cluster = s
        .admin
        .post(
            "/api/v1/tenants/lab/clusters",
            &json!({"name": "big", "size": 2, "gpus": 8, "networks": ["fast"]}),
        )
        .await
        .unwrap();
    let addrs: Vec<String> = cl
        .members
        .iter()
        .map(|m| m.address.clone().unwrap())
        .collect();
    assert_eq!(
        cl.hostfile,
        format!("{} slots=8\n{} slots=8\n", addrs[0], addrs[1])
    );
    for m in &cl.members {
        let v = s.admin.vm("lab", &m.name).await.unwrap();
        assert_eq!(v.networks.len(), 8, "{}", m.name);
        assert_eq!(v.networks[0].ip, *m.address.as_ref().unwrap());
    }
}
}

/// Twenty concurrent creations against three servers' worth of contention
/// on one PostgreSQL: every segment gets a VNI of its own.
#[tokio::test]
async fn concurrent_segments_never_share_a_vni_postgres() {
    let s = TestServer::start(Backend::Postgres).await;
    s.tenant("lab").await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let c = s.admin.clone();
        tasks.push(tokio::spawn(async move {
            c.post::<_, Segment>(
                "/api/v1/tenants/lab/segments",
                &seg(&format!("s-{i}"), SegmentKind::Ethernet, "10.1.0.0/24"),
            )
            .await
        }));
    }
    let mut vnis = BTreeSet::new();
    for t in tasks {
        let seg = t.await.unwrap().unwrap();
        assert!(vnis.insert(seg.vni), "VNI {} handed out twice", seg.vni);
    }
    assert_eq!(vnis.len(), 20);
    assert!(vnis.iter().all(|v| *v >= 4096), "{vnis:?}");
    s.stop().await;
}

/// The segment quota holds under concurrency on PostgreSQL: twelve
/// creations at once, RoCE and Ethernet, for a tenant allowed five
/// segments of which two RoCE: exactly five are made, at most two of
/// them RoCE, and every refusal names the limit it met.
#[tokio::test]
async fn concurrent_segments_stay_within_the_quota_postgres() {
    let s = TestServer::start(Backend::Postgres).await;
    s.bare_tenant("lab").await;
    s.quota(
        "lab",
        &kumo_api_types::Quota {
            segments: 5,
            roce_segments: 2,
            ..Default::default()
        },
    )
    .await;
    let mut tasks = Vec::new();
    for i in 0..12 {
        let c = s.admin.clone();
        let kind = if i % 2 == 0 {
            SegmentKind::Roce
        } else {
            SegmentKind::Ethernet
        };
        tasks.push(tokio::spawn(async move {
            c.post::<_, Segment>(
                "/api/v1/tenants/lab/segments",
                &seg(&format!("q-{i}"), kind, "10.1.0.0/24"),
            )
            .await
        }));
    }
    let mut made = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(seg) => made.push(seg),
            Err(e) => {
                let p = e.problem().unwrap();
                assert_eq!(p.kind, "/problems/quota-exceeded", "{p:?}");
                assert!(
                    matches!(p.resource.as_deref(), Some("segments" | "roce_segments")),
                    "{p:?}"
                );
            }
        }
    }
    let listed: kumo_api_types::Page<Segment> = s
        .admin
        .get("/api/v1/tenants/lab/segments?limit=100")
        .await
        .unwrap();
    assert_eq!(listed.items.len(), made.len());
    assert!(made.len() <= 5, "{} segments past a quota of 5", made.len());
    let roce = made.iter().filter(|m| m.kind == SegmentKind::Roce).count();
    assert!(roce <= 2, "{roce} RoCE segments past a quota of 2");
    // Six of each asked: the quota fills rather than refusing what fits
    // (an Ethernet segment is refused only when five are made).
    assert_eq!(made.len(), 5);
    s.stop().await;
}

/// A deleted RoCE segment's VLAN rests as its VNI does (the leaf switches
/// may still map it to the old segment): the next RoCE segment gets
/// another VLAN, even when the deleted one's was the lowest free.
#[tokio::test]
async fn a_freed_roce_vlan_rests_before_reuse() {
    let s = TestServer::start_with(Backend::Sqlite, |c| {
        c.network.vni_ranges = vec![5000..=5010];
        c.network.roce_vlans = 100..=102;
    })
    .await;
    s.tenant("lab").await;
    let make = |name: &'static str| {
        let c = s.admin.clone();
        async move {
            c.post::<_, Segment>(
                "/api/v1/tenants/lab/segments",
                &seg(name, SegmentKind::Roce, "10.5.0.0/24"),
            )
            .await
        }
    };
    let first = make("roce-1").await.unwrap();
    assert_eq!(first.vlan, Some(100));
    s.admin.delete_segment("lab", "roce-1").await.unwrap();
    let second = make("roce-2").await.unwrap();
    assert_eq!(second.vlan, Some(101), "VLAN 100 is resting");
    let third = make("roce-3").await.unwrap();
    assert_eq!(third.vlan, Some(102));
    let e = make("roce-4").await.unwrap_err();
    assert_eq!(
        e.problem().unwrap().kind,
        "/problems/insufficient-capacity",
        "100 still rests: no VLAN is free"
    );
    s.stop().await;
}

/// One tenant reprogramming shared hosts in a loop (rules replaced, egress
/// flipped) runs out of its own allowance: 429 with `Retry-After`, while
/// another tenant's changes go through; the allowance refills with time.
#[tokio::test]
async fn churn_on_shared_hosts_is_limited_per_tenant() {
    let clock = kumo_server::clock::Clock::manual(chrono::Utc::now());
    let s = TestServer::start_with(Backend::Sqlite, |c| {
        c.clock = clock.clone();
        c.network.tenant_changes = kumo_server::domain::churn::Allowance {
            per_minute: 6,
            burst: 5,
        };
    })
    .await;
    s.tenant("noisy").await;
    s.tenant("quiet").await;
    // Replacing a segment's ingress rules rewrites its hosts' tables.
    let flip = async |tenant: &str, open: bool| {
        let rules = if open {
            json!([{"protocol": "tcp", "ports": "22", "source": "0.0.0.0/0"}])
        } else {
            json!([])
        };
        s.http()
            .put(format!(
                "{}/api/v1/tenants/{tenant}/segments/lan/ingress",
                s.url
            ))
            .bearer_auth(&s.admin_token)
            .json(&json!({ "rules": rules }))
            .send()
            .await
            .unwrap()
    };
    for t in ["noisy", "quiet"] {
        let _: Segment = s
            .admin
            .post(
                &format!("/api/v1/tenants/{t}/segments"),
                &SegmentCreate {
                    egress: Some(false),
                    ..seg("lan", SegmentKind::Ethernet, "10.3.0.0/24")
                },
            )
            .await
            .unwrap();
    }
    // The create was the first of five; four flips use the rest.
    for i in 0..4 {
        assert_eq!(flip("noisy", i % 2 == 0).await.status(), 200, "flip {i}");
    }
    let r = flip("noisy", true).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "10", "one change every 10 s");
    let p: serde_json::Value = r.json().await.unwrap();
    assert_eq!(p["type"], "/problems/too-many-requests", "{p}");
    // VM actions (a reboot loop) take from the same allowance.
    let reboot = s
        .http()
        .post(format!("{}/api/v1/tenants/noisy/vms/any/reboot", s.url))
        .bearer_auth(&s.admin_token)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(reboot.status(), 429);
    // Another tenant is not held back by it.
    assert_eq!(flip("quiet", false).await.status(), 200);
    // Waiting refills it.
    clock.advance(chrono::Duration::seconds(10));
    assert_eq!(flip("noisy", true).await.status(), 200);
    assert_eq!(flip("noisy", false).await.status(), 429);
    s.stop().await;
}
