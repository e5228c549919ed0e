//! The fair queue (issue 42): requests made with `--queue` wait as `queued` when the fleet has
//! no room, instead of being refused.
//!
//! Two rules, both pure over plain data:
//!
//! - [`fair_order`] says who is admitted first: the tenant furthest below its guaranteed share,
//!   FIFO within a tenant. Each pick counts against the tenant's use as if it had started, so a
//!   tenant with many queued requests cannot take every front position while another tenant is
//!   as far below its share.
//! - [`plan`] estimates when each request starts and where, in fair order, by conservative
//!   backfill (as Slurm does it) over GPU counts per host: every request is given a slot at the
//!   earliest time it fits beside what is held and what was planned for those ahead of it. The
//!   server shows these as estimates and holds room only for the first in line's slot (EASY
//!   backfill, `app::queue`): holding every slot idled the fleet (BENCHMARKS.md, "Scheduling").

use std::collections::{BTreeMap, BTreeSet};
use std::iter;

use uuid::Uuid;

/// How many requests, in fair order, one pass plans (and may admit): a
/// plan's cost grows with the queue and the fleet, and the server passes
/// every second. Those further back wait to move up (Slurm's backfill
/// bounds itself the same way, `bf_max_job_test`).
pub const PLANNED: usize = 64;

/// A queued request: one VM, or a cluster's members together (a gang).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// The VM's id, or the cluster's.
    pub key: Uuid,
    pub tenant: Uuid,
    /// When it was queued, seconds since the epoch (FIFO within a tenant; ties between tenants).
    pub since: i64,
    /// The GPU model asked for; None: any model.
    pub model: Option<String>,
    /// VMs that must start together (1 for a lone VM).
    pub members: u32,
    /// GPUs per member (0: a CPU-only request).
    pub gpus: u32,
    /// A cluster that must stay within one scalable unit.
    pub one_unit: bool,
}

/// A tenant's GPUs of one model in use now, and its guaranteed share of them (0 when none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    pub tenant: Uuid,
    pub model: String,
    pub used: u64,
    pub guarantee: u64,
}

/// Fair order: indexes into `waiting`, first to be admitted first.
pub fn fair_order(waiting: &[Waiting], standing: &[Standing]) -> Vec<usize> {
    // Room below share (guarantee − used) per tenant and model. The `None` model is where
    // requests for any model count what they were given: a later any-model request of the same
    // tenant sees it (it sums every entry), a later request for a named model does not, since
    // which model an any-model request will get is not known yet.
    let mut room: BTreeMap<(Uuid, Option<String>), i128> = BTreeMap::new();
    for s in standing {
        *room.entry((s.tenant, Some(s.model.clone()))).or_default() +=
            i128::from(s.guarantee) - i128::from(s.used);
    }
    // Each tenant's line, youngest first, so its oldest request is the one popped next.
    let mut lines: BTreeMap<Uuid, Vec<usize>> = BTreeMap::new();
    for (i, w) in waiting.iter().enumerate() {
        lines.entry(w.tenant).or_default().push(i);
    }
    for line in lines.values_mut() {
        line.sort_by_key(|&i| std::cmp::Reverse((waiting[i].since, waiting[i].key)));
    }
    let mut order = Vec::with_capacity(waiting.len());
    loop {
        let next = lines
            .iter()
            .filter_map(|(&tenant, line)| line.last().map(|&i| (tenant, i)))
            .min_by_key(|&(tenant, i)| {
                let w = &waiting[i];
                let below = room_below_share(&room, tenant, &w.model);
                (std::cmp::Reverse(below), w.since, w.key)
            });
        let Some((tenant, i)) = next else { break };
        if let Some(line) = lines.get_mut(&tenant) {
            line.pop();
            if line.is_empty() {
                lines.remove(&tenant);
            }
        }
        let w = &waiting[i];
        // A CPU-only request counts as one per VM, so a project's many of
        // them do not all sort to the front.
        *room.entry((tenant, w.model.clone())).or_default() -=
            i128::from(w.members) * i128::from(w.gpus.max(1));
        order.push(i);
    }
    order
}

