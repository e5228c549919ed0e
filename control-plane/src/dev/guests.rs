//! Stand-in guests for the dev fleet's VMs. Its hosts run libvirt's test
//! driver, whose domains have no network; so that a person can reach a
//! VM through its public address as they would a real one, each running
//! VM with a NIC on an Ethernet segment gets a network namespace plugged
//! into its host's bridge with the API's MAC and address and a default
//! route via the gateway — what a VM's tap and cloud-init would give it —
//! answering TCP 22 with a line naming it and 80 with the same line over
//! HTTP. Level-triggered like the agents: each pass makes what is
//! missing, removes what is no longer wanted, and leaves the rest alone.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kumo_api_types::{Segment, SegmentKind, Vm, VmState};

use super::network::{ip, GuestNet};

/// What a guest is made of; a change makes it anew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestPlan {
    pub tenant: String,
    pub vm: String,
    /// The host's namespace.
    pub host_ns: String,
    pub nics: Vec<PlannedNic>,
    pub gateway: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedNic {
    pub bridge: String,
    pub mac: String,
    /// `a.b.c.d/len`
    pub address: String,
    pub mtu: u32,
}

/// The guests wanted, by VM id: running VMs on hosts with a namespace,
/// with their Ethernet NICs (RoCE NICs are VFs, not bridge ports).
pub fn plan(
    vms: &[Vm],
    segments: &[Segment],
    host_ns: &BTreeMap<String, String>,
) -> BTreeMap<uuid::Uuid, GuestPlan> {
    let mut out = BTreeMap::new();
    for v in vms.iter().filter(|v| v.state == VmState::Running) {
        let Some(ns) = v.host.as_ref().and_then(|h| host_ns.get(h)) else {
            continue;
        };
        let mut nics = Vec::new();
        let mut gateway = None;
        for n in &v.networks {
            let Some(s) = segments
                .iter()
                .find(|s| s.tenant == v.tenant && s.name == n.segment)
            else {
                continue;
            };
            let Some(len) = s.cidr.split_once('/').map(|c| c.1) else {
                continue;
            };
            if s.kind != SegmentKind::Ethernet {
                continue;
            }
            gateway.get_or_insert_with(|| s.gateway.clone());
            nics.push(PlannedNic {
                bridge: vxlan_manager::state::bridge_name(s.vni),
                mac: n.mac.clone(),
                address: format!("{}/{len}", n.ip),
                mtu: s.mtu,
            });
        }
        if let Some(gateway) = gateway {
            out.insert(
                v.id,
                GuestPlan {
                    tenant: v.tenant.clone(),
                    vm: v.name.clone(),
                    host_ns: ns.clone(),
                    nics,
                    gateway,
                },
            );
        }
    }
    out
}

/// A guest as made: its namespace, the host ends of its NICs, and the
/// thread answering inside it.
struct Guest {
    plan: GuestPlan,
    namespace: String,
    taps: Vec<String>,
    stop: Arc<AtomicBool>,
    server: Option<std::thread::JoinHandle<()>>,
}

impl Guest {
    fn remove(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.server.take() {
            let _ = t.join();
        }
        // Deleting one end of a veth deletes both: the VM's MAC leaves
        // the bridge at once.
        for tap in &self.taps {
            let _ = ip(&["-n", &self.plan.host_ns, "link", "del", tap]);
        }
        if let Err(e) = vxlan_manager::netns::delete(&self.namespace) {
            tracing::warn!(netns = %self.namespace, error = %e, "could not remove a stand-in guest");
        }
    }
}

/// The fleet's stand-in guests.
pub struct Guests {
    prefix: String,
    made: BTreeMap<uuid::Uuid, Guest>,
    /// Numbers names: VM names repeat across tenants and are too long
    /// for interface names.
    next: u32,
}

impl Guests {
    pub fn new(prefix: &str) -> Guests {
        Guests {
            prefix: prefix.to_owned(),
            made: BTreeMap::new(),
            next: 0,
        }
    }

