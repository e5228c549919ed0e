//! The IO edge: reads Kumo's links, FDB and neighbour entries from the
//! kernel over netlink and carries out a plan's changes, one netlink
//! request each (so a caller can count them).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use futures_util::stream::{StreamExt, TryStreamExt};
use nix::sched::CloneFlags;
use rtnetlink::packet_core::{
    NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_REPLACE,
    NLM_F_REQUEST,
};
use rtnetlink::packet_route::link::{
    InfoBridgePort, InfoData, InfoKind, InfoPortData, InfoVxlan, LinkAttribute, LinkFlags,
    LinkInfo, LinkMessage,
};
use rtnetlink::packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use rtnetlink::packet_route::route::RouteType;
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::{Handle, LinkBridge, LinkBridgePort, LinkUnspec, LinkVxlan};

use crate::plan::{plan, Change, Fdb, Link, LinkKind, Neigh, Observed, PortFlags};
use crate::state::{bridge_name, vni_of, vxlan_name, DesiredState, Mac, VXLAN_PORT};

const NUD_NOARP: u16 = 0x40;
const NUD_PERMANENT: u16 = 0x80;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("network namespace {name:?}")]
    Namespace {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("netlink socket: {0}")]
    Socket(std::io::Error),
    #[error("{what}: {source}")]
    Netlink {
        what: String,
        source: rtnetlink::Error,
    },
    #[error("{0} vanished while being configured")]
    Vanished(String),
    #[error("invalid state, nothing changed: {0}")]
    Invalid(#[from] crate::state::StateError),
    /// A helper program (nft, dcb) failed or is missing.
    #[error("{0}")]
    Tool(String),
}

/// Runs `f` in the named namespace (`/run/netns/NAME`, as `ip netns`
/// makes them), or in the caller's. A socket stays in the namespace it was
/// opened in, and a child process starts in its parent thread's: so `f`
/// runs on a thread of its own that enters the namespace, and the
/// caller's threads stay where they are.
pub(crate) fn within<T: Send>(
    netns: Option<&str>,
    f: impl FnOnce() -> Result<T, NetError> + Send,
) -> Result<T, NetError> {
    let Some(name) = netns else {
        return f();
    };
    let ns_err = |source| NetError::Namespace {
        name: name.to_owned(),
        source,
    };
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return Err(ns_err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a namespace name",
        )));
    }
    let file = std::fs::File::open(format!("/run/netns/{name}")).map_err(ns_err)?;
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(&file, CloneFlags::CLONE_NEWNET)
                .map_err(|e| ns_err(std::io::Error::from(e)))?;
            f()
        })
        .join()
        .unwrap_or_else(|_| {
            Err(NetError::Socket(std::io::Error::other(
                "namespace thread panicked",
            )))
        })
    })
}

/// Runs a helper program (`nft`, `dcb`) in the namespace, feeding it
/// `input`; answers `(success, stdout, stderr)`.
pub(crate) fn tool(
    netns: Option<&str>,
    program: &str,
    package: &str,
    args: &[&str],
    input: Option<&str>,
) -> Result<(bool, String, String), NetError> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    within(netns, || {
        let mut child = Command::new(program)
            .args(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                NetError::Tool(format!("cannot run {program} (package {package}): {e}"))
            })?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin
                .write_all(text.as_bytes())
                .map_err(|e| NetError::Tool(format!("writing to {program}: {e}")))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| NetError::Tool(format!("waiting for {program}: {e}")))?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ))
    })
}