/// How far `tenant` is below its share of `model` (negative: above it); `None` sums all models.
fn room_below_share(
    room: &BTreeMap<(Uuid, Option<String>), i128>,
    tenant: Uuid,
    model: &Option<String>,
) -> i128 {
    room.iter()
        .filter(|((t, m), _)| *t == tenant && (model.is_none() || m == model))
        .map(|(_, r)| r)
        .sum()
}

/// A host's GPUs of one model, for the estimate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub id: Uuid,
    pub unit: Option<String>,
    pub model: String,
    /// GPUs in service on it.
    pub gpus: u32,
    /// GPUs held now by VMs and when each is expected to give them back (seconds since epoch).
    pub held: Vec<(u32, i64)>,
}

/// When a queued request is expected to start and on which hosts (one per member).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// None: it fits on no host even when the fleet is empty.
    pub start: Option<i64>,
    pub hosts: Vec<Uuid>,
}

/// What a host carries over time: GPUs held over [from, until). What VMs hold now is carried
/// from `i64::MIN`, so held and planned GPUs are counted by the same rule.
struct Load {
    capacity: u32,
    holds: Vec<(u32, i64, i64)>,
}

impl Load {
    fn used_at(&self, t: i64) -> u64 {
        self.holds
            .iter()
            .filter(|&&(_, from, until)| from <= t && t < until)
            .map(|&(gpus, _, _)| u64::from(gpus))
            .sum()
    }

    fn free_at(&self, t: i64) -> u64 {
        u64::from(self.capacity).saturating_sub(self.used_at(t))
    }

    /// Whether `need` more GPUs fit over [t, until): usage only rises where a hold begins, so
    /// it is enough to look at `t` and at every hold beginning inside the interval.
    fn fits(&self, need: u32, t: i64, until: i64) -> bool {
        let room_at = |p: i64| self.free_at(p) >= u64::from(need);
        room_at(t)
            && self
                .holds
                .iter()
                .filter(|&&(_, from, _)| t < from && from < until)
                .all(|&(_, from, _)| room_at(from))
    }
}

/// Whether `host` can serve a member of `w`: its model, and enough GPUs in service.
fn serves(host: &Host, w: &Waiting) -> bool {
    w.model.as_ref().is_none_or(|m| *m == host.model) && host.gpus >= w.gpus
}

/// Plans `ordered` requests in that order (conservative backfill): each starts at the earliest
/// time ≥ `now` at which it fits for `runtime` seconds beside what is held and what the requests
/// before it were planned to hold, so a later request may start sooner only in room that no
/// earlier request was planned to use at that time. Every request is assumed to run `runtime`
/// seconds.
pub fn plan(hosts: &[Host], ordered: &[&Waiting], now: i64, runtime: i64) -> Vec<Plan> {
    let mut loads: Vec<Load> = hosts
        .iter()
        .map(|h| Load {
            capacity: h.gpus,
            // Held GPUs given back by `now` are already free.
            holds: h
                .held
                .iter()
                .filter(|&&(_, until)| until > now)
                .map(|&(gpus, until)| (gpus, i64::MIN, until))
                .collect(),
        })
        .collect();
    let mut plans = Vec::with_capacity(ordered.len());
    for w in ordered {
        let placed = if w.gpus == 0 {
            // GPU counts do not govern a CPU-only request.
            Some((now, Vec::new()))
        } else {
            place(hosts, &loads, w, now, runtime)
        };
        // One that never fits reserves nothing.
        let (start, chosen) = match placed {
            Some((start, chosen)) => (Some(start), chosen),
            None => (None, Vec::new()),
        };
        if let Some(from) = start {
            for &i in &chosen {
                loads[i]
                    .holds
                    .push((w.gpus, from, from.saturating_add(runtime)));
            }
        }
        let hosts = chosen.iter().map(|&i| hosts[i].id).collect();
        plans.push(Plan { start, hosts });
    }
    plans
}