    /// Brings the guests in line with `want`; answers whether any changed.
    /// A guest that cannot be made (its bridge not there yet) is tried
    /// again on the next pass and holds back no other.
    pub fn converge(&mut self, want: &BTreeMap<uuid::Uuid, GuestPlan>) -> bool {
        let stale: Vec<uuid::Uuid> = self
            .made
            .iter()
            .filter(|(id, g)| want.get(id) != Some(&g.plan))
            .map(|(id, _)| *id)
            .collect();
        let mut changed = !stale.is_empty();
        for id in stale {
            if let Some(g) = self.made.remove(&id) {
                g.remove();
            }
        }
        for (id, p) in want {
            if self.made.contains_key(id) {
                continue;
            }
            self.next += 1;
            match self.make(p, self.next) {
                Ok(g) => {
                    tracing::info!(vm = %p.vm, tenant = %p.tenant, netns = %g.namespace, "stand-in guest plugged in");
                    self.made.insert(*id, g);
                    changed = true;
                }
                Err(e) => tracing::debug!(vm = %p.vm, error = %e, "stand-in guest not made yet"),
            }
        }
        changed
    }

    /// Makes a guest; on failure removes what was made of it.
    fn make(&self, p: &GuestPlan, n: u32) -> anyhow::Result<Guest> {
        let mut g = Guest {
            plan: p.clone(),
            namespace: format!("{}-g{n}", self.prefix),
            taps: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
            server: None,
        };
        match plug(&mut g, n) {
            Ok(()) => Ok(g),
            Err(e) => {
                g.remove();
                Err(e)
            }
        }
    }

    pub fn listing(&self) -> Vec<GuestNet> {
        self.made
            .values()
            .map(|g| GuestNet {
                tenant: g.plan.tenant.clone(),
                vm: g.plan.vm.clone(),
                namespace: g.namespace.clone(),
                addresses: g.plan.nics.iter().map(|n| n.address.clone()).collect(),
            })
            .collect()
    }

    pub fn remove_all(&mut self) {
        for (_, g) in std::mem::take(&mut self.made) {
            g.remove();
        }
    }
}

impl Drop for Guests {
    fn drop(&mut self) {
        self.remove_all();
    }
}

