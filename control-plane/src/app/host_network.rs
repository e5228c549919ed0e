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
use vxlan_manager::state::{Allow, Filter, Net};
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
        out.push(Segment {
            vni: info.vni,
            mtu: info.mtu,
            remote_vteps: vteps.into_iter().collect(),
            remote_endpoints: endpoints,
            filter: Some(Filter {
                cidr: info.cidr,
                local_macs,
                allow: info.allow.clone(),
            }),
        });
    }
    out.sort_by_key(|s| s.vni);
    DesiredState {
        underlay_ip: underlay,
        segments: out,
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
    if local.is_empty() {
        return Ok(HostNetwork {
            network: underlay.map(|u| DesiredState {
                underlay_ip: u,
                segments: Vec::new(),
            }),
            nics: HashMap::new(),
        });
    }
    let seg_ids: BTreeSet<Uuid> = local.iter().map(|a| a.segment_id).collect();
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
    let ports = ports(db, &bridged).await?;
    Ok(HostNetwork {
        network: Some(network(host.id, underlay, &bridged, &ports)),
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
        out.insert(
            s.id,
            SegmentInfo {
                vni: u32::try_from(s.vni).unwrap_or(0),
                mtu: u32::try_from(s.mtu).unwrap_or(0),
                cidr: cidr.net(),
                allow,
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
        .filter(attachments::Column::SegmentId.is_in(segs))
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
    if hosts.is_empty() {
        return Ok(Vec::new());
    }
    hosts::Entity::update_many()
        .col_expr(
            hosts::Column::NetworkRevision,
            Expr::col(hosts::Column::NetworkRevision).add(1),
        )
        .filter(hosts::Column::Id.is_in(hosts.iter().copied()))
        .exec(db)
        .await?;
    Ok(hosts.into_iter().collect())
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
        n.validate().unwrap();
    }
}
