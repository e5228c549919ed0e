//! What a host's tenant networks should be: every segment with a VM on the
//! host, with the hosts (VTEPs) and VMs of that segment elsewhere — the
//! state document `vxlan-manager` converges the host's kernel to — and each
//! local VM's NICs. `network` is pure; `load` reads the rows it needs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};

use kumo_api_types::{DesiredNic, SegmentKind};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder};
use uuid::Uuid;
use vxlan_manager::state::{
    gateway_mac, Allow, DnsHost, Edge, Filter, Floating, Forward, LocalPort, Net, Protocol,
    PublicAddr,
};
use vxlan_manager::{DesiredState, Endpoint, Mac, Segment};

use crate::entity::{attachments, hosts, segments, vms};
use crate::error::ApiError;

/// One attachment of a segment that has a VM on the host, with where its
/// VM runs.
#[derive(Debug, Clone)]
pub struct Port {
    pub vm: Uuid,
    pub segment: Uuid,
    pub mac: Mac,
    pub ip: Ipv4Addr,
    /// The VM's host and that host's tunnel endpoint (`None`: the host
    /// has no underlay address, so nothing can reach the VM).
    pub host: Uuid,
    pub vtep: Option<Ipv4Addr>,
}

#[derive(Debug, Clone)]
pub struct SegmentInfo {
    pub vni: u32,
    pub mtu: u32,
    /// The segment's network: always let in.
    pub cidr: Net,
    /// Its ingress rules for everything else.
    pub allow: Vec<Allow>,
    /// Its edge's gateway MAC, when it has an edge.
    pub edge_mac: Option<Mac>,
}

/// The host's network document: a segment per VNI with a local VM, its
/// flood list (the other hosts with VMs on it), static entries for every
/// VM on those hosts, and the ingress filter for its VMs here.
pub fn network(
    host: Uuid,
    underlay: Ipv4Addr,
    segments: &BTreeMap<Uuid, SegmentInfo>,
    ports: &[Port],
) -> DesiredState {
    let local: BTreeSet<Uuid> = ports
        .iter()
        .filter(|p| p.host == host)
        .map(|p| p.segment)
        .collect();
    let mut out: Vec<Segment> = Vec::new();
    for id in &local {
        let Some(info) = segments.get(id) else {
            continue;
        };
        let mut vteps = BTreeSet::new();
        let mut endpoints = Vec::new();
        for p in ports.iter().filter(|p| p.segment == *id && p.host != host) {
            // A host sharing our underlay address would be ourselves:
            // bad data, left out rather than looped.
            let Some(vtep) = p.vtep.filter(|v| *v != underlay) else {
                continue;
            };
            vteps.insert(vtep);
            endpoints.push(Endpoint {
                mac: p.mac,
                ip: IpAddr::V4(p.ip),
                vtep,
            });
        }
        endpoints.sort();
        let mut local_macs: Vec<Mac> = ports
            .iter()
            .filter(|p| p.segment == *id && p.host == host)
            .map(|p| p.mac)
            .collect();
        local_macs.sort();
        local_macs.dedup();
        // Each VM NIC here with its own address, the only one its port
        // may send from (the edge's gateway port is no VM's: it forwards
        // the outside's addresses).
        let mut local_ports: Vec<LocalPort> = ports
            .iter()
            .filter(|p| p.segment == *id && p.host == host && !p.vm.is_nil())
            .map(|p| LocalPort {
                mac: p.mac,
                ip: p.ip,
            })
            .collect();
        local_ports.sort();
        local_ports.dedup_by_key(|p| p.mac);
        out.push(Segment {
            vni: info.vni,
            mtu: info.mtu,
            remote_vteps: vteps.into_iter().collect(),
            remote_endpoints: endpoints,
            filter: Some(Filter {
                cidr: info.cidr,
                local_macs,
                allow: info.allow.clone(),
                edge_mac: info.edge_mac,
                local_ports,
            }),
        });
    }
    out.sort_by_key(|s| s.vni);
    DesiredState {
        underlay_ip: underlay,
        segments: out,
        edges: Vec::new(),
    }
}

/// Everything the host's agent needs of its networks.
pub struct HostNetwork {
    /// `None` for a host without an underlay address.
    pub network: Option<DesiredState>,
    /// Each local VM's NICs in attachment order.
    pub nics: HashMap<Uuid, Vec<DesiredNic>>,
}

pub fn underlay_of(h: &hosts::Model) -> Option<Ipv4Addr> {
    h.underlay_ip.as_deref().and_then(|s| s.parse().ok())
}