/// Makes guest number `n`: its namespace, a veth per NIC on the host's
/// bridge, the default route, and the thread that answers.
fn plug(g: &mut Guest, n: u32) -> anyhow::Result<()> {
    let ns = g.namespace.clone();
    vxlan_manager::netns::create(&ns)?;
    ip(&["-n", &ns, "link", "set", "lo", "up"])?;
    for (i, nic) in g.plan.nics.clone().iter().enumerate() {
        let dev = format!("eth{i}");
        let tap = format!("kg{n}n{i}");
        let mtu = nic.mtu.to_string();
        ip(&[
            "link",
            "add",
            &dev,
            "netns",
            &ns,
            "type",
            "veth",
            "peer",
            "name",
            &tap,
            "netns",
            &g.plan.host_ns,
        ])?;
        g.taps.push(tap.clone());
        ip(&[
            "-n", &ns, "link", "set", &dev, "address", &nic.mac, "mtu", &mtu,
        ])?;
        ip(&["-n", &ns, "addr", "add", &nic.address, "dev", &dev])?;
        ip(&["-n", &ns, "link", "set", &dev, "up"])?;
        ip(&[
            "-n",
            &g.plan.host_ns,
            "link",
            "set",
            &tap,
            "mtu",
            &mtu,
            "master",
            &nic.bridge,
            "up",
        ])?;
    }
    ip(&["-n", &ns, "route", "add", "default", "via", &g.plan.gateway])?;
    let line = format!(
        "kumo dev guest {}/{} ({}): a stand-in for a VM, not a real SSH server\r\n",
        g.plan.tenant,
        g.plan.vm,
        g.plan
            .nics
            .first()
            .map(|n| n.address.as_str())
            .unwrap_or("")
    );
    let stop = g.stop.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    g.server = Some(vxlan_manager::netns::spawn_in(&ns, move || {
        let bound: std::io::Result<Vec<(u16, TcpListener)>> = [22u16, 80]
            .into_iter()
            .map(|p| {
                let l = TcpListener::bind(("0.0.0.0", p))?;
                l.set_nonblocking(true)?;
                Ok((p, l))
            })
            .collect();
        let listeners = match bound {
            Ok(l) => {
                let _ = tx.send(Ok(()));
                l
            }
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        answer(&listeners, &line, &stop);
    })?);
    rx.recv()
        .map_err(|_| anyhow::anyhow!("the guest's server ended"))??;
    Ok(())
}

/// Answers every connection until told to stop: port 22 with `line`,
/// port 80 with it as an HTTP response.
fn answer(listeners: &[(u16, TcpListener)], line: &str, stop: &AtomicBool) {
    let http = format!(
        "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{line}",
        line.len()
    );
    while !stop.load(Ordering::Relaxed) {
        let mut idle = true;
        for (port, l) in listeners {
            if let Ok((mut s, _)) = l.accept() {
                idle = false;
                let _ = s.set_nonblocking(false);
                let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
                let reply = if *port == 80 { &http } else { line };
                let _ = s.write_all(reply.as_bytes());
                let _ = s.shutdown(std::net::Shutdown::Write);
            }
        }
        if idle {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kumo_api_types::VmNetwork;

    fn vm(name: &str, state: VmState, host: Option<&str>, nets: &[(&str, &str)]) -> Vm {
        serde_json::from_value(serde_json::json!({
            "id": uuid::Uuid::new_v4(), "name": name, "tenant": "demo", "state": state,
            "host": host,
            "spec": {"gpus": 0, "vcpus": 1, "memory_gib": 1, "disk_gib": 10, "service_level": "guaranteed"},
            "networks": nets.iter().map(|(s, ip)| VmNetwork {
                segment: (*s).into(), ip: (*ip).into(), mac: "52:54:00:00:00:01".into(),
                public_ip: None, forwards: Vec::new(),
            }).collect::<Vec<_>>(),
            "created_at": "2026-11-25T00:00:00Z", "updated_at": "2026-11-25T00:00:00Z",
        }))
        .unwrap()
    }

    fn segment(name: &str, kind: SegmentKind, vni: u32) -> Segment {
        serde_json::from_value(serde_json::json!({
            "id": uuid::Uuid::new_v4(), "name": name, "tenant": "demo", "kind": kind,
            "cidr": "10.1.0.0/24", "gateway": "10.1.0.1", "mtu": 8950, "vni": vni,
            "attachments": 1, "egress": true, "created_at": "2026-11-25T00:00:00Z",
        }))
        .unwrap()
    }

    #[test]
    fn only_running_vms_on_namespaced_hosts_with_ethernet_nics_get_a_guest() {
        let hosts: BTreeMap<String, String> = [("host-001".into(), "ns-0".into())].into();
        let segs = [
            segment("lan", SegmentKind::Ethernet, 100),
            segment("rdma", SegmentKind::Roce, 101),
        ];
        let vms = [
            vm(
                "web",
                VmState::Running,
                Some("host-001"),
                &[("lan", "10.1.0.9")],
            ),
            vm(
                "off",
                VmState::Stopped,
                Some("host-001"),
                &[("lan", "10.1.0.10")],
            ),
            vm(
                "far",
                VmState::Running,
                Some("host-009"),
                &[("lan", "10.1.0.11")],
            ),
            vm(
                "gpu",
                VmState::Running,
                Some("host-001"),
                &[("rdma", "10.1.0.12")],
            ),
            vm("bare", VmState::Running, Some("host-001"), &[]),
        ];
        let want = plan(&vms, &segs, &hosts);
        assert_eq!(want.len(), 1, "{want:?}");
        let g = &want[&vms[0].id];
        assert_eq!(g.vm, "web");
        assert_eq!(g.host_ns, "ns-0");
        assert_eq!(g.gateway, "10.1.0.1");
        assert_eq!(
            g.nics,
            [PlannedNic {
                bridge: "kbr100".into(),
                mac: "52:54:00:00:00:01".into(),
                address: "10.1.0.9/24".into(),
                mtu: 8950,
            }]
        );
    }
}