/// The earliest start for `w` and its hosts (indexes), or None when no time would do.
///
/// Usage falls only when a hold ends, so if `w` fits at some time it also fits at the last
/// hold end before it (or `now`): those are the only times worth trying. After the last end
/// the fleet is empty, so a request that fits an empty fleet is always placed.
fn place(
    hosts: &[Host],
    loads: &[Load],
    w: &Waiting,
    now: i64,
    runtime: i64,
) -> Option<(i64, Vec<usize>)> {
    let eligible: Vec<usize> = (0..hosts.len()).filter(|&i| serves(&hosts[i], w)).collect();
    let times: BTreeSet<i64> = iter::once(now)
        .chain(loads.iter().flat_map(|l| l.holds.iter().map(|h| h.2)))
        .filter(|&t| t >= now)
        .collect();
    times.into_iter().find_map(|t| {
        pick(hosts, loads, &eligible, w, t, t.saturating_add(runtime)).map(|chosen| (t, chosen))
    })
}

/// A host that fits: its size (GPUs in service), its id, and where it is in the fleet.
type Fit = (u64, Uuid, usize);

/// `w.members` distinct hosts that fit `w` over [t, until): the smallest hosts first (GPUs in
/// service, then id), so big hosts stay whole for big requests. With `one_unit`, the unit whose
/// chosen hosts are smallest in all (then by name); hosts with no unit form one unit of their
/// own, the unit `None`.
///
/// The preference deliberately ignores what is free at `t`. Were it "fewest left free", a VM
/// admitted by backfill would, once held, steer an earlier request to other hosts on the next
/// plan, and that detour could delay requests after it: estimates ahead would move after all.
/// With a preference fixed per host, extra load only removes hosts that no longer fit, which
/// were not the ones chosen, so every reservation ahead stays where it was.
fn pick(
    hosts: &[Host],
    loads: &[Load],
    eligible: &[usize],
    w: &Waiting,
    t: i64,
    until: i64,
) -> Option<Vec<usize>> {
    let mut fitting: Vec<Fit> = eligible
        .iter()
        .filter(|&&i| loads[i].fits(w.gpus, t, until))
        .map(|&i| (u64::from(hosts[i].gpus), hosts[i].id, i))
        .collect();
    fitting.sort_unstable();
    let mut units: BTreeMap<Option<Option<&str>>, Vec<Fit>> = BTreeMap::new();
    for f in fitting {
        // Without `one_unit` every fitting host is in the one group, `None`.
        let unit = w.one_unit.then(|| hosts[f.2].unit.as_deref());
        units.entry(unit).or_default().push(f);
    }
    let needed = w.members as usize;
    units
        .into_values()
        .filter_map(|candidates| {
            // One member per host: the same host listed for two models is still one host.
            let mut seen = BTreeSet::new();
            let chosen: Vec<Fit> = candidates
                .into_iter()
                .filter(|&(_, id, _)| seen.insert(id))
                .take(needed)
                .collect();
            (chosen.len() == needed).then(|| {
                let size: u64 = chosen.iter().map(|c| c.0).sum();
                (size, chosen.into_iter().map(|c| c.2).collect::<Vec<_>>())
            })
        })
        .min_by_key(|(size, _)| *size)
        .map(|(_, chosen)| chosen)
}

