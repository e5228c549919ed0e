//! Placing one VM: which host, which GPUs (one NVLink domain, paired NICs
//! free and near), which CPUs and memory (on the devices' NUMA nodes).
//!
//! Best fit: among hosts that can take the VM, the one left with the
//! fewest free GPUs of the model, so whole hosts stay whole for 8-GPU VMs;
//! within a host the NUMA node and PCIe switch group best filled likewise.
//! CPU-only VMs go to CPU-only hosts first, then to NUMA nodes without
//! free GPUs, and only then beside free GPUs. First fit (the baseline the
//! benchmark compares against) takes the first host, lowest GPUs first.

use std::collections::BTreeMap;

use kumo_topology::guest_layout::{split, spread_memory, spread_vcpus};
use uuid::Uuid;

use crate::index::{HostCap, HostUse, Index};
use crate::profile::bits;
use crate::Hold;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    BestFit,
    FirstFit,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Request {
    pub gpus: u32,
    /// Interned model ([`Index::model_id`]); any model when `None` (but
    /// one model per VM).
    pub model: Option<u16>,
    pub vcpus: u32,
    pub memory_mib: u64,
    /// Only hosts of this scalable unit.
    pub unit: Option<u32>,
    /// The rails of the VM's GPUs in GPU order (training clusters: GPU *i*
    /// of every member on rail *i*).
    pub rails: Option<Vec<Option<u32>>>,
    /// The VM has NICs on tenant segments: only hosts with an underlay.
    pub networked: bool,
    /// The VM mounts project shares: only hosts with the shared filesystem.
    pub shares: bool,
    /// The VM is on a RoCE segment: only hosts whose GPU NICs have VFs.
    pub roce: bool,
    /// Only this host (where the VM's volumes or disks are).
    pub host: Option<Uuid>,
    /// Never these hosts (those a replaced VM left: its old domain there
    /// is removed only once the host learns it is no longer its own).
    pub avoid: Vec<Uuid>,
    /// Its root disk, provisioned GiB: only hosts whose storage has room
    /// (0 for a disk that is there already).
    pub disk_gib: u64,
    /// A spot VM: it may use clusters' spare capacity.
    pub spot: bool,
    /// A member of this cluster: it may use the cluster's own spares.
    pub cluster: Option<Uuid>,
    /// Runs on this reservation's hosts, and only there; `None`: on hosts
    /// no reservation holds.
    pub reservation: Option<Uuid>,
}

/// A proposed placement: not yet applied to the index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub host: usize,
    pub hold: Hold,
    /// Placed GPUs whose NIC is at PIX/PXB distance.
    pub near_nic_gpus: u32,
    /// How many placed GPUs could have had such a NIC, had the best GPUs
    /// of the host been chosen.
    pub near_nic_possible: u32,
    /// GPUs spread over NVLink domains although one domain could have held
    /// them all.
    pub split: bool,
}

impl Choice {
    pub fn rails(&self, index: &Index) -> Vec<Option<u32>> {
        rails_of(&index.hosts[self.host], self.hold.gpus)
    }
}

pub fn rails_of(h: &HostCap, gpus: u64) -> Vec<Option<u32>> {
    bits(gpus)
        .map(|i| h.profile.gpus[i].nic.and_then(|n| h.profile.nics[n].rail))
        .collect()
}

fn host_takes(h: &HostCap, req: &Request) -> bool {
    h.state == HostUse::Ready
        && h.reserved_for == req.reservation
        && req.host.is_none_or(|id| h.id == id)
        && !req.avoid.contains(&h.id)
        && req.unit.is_none_or(|u| h.scalable_unit == Some(u))
        && (h.networked || !req.networked)
        && (h.shares || !req.shares)
        && (h.profile.roce || !req.roce)
        && h.cpus_free_total >= req.vcpus
        && (h.mem_free_total >= req.memory_mib || h.profile.nodes.iter().all(|n| n.memory_mib == 0))
        && h.disk_fits(req.disk_gib)
}

/// Free GPUs of the request's model(s): `(model mask, free)` per model.
fn model_pools<'a>(h: &'a HostCap, req: &Request) -> impl Iterator<Item = u64> + 'a {
    let model = req.model;
    h.profile
        .model_masks
        .iter()
        .filter(move |(m, _)| model.is_none_or(|x| x == *m))
        .map(move |(_, mask)| h.gpu_free & mask)
}

