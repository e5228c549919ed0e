//! `kumo-server bench placement`: a synthetic fleet of real fixture
//! machines (scalable units of 32 hosts: HGX H100, DGX A100 and
//! reduced-NIC HGX H100 units in turn), filled with background VMs to a fraction of its GPUs, then
//! a stream of requests (1/2/4/8-GPU VMs, and 16×8-GPU clusters) placed by
//! Kumo's best fit and by a naive first fit over identical fleets. Churn
//! (random VMs leaving) keeps the fill steady while requests arrive.

use std::sync::Arc;
use std::time::Instant;

use kumo_topology::{fixtures, sysfs};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use uuid::Uuid;

use crate::cluster::{place_cluster, ClusterRequest};
use crate::index::{HostInput, HostUse, Index};
use crate::place::{place, place_on, Request, Strategy};
use crate::profile::HostProfile;

pub const UNIT_SIZE: usize = 32;
/// One request in this many is a 16×8-GPU cluster.
pub const CLUSTER_EVERY: usize = 50;
pub const CLUSTER_SIZE: u32 = 16;

#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub hosts: usize,
    pub fill: f64,
    pub requests: usize,
    pub seed: u64,
    /// NVSwitch hosts in Fabric Manager's shared mode: multi-GPU VMs on
    /// their default partitions only.
    pub partitions: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    pub p50_us: f64,
    pub p99_us: f64,
    pub placements_per_s: f64,
    pub cluster_p99_us: f64,
    pub paired_nic_pix_ratio: f64,
    pub cluster_single_su_ratio: f64,
    /// Clusters placed inside one scalable unit.
    pub cluster_single_su: u32,
    /// Clusters for which some scalable unit had room for all members at
    /// the moment they were asked for (what one-unit placement could
    /// reach; Kumo's best fit should match it).
    pub cluster_single_su_possible: u32,
    pub stranded_gpus: u32,
    pub whole_free_hosts: u32,
    pub vms_placed: u32,
    pub vms_refused: u32,
    pub clusters_placed: u32,
    pub clusters_refused: u32,
    pub fill_reached: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub hosts: usize,
    pub gpus: u32,
    pub fill: f64,
    pub requests: usize,
    pub seed: u64,
    pub partitions: bool,
    #[serde(flatten)]
    pub kumo: Figures,
    pub first_fit: Figures,
}

/// The fixture machines the fleet is made of, as profiles interned in `index`.
fn profiles(index: &mut Index, partitions: bool) -> Result<Vec<Arc<HostProfile>>, String> {
    let mut out = Vec::new();
    for name in ["hgx-h100", "dgx-a100", "hgx-h100-2nic"] {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let m = fixtures::machine(name).ok_or_else(|| format!("no fixture {name}"))?;
        fixtures::write(&m, dir.path()).map_err(|e| e.to_string())?;
        let mut topo = sysfs::discover(dir.path(), None).map_err(|e| e.to_string())?;
        if partitions {
            let table = kumo_topology::partitions::default_partitions(&topo)
                .ok_or_else(|| format!("{name} has no NVSwitch partition table"))?;
            topo.fabric_manager = Some(kumo_topology::FabricManager::Partitions(table));
        }
        out.push(
            index
                .profile(&topo, &Default::default())
                .map_err(|e| e.to_string())?,
        );
    }
    Ok(out)
}

fn fleet(n: usize, partitions: bool) -> Result<Index, String> {
    let mut index = Index::new();
    let profiles = profiles(&mut index, partitions)?;
    for i in 0..n {
        let unit = i / UNIT_SIZE;
        index.upsert(
            HostInput {
                id: Uuid::from_u128(i as u128 + 1),
                name: format!("h{i:05}"),
                scalable_unit: Some(format!("su{unit:03}")),
                state: HostUse::Ready,
                revision: 1,
                profile: profiles[unit % profiles.len()].clone(),
                networked: true,
                shares: true,
                blocked: Vec::new(),
                // Room for every request: the disk dimension is checked
                // on every host, never the one that refuses.
                disk_free_gib: Some(1 << 40),
            },
            &[],
        );
    }
    Ok(index)
}

fn vm_request(rng: &mut StdRng, models: &[u16]) -> Request {
    let gpus = [1, 2, 4, 8][rng.gen_range(0..4)];
    Request {
        gpus,
        model: Some(models[rng.gen_range(0..models.len())]),
        vcpus: 8 * gpus,
        memory_mib: 32 * 1024 * u64::from(gpus),
        unit: None,
        rails: None,
        networked: false,
        shares: false,
        roce: false,
        host: None,
        avoid: Vec::new(),
        disk_gib: 100 * u64::from(gpus),
        spot: false,
        cluster: None,
        reservation: None,
    }
}

