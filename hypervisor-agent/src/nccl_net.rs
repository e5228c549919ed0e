//! NCCL's network settings for a VM on a RoCE segment (pure, apart from
//! the probe script the guest runs).
//!
//! Without them NCCL sends RoCE on traffic class 0, outside the priority
//! the host's QoS plan makes lossless, picks HCAs in whatever order the
//! guest lists them and may pick a RoCEv1 or link-local GID. The host
//! knows which VF serves which rail, its MAC and address, and the plan's
//! DSCP; only the guest knows what it named each device and which GID
//! index its address got. So: a [`RocePlan`] from the desired state, a
//! [`GuestNet`] read from the guest's sysfs, and [`settings`] from both.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use kumo_api_types::{DesiredVm, SegmentKind};
use kumo_topology::Bdf;
use vxlan_manager::roce::Qos;

/// `/etc/nccl.conf` settings, `(key, value)`, in the order written.
pub type Lines = Vec<(String, String)>;

/// What the host knows of a VM's RoCE side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RocePlan {
    /// The VM's VFs in rail order (the order of the GPUs they serve):
    /// each one's MAC (lower case) and address on the RoCE segment.
    pub rails: Vec<(String, Ipv4Addr)>,
    /// `NCCL_IB_TC`.
    pub traffic_class: u8,
    /// The MAC of the VM's first Ethernet NIC: NCCL's bootstrap
    /// (`NCCL_SOCKET_IFNAME`) goes over it, not over a RoCE VF.
    pub socket_mac: Option<String>,
}

/// The plan for a VM with NICs on a RoCE segment; `None` for any other.
pub fn plan(vm: &DesiredVm, qos: &Qos) -> Option<RocePlan> {
    let roce: Vec<_> = vm
        .nics
        .iter()
        .filter(|n| n.kind == SegmentKind::Roce)
        .filter_map(|n| {
            let vf: Bdf = n.vf.as_deref()?.parse().ok()?;
            let ip: Ipv4Addr = n.address.split('/').next()?.parse().ok()?;
            Some((vf, n.mac.to_ascii_lowercase(), ip))
        })
        .collect();
    if roce.is_empty() {
        return None;
    }
    // Rail order: the GPUs' order, each GPU's NIC once; a VF no GPU names
    // goes after them, in the NICs' order.
    let mut order: Vec<Bdf> = Vec::new();
    for g in &vm.placement.gpus {
        if let Some(n) = vm.placement.nics.iter().find(|n| n.for_gpus.contains(g)) {
            if !order.contains(&n.host_bdf) {
                order.push(n.host_bdf);
            }
        }
    }
    let rank = |vf: &Bdf| order.iter().position(|b| b == vf).unwrap_or(usize::MAX);
    let mut rails: Vec<_> = roce.iter().enumerate().collect();
    rails.sort_by_key(|(i, (vf, _, _))| (rank(vf), *i));
    Some(RocePlan {
        rails: rails
            .into_iter()
            .map(|(_, (_, mac, ip))| (mac.clone(), *ip))
            .collect(),
        traffic_class: qos.roce_traffic_class(),
        socket_mac: vm
            .nics
            .iter()
            .find(|n| n.kind == SegmentKind::Ethernet)
            .map(|n| n.mac.to_ascii_lowercase()),
    })
}

/// What the guest runs (`/bin/sh -c`) to show its RDMA ports and NICs:
/// `grep -H` lines, `path:value`, relative to `/sys/class/infiniband` and
/// `/sys/class/net`. GID entries that are unset read as zeros (skipped)
/// and their attributes fail to read (errors dropped): a port's table
/// has 255 or more slots, so each file set is one `grep`, not a loop.
pub const PROBE: &str = "\
if cd /sys/class/infiniband 2>/dev/null; then \
for p in */ports/*; do \
grep -H . \"$p\"/gid_attrs/ndevs/* \"$p\"/gid_attrs/types/* 2>/dev/null; \
grep -H -v '^0000:0000:0000:0000:0000:0000:0000:0000$' \"$p\"/gids/* 2>/dev/null; \
done; fi; \
echo '--'; \
cd /sys/class/net && grep -H . */address; true";

/// One GID table entry of a guest RDMA port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gid {
    pub gid: Option<std::net::Ipv6Addr>,
    /// `RoCE v2`, `IB/RoCE v1`.
    pub kind: Option<String>,
    pub netdev: Option<String>,
}