/// Orders GPUs so the best-filled NUMA node and switch group come first,
/// and GPUs whose paired NIC is free before those whose NIC is taken.
fn gpu_key(h: &HostCap, pool: u64, i: usize) -> (u32, bool, u32, usize) {
    let p = &h.profile;
    let g = &p.gpus[i];
    let in_group = bits(pool).filter(|j| p.gpus[*j].group == g.group).count() as u32;
    let nic_taken = g.nic.is_some_and(|n| h.nic_free & (1 << n) == 0);
    let in_node = (pool & p.nodes[g.node].gpus).count_ones();
    (in_node, nic_taken, in_group, i)
}

/// Picks `n` GPUs from `pool`: one NUMA node when one has room (the
/// fullest such), otherwise the fewest nodes.
fn pick_from(h: &HostCap, pool: u64, n: usize) -> u64 {
    let p = &h.profile;
    let fits_node = p
        .nodes
        .iter()
        .map(|node| (pool & node.gpus).count_ones() as usize)
        .filter(|c| *c >= n)
        .min();
    let mut order: Vec<usize> = bits(pool).collect();
    match fits_node {
        Some(c) => {
            order.retain(|i| (pool & p.nodes[p.gpus[*i].node].gpus).count_ones() as usize == c);
            // Ties between equally filled nodes: the lowest node.
            let node = order.iter().map(|i| p.gpus[*i].node).min().unwrap_or(0);
            order.retain(|i| p.gpus[*i].node == node);
            order.sort_by_cached_key(|i| gpu_key(h, pool, *i));
        }
        None => order.sort_by_cached_key(|i| {
            let k = gpu_key(h, pool, *i);
            (std::cmp::Reverse(k.0), p.gpus[*i].node, k.1, k.2, k.3)
        }),
    }
    order.into_iter().take(n).fold(0, |m, i| m | (1 << i))
}

/// On a partitioned host: a free partition of `n` GPUs out of `free`.
/// Best fit takes the one inside the enclosing partitions with the fewest
/// free GPUs (smallest enclosing first), so that broken blocks fill up
/// and whole ones stay whole for larger VMs; then GPUs whose NICs are free.
fn pick_partition(
    h: &HostCap,
    parts: &[u64],
    free: u64,
    n: usize,
    strategy: Strategy,
    rails: Option<&Vec<Option<u32>>>,
) -> Option<u64> {
    let mut fits = parts.iter().copied().filter(|m| {
        m.count_ones() as usize == n
            && m & free == *m
            && rails.is_none_or(|r| &rails_of(h, *m) == r)
    });
    if strategy == Strategy::FirstFit {
        return fits.next();
    }
    fits.min_by_key(|m| {
        let mut enclosing: Vec<u64> = parts
            .iter()
            .copied()
            .filter(|b| b.count_ones() > m.count_ones() && b & m == *m)
            .collect();
        enclosing.sort_by_key(|b| b.count_ones());
        let free_around: Vec<u32> = enclosing.iter().map(|b| (b & free).count_ones()).collect();
        let nic_taken = bits(*m)
            .filter(|i| {
                h.profile.gpus[*i]
                    .nic
                    .is_some_and(|x| h.nic_free & (1 << x) == 0)
            })
            .count();
        (free_around, nic_taken, m.trailing_zeros())
    })
}

/// The GPUs for the request on this host and whether they span NVLink
/// domains needlessly.
fn choose_gpus(h: &HostCap, req: &Request, strategy: Strategy) -> Option<(u64, bool)> {
    let n = req.gpus as usize;
    let p = &h.profile;
    if let Some(parts) = &p.partitions {
        // Only a partition has NVLink (and only a partition can be
        // activated): any other set is no choice at all.
        return model_pools(h, req)
            .filter_map(|free| pick_partition(h, parts, free, n, strategy, req.rails.as_ref()))
            .next()
            .map(|m| (m, false));
    }
    let mut best: Option<(u64, bool)> = None;
    for free in model_pools(h, req) {
        if (free.count_ones() as usize) < n {
            continue;
        }
        let chosen = if let Some(rails) = &req.rails {
            // One free GPU per rail, in rail order; the GPUs' own order
            // must give the same sequence.
            let mut m = 0u64;
            for r in rails {
                let i =
                    bits(free & !m).find(|i| p.gpus[*i].nic.and_then(|x| p.nics[x].rail) == *r)?;
                m |= 1 << i;
            }
            if &rails_of(h, m) != rails {
                continue;
            }
            (m, false)
        } else if strategy == Strategy::FirstFit {
            (bits(free).take(n).fold(0, |m, i| m | (1 << i)), false)
        } else {
            // The fullest NVLink domain that holds them all.
            let mut domains: Vec<(u16, u64)> = Vec::new();
            for i in bits(free) {
                let d = p.gpus[i].domain;
                match domains.iter_mut().find(|(x, _)| *x == d) {
                    Some((_, m)) => *m |= 1 << i,
                    None => domains.push((d, 1 << i)),
                }
            }
            let fitting = domains
                .iter()
                .filter(|(_, m)| m.count_ones() as usize >= n)
                .min_by_key(|(d, m)| (m.count_ones(), *d));
            let (pool, split) = match fitting {
                Some((_, pool)) => (*pool, false),
                None => (free, n as u32 <= p.max_domain),
            };
            // GPUs whose paired NIC is still free, when there are enough:
            // a NIC passed through to one VM serves no other.
            let with_nic = bits(pool)
                .filter(|i| p.gpus[*i].nic.is_some_and(|x| h.nic_free & (1 << x) != 0))
                .fold(0u64, |m, i| m | (1 << i));
            let pool = if with_nic.count_ones() as usize >= n {
                with_nic
            } else {
                pool
            };
            (pick_from(h, pool, n), split)
        };
        if best.is_none_or(|b| b.1 && !chosen.1) {
            best = Some(chosen);
        }
    }
    best
}