/// Reads the attachments of the segments that have a VM on `host`.
pub async fn load(
    db: &impl ConnectionTrait,
    host: &hosts::Model,
    local_vms: &[vms::Model],
) -> Result<HostNetwork, ApiError> {
    let local = attachments::Entity::find()
        .filter(attachments::Column::VmId.is_in(local_vms.iter().map(|v| v.id)))
        .order_by_asc(attachments::Column::Id)
        .all(db)
        .await?;
    let underlay = underlay_of(host);
    // An edge host carries its edges' segments too, VMs or none.
    let edged = if host.edge_uplink.is_some() {
        crate::store::public_net::edges_on(db, host.id).await?
    } else {
        Vec::new()
    };
    if local.is_empty() && edged.is_empty() {
        return Ok(HostNetwork {
            network: underlay.map(|u| DesiredState {
                underlay_ip: u,
                segments: Vec::new(),
                edges: Vec::new(),
            }),
            nics: HashMap::new(),
        });
    }
    let seg_ids: BTreeSet<Uuid> = local
        .iter()
        .map(|a| a.segment_id)
        .chain(edged.iter().map(|s| s.id))
        .collect();
    let segs: HashMap<Uuid, segments::Model> = segments::Entity::find()
        .filter(segments::Column::Id.is_in(seg_ids.iter().copied()))
        .all(db)
        .await?
        .into_iter()
        .map(|s| (s.id, s))
        .collect();
    let nics = desired_nics(&local, &segs, &placed_vfs(local_vms)?)?;
    let Some(underlay) = underlay else {
        return Ok(HostNetwork {
            network: None,
            nics,
        });
    };
    let bridged = bridged(&segs)?;
    let mut ports = ports(db, &bridged).await?;
    ports.extend(edge_ports(db, &segs, &bridged).await?);
    let mut net = network(host.id, underlay, &bridged, &ports);
    for s in &edged {
        if let Some(info) = bridged.get(&s.id) {
            net.edges.push(edge(db, s, info).await?);
        }
    }
    Ok(HostNetwork {
        network: Some(net),
        nics,
    })
}

/// Each placed VM's VFs (host addresses), in placement order: a RoCE
/// segment's i-th NIC of a VM is the VF of its i-th placed NIC.
fn placed_vfs(local_vms: &[vms::Model]) -> Result<HashMap<Uuid, Vec<String>>, ApiError> {
    let mut vfs = HashMap::new();
    for v in local_vms {
        if let Some(p) = crate::store::vms::stored_placement(v)? {
            let list = p
                .nics
                .iter()
                .filter(|n| n.pf.is_some())
                .map(|n| n.host_bdf.to_string())
                .collect();
            vfs.insert(v.id, list);
        }
    }
    Ok(vfs)
}

/// The local VMs' NICs in attachment order, as the agent sets them up.
fn desired_nics(
    local: &[attachments::Model],
    segs: &HashMap<Uuid, segments::Model>,
    vfs: &HashMap<Uuid, Vec<String>>,
) -> Result<HashMap<Uuid, Vec<DesiredNic>>, ApiError> {
    let mut nics: HashMap<Uuid, Vec<DesiredNic>> = HashMap::new();
    let mut rail: HashMap<Uuid, usize> = HashMap::new();
    for a in local {
        let Some(s) = segs.get(&a.segment_id) else {
            continue;
        };
        let prefix = crate::store::segments::stored_cidr(s)?.prefix;
        let kind = crate::store::segments::stored_kind(s)?;
        let vf = match kind {
            SegmentKind::Ethernet => None,
            SegmentKind::Roce => {
                let i = rail.entry(a.vm_id).or_default();
                *i += 1;
                // Not placed on VFs (yet): nothing to give the agent.
                let Some(vf) = vfs.get(&a.vm_id).and_then(|l| l.get(*i - 1)) else {
                    continue;
                };
                Some(vf.clone())
            }
        };
        nics.entry(a.vm_id).or_default().push(DesiredNic {
            segment: s.name.clone(),
            kind,
            vni: u32::try_from(s.vni).unwrap_or(0),
            mac: a.mac.clone(),
            address: format!("{}/{prefix}", a.ip),
            gateway: s.gateway.clone(),
            mtu: u32::try_from(s.mtu).unwrap_or(0),
            vlan: s.vlan.and_then(|v| u16::try_from(v).ok()),
            vf,
        });
    }
    Ok(nics)
}