/// Whether starting `candidate` now, on `on` (the hosts of its plan), moves the planned start of
/// any request ahead of it. Convenience over `plan`: true when plan(hosts, ahead) and
/// plan(hosts with the candidate held from now for runtime, ahead) differ in any start.
#[cfg(test)]
fn delays_ahead(
    hosts: &[Host],
    ahead: &[&Waiting],
    candidate: &Waiting,
    on: &[Uuid],
    now: i64,
    runtime: i64,
) -> bool {
    let mut with = hosts.to_vec();
    for id in on {
        if let Some(h) = with
            .iter_mut()
            .find(|h| h.id == *id && serves(h, candidate))
        {
            h.held.push((candidate.gpus, now.saturating_add(runtime)));
        }
    }
    let starts = |fleet: &[Host]| -> Vec<Option<i64>> {
        plan(fleet, ahead, now, runtime)
            .into_iter()
            .map(|p| p.start)
            .collect()
    };
    starts(hosts) != starts(&with)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    const NOW: i64 = 1_800_000_000;

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn req(key: u128, tenant: u128, since: i64, model: Option<&str>) -> Waiting {
        Waiting {
            key: id(key),
            tenant: id(tenant),
            since,
            model: model.map(str::to_owned),
            members: 1,
            gpus: 8,
            one_unit: false,
        }
    }

    fn gang(key: u128, members: u32, gpus: u32, one_unit: bool) -> Waiting {
        let w = req(key, 1, 0, Some("H100"));
        Waiting {
            members,
            gpus,
            one_unit,
            ..w
        }
    }

    fn host(n: u128, unit: Option<&str>, gpus: u32, held: &[(u32, i64)]) -> Host {
        Host {
            id: id(n),
            unit: unit.map(str::to_owned),
            model: "H100".into(),
            gpus,
            held: held.to_vec(),
        }
    }

    /// Keys in fair order, given (tenant, model, used, guarantee) standings.
    fn order(q: &[Waiting], standing: &[(u128, &str, u64, u64)]) -> Vec<Uuid> {
        let standing: Vec<Standing> = standing
            .iter()
            .map(|&(t, m, used, guarantee)| {
                let (tenant, model) = (id(t), m.to_owned());
                Standing {
                    tenant,
                    model,
                    used,
                    guarantee,
                }
            })
            .collect();
        fair_order(q, &standing).iter().map(|&i| q[i].key).collect()
    }

    fn plan_all(fleet: &[Host], q: &[Waiting]) -> Vec<Plan> {
        plan(fleet, &q.iter().collect::<Vec<_>>(), NOW, 1000)
    }

    fn at(start: Option<i64>, hosts: &[u128]) -> Plan {
        let hosts = hosts.iter().map(|&n| id(n)).collect();
        Plan { start, hosts }
    }

    #[test]
    fn fifo_within_a_tenant_and_equal_tenants_interleave() {
        // Tenant 1 queued both first, but each pick adds to its use; tenant 2's keys are smaller.
        let q = [(32, 1, 20), (31, 1, 10), (22, 2, 40), (21, 2, 30)];
        let q = q.map(|(k, t, since)| req(k, t, since, Some("H100")));
        assert_eq!(order(&q, &[]), [31, 21, 32, 22].map(id));
    }

    #[test]
    fn furthest_below_share_goes_first_and_above_share_comes_after_no_share() {
        let q = [(1, 1, 10), (2, 2, 50), (3, 3, 0)];
        let q = q.map(|(k, t, since)| req(k, t, since, Some("H100")));
        // Tenant 2 (queued last) is 16 below its share; 3 is 8 above; 1 has no share and no use.
        let standing = [(2, "H100", 0, 16), (3, "H100", 16, 8)];
        assert_eq!(order(&q, &standing), [2, 1, 3].map(id));
    }

    #[test]
    fn any_model_sums_the_room_over_models() {
        let standing = [(1, "H100", 0, 8), (1, "A100", 0, 8), (2, "H100", 0, 12)];
        // Tenant 1's any-model request sees 16 of room; tenant 2's H100 request sees 12.
        let q = [req(2, 2, 0, Some("H100")), req(1, 1, 5, None)];
        assert_eq!(order(&q, &standing), [1, 2].map(id));
        // Asking for H100 only, tenant 1 sees 8 of room and goes second.
        let q = [req(2, 2, 0, Some("H100")), req(1, 1, 5, Some("H100"))];
        assert_eq!(order(&q, &standing), [2, 1].map(id));
    }

    #[test]
    fn whole_hosts_fill_then_the_third_waits_a_runtime() {
        let fleet = [host(1, None, 8, &[]), host(2, None, 8, &[])];
        let p = plan_all(&fleet, &[1, 2, 3].map(|k| gang(k, 1, 8, false)));
        let (now, later) = (Some(NOW), Some(NOW + 1000));
        assert_eq!(p, [at(now, &[1]), at(now, &[2]), at(later, &[1])]);
    }

    #[test]
    fn held_gpus_delay_a_request_until_given_back() {
        let q = [gang(1, 1, 8, false)];
        let p = plan_all(&[host(1, None, 8, &[(4, NOW + 100)])], &q);
        assert_eq!(p, [at(Some(NOW + 100), &[1])]);
        // Given back by now: already free.
        let p = plan_all(&[host(1, None, 8, &[(8, NOW)])], &q);
        assert_eq!(p, [at(Some(NOW), &[1])]);
    }

    /// The head needs all of host 1, half of which is held until NOW+100; host 2 has 2 GPUs.
    fn backfill_case() -> (Vec<Host>, [Waiting; 3]) {
        let fleet = vec![host(1, None, 8, &[(4, NOW + 100)]), host(2, None, 2, &[])];
        (
            fleet,
            [(1, 8), (2, 2), (3, 4)].map(|(k, g)| gang(k, 1, g, false)),
        )
    }

    #[test]
    fn backfill_only_into_room_nobody_ahead_will_use() {
        let (fleet, q) = backfill_case();
        let p = plan_all(&fleet, &q);
        assert_eq!(p[..2], [at(Some(NOW + 100), &[1]), at(Some(NOW), &[2])]);
        // 4 GPUs are free on host 1 now, but until NOW+1000 they would overlap the head's hold.
        assert_eq!(p[2], at(Some(NOW + 1100), &[1]));
    }

    #[test]
    fn delays_ahead_when_taking_the_heads_room_only() {
        let (fleet, q) = backfill_case();
        assert!(delays_ahead(&fleet, &[&q[0]], &q[2], &[id(1)], NOW, 1000));
        assert!(!delays_ahead(&fleet, &[&q[0]], &q[1], &[id(2)], NOW, 1000));
    }

    #[test]
    fn a_gang_takes_distinct_hosts_within_one_unit() {
        let unit = |n| Some(if n <= 2 { "su-a" } else { "su-b" });
        let mut fleet = [1, 2, 3, 4, 5].map(|n| host(n, unit(n), 8, &[]));
        let p = plan_all(&fleet, &[gang(1, 3, 8, true)]);
        assert_eq!(p, [at(Some(NOW), &[3, 4, 5])]);

        for h in &mut fleet[2..] {
            h.held = vec![(8, NOW + 50)];
        }
        let p = plan_all(&fleet, &[gang(1, 3, 8, true)]);
        assert_eq!(p, [at(Some(NOW + 50), &[3, 4, 5])]);
        // Without one_unit the 2 free hosts are still too few at once.
        let p = plan_all(&fleet, &[gang(1, 3, 8, false)]);
        assert_eq!(p[0].start, Some(NOW + 50));
        assert_eq!(p[0].hosts.iter().collect::<BTreeSet<_>>().len(), 3);
    }

    #[test]
    fn a_request_bigger_than_any_host_never_starts_and_reserves_nothing() {
        // Too many GPUs for one host; then two members in one unit that has one host.
        let fleet = [host(1, None, 8, &[]), host(2, Some("su-a"), 8, &[])];
        let q = [
            gang(1, 1, 16, false),
            gang(2, 2, 8, true),
            gang(3, 2, 8, false),
        ];
        let p = plan_all(&fleet, &q);
        assert_eq!(p, [at(None, &[]), at(None, &[]), at(Some(NOW), &[1, 2])]);
    }

    fn random_case(rng: &mut StdRng) -> (Vec<Host>, Vec<Waiting>, i64) {
        let models = [None, Some("H100"), Some("A100")];
        let units = [None, Some("su-a"), Some("su-b")];
        let fleet = (1..rng.gen_range(2..7))
            .map(|n| {
                let gpus = rng.gen_range(1..=8);
                let mut left = gpus;
                let mut held = Vec::new();
                for _ in 0..rng.gen_range(0..3) {
                    let g = rng.gen_range(0..=left);
                    left -= g;
                    held.push((g, NOW + rng.gen_range(-20..400)));
                }
                let mut h = host(n, units[rng.gen_range(0..3)], gpus, &held);
                h.model = models[rng.gen_range(1..3)].unwrap_or_default().into();
                h
            })
            .collect();
        let queue = (0..rng.gen_range(1..8))
            .map(|k| {
                let (members, gpus) = (rng.gen_range(1..=3), rng.gen_range(0..=9));
                let model = models[rng.gen_range(0..3)].map(str::to_owned);
                Waiting {
                    model,
                    ..gang(k, members, gpus, rng.gen_bool(0.5))
                }
            })
            .collect();
        (fleet, queue, rng.gen_range(1..300))
    }

    /// Random small fleets and queues over many fixed seeds (`rand`, since proptest is no
    /// dev-dependency of this crate): plans never overfill a host, gangs get distinct hosts of
    /// the right model and unit, and neither a later request nor a request admitted now by
    /// backfill moves the estimate of any request ahead of it.
    #[test]
    fn random_plans_never_overfill_and_never_delay_those_ahead() {
        for seed in 0..5000 {
            let (fleet, queue, runtime) = random_case(&mut StdRng::seed_from_u64(seed));
            let ordered: Vec<&Waiting> = queue.iter().collect();
            let plans = plan(&fleet, &ordered, NOW, runtime);
            let mut holds = Vec::new();
            for (k, (w, p)) in queue.iter().zip(&plans).enumerate() {
                let Some(start) = p.start else { continue };
                assert!(start >= NOW, "seed {seed}");
                let find = |h: &Uuid| fleet.iter().find(|f| f.id == *h);
                let on: Vec<&Host> = p.hosts.iter().flat_map(find).collect();
                let members = if w.gpus == 0 { 0 } else { w.members as usize };
                assert_eq!(
                    on.iter().map(|h| h.id).collect::<BTreeSet<_>>().len(),
                    members
                );
                assert!(on.iter().all(|h| serves(h, w)), "seed {seed}");
                assert!(
                    !w.one_unit || on.iter().all(|h| h.unit == on[0].unit),
                    "seed {seed}"
                );
                holds.extend(on.iter().map(|h| (h.id, w.gpus, start, start + runtime)));
                let moves = delays_ahead(&fleet, &ordered[..k], w, &p.hosts, NOW, runtime);
                assert!(start > NOW || !moves, "seed {seed}");
            }
            for t in holds.iter().map(|h| h.2).chain([NOW]) {
                for f in &fleet {
                    let held: u32 = f.held.iter().filter(|h| h.1 > t).map(|h| h.0).sum();
                    let planned: u32 = holds
                        .iter()
                        .filter(|&&(on, _, from, until)| on == f.id && from <= t && t < until)
                        .map(|h| h.1)
                        .sum();
                    assert!(held + planned <= f.gpus, "seed {seed}: {} at {t}", f.id);
                }
            }
            let before = plan(&fleet, &ordered[..ordered.len() - 1], NOW, runtime);
            assert_eq!(before[..], plans[..before.len()], "seed {seed}");
        }
    }
}