/// CPU-only VMs: `(class, node index)`, lower class better: 0 a node
/// without GPUs, 1 a node whose GPUs are all taken, 2 beside free GPUs.
fn node_class(h: &HostCap, node: usize) -> u8 {
    let gpus = h.profile.nodes[node].gpus;
    if gpus == 0 {
        0
    } else if gpus & h.gpu_free == 0 {
        1
    } else {
        2
    }
}

fn mem_ok(h: &HostCap, node: usize, mib: u64) -> bool {
    h.profile.nodes[node].memory_mib == 0 || h.mem_free[node] >= mib
}

/// Nodes for a CPU-only VM, as `(node, CPUs)` in `out`; returns the worst
/// node class used. One node with room when there is one: the best class
/// (CPU-only nodes, then nodes whose GPUs are all taken), best filled. A VM
/// larger than any node's free CPUs spans the fewest nodes, the roomiest
/// first, so the guest sees that many NUMA nodes.
fn cpu_only_nodes(
    h: &HostCap,
    req: &Request,
    strategy: Strategy,
    out: &mut Vec<(usize, u64)>,
) -> Option<u8> {
    let nodes = h.profile.nodes.len();
    let fits = |n: usize| h.cpu_free_n[n] >= req.vcpus && mem_ok(h, n, req.memory_mib);
    let one = (0..nodes).filter(|n| fits(*n)).min_by_key(|n| {
        let left = h.cpu_free_n[*n] - req.vcpus;
        match strategy {
            Strategy::BestFit => (node_class(h, *n), left, *n),
            Strategy::FirstFit => (0, 0, *n),
        }
    });
    if let Some(node) = one {
        out.push((node, u64::from(req.vcpus)));
        return Some(node_class(h, node));
    }
    let mut order: Vec<usize> = (0..nodes).filter(|n| h.cpu_free_n[*n] > 0).collect();
    order.sort_by_key(|n| (node_class(h, *n), std::cmp::Reverse(h.cpu_free_n[*n]), *n));
    let mut left = req.vcpus;
    let mut class = 0;
    for n in order {
        if left == 0 {
            break;
        }
        let take = h.cpu_free_n[n].min(left);
        out.push((n, u64::from(take)));
        class = class.max(node_class(h, n));
        left -= take;
    }
    out.sort();
    (left == 0).then_some(class)
}

