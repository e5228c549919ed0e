//! `kumo-server bench scheduling` (issue 42): a month of GPU requests from
//! many projects with guaranteed shares, on a fleet of 8-GPU hosts, replayed
//! twice from the same seed:
//!
//! - **refuse and retry** (Kumo without `--queue`): a request that does not
//!   fit is refused; its researcher tries again every hour, for a day, then
//!   gives up;
//! - **the fair queue**: it waits, and each change to the fleet runs the
//!   queue's pass as the server does ([`crate::domain::queue`]: fair order,
//!   the first in line holding the hosts its plan names, the rest starting
//!   wherever they fit off them; at most [`crate::domain::queue::PLANNED`]
//!   requests planned per pass).
//!
//! Hosts are modelled by GPU count (placement's NUMA and NIC rules do not
//! change who waits for whole GPUs): best fit for VMs, whole hosts in one
//! scalable unit where one has room for a cluster's members. Reclaiming spot
//! or borrowed VMs is left out of both runs: every request is guaranteed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use uuid::Uuid;

use crate::domain::queue::{fair_order, plan, Host, Standing, Waiting, PLANNED};

const GPUS_PER_HOST: u32 = 8;
const UNIT_SIZE: usize = 32;
const HOUR: i64 = 3600;
const DAY: i64 = 86_400;
/// What the refused researcher does: tries again every hour, for a day.
const RETRY_EVERY: i64 = HOUR;
const RETRIES: u32 = 24;
/// The queue's defaults ([`crate::config::QueueConfig`]).
const ASSUMED_RUNTIME: i64 = DAY;
const EXPIRE_AFTER: i64 = 7 * DAY;
const MODEL: &str = "H100-SXM5-80GB";