/// The Ethernet segments among `segs`: only they are VXLAN bridges on the
/// host; RoCE NICs are the GPU-paired NIC's own functions.
fn bridged(segs: &HashMap<Uuid, segments::Model>) -> Result<BTreeMap<Uuid, SegmentInfo>, ApiError> {
    let mut out = BTreeMap::new();
    for s in segs.values() {
        if crate::store::segments::stored_kind(s)? != SegmentKind::Ethernet {
            continue;
        }
        let cidr = crate::store::segments::stored_cidr(s)?;
        let allow = crate::domain::ingress::parse_rules(
            "ingress",
            &crate::store::segments::stored_rules(s),
        )?;
        let vni = u32::try_from(s.vni).unwrap_or(0);
        out.insert(
            s.id,
            SegmentInfo {
                vni,
                mtu: u32::try_from(s.mtu).unwrap_or(0),
                cidr: cidr.net(),
                allow,
                edge_mac: s.edge_host_id.map(|_| gateway_mac(vni)),
            },
        );
    }
    Ok(out)
}

/// Every placed port of the bridged segments, with its host's VTEP.
async fn ports(
    db: &impl ConnectionTrait,
    bridged: &BTreeMap<Uuid, SegmentInfo>,
) -> Result<Vec<Port>, ApiError> {
    let all = attachments::Entity::find()
        .filter(attachments::Column::SegmentId.is_in(bridged.keys().copied()))
        .all(db)
        .await?;
    let placed: HashMap<Uuid, Uuid> = vms::Entity::find()
        .filter(vms::Column::Id.is_in(all.iter().map(|a| a.vm_id)))
        .filter(vms::Column::HostId.is_not_null())
        .all(db)
        .await?
        .into_iter()
        .filter_map(|v| Some((v.id, v.host_id?)))
        .collect();
    let vteps: HashMap<Uuid, Option<Ipv4Addr>> = hosts::Entity::find()
        .filter(hosts::Column::Id.is_in(placed.values().copied()))
        .all(db)
        .await?
        .iter()
        .map(|h| (h.id, underlay_of(h)))
        .collect();
    Ok(all
        .iter()
        .filter_map(|a| {
            let host = *placed.get(&a.vm_id)?;
            Some(Port {
                vm: a.vm_id,
                segment: a.segment_id,
                mac: a.mac.parse().ok()?,
                ip: a.ip.parse().ok()?,
                host,
                vtep: vteps.get(&host).copied().flatten(),
            })
        })
        .collect())
}

/// Each placed edge of the bridged segments as a port of its segment: the
/// gateway's MAC and address on the edge host, so VM hosts flood to it
/// and know where the gateway is, and the edge host gets the segment.
async fn edge_ports(
    db: &impl ConnectionTrait,
    segs: &HashMap<Uuid, segments::Model>,
    bridged: &BTreeMap<Uuid, SegmentInfo>,
) -> Result<Vec<Port>, ApiError> {
    let mut out = Vec::new();
    for (id, info) in bridged {
        let Some(s) = segs.get(id) else { continue };
        let Some(h) = s.edge_host_id else { continue };
        let Some(host) = crate::store::hosts::by_id(db, h).await? else {
            continue;
        };
        let Ok(gateway) = s.gateway.parse() else {
            continue;
        };
        out.push(Port {
            vm: Uuid::nil(),
            segment: *id,
            mac: gateway_mac(info.vni),
            ip: gateway,
            host: h,
            vtep: underlay_of(&host),
        });
    }
    Ok(out)
}