fn used_fraction(index: &Index) -> f64 {
    let (free, total) = index.gpu_totals();
    f64::from(total - free) / f64::from(total.max(1))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn run_one(cfg: &BenchConfig, strategy: Strategy) -> Result<(Figures, u32), String> {
    let mut index = fleet(cfg.hosts, cfg.partitions)?;
    let models: Vec<u16> = ["H100-SXM5-80GB", "A100-SXM4-40GB"]
        .iter()
        .filter_map(|m| index.model_id(m))
        .collect();
    if models.is_empty() {
        return Err("the fixtures have no GPU models".into());
    }
    // Three streams, so that both strategies are asked the same things:
    // with one, a refusal (or a fill reached after more or fewer VMs)
    // shifted every later draw, and the strategies were compared on
    // different requests (seed 1 on 1,000 hosts asked best fit for 58
    // clusters of the scarcer model, first fit for far fewer).
    let mut fill_rng = StdRng::seed_from_u64(cfg.seed);
    let mut rng = StdRng::seed_from_u64(cfg.seed ^ 0x5eed_0f7e_9e57);
    let mut leave_rng = StdRng::seed_from_u64(cfg.seed ^ 0x1ea7e);
    let mut live: Vec<(usize, Uuid)> = Vec::new();
    let mut next_id: u128 = 1 << 64;
    let mut id = || {
        next_id += 1;
        Uuid::from_u128(next_id)
    };
    // Background load; a few refusals in a row mean the fleet is as full
    // as this mix gets.
    let mut refusals = 0;
    while used_fraction(&index) < cfg.fill && refusals < 100 {
        let req = vm_request(&mut fill_rng, &models);
        match place(&index, &req, strategy) {
            Some(c) => {
                let vm = id();
                let mut hold = c.hold;
                hold.vm = vm;
                index.apply(c.host, hold);
                live.push((c.host, vm));
                refusals = 0;
            }
            None => refusals += 1,
        }
    }
    let fill_reached = used_fraction(&index);
    // A fleet that could not be filled as asked measures something else:
    // say so instead of reporting the figures of an emptier fleet.
    if fill_reached + 0.02 < cfg.fill {
        return Err(format!(
            "the fleet filled to {:.1} % of its GPUs, not the {:.1} % asked for",
            fill_reached * 100.0,
            cfg.fill * 100.0
        ));
    }
    let mut vm_times = Vec::new();
    let mut cluster_times = Vec::new();
    let (mut near, mut possible) = (0u32, 0u32);
    let (mut vms_refused, mut clusters_placed, mut clusters_refused, mut single_su) =
        (0u32, 0u32, 0u32, 0u32);
    let mut single_su_possible = 0u32;
    for r in 0..cfg.requests {
        if r % CLUSTER_EVERY == CLUSTER_EVERY - 1 {
            let req = ClusterRequest {
                size: CLUSTER_SIZE,
                member: Request {
                    gpus: 8,
                    ..vm_request(&mut rng, &models)
                },
                one_unit: false,
            };
            let ids: Vec<Uuid> = (0..CLUSTER_SIZE).map(|_| id()).collect();
            if one_unit_had_room(&index, &req) {
                single_su_possible += 1;
            }
            let t = Instant::now();
            let placed = place_cluster(&mut index, &req, &ids, strategy);
            cluster_times.push(t.elapsed().as_secs_f64() * 1e6);
            match placed {
                Some(members) => {
                    clusters_placed += 1;
                    let first = members.first().map(|c| index.hosts[c.host].scalable_unit);
                    if members
                        .iter()
                        .all(|c| Some(index.hosts[c.host].scalable_unit) == first)
                    {
                        single_su += 1;
                    }
                    for c in members {
                        near += c.near_nic_gpus;
                        possible += c.near_nic_possible;
                        live.push((c.host, c.hold.vm));
                    }
                }
                None => clusters_refused += 1,
            }
        } else {
            let req = vm_request(&mut rng, &models);
            let vm = id();
            let t = Instant::now();
            let placed = place(&index, &req, strategy).inspect(|c| {
                let mut hold = c.hold.clone();
                hold.vm = vm;
                index.apply(c.host, hold);
            });
            vm_times.push(t.elapsed().as_secs_f64() * 1e6);
            match placed {
                Some(c) => {
                    near += c.near_nic_gpus;
                    possible += c.near_nic_possible;
                    live.push((c.host, vm));
                }
                None => vms_refused += 1,
            }
        }
        while used_fraction(&index) > cfg.fill && !live.is_empty() {
            let (host, vm) = live.swap_remove(leave_rng.gen_range(0..live.len()));
            index.release(host, vm);
        }
    }
    let total_s: f64 = vm_times.iter().sum::<f64>() / 1e6;
    let placed = vm_times.len() as u32 - vms_refused;
    vm_times.sort_by(f64::total_cmp);
    cluster_times.sort_by(f64::total_cmp);
    let ratio = |a: u32, b: u32| {
        if b == 0 {
            1.0
        } else {
            f64::from(a) / f64::from(b)
        }
    };
    Ok((
        Figures {
            p50_us: percentile(&vm_times, 0.5),
            p99_us: percentile(&vm_times, 0.99),
            placements_per_s: if total_s > 0.0 {
                vm_times.len() as f64 / total_s
            } else {
                0.0
            },
            cluster_p99_us: percentile(&cluster_times, 0.99),
            paired_nic_pix_ratio: ratio(near, possible),
            cluster_single_su_ratio: ratio(single_su, clusters_placed),
            cluster_single_su: single_su,
            cluster_single_su_possible: single_su_possible,
            stranded_gpus: index.stranded_gpus(),
            whole_free_hosts: index.whole_free_hosts(),
            vms_placed: placed,
            vms_refused,
            clusters_placed,
            clusters_refused,
            fill_reached,
        },
        index.gpu_totals().1,
    ))
}

/// Whether one scalable unit has room for every member of `req` now.
/// Exact for the bench's members of 8 GPUs: each takes a whole host (no
/// fixture has more than 8), so a unit has room when that many of its
/// hosts take one.
fn one_unit_had_room(index: &Index, req: &ClusterRequest) -> bool {
    debug_assert_eq!(req.member.gpus, 8, "members take whole hosts");
    let mut fits: std::collections::BTreeMap<Option<u32>, u32> = Default::default();
    for h in &index.hosts {
        if place_on(h, &req.member, Strategy::BestFit).is_some() {
            *fits.entry(h.scalable_unit).or_default() += 1;
        }
    }
    fits.values().any(|n| *n >= req.size)
}

/// Runs the benchmark for both strategies over identical fleets and
/// request streams.
pub fn run(cfg: &BenchConfig) -> Result<Report, String> {
    if cfg.hosts == 0 || !(0.0..1.0).contains(&cfg.fill) {
        return Err("--hosts must be positive and --fill in [0, 1)".into());
    }
    let (kumo, gpus) = run_one(cfg, Strategy::BestFit)?;
    let (first_fit, _) = run_one(cfg, Strategy::FirstFit)?;
    Ok(Report {
        hosts: cfg.hosts,
        gpus,
        fill: cfg.fill,
        requests: cfg.requests,
        seed: cfg.seed,
        partitions: cfg.partitions,
        kumo,
        first_fit,
    })
}

/// A figure BENCHMARKS.md records for the `--extended` guards, on a line
/// `<!-- guard NAME: VALUE -->` (the placement guard and the fleet
/// simulator's both read them).
pub fn guarded_figure(benchmarks_md: &str, name: &str) -> Option<f64> {
    let key = format!("<!-- guard {name}: ");
    benchmarks_md.lines().find_map(|l| {
        l.trim()
            .strip_prefix(&key)?
            .strip_suffix(" -->")?
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whenever one scalable unit had room for a whole cluster, Kumo's
    /// best fit put it in one; first fit, which takes hosts in order,
    /// does not.
    #[test]
    fn clusters_land_in_one_unit_whenever_one_has_room() {
        let r = run(&BenchConfig {
            hosts: 256,
            fill: 0.6,
            requests: 1000,
            seed: 7,
            partitions: false,
        })
        .unwrap();
        assert!(r.kumo.cluster_single_su_possible >= 10, "{r:?}");
        assert_eq!(
            r.kumo.cluster_single_su, r.kumo.cluster_single_su_possible,
            "{r:?}"
        );
        assert!(
            r.first_fit.cluster_single_su < r.first_fit.cluster_single_su_possible,
            "{r:?}"
        );
    }

    /// On partitioned NVSwitch hosts best fit still packs. One end-of-run
    /// reading of stranded GPUs swings by ±50 % between seeds, so the
    /// 5 % comparison is the benchmark's (BENCHMARKS.md: 1,000 hosts, 8
    /// seeds, 8 % fewer stranded with partitions); here, on 256 hosts and
    /// four seeds, only a bound loose enough for that noise: a guard
    /// against packing that falls apart, not a measure of the heuristics
    /// (which partition inside a host matters little here: the host choice
    /// dominates). That every multi-GPU VM is on a partition, and that a
    /// free partition of the size asked is always taken, the scheduler's
    /// own tests hold.
    #[test]
    fn partitions_keep_best_fits_packing() {
        let stranded = |partitions| -> u32 {
            (1..=4)
                .map(|seed| {
                    let r = run(&BenchConfig {
                        hosts: 256,
                        fill: 0.6,
                        requests: 1000,
                        seed,
                        partitions,
                    })
                    .unwrap();
                    assert!(r.kumo.vms_placed > 0, "{r:?}");
                    r.kumo.stranded_gpus
                })
                .sum()
        };
        let (free, parted) = (stranded(false), stranded(true));
        assert!(
            f64::from(parted) <= f64::from(free) * 1.25,
            "stranded: {parted} partitioned, {free} not"
        );
    }
}