/// The guest's view: `(device, port) → index → entry`, and netdev → MAC.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuestNet {
    pub ports: BTreeMap<(String, u32), BTreeMap<u32, Gid>>,
    pub macs: BTreeMap<String, String>,
}

/// A device or interface name as Linux allows it (and as it may go into
/// `/etc/nccl.conf`: no spaces, `=`, `,` or line breaks).
fn plain_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Reads [`PROBE`]'s output. Lines that do not parse, and names that are
/// not plain, are skipped: the output is the guest's, and a tenant can
/// make it say anything (though only into its own guest's file).
pub fn parse(output: &str) -> GuestNet {
    let mut net = GuestNet::default();
    let mut lines = output.lines();
    for line in lines.by_ref().take_while(|l| *l != "--") {
        let Some((path, value)) = line.split_once(':') else {
            continue;
        };
        let parts: Vec<&str> = path.split('/').collect();
        let (dev, port, index, what) = match parts[..] {
            [dev, "ports", port, "gids", i] => (dev, port, i, "gid"),
            [dev, "ports", port, "gid_attrs", what @ ("ndevs" | "types"), i] => {
                (dev, port, i, what)
            }
            _ => continue,
        };
        let (Ok(port), Ok(index)) = (port.parse::<u32>(), index.parse::<u32>()) else {
            continue;
        };
        if !plain_name(dev) {
            continue;
        }
        let entry = net
            .ports
            .entry((dev.to_owned(), port))
            .or_default()
            .entry(index)
            .or_default();
        let value = value.trim();
        match what {
            "gid" => entry.gid = value.parse().ok(),
            "types" => entry.kind = Some(value.to_owned()),
            _ => entry.netdev = plain_name(value).then(|| value.to_owned()),
        }
    }
    for line in lines {
        if let Some((dev, mac)) = line
            .split_once(':')
            .and_then(|(p, mac)| Some((p.strip_suffix("/address")?, mac)))
            .filter(|(dev, _)| plain_name(dev))
        {
            net.macs
                .insert(dev.to_owned(), mac.trim().to_ascii_lowercase());
        }
    }
    net
}