#[derive(Debug, Clone)]
pub struct SchedulingConfig {
    pub hosts: usize,
    pub tenants: usize,
    pub days: u32,
    /// GPU-hours asked for over the month, as a fraction of the fleet's.
    pub load: f64,
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct TenantUse {
    pub tenant: usize,
    pub share_gpus: u32,
    /// GPUs its requests would have held on average, had they all run at once.
    pub demand_gpus: f64,
    /// GPUs it held on average over the month.
    pub held_gpus: f64,
    /// `held_gpus / share_gpus` (none without a share).
    pub held_to_share: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    /// GPU-hours held over the month / the fleet's GPU-hours.
    pub gpu_utilisation: f64,
    pub admitted: usize,
    /// Refused answers (each retry counts).
    pub refusals: usize,
    /// Requests never admitted: gave up after a day of retries, expired
    /// from the queue, or still waiting at the month's end.
    pub never_admitted: usize,
    /// From asking to running, admitted requests, hours.
    pub wait_p50_h: f64,
    pub wait_p99_h: f64,
    /// Of clusters alone.
    pub cluster_wait_p50_h: f64,
    pub clusters_admitted: usize,
    /// Projects whose demand reached their share but that held less than
    /// 90 % of it on average.
    pub tenants_under_share: usize,
    pub tenants: Vec<TenantUse>,
    /// The queue's pass (order, plan, admit), wall time.
    pub pass_p50_ms: f64,
    pub pass_p99_ms: f64,
    pub passes: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct SchedulingReport {
    pub hosts: usize,
    pub gpus: u32,
    pub tenants: usize,
    pub days: u32,
    pub load: f64,
    pub seed: u64,
    pub requests: usize,
    pub clusters: usize,
    pub refuse_and_retry: Figures,
    pub fair_queue: Figures,
}

#[derive(Debug, Clone)]
struct Ask {
    tenant: usize,
    at: i64,
    members: u32,
    gpus: u32,
    runtime: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A running request ends (its index).
    Ends(usize),
    /// A request is asked for (again, in the retry run).
    Asks(usize, u32),
}

struct Fleet {
    free: Vec<u32>,
    /// Running requests: hosts and GPUs, started, expected back (assumed).
    running: HashMap<usize, (Vec<usize>, i64)>,
    held_by: Vec<u32>,
    /// Integrals of GPUs held, overall and per tenant, up to `last`.
    gpu_seconds: f64,
    tenant_seconds: Vec<f64>,
    last: i64,
    end: i64,
}

impl Fleet {
    fn new(hosts: usize, tenants: usize, end: i64) -> Fleet {
        Fleet {
            free: vec![GPUS_PER_HOST; hosts],
            running: HashMap::new(),
            held_by: vec![0; tenants],
            gpu_seconds: 0.0,
            tenant_seconds: vec![0.0; tenants],
            last: 0,
            end,
        }
    }

    fn advance(&mut self, t: i64) {
        let to = t.min(self.end);
        if to > self.last {
            let dt = (to - self.last) as f64;
            for (i, held) in self.held_by.iter().enumerate() {
                self.tenant_seconds[i] += f64::from(*held) * dt;
                self.gpu_seconds += f64::from(*held) * dt;
            }
            self.last = to;
        }
    }

    /// Best fit by GPU count, off `keep_off`: a VM on the host left
    /// fullest; a cluster's members on whole hosts, in one unit where one
    /// has room, else across units.
    fn place(&self, a: &Ask, keep_off: &[bool]) -> Option<Vec<usize>> {
        let ok = |h: usize| !keep_off[h] && self.free[h] >= a.gpus;
        if a.members == 1 {
            return (0..self.free.len())
                .filter(|&h| ok(h))
                .min_by_key(|&h| (self.free[h], h))
                .map(|h| vec![h]);
        }
        let need = a.members as usize;
        let units = self.free.len().div_ceil(UNIT_SIZE);
        for u in 0..units {
            let hosts: Vec<usize> = (u * UNIT_SIZE..((u + 1) * UNIT_SIZE).min(self.free.len()))
                .filter(|&h| ok(h))
                .take(need)
                .collect();
            if hosts.len() == need {
                return Some(hosts);
            }
        }
        let hosts: Vec<usize> = (0..self.free.len()).filter(|&h| ok(h)).take(need).collect();
        (hosts.len() == need).then_some(hosts)
    }

    fn start(&mut self, i: usize, a: &Ask, hosts: Vec<usize>, t: i64) {
        for &h in &hosts {
            self.free[h] -= a.gpus;
        }
        self.held_by[a.tenant] += a.gpus * a.members;
        self.running.insert(i, (hosts, t));
    }

    fn finish(&mut self, i: usize, a: &Ask) {
        if let Some((hosts, _)) = self.running.remove(&i) {
            for h in hosts {
                self.free[h] += a.gpus;
            }
            self.held_by[a.tenant] -= a.gpus * a.members;
        }
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// A month of asks: arrivals by day and night (twice as many by day),
/// projects asking in proportion to their share times a factor of 0.5–2
/// (two projects without a share ask a little), shapes 1/2/4/8-GPU VMs
/// and, one in seven, 2/4/8 × 8-GPU clusters; run times log-normal
/// (median 6 h for VMs, 12 h for clusters; 10 min to 7 days).
fn asks(cfg: &SchedulingConfig, shares: &[u32], rng: &mut StdRng) -> Vec<Ask> {
    let capacity = (cfg.hosts as f64) * f64::from(GPUS_PER_HOST) * f64::from(cfg.days) * 24.0;
    let mut demand: Vec<f64> = shares
        .iter()
        .map(|s| f64::from((*s).max(8)) * rng.gen_range(0.5..2.0))
        .collect();
    let total: f64 = demand.iter().sum();
    demand.iter_mut().for_each(|d| *d /= total);
    let mut out = Vec::new();
    let mut gpu_hours = 0.0;
    let end = i64::from(cfg.days) * DAY;
    let mut t = 0i64;
    while gpu_hours < cfg.load * capacity {
        // Mean gap 10 min by day, 20 by night, rescaled below.
        let day = (t % DAY) >= 8 * HOUR && (t % DAY) < 20 * HOUR;
        let mean = if day { 600.0 } else { 1200.0 };
        t += (-mean * (1.0 - rng.gen::<f64>()).ln()) as i64;
        let mut pick = rng.gen::<f64>();
        let tenant = demand
            .iter()
            .position(|d| {
                pick -= d;
                pick <= 0.0
            })
            .unwrap_or(demand.len() - 1);
        let cluster = rng.gen_ratio(1, 7);
        let (members, gpus, median) = if cluster {
            ([2, 4, 8][rng.gen_range(0..3)], 8, 12.0 * 3600.0)
        } else {
            let g = [1, 1, 2, 4, 8, 8][rng.gen_range(0..6)];
            (1, g, 6.0 * 3600.0)
        };
        // Log-normal with σ = 1 (Box–Muller).
        let z = (-2.0 * (1.0 - rng.gen::<f64>()).ln()).sqrt()
            * (2.0 * std::f64::consts::PI * rng.gen::<f64>()).cos();
        let runtime = ((median * z.exp()) as i64).clamp(600, 7 * DAY);
        gpu_hours += f64::from(members * gpus) * runtime as f64 / 3600.0;
        out.push(Ask {
            tenant,
            at: t,
            members,
            gpus,
            runtime,
        });
    }
    // The stream as drawn spans some time: squeeze or stretch it over the
    // month, keeping its day and night shape roughly.
    let span = t.max(1) as f64;
    for a in &mut out {
        a.at = ((a.at as f64) * (end as f64) / span) as i64;
    }
    out
}

/// Shares: 70 % of the fleet's GPUs promised, unevenly (weights 1/(i+1)),
/// in whole hosts; the last two projects get none.
fn shares(cfg: &SchedulingConfig) -> Vec<u32> {
    let gpus = cfg.hosts as f64 * f64::from(GPUS_PER_HOST);
    let with = cfg.tenants.saturating_sub(2).max(1);
    let weights: Vec<f64> = (0..with).map(|i| 1.0 / (i as f64 + 1.0)).collect();
    let total: f64 = weights.iter().sum();
    let mut out: Vec<u32> = weights
        .iter()
        .map(|w| ((0.7 * gpus * w / total) / 8.0).floor() as u32 * 8)
        .collect();
    out.resize(cfg.tenants, 0);
    out
}

pub fn run(cfg: &SchedulingConfig) -> Result<SchedulingReport, String> {
    if cfg.hosts == 0 || cfg.tenants == 0 || cfg.days == 0 || cfg.load <= 0.0 {
        return Err("hosts, tenants, days and load must be positive".into());
    }
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let shares = shares(cfg);
    let asks = asks(cfg, &shares, &mut rng);
    if asks.is_empty() {
        return Err("no requests drawn".into());
    }
    Ok(SchedulingReport {
        hosts: cfg.hosts,
        gpus: cfg.hosts as u32 * GPUS_PER_HOST,
        tenants: cfg.tenants,
        days: cfg.days,
        load: cfg.load,
        seed: cfg.seed,
        requests: asks.len(),
        clusters: asks.iter().filter(|a| a.members > 1).count(),
        refuse_and_retry: replay(cfg, &shares, &asks, false),
        fair_queue: replay(cfg, &shares, &asks, true),
    })
}

fn replay(cfg: &SchedulingConfig, shares: &[u32], asks: &[Ask], queue: bool) -> Figures {
    let end = i64::from(cfg.days) * DAY;
    let mut fleet = Fleet::new(cfg.hosts, cfg.tenants, end);
    let mut events: BinaryHeap<Reverse<(i64, Event)>> = asks
        .iter()
        .enumerate()
        .map(|(i, a)| Reverse((a.at, Event::Asks(i, 0))))
        .collect();
    let none_kept = vec![false; cfg.hosts];
    let ids: Vec<Uuid> = (0..cfg.hosts)
        .map(|h| Uuid::from_u128(h as u128 + 1))
        .collect();
    let mut waits: Vec<f64> = Vec::new();
    let mut cluster_waits: Vec<f64> = Vec::new();
    let mut refusals = 0;
    let mut given_up = 0;
    let mut waiting: Vec<usize> = Vec::new();
    let mut pass_ms: Vec<f64> = Vec::new();
    let mut started = |fleet: &mut Fleet,
                       events: &mut BinaryHeap<Reverse<(i64, Event)>>,
                       i: usize,
                       hosts: Vec<usize>,
                       t: i64| {
        let a = &asks[i];
        fleet.start(i, a, hosts, t);
        events.push(Reverse((t + a.runtime, Event::Ends(i))));
        let w = (t - a.at) as f64 / 3600.0;
        waits.push(w);
        if a.members > 1 {
            cluster_waits.push(w);
        }
    };
    while let Some(Reverse((t, e))) = events.pop() {
        if t > end && waiting.is_empty() {
            break;
        }
        fleet.advance(t);
        match e {
            Event::Ends(i) => fleet.finish(i, &asks[i]),
            Event::Asks(i, tries) if !queue => {
                match fleet.place(&asks[i], &none_kept) {
                    Some(hosts) => started(&mut fleet, &mut events, i, hosts, t),
                    None => {
                        refusals += 1;
                        if tries < RETRIES && t + RETRY_EVERY <= end {
                            events.push(Reverse((t + RETRY_EVERY, Event::Asks(i, tries + 1))));
                        } else {
                            given_up += 1;
                        }
                    }
                }
                continue;
            }
            Event::Asks(i, _) => {
                // With others waiting it queues behind them (the pass
                // below may admit it at once, in fair order).
                let placed = if waiting.is_empty() {
                    fleet.place(&asks[i], &none_kept)
                } else {
                    None
                };
                match placed {
                    Some(hosts) => {
                        started(&mut fleet, &mut events, i, hosts, t);
                        continue;
                    }
                    None => waiting.push(i),
                }
            }
        }
        if !queue || waiting.is_empty() || t > end {
            continue;
        }
        // The queue's pass, as `app::queue::run` does it.
        let began = Instant::now();
        waiting.retain(|&i| {
            let keep = t - asks[i].at < EXPIRE_AFTER;
            if !keep {
                given_up += 1;
            }
            keep
        });
        let requests: Vec<Waiting> = waiting
            .iter()
            .map(|&i| {
                let a = &asks[i];
                Waiting {
                    key: Uuid::from_u128(i as u128 + 1),
                    tenant: Uuid::from_u128(a.tenant as u128 + 1),
                    since: a.at,
                    model: Some(MODEL.into()),
                    members: a.members,
                    gpus: a.gpus,
                    one_unit: false,
                }
            })
            .collect();
        let standing: Vec<Standing> = (0..cfg.tenants)
            .map(|n| Standing {
                tenant: Uuid::from_u128(n as u128 + 1),
                model: MODEL.into(),
                used: u64::from(fleet.held_by[n]),
                guarantee: u64::from(shares[n]),
            })
            .collect();
        let order = fair_order(&requests, &standing);
        let mut held: Vec<Vec<(u32, i64)>> = vec![Vec::new(); cfg.hosts];
        for (i, (hosts, since)) in &fleet.running {
            for &h in hosts {
                held[h].push((asks[*i].gpus, (since + ASSUMED_RUNTIME).max(t)));
            }
        }
        let hosts: Vec<Host> = held
            .into_iter()
            .enumerate()
            .map(|(h, held)| Host {
                id: ids[h],
                unit: Some(format!("su{}", h / UNIT_SIZE)),
                model: MODEL.into(),
                gpus: GPUS_PER_HOST,
                held,
            })
            .collect();
        let planned: Vec<&Waiting> = order.iter().take(PLANNED).map(|&k| &requests[k]).collect();
        let plans = plan(&hosts, &planned, t, ASSUMED_RUNTIME);
        // EASY backfill, as the server: the first in line holds its
        // planned hosts; the rest start wherever they fit off them.
        let mut keep_off = vec![false; cfg.hosts];
        let mut head_seen = false;
        let mut admitted = Vec::new();
        for (&k, p) in order.iter().zip(&plans) {
            let i = waiting[k];
            if let Some(hosts) = fleet.place(&asks[i], &keep_off) {
                started(&mut fleet, &mut events, i, hosts, t);
                admitted.push(i);
                continue;
            }
            if !head_seen && p.start.is_some() {
                head_seen = true;
                for id in &p.hosts {
                    keep_off[(id.as_u128() - 1) as usize] = true;
                }
            }
        }
        waiting.retain(|i| !admitted.contains(i));
        pass_ms.push(began.elapsed().as_secs_f64() * 1e3);
    }
    given_up += waiting.len();
    fleet.advance(end);
    let seconds = end as f64;
    let mut demand = vec![0.0; cfg.tenants];
    for a in asks {
        demand[a.tenant] += f64::from(a.members * a.gpus) * a.runtime as f64 / seconds;
    }
    let tenants: Vec<TenantUse> = (0..cfg.tenants)
        .map(|n| TenantUse {
            tenant: n,
            share_gpus: shares[n],
            demand_gpus: demand[n],
            held_gpus: fleet.tenant_seconds[n] / seconds,
            held_to_share: (shares[n] > 0)
                .then(|| fleet.tenant_seconds[n] / seconds / f64::from(shares[n])),
        })
        .collect();
    let passes = pass_ms.len();
    Figures {
        gpu_utilisation: fleet.gpu_seconds
            / (seconds * cfg.hosts as f64 * f64::from(GPUS_PER_HOST)),
        admitted: waits.len(),
        refusals,
        never_admitted: given_up,
        wait_p50_h: percentile(&mut waits, 0.5),
        wait_p99_h: percentile(&mut waits, 0.99),
        clusters_admitted: cluster_waits.len(),
        cluster_wait_p50_h: percentile(&mut cluster_waits, 0.5),
        tenants_under_share: tenants
            .iter()
            .filter(|u| {
                u.share_gpus > 0
                    && u.demand_gpus >= f64::from(u.share_gpus)
                    && u.held_gpus < 0.9 * f64::from(u.share_gpus)
            })
            .count(),
        tenants,
        pass_p50_ms: percentile(&mut pass_ms.clone(), 0.5),
        pass_p99_ms: percentile(&mut pass_ms, 0.99),
        passes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small overloaded fleet: the retry run refuses and the queue never
    /// does; every request is accounted for once; every figure is within
    /// its range. (Which run keeps the fleet busier is what the bench
    /// measures, not a rule: see BENCHMARKS.md.)
    #[test]
    fn the_queue_replaces_refusals_and_accounts_for_every_request() {
        let cfg = SchedulingConfig {
            hosts: 32,
            tenants: 6,
            days: 4,
            load: 1.2,
            seed: 3,
        };
        let r = run(&cfg).unwrap_or_else(|e| panic!("{e}"));
        assert!(r.requests > 100 && r.clusters > 0, "{r:?}");
        let (retry, queue) = (&r.refuse_and_retry, &r.fair_queue);
        assert!(retry.refusals > 0, "an overloaded fleet refuses");
        assert_eq!(queue.refusals, 0);
        assert!(queue.passes > 0);
        for f in [retry, queue] {
            assert!(f.gpu_utilisation > 0.5 && f.gpu_utilisation <= 1.0, "{f:?}");
            assert_eq!(f.admitted + f.never_admitted, r.requests, "{f:?}");
            assert!(f.wait_p50_h <= f.wait_p99_h);
        }
        assert!(queue.clusters_admitted > 0 && retry.clusters_admitted > 0);
        assert!(run(&SchedulingConfig { hosts: 0, ..cfg }).is_err());
    }
}
