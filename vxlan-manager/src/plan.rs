//! What the kernel has of Kumo's (plain data read over netlink) and the
//! pure diff from it to the desired state: the smallest list of changes,
//! in an order the kernel accepts. Objects whose names are not Kumo's
//! (`kvx<VNI>`, `kbr<VNI>`) are never in either.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use serde::Serialize;

use crate::state::{bridge_name, vni_of, vxlan_name, DesiredState, Mac, VXLAN_PORT};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LinkKind {
    Vxlan {
        vni: u32,
        local: Option<Ipv4Addr>,
        port: u16,
        learning: bool,
    },
    Bridge,
    /// Named like ours but something else: replaced.
    Other,
}

/// A bridge port's flags that the design fixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PortFlags {
    pub learning: bool,
    pub neigh_suppress: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Link {
    pub kind: LinkKind,
    pub mtu: u32,
    pub up: bool,
    /// The bridge it is a port of.
    pub master: Option<String>,
    pub port: Option<PortFlags>,
}

/// A static entry in a VXLAN device's own FDB: frames for `mac` go to
/// `dst` (the all-zero MAC is the flood list).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Fdb {
    pub vni: u32,
    pub mac: Mac,
    pub dst: Ipv4Addr,
}

/// A neighbour entry on a segment's bridge, answered locally by
/// `neigh_suppress`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Neigh {
    pub vni: u32,
    pub ip: IpAddr,
    pub mac: Mac,
}

/// Kumo's objects in one network namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Observed {
    pub links: BTreeMap<String, Link>,
    pub fdb: BTreeSet<Fdb>,
    /// Static entries in the bridge's FDB pointing remote MACs at the VXLAN
    /// port, so the bridge neither floods them locally nor fails to answer
    /// ARP for them.
    pub bridge_fdb: BTreeSet<(u32, Mac)>,
    pub neigh: BTreeSet<Neigh>,
}

/// One netlink request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Change {
    DelLink {
        name: String,
    },
    AddBridge {
        name: String,
        mtu: u32,
        address: Mac,
    },
    AddVxlan {
        name: String,
        vni: u32,
        local: Ipv4Addr,
        mtu: u32,
    },
    SetMtu {
        name: String,
        mtu: u32,
    },
    SetMaster {
        name: String,
        master: String,
    },
    SetPort {
        name: String,
    },
    SetUp {
        name: String,
    },
    DelFdb(Fdb),
    AddFdb(Fdb),
    DelBridgeFdb {
        vni: u32,
        mac: Mac,
    },
    AddBridgeFdb {
        vni: u32,
        mac: Mac,
    },
    DelNeigh(Neigh),
    AddNeigh(Neigh),
}

impl Change {
    /// The VNI whose objects the change touches: changes of one segment
    /// are applied together, apart from other segments'.
    pub fn vni(&self) -> Option<u32> {
        match self {
            Change::DelLink { name }
            | Change::AddBridge { name, .. }
            | Change::SetMtu { name, .. }
            | Change::SetMaster { name, .. }
            | Change::SetPort { name }
            | Change::SetUp { name } => crate::state::vni_of(name).map(|(vni, _)| vni),
            Change::AddVxlan { vni, .. }
            | Change::DelBridgeFdb { vni, .. }
            | Change::AddBridgeFdb { vni, .. } => Some(*vni),
            Change::DelFdb(f) | Change::AddFdb(f) => Some(f.vni),
            Change::DelNeigh(n) | Change::AddNeigh(n) => Some(n.vni),
        }
    }
}

/// The port flags every VXLAN device has on its bridge.
pub const VXLAN_PORT_FLAGS: PortFlags = PortFlags {
    learning: false,
    neigh_suppress: true,
};

/// A segment bridge's own address: locally administered, unique per VNI
/// and host (never on the wire: the bridge has no IP address).
pub fn bridge_address(vni: u32, underlay: Ipv4Addr) -> Mac {
    let v = vni.to_be_bytes();
    let u = underlay.octets();
    Mac([0x06, v[1], v[2], v[3], u[2], u[3]])
}