/// The NCCL settings for `plan` in the guest `net`, as `(key, value)`
/// lines, and what could not be found yet (a VF whose driver or address
/// is not up; the next pass looks again).
pub fn settings(plan: &RocePlan, net: &GuestNet) -> (Lines, Option<String>) {
    let netdev_of = |mac: &str| {
        net.macs
            .iter()
            .find(|(_, m)| m.as_str() == mac)
            .map(|(d, _)| d.clone())
    };
    let mut hcas = Vec::new();
    let mut gid_indexes = Vec::new();
    let mut missing = Vec::new();
    for (mac, ip) in &plan.rails {
        let Some(netdev) = netdev_of(mac) else {
            missing.push(format!("no NIC with MAC {mac}"));
            continue;
        };
        let want = ip.to_ipv6_mapped();
        // The RoCEv2 entry holding the VF's IPv4 address, on the port of
        // that netdev: NCCL then routes over UDP/IP with the address the
        // fabric expects.
        let found = net.ports.iter().find_map(|((dev, port), gids)| {
            gids.iter()
                .find(|(_, g)| {
                    g.netdev.as_deref() == Some(netdev.as_str())
                        && g.gid == Some(want)
                        && g.kind.as_deref() == Some("RoCE v2")
                })
                .map(|(i, _)| (format!("{dev}:{port}"), *i))
        });
        match found {
            Some((hca, index)) => {
                hcas.push(hca);
                gid_indexes.push(index);
            }
            None => missing.push(format!("no RoCE v2 GID for {ip} on {netdev}")),
        }
    }
    let mut lines = vec![("NCCL_IB_TC".to_owned(), plan.traffic_class.to_string())];
    if !hcas.is_empty() {
        // A leading `=` makes NCCL match names exactly (`mlx5_1` would
        // otherwise also select `mlx5_10`).
        lines.push(("NCCL_IB_HCA".into(), format!("={}", hcas.join(","))));
    }
    // NCCL takes one index for every HCA; the guest's kernel numbers the
    // tables alike, so they agree. When they do not, the first rail's wins
    // and the condition says so.
    if let Some(first) = gid_indexes.first() {
        lines.push(("NCCL_IB_GID_INDEX".into(), first.to_string()));
        if gid_indexes.iter().any(|i| i != first) {
            missing.push(format!("GID indexes differ between rails: {gid_indexes:?}"));
        }
    }
    match plan.socket_mac.as_deref().map(|m| (m, netdev_of(m))) {
        Some((_, Some(dev))) => lines.push(("NCCL_SOCKET_IFNAME".into(), format!("={dev}"))),
        Some((mac, None)) => missing.push(format!("no NIC with MAC {mac}")),
        None => {}
    }
    let note = (!missing.is_empty()).then(|| format!("nccl-roce pending: {}", missing.join("; ")));
    (lines, note)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use kumo_api_types::DesiredNic;
    use kumo_topology::guest_layout::PlacedNic;
    use vxlan_manager::roce::LOSSLESS;

    fn nic(kind: SegmentKind, mac: &str, address: &str, vf: Option<&str>) -> DesiredNic {
        DesiredNic {
            segment: "s".into(),
            kind,
            vni: 5000,
            mac: mac.into(),
            address: address.into(),
            gateway: "10.2.0.1".into(),
            mtu: 4200,
            vlan: vf.map(|_| 100),
            vf: vf.map(str::to_owned),
        }
    }

    fn vm() -> DesiredVm {
        let b = |s: &str| s.parse::<Bdf>().unwrap();
        let mut vm = crate::reconcile::tests::vm();
        // GPUs in the order 1a, 9a; their NICs' VFs listed the other way.
        vm.placement.gpus = vec![b("0000:1a:00.0"), b("0000:9a:00.0")];
        vm.placement.nics = vec![
            PlacedNic {
                host_bdf: b("0000:9c:00.2"),
                pf: Some(b("0000:9c:00.0")),
                rdma_device: "mlx5_5".into(),
                for_gpus: vec![b("0000:9a:00.0")],
            },
            PlacedNic {
                host_bdf: b("0000:1c:00.2"),
                pf: Some(b("0000:1c:00.0")),
                rdma_device: "mlx5_0".into(),
                for_gpus: vec![b("0000:1a:00.0")],
            },
        ];
        vm.nics = vec![
            nic(
                SegmentKind::Ethernet,
                "02:6B:00:00:00:E1",
                "10.1.0.5/24",
                None,
            ),
            nic(
                SegmentKind::Roce,
                "02:6b:00:00:00:09",
                "10.2.0.9/24",
                Some("0000:9c:00.2"),
            ),
            nic(
                SegmentKind::Roce,
                "02:6b:00:00:00:01",
                "10.2.0.1/24",
                Some("0000:1c:00.2"),
            ),
        ];
        vm
    }

    #[test]
    fn the_plan_orders_vfs_by_rail_and_takes_the_lossless_class() {
        let p = plan(&vm(), &LOSSLESS).unwrap();
        assert_eq!(
            p.rails,
            vec![
                ("02:6b:00:00:00:01".to_owned(), Ipv4Addr::new(10, 2, 0, 1)),
                ("02:6b:00:00:00:09".to_owned(), Ipv4Addr::new(10, 2, 0, 9)),
            ],
            "the GPUs' order, not the NICs' list"
        );
        assert_eq!(p.traffic_class, 104, "DSCP 26 << 2");
        assert_eq!(p.socket_mac.as_deref(), Some("02:6b:00:00:00:e1"));
        let mut cpu = vm();
        cpu.nics.retain(|n| n.kind == SegmentKind::Ethernet);
        assert_eq!(plan(&cpu, &LOSSLESS), None, "no RoCE, no RoCE settings");
    }

    /// What the probe prints in a guest with two ConnectX VFs, renamed by
    /// rdma-core's udev rules (`rocep…`), each with the link-local and the
    /// IPv4 GIDs in v1 and v2 flavours (the kernel's order: v1 then v2).
    const TWO_VFS: &str = "\
rocep6s0/ports/1/gid_attrs/ndevs/0:ens6
rocep6s0/ports/1/gid_attrs/ndevs/1:ens6
rocep6s0/ports/1/gid_attrs/ndevs/2:ens6
rocep6s0/ports/1/gid_attrs/ndevs/3:ens6
rocep6s0/ports/1/gid_attrs/types/0:IB/RoCE v1
rocep6s0/ports/1/gid_attrs/types/1:RoCE v2
rocep6s0/ports/1/gid_attrs/types/2:IB/RoCE v1
rocep6s0/ports/1/gid_attrs/types/3:RoCE v2
rocep6s0/ports/1/gids/0:fe80:0000:0000:0000:006b:00ff:fe00:0001
rocep6s0/ports/1/gids/1:fe80:0000:0000:0000:006b:00ff:fe00:0001
rocep6s0/ports/1/gids/2:0000:0000:0000:0000:0000:ffff:0a02:0001
rocep6s0/ports/1/gids/3:0000:0000:0000:0000:0000:ffff:0a02:0001
rocep7s0/ports/1/gid_attrs/ndevs/2:ens7
rocep7s0/ports/1/gid_attrs/ndevs/3:ens7
rocep7s0/ports/1/gid_attrs/types/2:IB/RoCE v1
rocep7s0/ports/1/gid_attrs/types/3:RoCE v2
rocep7s0/ports/1/gids/2:0000:0000:0000:0000:0000:ffff:0a02:0009
rocep7s0/ports/1/gids/3:0000:0000:0000:0000:0000:ffff:0a02:0009
--
eth0/address:02:6b:00:00:00:e1
ens6/address:02:6b:00:00:00:01
ens7/address:02:6B:00:00:00:09
lo/address:00:00:00:00:00:00
";

    #[test]
    fn settings_name_the_guests_devices_in_rail_order_with_the_v2_ipv4_gid() {
        let p = plan(&vm(), &LOSSLESS).unwrap();
        let (lines, note) = settings(&p, &parse(TWO_VFS));
        assert_eq!(note, None);
        let get = |k: &str| {
            lines
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("NCCL_IB_HCA"), Some("=rocep6s0:1,rocep7s0:1"));
        assert_eq!(get("NCCL_IB_GID_INDEX"), Some("3"));
        assert_eq!(get("NCCL_IB_TC"), Some("104"));
        assert_eq!(get("NCCL_SOCKET_IFNAME"), Some("=eth0"));
    }

    #[test]
    fn a_vf_not_up_yet_is_pending_and_the_rest_is_written() {
        let mut p = plan(&vm(), &LOSSLESS).unwrap();
        p.socket_mac = Some("02:6b:00:00:00:aa".into());
        let net = parse(TWO_VFS);
        let mut rails = p.rails.clone();
        // The second VF's address is not configured yet.
        rails[1].1 = Ipv4Addr::new(10, 2, 0, 99);
        p.rails = rails;
        let (lines, note) = settings(&p, &net);
        assert!(lines.contains(&("NCCL_IB_HCA".into(), "=rocep6s0:1".into())));
        assert!(lines.contains(&("NCCL_IB_TC".into(), "104".into())));
        let note = note.unwrap();
        assert!(
            note.contains("no RoCE v2 GID for 10.2.0.99 on ens7"),
            "{note}"
        );
        assert!(note.contains("no NIC with MAC 02:6b:00:00:00:aa"), "{note}");
        // No RDMA at all (no driver in the guest): only the class.
        let (lines, note) = settings(&p, &GuestNet::default());
        assert_eq!(lines, vec![("NCCL_IB_TC".into(), "104".into())]);
        assert!(note
            .unwrap()
            .starts_with("nccl-roce pending: no NIC with MAC"));
    }

    #[test]
    fn garbage_from_the_guest_is_skipped() {
        let net = parse("x\n:::\nrocep6s0/ports/one/gids/0:fe80::1\nrocep6s0/ports/1/gids/x:1\na/b/c/d/e/f/g:1\n--\nnoaddress\n/address:\n");
        assert!(net.ports.is_empty(), "{net:?}");
        assert!(net.macs.is_empty(), "{net:?}");
        // Names that would break the file's lines are not taken.
        let net = parse("evil\nNCCL_X/ports/1/gids/3:0000:0000:0000:0000:0000:ffff:0a02:0007\nmlx5_0/ports/1/gid_attrs/ndevs/3:a=b,c\n--\nx y/address:02:00:00:00:00:01\n");
        assert!(
            net.ports
                .values()
                .flat_map(|g| g.values())
                .all(|g| g.netdev.is_none()),
            "{net:?}"
        );
        assert!(net.macs.is_empty());
    }
}