/// CPUs and memory for the chosen devices; `None` when their nodes lack room.
fn build_hold(h: &HostCap, req: &Request, gpus: u64, strategy: Strategy) -> Option<(Hold, u8)> {
    let p = &h.profile;
    // Fabric NICs only for a VM on a RoCE segment, and then only as VFs
    // (the host sets their VLAN, spoof check and trust): a tenant given a
    // physical function could tag any VLAN on the leaf, make VFs of its
    // own and change the NIC's persistent firmware settings.
    let mut nics = 0u64;
    if req.roce {
        for i in bits(gpus) {
            if let Some(n) = p.gpus[i].nic.filter(|n| p.nics[*n].roce_vf.is_some()) {
                if h.nic_free & (1 << n) != 0 {
                    nics |= 1 << n;
                }
            }
        }
    }
    let mut weight: Vec<(usize, u64)> = Vec::new();
    let devices = bits(gpus)
        .map(|i| p.gpus[i].node)
        .chain(bits(nics).map(|j| p.nics[j].node));
    for node in devices {
        match weight.iter_mut().find(|(n, _)| *n == node) {
            Some((_, w)) => *w += 1,
            None => weight.push((node, 1)),
        }
    }
    weight.sort();
    let mut class = 0;
    // (node, CPUs, memory) the VM takes on each of its nodes.
    let shares: Vec<(usize, u64, u64)> = if weight.is_empty() {
        class = cpu_only_nodes(h, req, strategy, &mut weight)?;
        let ws: Vec<u64> = weight.iter().map(|(_, w)| *w).collect();
        let mem_split = split(req.memory_mib, &ws);
        weight
            .iter()
            .zip(mem_split)
            .map(|((n, c), m)| (*n, *c, m))
            .collect()
    } else {
        // CPUs and memory follow the devices: each of their nodes gets
        // at least one CPU, the rest in proportion to its devices, capped
        // at each node's free CPUs and spilled to nodes with room.
        let ws: Vec<(u32, u64)> = weight.iter().map(|(n, w)| (*n as u32, *w)).collect();
        let free: BTreeMap<u32, u64> = h
            .cpu_free_n
            .iter()
            .enumerate()
            .map(|(n, c)| (n as u32, u64::from(*c)))
            .collect();
        let cpus = spread_vcpus(u64::from(req.vcpus), &ws, &free).ok()?;
        let memory = spread_memory(req.memory_mib, &ws, &cpus);
        cpus.iter()
            .map(|(n, c)| (*n as usize, *c, memory.get(n).copied().unwrap_or(0)))
            .collect()
    };
    let mut cpus = Vec::with_capacity(shares.len());
    let mut memory = Vec::with_capacity(shares.len());
    for (node, want, mem) in &shares {
        let (node, want) = (node, *want as usize);
        if (h.cpu_free_n[*node] as usize) < want || !mem_ok(h, *node, *mem) {
            return None;
        }
        let mut taken = Vec::with_capacity(want);
        for (w, word) in h.cpu_free[*node].iter().enumerate() {
            for b in bits(*word) {
                if taken.len() == want {
                    break;
                }
                taken.push(w * 64 + b);
            }
        }
        cpus.push((*node, taken));
        memory.push((*node, *mem));
    }
    Some((
        Hold {
            vm: uuid::Uuid::nil(),
            tenant: uuid::Uuid::nil(),
            spot: false,
            borrowed: false,
            reclaiming: false,
            since: 0,
            cpu_only: gpus == 0,
            gpus,
            nics,
            cpus,
            memory,
            disk_gib: req.disk_gib,
        },
        class,
    ))
}