fn vxlan_ok(link: &Link, vni: u32, local: Ipv4Addr) -> bool {
    link.kind
        == LinkKind::Vxlan {
            vni,
            local: Some(local),
            port: VXLAN_PORT,
            learning: false,
        }
}

/// The changes that turn `have` into `want`. Applying them and diffing
/// again gives nothing.
pub fn plan(want: &DesiredState, have: &Observed) -> Vec<Change> {
    let mut out = Vec::new();
    let wanted: BTreeMap<u32, _> = want.segments.iter().map(|s| (s.vni, s)).collect();

    // Links: stale or wrongly built ones go first (a VXLAN device's VNI,
    // address and port cannot be changed in place).
    let mut gone: BTreeSet<&str> = BTreeSet::new();
    for (name, link) in &have.links {
        let keep = match vni_of(name) {
            Some((vni, true)) => wanted.contains_key(&vni) && vxlan_ok(link, vni, want.underlay_ip),
            Some((vni, false)) => wanted.contains_key(&vni) && link.kind == LinkKind::Bridge,
            None => true,
        };
        if !keep {
            out.push(Change::DelLink { name: name.clone() });
            gone.insert(name);
        }
    }
    let present = |name: &str| have.links.get(name).filter(|_| !gone.contains(name));
    for s in &want.segments {
        let (br, vx) = (bridge_name(s.vni), vxlan_name(s.vni));
        match present(&br) {
            None => out.push(Change::AddBridge {
                name: br.clone(),
                mtu: s.mtu,
                address: bridge_address(s.vni, want.underlay_ip),
            }),
            Some(l) if l.mtu != s.mtu => out.push(Change::SetMtu {
                name: br.clone(),
                mtu: s.mtu,
            }),
            Some(_) => {}
        }
        let vx_link = present(&vx);
        match vx_link {
            None => out.push(Change::AddVxlan {
                name: vx.clone(),
                vni: s.vni,
                local: want.underlay_ip,
                mtu: s.mtu,
            }),
            Some(l) if l.mtu != s.mtu => out.push(Change::SetMtu {
                name: vx.clone(),
                mtu: s.mtu,
            }),
            Some(_) => {}
        }
        if vx_link.and_then(|l| l.master.as_deref()) != Some(br.as_str()) {
            out.push(Change::SetMaster {
                name: vx.clone(),
                master: br.clone(),
            });
        }
        let enslaved_now = vx_link.is_some_and(|l| l.master.as_deref() == Some(br.as_str()));
        if !enslaved_now || vx_link.and_then(|l| l.port) != Some(VXLAN_PORT_FLAGS) {
            out.push(Change::SetPort { name: vx.clone() });
        }
        for name in [&br, &vx] {
            if !present(name).is_some_and(|l| l.up) {
                out.push(Change::SetUp { name: name.clone() });
            }
        }
    }

    // Entries: those of deleted links went with them.
    let fresh = |vni: u32| present(&vxlan_name(vni)).is_some();
    let fresh_br = |vni: u32| present(&bridge_name(vni)).is_some();
    let mut want_fdb = BTreeSet::new();
    let mut want_bridge_fdb = BTreeSet::new();
    let mut want_neigh = BTreeSet::new();
    for s in &want.segments {
        for v in &s.remote_vteps {
            want_fdb.insert(Fdb {
                vni: s.vni,
                mac: Mac::ZERO,
                dst: *v,
            });
        }
        for e in &s.remote_endpoints {
            want_fdb.insert(Fdb {
                vni: s.vni,
                mac: e.mac,
                dst: e.vtep,
            });
            want_bridge_fdb.insert((s.vni, e.mac));
            want_neigh.insert(Neigh {
                vni: s.vni,
                ip: e.ip,
                mac: e.mac,
            });
        }
    }
    for f in have.fdb.difference(&want_fdb) {
        if fresh(f.vni) {
            out.push(Change::DelFdb(*f));
        }
    }
    for (vni, mac) in have.bridge_fdb.difference(&want_bridge_fdb) {
        if fresh(*vni) {
            out.push(Change::DelBridgeFdb {
                vni: *vni,
                mac: *mac,
            });
        }
    }
    for n in have.neigh.iter() {
        if fresh_br(n.vni) && !want_neigh.contains(n) {
            out.push(Change::DelNeigh(*n));
        }
    }
    for f in &want_fdb {
        if !(fresh(f.vni) && have.fdb.contains(f)) {
            out.push(Change::AddFdb(*f));
        }
    }
    for (vni, mac) in &want_bridge_fdb {
        if !(fresh(*vni) && have.bridge_fdb.contains(&(*vni, *mac))) {
            out.push(Change::AddBridgeFdb {
                vni: *vni,
                mac: *mac,
            });
        }
    }
    for n in &want_neigh {
        if !(fresh_br(n.vni) && have.neigh.contains(n)) {
            out.push(Change::AddNeigh(*n));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Endpoint, Segment};

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    fn state() -> DesiredState {
        DesiredState {
            underlay_ip: ip("10.99.0.1"),
            segments: vec![Segment {
                vni: 100,
                mtu: 1450,
                remote_vteps: vec![ip("10.99.0.2"), ip("10.99.0.3")],
                remote_endpoints: vec![Endpoint {
                    mac: "02:00:00:00:00:05".parse().unwrap(),
                    ip: "10.1.0.5".parse().unwrap(),
                    vtep: ip("10.99.0.2"),
                }],
                filter: None,
            }],
            edges: Vec::new(),
        }
    }

    /// What the kernel would hold after `plan` ran on an empty host.
    fn converged(s: &DesiredState) -> Observed {
        let mut o = Observed::default();
        for c in plan(s, &Observed::default()) {
            apply(&mut o, &c);
        }
        o
    }

    /// A model of the kernel's effect of each change, for the pure tests.
    fn apply(o: &mut Observed, c: &Change) {
        match c.clone() {
            Change::DelLink { name } => {
                o.links.remove(&name);
                if let Some((vni, vx)) = vni_of(&name) {
                    if vx {
                        o.fdb.retain(|f| f.vni != vni);
                        o.bridge_fdb.retain(|f| f.0 != vni);
                    } else {
                        o.neigh.retain(|n| n.vni != vni);
                    }
                }
            }
            Change::AddBridge { name, mtu, .. } => {
                o.links.insert(
                    name,
                    Link {
                        kind: LinkKind::Bridge,
                        mtu,
                        up: false,
                        master: None,
                        port: None,
                    },
                );
            }
            Change::AddVxlan {
                name,
                vni,
                local,
                mtu,
            } => {
                o.links.insert(
                    name,
                    Link {
                        kind: LinkKind::Vxlan {
                            vni,
                            local: Some(local),
                            port: VXLAN_PORT,
                            learning: false,
                        },
                        mtu,
                        up: false,
                        master: None,
                        port: None,
                    },
                );
            }
            Change::SetMtu { name, mtu } => o.links.get_mut(&name).unwrap().mtu = mtu,
            Change::SetMaster { name, master } => {
                let l = o.links.get_mut(&name).unwrap();
                l.master = Some(master);
                l.port = Some(PortFlags {
                    learning: true,
                    neigh_suppress: false,
                });
            }
            Change::SetPort { name } => {
                o.links.get_mut(&name).unwrap().port = Some(VXLAN_PORT_FLAGS)
            }
            Change::SetUp { name } => o.links.get_mut(&name).unwrap().up = true,
            Change::DelFdb(f) => assert!(o.fdb.remove(&f)),
            Change::AddFdb(f) => assert!(o.fdb.insert(f)),
            Change::DelBridgeFdb { vni, mac } => assert!(o.bridge_fdb.remove(&(vni, mac))),
            Change::AddBridgeFdb { vni, mac } => assert!(o.bridge_fdb.insert((vni, mac))),
            Change::DelNeigh(n) => assert!(o.neigh.remove(&n)),
            Change::AddNeigh(n) => assert!(o.neigh.insert(n)),
        }
    }

    #[test]
    fn an_empty_host_gets_devices_flood_list_and_entries_then_nothing_more() {
        let s = state();
        let changes = plan(&s, &Observed::default());
        assert_eq!(
            changes[..6],
            [
                Change::AddBridge {
                    name: "kbr100".into(),
                    mtu: 1450,
                    address: Mac([6, 0, 0, 100, 0, 1])
                },
                Change::AddVxlan {
                    name: "kvx100".into(),
                    vni: 100,
                    local: ip("10.99.0.1"),
                    mtu: 1450
                },
                Change::SetMaster {
                    name: "kvx100".into(),
                    master: "kbr100".into()
                },
                Change::SetPort {
                    name: "kvx100".into()
                },
                Change::SetUp {
                    name: "kbr100".into()
                },
                Change::SetUp {
                    name: "kvx100".into()
                },
            ]
        );
        let o = converged(&s);
        assert_eq!(o.fdb.len(), 3, "two flood entries and one VM");
        assert_eq!(o.neigh.len(), 1);
        assert_eq!(plan(&s, &o), vec![]);
    }

    #[test]
    fn removals_take_exactly_what_is_stale() {
        let mut s = state();
        let o = converged(&s);
        // The VM moved to host 3, host 2 left the segment.
        s.segments[0].remote_vteps = vec![ip("10.99.0.3")];
        s.segments[0].remote_endpoints[0].vtep = ip("10.99.0.3");
        let changes = plan(&s, &o);
        let mac = s.segments[0].remote_endpoints[0].mac;
        assert_eq!(
            changes,
            vec![
                Change::DelFdb(Fdb {
                    vni: 100,
                    mac: Mac::ZERO,
                    dst: ip("10.99.0.2")
                }),
                Change::DelFdb(Fdb {
                    vni: 100,
                    mac,
                    dst: ip("10.99.0.2")
                }),
                Change::AddFdb(Fdb {
                    vni: 100,
                    mac,
                    dst: ip("10.99.0.3")
                }),
            ]
        );
        // The segment gone: its two devices go, their entries with them.
        s.segments.clear();
        let changes = plan(&s, &o);
        assert_eq!(
            changes,
            vec![
                Change::DelLink {
                    name: "kbr100".into()
                },
                Change::DelLink {
                    name: "kvx100".into()
                }
            ]
        );
    }

    #[test]
    fn a_device_built_otherwise_is_rebuilt_and_foreign_ones_are_left_alone() {
        let s = state();
        let mut o = converged(&s);
        o.links.insert(
            "eth0".into(),
            Link {
                kind: LinkKind::Other,
                mtu: 1500,
                up: true,
                master: None,
                port: None,
            },
        );
        if let Some(l) = o.links.get_mut("kvx100") {
            l.kind = LinkKind::Vxlan {
                vni: 100,
                local: Some(ip("10.99.0.1")),
                port: 8472,
                learning: false,
            };
        }
        let changes = plan(&s, &o);
        assert_eq!(
            changes[0],
            Change::DelLink {
                name: "kvx100".into()
            }
        );
        assert!(!changes
            .iter()
            .any(|c| matches!(c, Change::DelLink { name } if name == "eth0")));
        for c in &changes {
            apply(&mut o, c);
        }
        assert_eq!(plan(&s, &o), vec![]);
        // An MTU change is made in place.
        let mut s2 = s.clone();
        s2.segments[0].mtu = 8950;
        assert_eq!(
            plan(&s2, &o),
            vec![
                Change::SetMtu {
                    name: "kbr100".into(),
                    mtu: 8950
                },
                Change::SetMtu {
                    name: "kvx100".into(),
                    mtu: 8950
                },
            ]
        );
    }
}
