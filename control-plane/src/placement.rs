//! First-fit placement, pairing-aware: the first host (in name order; hosts
//! without GPUs first for CPU-only VMs) with enough free GPUs of the model,
//! taking GPUs whose paired NIC is free before those whose NIC is taken.
//! Pure: the database commit of the allocation rows decides races.

use std::collections::BTreeSet;

use kumo_topology::guest_layout::{place_avoiding, InUse, Placement};
use kumo_topology::{pairing, Bdf, HostTopology};
use uuid::Uuid;

pub const KIND_GPU: &str = "gpu";
pub const KIND_NIC: &str = "nic";
pub const KIND_CPU: &str = "cpu";

/// A host that may take the VM, with what its VMs already hold.
pub struct Candidate<'a> {
    pub host_id: Uuid,
    pub name: &'a str,
    pub topology: &'a HostTopology,
    /// `(kind, key)` of every allocation on the host.
    pub held: &'a BTreeSet<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub gpus: u32,
    pub gpu_model: Option<String>,
    pub vcpus: u32,
    pub memory_gib: u32,
}

/// The allocation rows a placement needs: `(kind, key)`.
pub fn allocations(p: &Placement) -> Vec<(&'static str, String)> {
    let mut rows: Vec<(&'static str, String)> =
        p.gpus.iter().map(|g| (KIND_GPU, g.to_string())).collect();
    rows.extend(p.nics.iter().map(|n| (KIND_NIC, n.host_bdf.to_string())));
    rows.extend(p.cpus.values().flatten().map(|c| (KIND_CPU, c.to_string())));
    rows
}

fn place_on(c: &Candidate, req: &Request) -> Option<Placement> {
    let held = |kind: &str, key: String| c.held.contains(&(kind.to_owned(), key));
    let pairs = pairing(c.topology);
    let nic_bdf = |g: Bdf| {
        pairs
            .get(&g)
            .cloned()
            .flatten()
            .and_then(|n| c.topology.nic(&n).map(|x| x.location.bdf))
    };
    let mut free: Vec<(bool, Bdf)> = c
        .topology
        .gpus
        .iter()
        .filter(|g| req.gpu_model.as_ref().is_none_or(|m| &g.model == m))
        .map(|g| g.location.bdf)
        .filter(|b| !held(KIND_GPU, b.to_string()))
        .map(|b| (nic_bdf(b).is_some_and(|n| held(KIND_NIC, n.to_string())), b))
        .collect();
    if free.len() < req.gpus as usize {
        return None;
    }
    free.sort();
    let gpus: Vec<Bdf> = free
        .iter()
        .take(req.gpus as usize)
        .map(|(_, b)| *b)
        .collect();
    let in_use = InUse {
        cpus: c
            .held
            .iter()
            .filter(|(k, _)| k == KIND_CPU)
            .filter_map(|(_, v)| v.parse().ok())
            .collect(),
        nics: c
            .held
            .iter()
            .filter(|(k, _)| k == KIND_NIC)
            .filter_map(|(_, v)| v.parse().ok())
            .collect(),
    };
    place_avoiding(c.topology, &gpus, req.vcpus, req.memory_gib, &in_use).ok()
}

/// Candidates in the order first-fit tries them.
pub fn order(candidates: &mut [Candidate], req: &Request) {
    candidates.sort_by(|a, b| {
        let key = |c: &Candidate| {
            (
                req.gpus == 0 && !c.topology.gpus.is_empty(),
                c.name.to_owned(),
            )
        };
        key(a).cmp(&key(b))
    });
}

/// All hosts that can take the VM, best first, each with its placement;
/// the caller commits the first whose allocation rows it wins.
pub fn fits(candidates: &mut [Candidate], req: &Request) -> Vec<(Uuid, Placement)> {
    order(candidates, req);
    candidates
        .iter()
        .filter_map(|c| place_on(c, req).map(|p| (c.host_id, p)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kumo_topology::{fixtures, sysfs};

    fn topo(name: &str) -> HostTopology {
        let dir = tempfile::tempdir().unwrap();
        fixtures::write(&fixtures::machine(name).unwrap(), dir.path()).unwrap();
        sysfs::discover(dir.path(), None).unwrap()
    }

    #[test]
    fn fills_hosts_in_order_and_avoids_held_devices() {
        let h100 = topo("hgx-h100");
        let empty = BTreeSet::new();
        let req = Request {
            gpus: 4,
            gpu_model: Some("H100-SXM5-80GB".into()),
            vcpus: 16,
            memory_gib: 64,
        };
        let a = Uuid::now_v7();
        let mut c = vec![Candidate {
            host_id: a,
            name: "a",
            topology: &h100,
            held: &empty,
        }];
        let (host, p) = fits(&mut c, &req).remove(0);
        assert_eq!(host, a);
        assert_eq!(p.gpus.len(), 4);
        assert_eq!(p.nics.len(), 4, "each GPU brings its PIX NIC");
        // With those held, the next VM gets the other four GPUs, other CPUs.
        let held: BTreeSet<(String, String)> = allocations(&p)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        let mut c = vec![Candidate {
            host_id: a,
            name: "a",
            topology: &h100,
            held: &held,
        }];
        let (_, q) = fits(&mut c, &req).remove(0);
        assert!(q.gpus.iter().all(|g| !p.gpus.contains(g)));
        let cpus_p: BTreeSet<u32> = p.cpus.values().flatten().copied().collect();
        assert!(q.cpus.values().flatten().all(|c| !cpus_p.contains(c)));
        // Nine GPUs fit nowhere; a wrong model fits nowhere.
        let mut c = vec![Candidate {
            host_id: a,
            name: "a",
            topology: &h100,
            held: &empty,
        }];
        assert!(fits(
            &mut c,
            &Request {
                gpus: 9,
                ..req.clone()
            }
        )
        .is_empty());
        assert!(fits(
            &mut c,
            &Request {
                gpu_model: Some("A100-SXM4-40GB".into()),
                ..req.clone()
            }
        )
        .is_empty());
    }

    #[test]
    fn cpu_only_vms_go_to_cpu_hosts_first() {
        let h100 = topo("hgx-h100");
        let cpu = topo("cpu-only");
        let empty = BTreeSet::new();
        let (g, c) = (Uuid::now_v7(), Uuid::now_v7());
        let mut cands = vec![
            Candidate {
                host_id: g,
                name: "a-gpu",
                topology: &h100,
                held: &empty,
            },
            Candidate {
                host_id: c,
                name: "z-cpu",
                topology: &cpu,
                held: &empty,
            },
        ];
        let req = Request {
            gpus: 0,
            gpu_model: None,
            vcpus: 4,
            memory_gib: 8,
        };
        assert_eq!(fits(&mut cands, &req)[0].0, c);
    }

    #[test]
    fn cpu_only_vms_spread_to_the_node_with_room() {
        let h100 = topo("hgx-h100");
        let mut held: BTreeSet<(String, String)> = BTreeSet::new();
        let req = Request {
            gpus: 0,
            gpu_model: None,
            vcpus: 8,
            memory_gib: 8,
        };
        let host = Uuid::now_v7();
        // 224 CPUs in two nodes of 112: 28 VMs of 8 vCPUs fit, none twice on a CPU.
        for i in 0..28 {
            let mut c = vec![Candidate {
                host_id: host,
                name: "h",
                topology: &h100,
                held: &held,
            }];
            let (_, p) = fits(&mut c, &req)
                .into_iter()
                .next()
                .unwrap_or_else(|| panic!("VM {i} did not fit"));
            for (k, v) in allocations(&p) {
                assert!(held.insert((k.to_owned(), v)), "a CPU held twice");
            }
        }
        let mut c = vec![Candidate {
            host_id: host,
            name: "h",
            topology: &h100,
            held: &held,
        }];
        assert!(fits(&mut c, &req).is_empty(), "the 29th does not fit");
    }
}