fn nl(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetError {
    let what = what.into();
    move |source| NetError::Netlink { what, source }
}

#[derive(Default)]
struct Indexes(BTreeMap<String, u32>);

/// A netlink connection in one network namespace.
pub struct Kernel {
    handle: Handle,
}

impl Kernel {
    /// Connects in the named namespace (`/run/netns/NAME`, as `ip netns`
    /// makes them), or in the caller's. Must run inside a Tokio runtime.
    pub fn connect(netns: Option<&str>) -> Result<Kernel, NetError> {
        let rt = tokio::runtime::Handle::current();
        let (conn, handle, _) = within(netns, || {
            let _rt = rt.enter();
            rtnetlink::new_connection().map_err(NetError::Socket)
        })?;
        tokio::spawn(conn);
        Ok(Kernel { handle })
    }

    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    async fn links(&self) -> Result<Vec<LinkMessage>, NetError> {
        self.handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(nl("listing links"))
    }

    async fn index_of(&self, name: &str) -> Result<u32, NetError> {
        let mut s = self
            .handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute();
        match s.next().await {
            Some(Ok(m)) => Ok(m.header.index),
            _ => Err(NetError::Vanished(name.to_owned())),
        }
    }

    /// Interface indexes by name, looked up once per `apply`.
    async fn index(&self, indexes: &mut Indexes, name: &str) -> Result<u32, NetError> {
        if let Some(i) = indexes.0.get(name) {
            return Ok(*i);
        }
        let i = self.index_of(name).await?;
        indexes.0.insert(name.to_owned(), i);
        Ok(i)
    }

    async fn neighbours(&self, family: AddressFamily) -> Result<Vec<NeighbourMessage>, NetError> {
        let mut req = self.handle.neighbours().get();
        req.message_mut().header.family = family;
        req.execute()
            .try_collect()
            .await
            .map_err(nl("listing neighbour entries"))
    }

    /// Kumo's objects as the kernel has them.
    pub async fn observe(&self) -> Result<Observed, NetError> {
        let msgs = self.links().await?;
        let names: BTreeMap<u32, String> = msgs
            .iter()
            .filter_map(|m| link_name(m).map(|n| (m.header.index, n)))
            .collect();
        let mut out = Observed::default();
        for m in &msgs {
            let Some(name) = names.get(&m.header.index) else {
                continue;
            };
            if vni_of(name).is_none() {
                continue;
            }
            out.links.insert(name.clone(), parse_link(m, &names));
        }
        let vni_of_index = |i: u32| names.get(&i).and_then(|n| vni_of(n));
        for m in self.neighbours(AddressFamily::Bridge).await? {
            let Some((vni, true)) = vni_of_index(m.header.ifindex) else {
                continue;
            };
            let Some(mac) = lladdr(&m) else {
                continue;
            };
            // The VXLAN device's own entries carry NTF_SELF; the bridge's
            // name their bridge (NDA_MASTER) instead.
            let own = m.header.flags.contains(NeighbourFlags::Own);
            let master = m
                .attributes
                .iter()
                .any(|a| matches!(a, NeighbourAttribute::Controller(_)));
            // The state is a bit set (iproute2 writes PERMANENT|NOARP).
            let state = u16::from(m.header.state);
            let permanent = state & NUD_PERMANENT != 0;
            let noarp = state & NUD_NOARP != 0;
            match (own, master, dst(&m)) {
                (true, _, Some(IpAddr::V4(dst))) if permanent => {
                    out.fdb.insert(Fdb { vni, mac, dst });
                }
                // Static: not the port's own (permanent) address, not learned.
                (false, true, _) if noarp && !permanent => {
                    out.bridge_fdb.insert((vni, mac));
                }
                _ => {}
            }
        }
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            for m in self.neighbours(family).await? {
                let Some((vni, false)) = vni_of_index(m.header.ifindex) else {
                    continue;
                };
                if u16::from(m.header.state) & NUD_PERMANENT == 0 {
                    continue;
                }
                if let (Some(ip), Some(mac)) = (dst(&m), lladdr(&m)) {
                    out.neigh.insert(Neigh { vni, ip, mac });
                }
            }
        }
        Ok(out)
    }

    async fn send(
        &self,
        what: String,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<(), NetError> {
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        let mut handle = self.handle.clone();
        let mut resp = handle.request(req).map_err(nl(what.clone()))?;
        while let Some(m) = resp.next().await {
            if let NetlinkPayload::Error(e) = m.payload {
                if e.code.is_some() {
                    return Err(NetError::Netlink {
                        what,
                        source: rtnetlink::Error::NetlinkError(e),
                    });
                }
            }
        }
        Ok(())
    }

    /// RTM_DELNEIGH when `delete`, else RTM_NEWNEIGH with `add_flags`.
    async fn neighbour(
        &self,
        what: String,
        m: NeighbourMessage,
        delete: bool,
        add_flags: u16,
    ) -> Result<(), NetError> {
        if delete {
            self.send(what, RouteNetlinkMessage::DelNeighbour(m), 0)
                .await
        } else {
            self.send(what, RouteNetlinkMessage::NewNeighbour(m), add_flags)
                .await
        }
    }

    /// Carries out `changes` in order; returns how many requests it sent.
    pub async fn apply(&self, changes: &[Change]) -> Result<usize, NetError> {
        let mut indexes = Indexes::default();
        let mut n = 0;
        for c in changes {
            self.apply_one(c, &mut indexes).await?;
            n += 1;
        }
        Ok(n)
    }

    async fn apply_one(&self, c: &Change, indexes: &mut Indexes) -> Result<(), NetError> {
        if let Change::DelLink { name }
        | Change::AddBridge { name, .. }
        | Change::AddVxlan { name, .. } = c
        {
            indexes.0.remove(name);
        }
        let links = self.handle.link();
        match c {
            Change::DelLink { name } => {
                let i = self.index(indexes, name).await?;
                links
                    .del(i)
                    .execute()
                    .await
                    .map_err(nl(format!("deleting {name}")))
            }
            Change::AddBridge { name, mtu, address } => links
                // A fixed address: otherwise the bridge takes its lowest
                // port's, and the change flushes its neighbour entries.
                .add(
                    LinkBridge::new(name)
                        .mtu(*mtu)
                        .address(address.0.to_vec())
                        .build(),
                )
                .execute()
                .await
                .map_err(nl(format!("creating bridge {name}"))),
            Change::AddVxlan {
                name,
                vni,
                local,
                mtu,
            } => links
                .add(
                    LinkVxlan::new(name, *vni)
                        .local(*local)
                        .port(VXLAN_PORT)
                        .learning(false)
                        .mtu(*mtu)
                        .build(),
                )
                .execute()
                .await
                .map_err(nl(format!("creating VXLAN device {name}"))),
            Change::SetMtu { name, mtu } => {
                let i = self.index(indexes, name).await?;
                links
                    .set(LinkUnspec::new_with_index(i).mtu(*mtu).build())
                    .execute()
                    .await
                    .map_err(nl(format!("setting the MTU of {name}")))
            }
            Change::SetMaster { name, master } => {
                let i = self.index(indexes, name).await?;
                let m = self.index(indexes, master).await?;
                links
                    .set(LinkUnspec::new_with_index(i).controller(m).build())
                    .execute()
                    .await
                    .map_err(nl(format!("adding {name} to {master}")))
            }
            Change::SetPort { name } => {
                let i = self.index(indexes, name).await?;
                links
                    .set_port(
                        LinkBridgePort::new(i)
                            .learning(false)
                            .append_info_data(InfoBridgePort::NeighSupress(true))
                            .build(),
                    )
                    .execute()
                    .await
                    .map_err(nl(format!("setting the bridge port flags of {name}")))
            }
            Change::SetUp { name } => {
                let i = self.index(indexes, name).await?;
                links
                    .set(LinkUnspec::new_with_index(i).up().build())
                    .execute()
                    .await
                    .map_err(nl(format!("bringing {name} up")))
            }
            Change::AddFdb(f) | Change::DelFdb(f) => {
                let dev = vxlan_name(f.vni);
                let i = self.index(indexes, &dev).await?;
                let mut m = bridge_entry(i, f.mac, NeighbourFlags::Own, NeighbourState::Permanent);
                m.attributes
                    .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(
                        f.dst,
                    )));
                let what = format!("FDB entry {} → {} on {dev}", f.mac, f.dst);
                // The flood list holds one all-zero entry per remote VTEP:
                // APPEND (REPLACE on it is refused by the kernel).
                let add = if f.mac == Mac::ZERO {
                    NLM_F_CREATE | NLM_F_APPEND
                } else {
                    NLM_F_CREATE | NLM_F_REPLACE
                };
                self.neighbour(what, m, matches!(c, Change::DelFdb(_)), add)
                    .await
            }
            Change::AddBridgeFdb { vni, mac } | Change::DelBridgeFdb { vni, mac } => {
                let dev = vxlan_name(*vni);
                let i = self.index(indexes, &dev).await?;
                let m = bridge_entry(i, *mac, NeighbourFlags::Controller, NeighbourState::Noarp);
                let what = format!("bridge FDB entry {mac} on {dev}");
                let delete = matches!(c, Change::DelBridgeFdb { .. });
                self.neighbour(what, m, delete, NLM_F_CREATE | NLM_F_REPLACE)
                    .await
            }
            Change::AddNeigh(n) | Change::DelNeigh(n) => {
                let dev = bridge_name(n.vni);
                let i = self.index(indexes, &dev).await?;
                let mut m = NeighbourMessage::default();
                m.header.family = match n.ip {
                    IpAddr::V4(_) => AddressFamily::Inet,
                    IpAddr::V6(_) => AddressFamily::Inet6,
                };
                m.header.ifindex = i;
                m.header.state = NeighbourState::Permanent;
                m.header.kind = RouteType::Unspec;
                m.attributes
                    .push(NeighbourAttribute::Destination(match n.ip {
                        IpAddr::V4(a) => NeighbourAddress::Inet(a),
                        IpAddr::V6(a) => NeighbourAddress::Inet6(a),
                    }));
                m.attributes
                    .push(NeighbourAttribute::LinkLayerAddress(n.mac.0.to_vec()));
                let what = format!("neighbour {} → {} on {dev}", n.ip, n.mac);
                let delete = matches!(c, Change::DelNeigh(_));
                self.neighbour(what, m, delete, NLM_F_CREATE | NLM_F_REPLACE)
                    .await
            }
        }
    }
}