/// A segment's edge as its edge host converges it: the gateway, the
/// public addresses with their pools' prefixes and router, egress, the
/// floating addresses and forwards to its NICs, its ingress rules and its
/// VMs' names.
async fn edge(
    db: &impl ConnectionTrait,
    s: &segments::Model,
    info: &SegmentInfo,
) -> Result<Edge, ApiError> {
    let rules = crate::store::public_net::edge_rules(db, &[s.id]).await?;
    let snat = crate::store::public_net::snat_of(db, s.id).await?;
    let private: HashMap<Uuid, Ipv4Addr> = rules
        .nics
        .iter()
        .filter_map(|a| Some((a.id, a.ip.parse().ok()?)))
        .collect();
    let mut pools = HashMap::new();
    for p in crate::store::public_net::pools(db).await? {
        pools.insert(p.id, crate::store::public_net::stored_pool(&p)?);
    }
    let mut public = BTreeSet::new();
    let mut uplink_gateway = None;
    let mut carry = |ip: &crate::entity::public_ips::Model| -> Option<Ipv4Addr> {
        let addr: Ipv4Addr = ip.address.parse().ok()?;
        let pool = pools.get(&ip.pool_id)?;
        public.insert(PublicAddr {
            addr,
            prefix: pool.cidr.prefix,
        });
        uplink_gateway.get_or_insert(pool.gateway);
        Some(addr)
    };
    let snat = snat.as_ref().and_then(&mut carry);
    let mut floating = Vec::new();
    for ip in &rules.floating {
        let (Some(public), Some(private)) = (
            carry(ip),
            ip.attachment_id.and_then(|a| private.get(&a).copied()),
        ) else {
            continue;
        };
        floating.push(Floating { public, private });
    }
    let by_id: HashMap<Uuid, &crate::entity::public_ips::Model> =
        rules.forwarded.iter().map(|p| (p.id, p)).collect();
    let mut forwards = Vec::new();
    for f in &rules.forwards {
        let (Some(public), Some(private)) = (
            by_id.get(&f.public_ip_id).and_then(|ip| carry(ip)),
            private.get(&f.attachment_id).copied(),
        ) else {
            continue;
        };
        forwards.push(Forward {
            public,
            protocol: match crate::store::public_net::stored_protocol(f)? {
                kumo_api_types::ForwardProtocol::Tcp => Protocol::Tcp,
                kumo_api_types::ForwardProtocol::Udp => Protocol::Udp,
            },
            port: u16::try_from(f.public_port).unwrap_or(0),
            private,
            private_port: u16::try_from(f.private_port).unwrap_or(0),
        });
    }
    let names: HashMap<Uuid, String> = vms::Entity::find()
        .filter(vms::Column::Id.is_in(rules.nics.iter().map(|a| a.vm_id)))
        .all(db)
        .await?
        .into_iter()
        .map(|v| (v.id, v.name))
        .collect();
    let mut hosts: Vec<DnsHost> = rules
        .nics
        .iter()
        .filter_map(|a| {
            Some(DnsHost {
                name: names.get(&a.vm_id)?.clone(),
                addr: a.ip.parse().ok()?,
            })
        })
        .collect();
    hosts.sort();
    floating.sort();
    forwards.sort();
    Ok(Edge {
        vni: info.vni,
        cidr: info.cidr,
        gateway: s
            .gateway
            .parse()
            .map_err(|_| ApiError::Internal(format!("segment {}: bad gateway", s.id)))?,
        mtu: info.mtu,
        uplink_gateway,
        public: public.into_iter().collect(),
        snat,
        floating,
        forwards,
        allow: info.allow.clone(),
        hosts,
    })
}

/// A VM with NICs came to a host or left it: every host with a VM on one
/// of its segments has new networks. Bumps their `network_revision` (not
/// `revision`, which placement commits check) in the caller's transaction,
/// and answers those hosts, to be woken once it commits.
pub async fn touch_peers(db: &impl ConnectionTrait, vm: Uuid) -> Result<Vec<Uuid>, ApiError> {
    let segs = crate::store::segments::segments_of(db, vm).await?;
    touch_segments(db, segs).await
}

/// Every host with a VM on one of these segments has new networks.
pub async fn touch_segments(
    db: &impl ConnectionTrait,
    segs: Vec<Uuid>,
) -> Result<Vec<Uuid>, ApiError> {
    if segs.is_empty() {
        return Ok(Vec::new());
    }
    let peers: BTreeSet<Uuid> = attachments::Entity::find()
        .filter(attachments::Column::SegmentId.is_in(segs.iter().copied()))
        .all(db)
        .await?
        .into_iter()
        .map(|a| a.vm_id)
        .collect();
    let hosts: BTreeSet<Uuid> = vms::Entity::find()
        .filter(vms::Column::Id.is_in(peers))
        .filter(vms::Column::HostId.is_not_null())
        .all(db)
        .await?
        .into_iter()
        .filter_map(|v| v.host_id)
        .collect();
    let mut hosts: Vec<Uuid> = hosts.into_iter().collect();
    // The segments' edges carry them too.
    for s in segments::Entity::find()
        .filter(segments::Column::Id.is_in(segs))
        .filter(segments::Column::EdgeHostId.is_not_null())
        .all(db)
        .await?
    {
        if let Some(h) = s.edge_host_id.filter(|h| !hosts.contains(h)) {
            hosts.push(h);
        }
    }
    touch_hosts(db, &hosts).await?;
    Ok(hosts)
}

