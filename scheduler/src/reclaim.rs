//! Which spot VMs to reclaim for a guaranteed request that does not fit:
//! on one host, the fewest VMs, then the least run time lost. Capacity of
//! spot VMs already being reclaimed counts as free (it soon will be), so
//! asking again while they drain names no new victims. Spot requests never
//! reclaim anything. Guaranteed VMs are victims only when they are
//! borrowed (above their tenant's guaranteed share) and the request comes
//! from a tenant within its own share ([`Lenders`]): plans taking spot VMs
//! alone come first, then those whose borrowers are furthest above their
//! shares.

use std::cmp::Reverse;
use std::collections::HashMap;

use uuid::Uuid;

use crate::cluster::ClusterRequest;
use crate::index::{HostCap, HostUse, Index};
use crate::place::{place_on, Request, Strategy};

/// Spot VMs of a host considered as victims (the largest first); more
/// would make the search slow without finding fewer victims.
const MAX_CANDIDATES: usize = 12;

/// Tenants whose borrowed VMs a request may reclaim: it comes from a
/// tenant within its guaranteed share, and these run guaranteed VMs above
/// theirs. Empty: spot VMs only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lenders {
    /// GPUs each tenant runs above its share of the request's model.
    pub above: HashMap<Uuid, u64>,
}

impl Lenders {
    fn may_take(&self, x: &crate::Hold) -> bool {
        !x.reclaiming && (x.spot || (x.borrowed && self.above.contains_key(&x.tenant)))
    }

    /// Plans taking borrowed VMs come after those taking spot VMs only,
    /// and among them the one whose least-over borrower is furthest above
    /// its share comes first.
    fn cost(&self, victims: &[&crate::Hold]) -> (bool, Reverse<u64>) {
        let least = victims
            .iter()
            .filter(|x| !x.spot)
            .map(|x| self.above.get(&x.tenant).copied().unwrap_or(0))
            .min();
        match least {
            Some(n) => (true, Reverse(n)),
            None => (false, Reverse(u64::MAX)),
        }
    }
}

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

/// The cheapest reclamation for `req` on one host: victims, VMs already
/// being reclaimed, and the cost: (whose VMs, victims, run time lost).
struct HostPlan {
    victims: Vec<Uuid>,
    waiting: Vec<Uuid>,
    cost: ((bool, Reverse<u64>), usize, i64),
}

fn plan_on(
    index: &Index,
    at: usize,
    req: &Request,
    now: i64,
    lenders: &Lenders,
) -> Option<HostPlan> {
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
        h.holds.iter().filter(|x| lenders.may_take(x)).collect();
    // Upper bound: even with every candidate gone, do enough GPUs free up?
    let spare =
        base.gpu_free.count_ones() + candidates.iter().map(|x| x.gpus.count_ones()).sum::<u32>();
    if spare < req.gpus {
        return None;
    }
    candidates.sort_by_key(|x| {
        (
            !x.spot,
            std::cmp::Reverse(x.gpus.count_ones()),
            std::cmp::Reverse(x.cpus.iter().map(|(_, c)| c.len()).sum::<usize>()),
            std::cmp::Reverse(x.since),
        )
    });
    candidates.truncate(MAX_CANDIDATES);
    for k in 0..=candidates.len() {
        type Best = (Vec<Uuid>, ((bool, Reverse<u64>), i64));
        let mut best: Option<Best> = None;
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
                let taken: Vec<&crate::Hold> = set.iter().map(|i| candidates[*i]).collect();
                let lost: i64 = taken.iter().map(|x| lost(h, x.vm, now)).sum();
                let cost = (lenders.cost(&taken), lost);
                if best.as_ref().is_none_or(|b| cost < b.1) {
                    best = Some((taken.iter().map(|x| x.vm).collect(), cost));
                }
            }
            false
        });
        if let Some((vms, (whose, lost))) = best {
            return Some(HostPlan {
                victims: vms,
                waiting,
                cost: (whose, k, lost),
            });
        }
    }
    None
}

/// The cheapest reclamation for a guaranteed VM over all hosts, or `None`
/// when even reclaiming every spot VM would not make room.
pub fn plan(index: &Index, req: &Request, now: i64) -> Option<Plan> {
    plan_lending(index, req, now, &Lenders::default())
}

/// [`plan`], borrowed VMs of `lenders` taken too where spot VMs are not
/// enough.
pub fn plan_lending(index: &Index, req: &Request, now: i64, lenders: &Lenders) -> Option<Plan> {
    let mut best: Option<(usize, HostPlan)> = None;
    for i in 0..index.hosts.len() {
        if let Some(p) = plan_on(index, i, req, now, lenders) {
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
    plan_cluster_lending(index, req, now, &Lenders::default())
}

/// [`plan_cluster`], borrowed VMs of `lenders` taken too.
pub fn plan_cluster_lending(
    index: &Index,
    req: &ClusterRequest,
    now: i64,
    lenders: &Lenders,
) -> Option<Plan> {
    if req.one_unit && req.member.unit.is_none() {
        // One unit for all: the plan of the unit whose victims cost least
        // as one host's would (spot VMs only before borrowed ones, then
        // the borrower furthest above its share), then that reclaims
        // fewest.
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
                plan_cluster_lending(
                    index,
                    &ClusterRequest {
                        member,
                        ..req.clone()
                    },
                    now,
                    lenders,
                )
            })
            .min_by_key(|p| {
                let taken: Vec<&crate::Hold> = p
                    .victims
                    .iter()
                    .filter_map(|(h, vm)| index.hosts.get(*h)?.holds.iter().find(|x| x.vm == *vm))
                    .collect();
                (lenders.cost(&taken), p.victims.len(), p.waiting_on.len())
            });
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
        let p = plan_lending(&scratch, member, now, lenders)?;
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