/// One pass: read, diff, change. Returns the changes made (none when the
/// kernel already matched).
pub async fn converge(kernel: &Kernel, want: &DesiredState) -> Result<Vec<Change>, NetError> {
    want.validate()?;
    let have = kernel.observe().await?;
    let changes = plan(want, &have);
    kernel.apply(&changes).await?;
    Ok(changes)
}

/// What a segment-by-segment pass did.
#[derive(Debug, Default)]
pub struct Converged {
    /// The changes made (none when the kernel already matched).
    pub changes: Vec<Change>,
    /// The segments left unconverged, by VNI, with why: a bad document or
    /// a change the kernel refused. Every other segment converged.
    pub failed: BTreeMap<u32, String>,
}

/// One pass, segment by segment: a segment whose part of the document is
/// bad, or whose kernel changes fail, is left out and named in
/// [`Converged::failed`]; the others converge all the same. Only what is
/// the host's own (its underlay address, reading the kernel) fails the pass.
pub async fn converge_each(kernel: &Kernel, want: &DesiredState) -> Result<Converged, NetError> {
    let (usable, mut failed) = want.usable()?;
    let have = kernel.observe().await?;
    let mut by_vni: BTreeMap<Option<u32>, Vec<Change>> = BTreeMap::new();
    for c in plan(&usable, &have) {
        by_vni.entry(c.vni()).or_default().push(c);
    }
    let mut done = Converged::default();
    for (vni, changes) in by_vni {
        match (kernel.apply(&changes).await, vni) {
            (Ok(_), _) => done.changes.extend(changes),
            (Err(e), Some(vni)) => {
                failed.insert(vni, e.to_string());
            }
            (Err(e), None) => return Err(e),
        }
    }
    done.failed = failed;
    Ok(done)
}