/// These hosts have new networks: bumps their `network_revision`.
pub async fn touch_hosts(db: &impl ConnectionTrait, hosts: &[Uuid]) -> Result<(), ApiError> {
    if hosts.is_empty() {
        return Ok(());
    }
    hosts::Entity::update_many()
        .col_expr(
            hosts::Column::NetworkRevision,
            Expr::col(hosts::Column::NetworkRevision).add(1),
        )
        .filter(hosts::Column::Id.is_in(hosts.iter().copied()))
        .exec(db)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn port(vm: u128, segment: u128, host: u128, vtep: Option<&str>, n: u8) -> Port {
        Port {
            vm: Uuid::from_u128(vm),
            segment: Uuid::from_u128(segment),
            mac: Mac([2, 0x6b, 0, 0, 0, n]),
            ip: Ipv4Addr::new(10, 1, 0, n),
            host: Uuid::from_u128(host),
            vtep: vtep.map(|v| v.parse().unwrap()),
        }
    }

    fn info(vni: u32, mtu: u32) -> SegmentInfo {
        SegmentInfo {
            vni,
            mtu,
            cidr: "10.1.0.0/24".parse().unwrap(),
            allow: vec![],
            edge_mac: None,
        }
    }

    #[test]
    fn a_host_gets_its_segments_with_the_other_hosts_and_their_vms() {
        let segs: BTreeMap<Uuid, SegmentInfo> = [
            (Uuid::from_u128(1), info(5000, 8950)),
            (Uuid::from_u128(2), info(4096, 1450)),
            (Uuid::from_u128(3), info(6000, 8950)),
        ]
        .into();
        let ports = [
            // segment 1: a VM here, two on host 20, one on host 30
            port(1, 1, 10, Some("192.0.2.10"), 1),
            port(2, 1, 20, Some("192.0.2.20"), 2),
            port(3, 1, 20, Some("192.0.2.20"), 3),
            port(4, 1, 30, Some("192.0.2.30"), 4),
            // segment 2: only here
            port(5, 2, 10, Some("192.0.2.10"), 5),
            // segment 3: nothing here, so not ours at all
            port(6, 3, 20, Some("192.0.2.20"), 6),
            // a host without an underlay cannot be reached
            port(7, 1, 40, None, 7),
        ];
        let n = network(
            Uuid::from_u128(10),
            "192.0.2.10".parse().unwrap(),
            &segs,
            &ports,
        );
        assert_eq!(n.segments.len(), 2);
        let (a, b) = (&n.segments[0], &n.segments[1]);
        assert_eq!((a.vni, a.mtu), (4096, 1450));
        assert!(a.remote_vteps.is_empty() && a.remote_endpoints.is_empty());
        assert_eq!(b.vni, 5000);
        let vteps: Vec<String> = b.remote_vteps.iter().map(|v| v.to_string()).collect();
        assert_eq!(vteps, ["192.0.2.20", "192.0.2.30"]);
        let macs: Vec<String> = b
            .remote_endpoints
            .iter()
            .map(|e| format!("{} {} {}", e.mac, e.ip, e.vtep))
            .collect();
        assert_eq!(
            macs,
            [
                "02:6b:00:00:00:02 10.1.0.2 192.0.2.20",
                "02:6b:00:00:00:03 10.1.0.3 192.0.2.20",
                "02:6b:00:00:00:04 10.1.0.4 192.0.2.30",
            ]
        );
        // The filter protects exactly the VMs here.
        let local = |s: &Segment| {
            s.filter.as_ref().map(|f| {
                f.local_macs
                    .iter()
                    .map(|m| m.to_string())
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(local(a), Some(vec!["02:6b:00:00:00:05".to_owned()]));
        assert_eq!(local(b), Some(vec!["02:6b:00:00:00:01".to_owned()]));
        // Each with the one address its port may send from.
        let own = |s: &Segment| {
            s.filter.as_ref().map(|f| {
                f.local_ports
                    .iter()
                    .map(|p| format!("{} {}", p.mac, p.ip))
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(own(a), Some(vec!["02:6b:00:00:00:05 10.1.0.5".to_owned()]));
        assert_eq!(own(b), Some(vec!["02:6b:00:00:00:01 10.1.0.1".to_owned()]));
        n.validate().unwrap();
        // The edge's gateway port on its edge host (no VM's) is a local
        // port of the segment, but none with an address of its own: it
        // forwards the outside's.
        let mut with_edge = ports.to_vec();
        with_edge.push(Port {
            vm: Uuid::nil(),
            mac: gateway_mac(4096),
            ..port(0, 2, 10, Some("192.0.2.10"), 1)
        });
        let n = network(
            Uuid::from_u128(10),
            "192.0.2.10".parse().unwrap(),
            &segs,
            &with_edge,
        );
        let a = &n.segments[0];
        assert_eq!(
            local(a),
            Some(vec![
                "02:67:77:00:10:00".to_owned(),
                "02:6b:00:00:00:05".to_owned()
            ])
        );
        assert_eq!(own(a), Some(vec!["02:6b:00:00:00:05 10.1.0.5".to_owned()]));
        n.validate().unwrap();
    }
}
