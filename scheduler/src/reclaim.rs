//! Which spot VMs to reclaim for a guaranteed request that does not fit:
//! on one host, the fewest VMs, then the least run time lost. Capacity of
//! spot VMs already being reclaimed counts as free (it soon will be), so
//! asking again while they drain names no new victims. Spot requests never
//! reclaim anything, and guaranteed VMs are never victims.

use uuid::Uuid;

use crate::cluster::ClusterRequest;
use crate::index::{HostCap, HostUse, Index};
use crate::place::{place_on, Request, Strategy};

/// Spot VMs of a host considered as victims (the largest first); more
/// would make the search slow without finding fewer victims.
const MAX_CANDIDATES: usize = 12;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Spot VMs to reclaim now.
    pub victims: Vec<(usize, Uuid)>,
    /// Spot VMs already being reclaimed that the request waits for.
    pub waiting_on: Vec<(usize, Uuid)>,
}

fn lost(h: &HostCap, vm: Uuid, now: i64) -> i64 {
    h.holds
        .iter()
        .find(|x| x.vm == vm)
        .map(|x| (now - x.since).max(0))
        .unwrap_or(0)
}

/// All `k`-subsets of `0..n`, in lexicographic order.
fn subsets(n: usize, k: usize, mut f: impl FnMut(&[usize]) -> bool) {
    let mut idx: Vec<usize> = (0..k).collect();
    if k > n {
        return;
    }
    loop {
        if f(&idx) {
            return;
        }
        let mut i = k;
        loop {
            if i == 0 {
                return;
            }
            i -= 1;
            if idx[i] != i + n - k {
                break;
            }
            if i == 0 {
                return;
            }
        }
        idx[i] += 1;
        for j in i + 1..k {
            idx[j] = idx[j - 1] + 1;
        }
    }
}

/// The cheapest reclamation for `req` on one host: `(victims, cost)`.
/// Victims, VMs already being reclaimed, and the cost: (victims, run time lost).
struct HostPlan {
    victims: Vec<Uuid>,
    waiting: Vec<Uuid>,
    cost: (usize, i64),
}

fn plan_on(index: &Index, at: usize, req: &Request, now: i64) -> Option<HostPlan> {
    let h = &index.hosts[at];
    if h.state != HostUse::Ready {
        return None;
    }
    let mut base = h.clone();
    let waiting: Vec<Uuid> = h
        .holds
        .iter()
        .filter(|x| x.reclaiming)
        .map(|x| x.vm)
        .collect();
    for vm in &waiting {
        base.release(*vm);
    }
    let mut candidates: Vec<&crate::Hold> =
        h.holds.iter().filter(|x| x.spot && !x.reclaiming).collect();
    // Upper bound: even with every candidate gone, do enough GPUs free up?
    let spare =
        base.gpu_free.count_ones() + candidates.iter().map(|x| x.gpus.count_ones()).sum::<u32>();
    if spare < req.gpus {
        return None;
    }
    candidates.sort_by_key(|x| {
        (
            std::cmp::Reverse(x.gpus.count_ones()),
            std::cmp::Reverse(x.cpus.iter().map(|(_, c)| c.len()).sum::<usize>()),
            std::cmp::Reverse(x.since),
        )
    });
    candidates.truncate(MAX_CANDIDATES);
    for k in 0..=candidates.len() {
        let mut best: Option<(Vec<Uuid>, i64)> = None;
        subsets(candidates.len(), k, |set| {
            let mut scratch = base.clone();
            for i in set {
                scratch.release(candidates[*i].vm);
            }
            // Room made on a cluster's spares is room only for that
            // cluster (or another spot VM).
            let fits = place_on(&scratch, req, Strategy::BestFit)
                .is_some_and(|(c, _)| crate::spares::kept(index, at, &c.hold, req));
            if fits {
                let vms: Vec<Uuid> = set.iter().map(|i| candidates[*i].vm).collect();
                let cost: i64 = vms.iter().map(|v| lost(h, *v, now)).sum();
                if best.as_ref().is_none_or(|b| cost < b.1) {
                    best = Some((vms, cost));
                }
            }
            false
        });
        if let Some((vms, cost)) = best {
            return Some(HostPlan {
                victims: vms,
                waiting,
                cost: (k, cost),
            });
        }
    }
    None
}

/// The cheapest reclamation for a guaranteed VM over all hosts, or `None`
/// when even reclaiming every spot VM would not make room.
pub fn plan(index: &Index, req: &Request, now: i64) -> Option<Plan> {
    let mut best: Option<(usize, HostPlan)> = None;
    for i in 0..index.hosts.len() {
        if let Some(p) = plan_on(index, i, req, now) {
            if best.as_ref().is_none_or(|b| p.cost < b.1.cost) {
                best = Some((i, p));
            }
        }
    }
    best.map(|(i, p)| Plan {
        victims: p.victims.into_iter().map(|v| (i, v)).collect(),
        waiting_on: p.waiting.into_iter().map(|v| (i, v)).collect(),
    })
}

/// A reclamation for a whole cluster: members that fit go on free
/// capacity, the rest each reclaim on one host. The index is left as it
/// was. `None` when the cluster cannot be made to fit.
pub fn plan_cluster(index: &Index, req: &ClusterRequest, now: i64) -> Option<Plan> {
    if req.one_unit && req.member.unit.is_none() {
        // One unit for all: the plan of the unit that reclaims fewest.
        let mut units: Vec<Option<u32>> = index.hosts.iter().map(|h| h.scalable_unit).collect();
        units.sort();
        units.dedup();
        return units
            .into_iter()
            .filter_map(|u| {
                let member = Request {
                    unit: u,
                    ..req.member.clone()
                };
                // Hosts without a unit are no unit to keep a cluster in.
                u?;
                plan_cluster(
                    index,
                    &ClusterRequest {
                        member,
                        ..req.clone()
                    },
                    now,
                )
            })
            .min_by_key(|p| (p.victims.len(), p.waiting_on.len()));
    }
    let mut scratch = index.clone();
    let mut out = Plan {
        victims: Vec::new(),
        waiting_on: Vec::new(),
    };
    for _ in 0..req.size {
        let member = &req.member;
        if let Some(c) = crate::place::place(&scratch, member, Strategy::BestFit) {
            let mut hold = c.hold;
            hold.vm = Uuid::now_v7();
            scratch.apply(c.host, hold);
            continue;
        }
        let p = plan(&scratch, member, now)?;
        for (h, vm) in p.victims.iter().chain(&p.waiting_on) {
            scratch.release(*h, *vm);
        }
        out.victims.extend(p.victims);
        out.waiting_on.extend(p.waiting_on);
        let c = crate::place::place(&scratch, member, Strategy::BestFit)?;
        let mut hold = c.hold;
        hold.vm = Uuid::now_v7();
        scratch.apply(c.host, hold);
    }
    Some(out)
}