fn bridge_entry(
    ifindex: u32,
    mac: Mac,
    flags: NeighbourFlags,
    state: NeighbourState,
) -> NeighbourMessage {
    let mut m = NeighbourMessage::default();
    m.header.family = AddressFamily::Bridge;
    m.header.ifindex = ifindex;
    m.header.flags = flags;
    m.header.state = state;
    m.header.kind = RouteType::Unspec;
    m.attributes
        .push(NeighbourAttribute::LinkLayerAddress(mac.0.to_vec()));
    m
}

fn link_name(m: &LinkMessage) -> Option<String> {
    m.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.clone()),
        _ => None,
    })
}

fn parse_link(m: &LinkMessage, names: &BTreeMap<u32, String>) -> Link {
    let mut link = Link {
        kind: LinkKind::Other,
        mtu: 0,
        up: m.header.flags.contains(LinkFlags::Up),
        master: None,
        port: None,
    };
    for a in &m.attributes {
        match a {
            LinkAttribute::Mtu(v) => link.mtu = *v,
            LinkAttribute::Controller(i) => link.master = names.get(i).cloned(),
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    match info {
                        LinkInfo::Kind(InfoKind::Bridge) => link.kind = LinkKind::Bridge,
                        LinkInfo::Data(InfoData::Vxlan(v)) => link.kind = vxlan_kind(v),
                        LinkInfo::PortData(InfoPortData::BridgePort(p)) => {
                            let mut flags = PortFlags {
                                learning: true,
                                neigh_suppress: false,
                            };
                            for x in p {
                                match x {
                                    InfoBridgePort::Learning(b) => flags.learning = *b,
                                    InfoBridgePort::NeighSupress(b) => flags.neigh_suppress = *b,
                                    _ => {}
                                }
                            }
                            link.port = Some(flags);
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    link
}

fn vxlan_kind(v: &[InfoVxlan]) -> LinkKind {
    let mut vni = 0;
    let mut local: Option<Ipv4Addr> = None;
    let mut port = 0;
    let mut learning = true;
    for x in v {
        match x {
            InfoVxlan::Id(i) => vni = *i,
            InfoVxlan::Local(a) => local = Some(*a),
            InfoVxlan::Port(p) => port = *p,
            InfoVxlan::Learning(b) => learning = *b,
            _ => {}
        }
    }
    LinkKind::Vxlan {
        vni,
        local,
        port,
        learning,
    }
}

fn lladdr(m: &NeighbourMessage) -> Option<Mac> {
    m.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::LinkLayerAddress(b) => <[u8; 6]>::try_from(b.as_slice()).ok().map(Mac),
        _ => None,
    })
}

fn dst(m: &NeighbourMessage) -> Option<IpAddr> {
    m.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(NeighbourAddress::Inet(v)) => Some(IpAddr::V4(*v)),
        NeighbourAttribute::Destination(NeighbourAddress::Inet6(v)) => Some(IpAddr::V6(*v)),
        // In AF_BRIDGE messages the parser cannot tell the address family.
        NeighbourAttribute::Destination(NeighbourAddress::Other(b)) => match b.len() {
            4 => <[u8; 4]>::try_from(b.as_slice()).ok().map(IpAddr::from),
            16 => <[u8; 16]>::try_from(b.as_slice()).ok().map(IpAddr::from),
            _ => None,
        },
        _ => None,
    })
}