/// The request on one host, if it fits, with its score (lower is better).
pub fn place_on(h: &HostCap, req: &Request, strategy: Strategy) -> Option<(Choice, Score)> {
    if !host_takes(h, req) {
        return None;
    }
    let p = &h.profile;
    let (gpus, split) = if req.gpus == 0 {
        (0, false)
    } else {
        choose_gpus(h, req, strategy)?
    };
    let (hold, class) = build_hold(h, req, gpus, strategy)?;
    // How many of the placed GPUs could have had a near, free paired NIC
    // on this host, and how many got one.
    let near_paired = |i: usize, nics: u64| {
        let g = &p.gpus[i];
        g.nic
            .is_some_and(|n| nics & (1 << n) != 0 && g.near_nics & (1 << n) != 0)
    };
    let could = model_pools(h, req)
        .map(|f| bits(f).filter(|i| near_paired(*i, h.nic_free)).count() as u32)
        .max()
        .unwrap_or(0);
    let possible = could.min(req.gpus);
    let near = bits(gpus).filter(|i| near_paired(*i, hold.nics)).count() as u32;
    let left = model_pools(h, req)
        .map(|f| (f & !gpus).count_ones())
        .min()
        .unwrap_or(0);
    let cpu_left = h.cpus_free_total - req.vcpus;
    let broken = match &p.partitions {
        Some(parts) if gpus != 0 => {
            let free = h.gpu_free;
            parts
                .iter()
                .filter(|m| m.count_ones() > req.gpus && *m & free == **m && *m & gpus != 0)
                .count() as u32
        }
        _ => 0,
    };
    let score = Score {
        split,
        broken,
        class: class + u8::from(req.gpus == 0 && !p.gpus.is_empty()),
        gpus_left: left,
        far_nics: possible.saturating_sub(near),
        cpus_left: cpu_left,
    };
    Some((
        Choice {
            host: 0,
            hold,
            near_nic_gpus: near,
            near_nic_possible: possible,
            split,
        },
        score,
    ))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Score {
    split: bool,
    class: u8,
    /// On a partitioned host: the wholly free partitions larger than the
    /// request that this placement breaks (a host whose free GPUs are no
    /// partition anyway is the better home for a small VM).
    broken: u32,
    gpus_left: u32,
    far_nics: u32,
    cpus_left: u32,
}

/// Hosts of one leftover bucket tried in detail before taking the best.
const TRIES_PER_BUCKET: usize = 4;

/// The best host for the request, or `None` when nothing fits. A choice
/// that would take clusters' spare capacity is passed over for the next
/// best ([`crate::spares::kept`]).
pub fn place(index: &Index, req: &Request, strategy: Strategy) -> Option<Choice> {
    let mut req = std::borrow::Cow::Borrowed(req);
    loop {
        let c = place_anywhere(index, &req, strategy)?;
        if crate::spares::kept(index, c.host, &c.hold, &req) {
            return Some(c);
        }
        let host = index.hosts[c.host].id;
        req.to_mut().avoid.push(host);
    }
}

fn place_anywhere(index: &Index, req: &Request, strategy: Strategy) -> Option<Choice> {
    let found = match strategy {
        Strategy::FirstFit => index
            .hosts
            .iter()
            .enumerate()
            .find_map(|(i, h)| place_on(h, req, strategy).map(|(c, _)| (i, c))),
        Strategy::BestFit if req.gpus == 0 => index
            .hosts
            .iter()
            .enumerate()
            .filter_map(|(i, h)| place_on(h, req, strategy).map(|(c, s)| (s, i, c)))
            .min_by_key(|(s, i, _)| (*s, *i))
            .map(|(_, i, c)| (i, c)),
        Strategy::BestFit => best_fit_gpu(index, req),
    };
    found.map(|(i, mut c)| {
        c.host = i;
        c
    })
}

/// GPU VMs: hosts bucketed by the GPUs they would have left, the fullest
/// bucket first; in each, the first few hosts (by position) that can take
/// the VM are scored in full. Buckets come from the index's filing by free
/// GPUs per model ([`Index::with_free`]), so the cost follows the hosts
/// looked at, not the fleet's size.
fn best_fit_gpu(index: &Index, req: &Request) -> Option<(usize, Choice)> {
    let n = req.gpus;
    if let Some(id) = req.host {
        let i = index.position(id)?;
        return place_on(&index.hosts[i], req, Strategy::BestFit).map(|(c, _)| (i, c));
    }
    let left_of = |h: &HostCap| -> Option<u32> {
        if !host_takes(h, req) {
            return None;
        }
        model_pools(h, req)
            .map(|f| f.count_ones())
            .filter(|f| *f >= n)
            .min()
            .map(|f| f - n)
    };
    let models: Vec<u16> = match req.model {
        Some(m) => vec![m],
        None => index.model_ids().collect(),
    };
    let mut fallback: Option<(Score, usize, Choice)> = None;
    for left in 0..=(64u32.saturating_sub(n)) {
        // The first hosts of the bucket by position: per model the first
        // that place (a host files under each of its models, and belongs
        // to the bucket of its fullest fitting one), then merged.
        let mut tried: Vec<(usize, Score, Choice)> = Vec::new();
        for m in &models {
            let mut of_model = 0;
            for i in index.with_free(req.unit, *m, n + left) {
                let h = &index.hosts[i];
                if left_of(h) != Some(left) || tried.iter().any(|t| t.0 == i) {
                    continue;
                }
                if let Some((c, s)) = place_on(h, req, Strategy::BestFit) {
                    tried.push((i, s, c));
                    of_model += 1;
                    if of_model == TRIES_PER_BUCKET {
                        break;
                    }
                }
            }
        }
        tried.sort_by_key(|t| t.0);
        tried.truncate(TRIES_PER_BUCKET);
        let mut best: Option<(Score, usize, Choice)> = None;
        for (i, s, c) in tried {
            if best.as_ref().is_none_or(|b| s < b.0) {
                best = Some((s, i, c));
            }
        }
        match best {
            Some((s, i, c)) if !s.split => return Some((i, c)),
            Some(b) if fallback.as_ref().is_none_or(|f| b.0 < f.0) => fallback = Some(b),
            _ => {}
        }
    }
    fallback.map(|(_, i, c)| (i, c))
}
