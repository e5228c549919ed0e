//! `kumo-load fleet`: N simulated hosts in this process, each speaking the
//! agent protocol through the agent's own client (`kumo_agent::client`):
//! registered with multi-use join tokens, heart-beating (the inventory on
//! the first beat, device health every telemetry interval, the storage
//! every beat, as `kumo-agent run` does), holding the long poll on its
//! desired state and acting on it (its VMs reported running, stopped or
//! gone at once), and reporting GPU figures for its running GPU VMs.
//! Beside them a second load creates, stops, starts and deletes VMs and
//! clusters and reads the API, each at a set rate.
//!
//! It fails (non-zero exit, no figures) when fewer hosts register than
//! asked, when no created VM ever runs, or when any heartbeat fails: a
//! figure of a smaller fleet than the one named is worse than none.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kumo_agent::client::{register_as, AgentClient};
use kumo_api_types::{
    ActualState, AgentHeartbeat, AgentRegister, DesiredState, GpuReading, Power, StatusReport,
    StorageCapacity, TelemetryReport, VmStatus, VmTelemetry,
};
use serde_json::{json, Value};
use tokio::sync::Mutex;
use uuid::Uuid;

use crate::Tally;

pub struct FleetArgs {
    pub hosts: usize,
    pub heartbeat: Duration,
    pub telemetry: Duration,
    /// The figures leave out requests due in the first `warmup` (they are
    /// in `whole_run`).
    pub warmup: Duration,
    pub seconds: u64,
    pub parallel: usize,
    /// VM changes per second (create, stop, start, delete; every 20th a
    /// 2-member cluster).
    pub change_rate: f64,
    /// API reads per second.
    pub read_rate: f64,
    /// The server's processes (replicas), for their CPU time and memory.
    pub server_pids: Vec<u32>,
    /// What the database's size is read from: a SQLite file's path, or
    /// a PostgreSQL URL (`psql`).
    pub database: Option<String>,
}

/// The four machine designs of the fleet, in turn.
const MACHINES: [&str; 4] = ["hgx-h100", "dgx-a100", "l40s-pcie", "cpu-only"];
const H100: &str = "H100-SXM5-80GB";
/// Projects the load spreads its changes over: each project's allowance
/// of changes to shared hosts (120 a minute by default) is the server's
/// to enforce, not this load's to trip.
const TENANTS: usize = 20;

fn tenant(n: u64) -> String {
    format!("fleet-sim-{:02}", n % TENANTS as u64)
}

/// What the simulated hosts saw, for the load's figures.
#[derive(Default)]
struct Seen {
    /// VM → when its host first reported it running.
    running: HashMap<Uuid, Instant>,
    /// VM → when its host's long poll first brought it.
    delivered: HashMap<Uuid, Instant>,
}

#[derive(Default)]
struct Figures {
    heartbeat: Tally,
    long_poll_changes: u64,
    status: Tally,
    telemetry: Tally,
}

struct Design {
    topology: kumo_topology::HostTopology,
    health: kumo_topology::health::HostSignals,
}

fn designs() -> anyhow::Result<Vec<Design>> {
    MACHINES
        .iter()
        .map(|m| {
            let t = kumo_topology::fixtures::machine(m)
                .ok_or_else(|| anyhow::anyhow!("no fixture {m}"))?;
            let dir = tempfile::tempdir()?;
            kumo_topology::fixtures::write(&t, dir.path())?;
            let topology = kumo_topology::sysfs::discover(dir.path(), None)?;
            // What the agent reads of its devices' health, from the same
            // sysfs: the real reading code on the fixture's files.
            let health = kumo_topology::health::read(dir.path(), &topology);
            Ok(Design { topology, health })
        })
        .collect()
}

async fn admin_setup(http: &reqwest::Client, base: &str, token: &str) -> anyhow::Result<()> {
    let send = |r: reqwest::RequestBuilder| async move {
        let r = r.bearer_auth(token).send().await?;
        anyhow::ensure!(
            r.status().is_success() || r.status() == 409,
            "setting up the load's projects: {} {}",
            r.status(),
            r.text().await.unwrap_or_default()
        );
        Ok(())
    };
    let expires = chrono::Utc::now() + chrono::Duration::days(365);
    for n in 0..TENANTS as u64 {
        let t = tenant(n);
        send(
            http.post(format!("{base}/api/v1/tenants"))
                .json(&json!({ "name": t })),
        )
        .await?;
        send(
            http.put(format!("{base}/api/v1/tenants/{t}/quota"))
                .json(&json!({
                    "gpus": { H100: 100_000 },
                    "vcpus": 1_000_000, "memory_gib": 1_000_000, "vms": 100_000,
                    "disk_gib": 1_000_000,
                })),
        )
        .await?;
        send(
            http.post(format!("{base}/api/v1/tenants/{t}/points/grants"))
                .json(&json!({ "amount": "1000000000000", "expires_at": expires })),
        )
        .await?;
    }
    Ok(())
}

async fn register_all(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    designs: &Arc<Vec<Design>>,
    hosts: usize,
    parallel: usize,
) -> anyhow::Result<(Vec<(usize, AgentClient)>, Vec<String>)> {
    // Join tokens of up to 10,000 uses each (the server's limit).
    let mut joins = Vec::new();
    let mut left = hosts;
    while left > 0 {
        let uses = left.min(10_000);
        let r: Value = http
            .post(format!("{base}/api/v1/hosts/join-tokens"))
            .bearer_auth(token)
            .json(&json!({ "description": "kumo-load fleet", "ttl_seconds": 86400, "uses": uses }))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let t = r["token"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("no join token in {r}"))?;
        joins.push(t.to_owned());
        left -= uses;
    }
    let joins = Arc::new(joins);
    let out = Arc::new(Mutex::new(Vec::with_capacity(hosts)));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    let run = std::process::id();
    for _ in 0..parallel.max(1) {
        let (http, base, joins, designs, out, errors, next) = (
            http.clone(),
            base.to_owned(),
            joins.clone(),
            designs.clone(),
            out.clone(),
            errors.clone(),
            next.clone(),
        );
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= hosts {
                    return;
                }
                let d = i % designs.len();
                // Scalable units of 32 hosts, as the placement bench.
                let body = AgentRegister {
                    join_token: joins[i / 10_000].clone(),
                    name: format!("sim{run}-{i:06}"),
                    topology: designs[d].topology.clone(),
                    virt_type: "kvm".into(),
                    scalable_unit: Some(format!("su-{}", i / 32)),
                    rails: Default::default(),
                    underlay_ip: None,
                    edge_uplink: None,
                    transfer_url: None,
                };
                match register_as(&http, &base, &body, None).await {
                    Ok(r) => out
                        .lock()
                        .await
                        .push((d, AgentClient::sharing(http.clone(), &base, &r.credential))),
                    Err(e) => errors.lock().await.push(e.to_string()),
                }
            }
        });
    }
    while workers.join_next().await.is_some() {}
    let out = std::mem::take(&mut *out.lock().await);
    let errors = std::mem::take(&mut *errors.lock().await);
    Ok((out, errors))
}

/// One simulated host's life: beats, the long poll and its reports,
/// telemetry, until `until`.
#[allow(clippy::too_many_arguments)]
async fn host(
    client: AgentClient,
    design: Arc<Vec<Design>>,
    d: usize,
    args: Arc<FleetArgs>,
    offset: Duration,
    until: Instant,
    seen: Arc<Mutex<Seen>>,
    figures: Arc<Mutex<Figures>>,
) {
    let beats = {
        let (client, design, args, figures) = (
            client.clone(),
            design.clone(),
            args.clone(),
            figures.clone(),
        );
        async move {
            tokio::time::sleep(offset).await;
            let mut tick = tokio::time::interval(args.heartbeat);
            let mut first = true;
            let mut health_at: Option<Instant> = None;
            while Instant::now() < until {
                let due = tick.tick().await.into_std();
                let health = health_at
                    .is_none_or(|t| t.elapsed() >= args.telemetry)
                    .then(|| {
                        health_at = Some(Instant::now());
                        design[d].health.clone()
                    });
                let body = AgentHeartbeat {
                    topology: first.then(|| design[d].topology.clone()),
                    segment_faults: Some(Default::default()),
                    health,
                    storage: Some(StorageCapacity {
                        capacity_gib: 30_000,
                        root_disks_gib: None,
                        free_gib: 30_000,
                    }),
                    ..Default::default()
                };
                let r = client.heartbeat(&body).await;
                first &= r.is_err();
                figures.lock().await.heartbeat.record_result(due, r.is_ok());
            }
        }
    };
    let polls = {
        let (client, seen, figures) = (client.clone(), seen.clone(), figures.clone());
        let last: Arc<Mutex<Option<DesiredState>>> = Arc::default();
        let telemetry = {
            let (client, last, figures, args) =
                (client.clone(), last.clone(), figures.clone(), args.clone());
            async move {
                tokio::time::sleep(offset).await;
                let mut tick = tokio::time::interval(args.telemetry);
                while Instant::now() < until {
                    let due = tick.tick().await.into_std();
                    let report = telemetry_of(last.lock().await.as_ref());
                    if report.vms.is_empty() {
                        continue;
                    }
                    let r = client.telemetry(&report).await;
                    figures.lock().await.telemetry.record_result(due, r.is_ok());
                }
            }
        };
        let poll = async move {
            let mut after = None;
            let mut known: BTreeSet<Uuid> = BTreeSet::new();
            while Instant::now() < until {
                let Ok(desired) = client.desired(after).await else {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                };
                let now = Instant::now();
                if after.is_some_and(|a| desired.revision > a) {
                    figures.lock().await.long_poll_changes += 1;
                }
                after = Some(desired.revision);
                {
                    let mut s = seen.lock().await;
                    for v in &desired.vms {
                        s.delivered.entry(v.id).or_insert(now);
                    }
                }
                let (report, now_known) = converge(&desired, &known);
                if report.vms.is_empty() {
                    *last.lock().await = Some(desired);
                    continue;
                }
                let due = Instant::now();
                let r = client.status(&report).await;
                figures.lock().await.status.record_result(due, r.is_ok());
                if r.is_ok() {
                    known = now_known;
                    let at = Instant::now();
                    let mut s = seen.lock().await;
                    for v in report
                        .vms
                        .iter()
                        .filter(|v| v.state == ActualState::Running)
                    {
                        s.running.entry(v.id).or_insert(at);
                    }
                }
                *last.lock().await = Some(desired);
            }
        };
        async move {
            tokio::join!(telemetry, poll);
        }
    };
    tokio::join!(beats, polls);
}

/// What a host that makes whatever it is asked to reports: each desired
/// VM in its power state, each VM no longer desired gone.
fn converge(d: &DesiredState, known: &BTreeSet<Uuid>) -> (StatusReport, BTreeSet<Uuid>) {
    let desired: BTreeSet<Uuid> = d.vms.iter().map(|v| v.id).collect();
    let mut vms: Vec<VmStatus> = d
        .vms
        .iter()
        .map(|v| VmStatus {
            id: v.id,
            state: match v.power {
                Power::Running => ActualState::Running,
                Power::Stopped => ActualState::Stopped,
                Power::Suspended => ActualState::Suspended,
            },
            reason: None,
            guest: None,
            notice: None,
            mounts: Vec::new(),
        })
        .collect();
    for gone in known
        .difference(&desired)
        .chain(d.remove.iter())
        .chain(d.shelve.iter())
    {
        vms.push(VmStatus {
            id: *gone,
            state: ActualState::Absent,
            reason: None,
            guest: None,
            notice: None,
            mounts: Vec::new(),
        });
    }
    let report = StatusReport {
        vms,
        ..Default::default()
    };
    (report, desired)
}

/// Figures of a busy GPU for each GPU of each running GPU VM.
fn telemetry_of(d: Option<&DesiredState>) -> TelemetryReport {
    let vms = d
        .map(|d| {
            d.vms
                .iter()
                .filter(|v| v.power == Power::Running && !v.placement.gpus.is_empty())
                .map(|v| VmTelemetry {
                    vm: v.id,
                    gpus: v
                        .placement
                        .gpus
                        .iter()
                        .enumerate()
                        .map(|(i, b)| GpuReading {
                            host_bdf: b.to_string(),
                            sample: kumo_topology::gpu_telemetry::GpuSample {
                                bus_id: format!("0000:{:02x}:00.0", i + 1),
                                utilization_pct: Some(87.0),
                                memory_used_mib: Some(61_000),
                                memory_total_mib: Some(81_559),
                                temperature_c: Some(61.0),
                                memory_temperature_c: Some(70.0),
                                power_w: Some(540.0),
                                ecc_uncorrected: Some(0),
                                throttle_reasons: Some(0),
                            },
                        })
                        .collect(),
                    xids: Vec::new(),
                    unknown: None,
                })
                .collect()
        })
        .unwrap_or_default();
    TelemetryReport { vms }
}

/// The server's CPU seconds (user + system) and resident MiB.
fn server_usage(pid: u32) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    // USER_HZ is 100 on Linux.
    Some((ticks / 100.0, rss_kib / 1024.0))
}

/// The servers' CPU seconds and resident MiB together; `None` when there
/// are none or one cannot be read.
fn servers_usage(pids: &[u32]) -> Option<(f64, f64)> {
    if pids.is_empty() {
        return None;
    }
    pids.iter().try_fold((0.0, 0.0), |(cpu, rss), pid| {
        let (c, r) = server_usage(*pid)?;
        Some((cpu + c, rss + r))
    })
}

/// This machine's CPU time so far, busy and all, in USER_HZ ticks over
/// every core (`/proc/stat`'s first line): whether the run had a core to
/// spare, or the server and the simulator queued for them.
fn machine_ticks() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu: Vec<f64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal …
    let idle = cpu.get(3)? + cpu.get(4).unwrap_or(&0.0);
    let all: f64 = cpu.iter().take(8).sum();
    Some((all - idle, all))
}

/// This process's CPU seconds so far.
fn own_cpu_s() -> Option<f64> {
    server_usage(std::process::id()).map(|(cpu, _)| cpu)
}

/// The database's size in MiB: a SQLite file with its WAL, or a
/// PostgreSQL database through `psql`.
fn database_mib(db: &str) -> Option<f64> {
    if db.starts_with("postgres") {
        let out = std::process::Command::new("psql")
            .args([db, "-Atc", "SELECT pg_database_size(current_database())"])
            .output()
            .ok()?;
        let bytes: f64 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
        return Some(bytes / 1048576.0);
    }
    let size = |p: String| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let bytes = size(db.to_owned()) + size(format!("{db}-wal"));
    (bytes > 0).then_some(bytes as f64 / 1048576.0)
}

#[derive(Default)]
struct ApiFigures {
    by_class: HashMap<&'static str, Tally>,
    /// VM → when its create was sent, and when it was answered.
    created: HashMap<Uuid, (Instant, Instant)>,
    refused: u64,
    /// Creates refused as bad requests: the load's own mistake, which
    /// would make it measure less than it says.
    rejected: Vec<String>,
}

/// The second load: VM changes and API reads, open loop.
async fn api_load(
    http: reqwest::Client,
    base: String,
    token: String,
    args: Arc<FleetArgs>,
    until: Instant,
) -> ApiFigures {
    let figures = Arc::new(Mutex::new(ApiFigures::default()));
    // The URLs of VMs this load made that still exist, oldest first,
    // with whether they run.
    let live: Arc<Mutex<std::collections::VecDeque<(String, bool)>>> = Arc::default();
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let change_every = Duration::from_secs_f64(1.0 / args.change_rate.max(0.001));
    let read_every = Duration::from_secs_f64(1.0 / args.read_rate.max(0.001));
    let (mut next_change, mut next_read) = (start, start);
    let mut n = 0u64;
    while Instant::now() < until {
        let due = next_change.min(next_read);
        tokio::time::sleep_until(due.into()).await;
        let vms = format!("{base}/api/v1/tenants/{}/vms", tenant(n));
        let (http, token, figures, live, base) = (
            http.clone(),
            token.clone(),
            figures.clone(),
            live.clone(),
            base.clone(),
        );
        if due == next_read {
            next_read += read_every;
            n += 1;
            tasks.spawn(async move {
                let vm = live.lock().await.front().map(|v| v.0.clone());
                let req = match (n % 3, vm) {
                    (0, Some(vm)) => http.get(vm),
                    (1, _) => http.get(format!("{base}/api/v1/hosts?limit=50")),
                    _ => http.get(format!("{vms}?limit=50")),
                };
                let r = req.bearer_auth(token).send().await;
                figures
                    .lock()
                    .await
                    .by_class
                    .entry("read")
                    .or_default()
                    .record(due, &r);
            });
            continue;
        }
        next_change += change_every;
        n += 1;
        tasks.spawn(async move {
            // Keep a standing population: past 200 live VMs the oldest
            // goes; otherwise create, and now and then stop or start one.
            let count = live.lock().await.len();
            let (class, req, made) = if count > 200 {
                let Some((vm, _)) = live.lock().await.pop_front() else {
                    return;
                };
                ("delete", http.delete(vm), None)
            } else if n.is_multiple_of(20) {
                let name = format!("cl-{n}");
                let body = json!({
                    "name": name, "size": 2, "gpus": 8, "gpu_model": H100,
                    "vcpus": 32, "memory_gib": 128, "service_level": "guaranteed",
                });
                let url = format!("{base}/api/v1/tenants/{}/clusters", tenant(n));
                ("cluster create", http.post(url).json(&body), None)
            } else if n.is_multiple_of(7) && count > 10 {
                let mut l = live.lock().await;
                let Some(v) = l.iter_mut().rev().nth(5) else {
                    return;
                };
                let action = if v.1 { "stop" } else { "start" };
                v.1 = !v.1;
                let url = format!("{}/{action}", v.0);
                ("start/stop", http.post(url), None)
            } else {
                // Names take 3–63 characters: "v1" … "v9" were refused (400).
                let name = format!("vm-{n}");
                let body = json!({
                    "name": name, "gpus": 8, "gpu_model": H100, "vcpus": 32,
                    "memory_gib": 128, "service_level": "guaranteed",
                });
                let url = format!("{vms}/{name}");
                ("vm create", http.post(&vms).json(&body), Some(url))
            };
            let r = req.bearer_auth(token).send().await;
            let answered = Instant::now();
            let mut f = figures.lock().await;
            f.by_class.entry(class).or_default().record(due, &r);
            if let (Some(url), Ok(r)) = (made, r) {
                if r.status().is_success() {
                    if let Ok(v) = r.json::<Value>().await {
                        if let Some(id) = v["id"].as_str().and_then(|s| s.parse().ok()) {
                            f.created.insert(id, (due, answered));
                            live.lock().await.push_back((url, true));
                        }
                    }
                } else if r.status() == 409 {
                    f.refused += 1;
                } else if r.status() == 400 {
                    let status = r.status();
                    let said = r.text().await.unwrap_or_default();
                    f.rejected.push(format!("{status}: {said}"));
                }
            }
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    Arc::try_unwrap(figures)
        .map(Mutex::into_inner)
        .unwrap_or_default()
}

fn quantiles(mut ms: Vec<f64>) -> Value {
    ms.sort_by(f64::total_cmp);
    let n = ms.len();
    let at = |q: f64| {
        if n == 0 {
            Value::Null
        } else {
            let i = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
            json!((ms[i] * 100.0).round() / 100.0)
        }
    };
    json!({ "n": n, "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": at(1.0) })
}

pub async fn run(url: &str, token: &str, args: FleetArgs) -> anyhow::Result<Value> {
    let args = Arc::new(args);
    // One connection pool for every simulated host: each long poll holds
    // a connection, beats and reports take idle ones.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(args.hosts + 256)
        .build()?;
    let base = url.trim_end_matches('/').to_owned();
    // A warm-up that eats the run would leave figures of nothing.
    anyhow::ensure!(
        args.warmup.as_secs_f64() < args.seconds as f64,
        "the warm-up ({} s) must be shorter than the run ({} s)",
        args.warmup.as_secs_f64(),
        args.seconds
    );
    admin_setup(&http, &base, token).await?;
    let designs = Arc::new(designs()?);
    let t = Instant::now();
    let (clients, errors) =
        register_all(&http, &base, token, &designs, args.hosts, args.parallel).await?;
    let registration = t.elapsed();
    anyhow::ensure!(
        clients.len() == args.hosts,
        "only {} of {} hosts registered; first errors: {:?}",
        clients.len(),
        args.hosts,
        errors.iter().take(3).collect::<Vec<_>>()
    );
    let usage_before = servers_usage(&args.server_pids);
    let (machine_before, own_before) = (machine_ticks(), own_cpu_s());
    let db_before = args.database.as_deref().and_then(database_mib);
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let figures: Arc<Mutex<Figures>> = Arc::default();
    let start = Instant::now();
    let until = start + Duration::from_secs(args.seconds);
    let mut hosts = tokio::task::JoinSet::new();
    let spread = args.heartbeat.as_secs_f64() / clients.len().max(1) as f64;
    for (i, (d, c)) in clients.into_iter().enumerate() {
        let offset = Duration::from_secs_f64(spread * i as f64);
        hosts.spawn(host(
            c,
            designs.clone(),
            d,
            args.clone(),
            offset,
            until,
            seen.clone(),
            figures.clone(),
        ));
    }
    // The API load starts once every host has beaten once.
    tokio::time::sleep(args.heartbeat).await;
    let api = api_load(
        http.clone(),
        base.clone(),
        token.to_owned(),
        args.clone(),
        until,
    )
    .await;
    // Long polls end at their next answer (at most 25 s); the figures
    // are in.
    hosts.abort_all();
    let elapsed = start.elapsed();
    let usage_after = servers_usage(&args.server_pids);
    let (machine_after, own_after) = (machine_ticks(), own_cpu_s());
    let db_after = args.database.as_deref().and_then(database_mib);
    let seen = std::mem::take(&mut *seen.lock().await);
    let f = std::mem::take(&mut *figures.lock().await);
    // The steady state: requests due after the warm-up.
    let from = start + args.warmup;
    let steady = elapsed.saturating_sub(args.warmup);
    let to = |at: &HashMap<Uuid, Instant>| -> Vec<f64> {
        api.created
            .iter()
            .filter(|(_, (sent, _))| *sent >= from)
            .filter_map(|(id, (sent, _))| {
                Some(at.get(id)?.duration_since(*sent).as_secs_f64() * 1e3)
            })
            .collect()
    };
    let scheduled: Vec<f64> = api
        .created
        .values()
        .filter(|(sent, _)| *sent >= from)
        .map(|(sent, answered)| answered.duration_since(*sent).as_secs_f64() * 1e3)
        .collect();
    let running = to(&seen.running);
    let ran = running.len();
    let heartbeat_failures = f.heartbeat.failures();
    let hours = elapsed.as_secs_f64() / 3600.0;
    let per_k = args.hosts as f64 / 1000.0;
    let mut by_class = serde_json::Map::new();
    let mut whole_api = serde_json::Map::new();
    for (class, t) in api.by_class {
        by_class.insert(class.into(), t.summary_since(steady, from));
        whole_api.insert(class.into(), t.summary(elapsed));
    }
    let out = json!({
        "hosts": args.hosts,
        "registered": args.hosts,
        "registration_s": (registration.as_secs_f64() * 10.0).round() / 10.0,
        "heartbeat_every_s": args.heartbeat.as_secs_f64(),
        "telemetry_every_s": args.telemetry.as_secs_f64(),
        "seconds": elapsed.as_secs(),
        "warmup_s": args.warmup.as_secs_f64(),
        "api": by_class,
        "vms_created": api.created.len(),
        "creates_refused": api.refused,
        "create_to_scheduled": quantiles(scheduled),
        "create_to_delivered": quantiles(to(&seen.delivered)),
        "create_to_running": quantiles(running),
        "heartbeat": f.heartbeat.summary_since(steady, from),
        "status_report": f.status.summary_since(steady, from),
        "telemetry": f.telemetry.summary_since(steady, from),
        "whole_run": {
            "api": whole_api,
            "heartbeat": f.heartbeat.summary(elapsed),
            "status_report": f.status.summary(elapsed),
            "telemetry": f.telemetry.summary(elapsed),
        },
        "long_poll_answers_with_changes": f.long_poll_changes,
        "server_cpu_s_per_1000_hosts": match (usage_before, usage_after) {
            (Some(b), Some(a)) => json!(((a.0 - b.0) / per_k * 100.0).round() / 100.0),
            _ => Value::Null,
        },
        "server_cpu_share": match (usage_before, usage_after) {
            (Some(b), Some(a)) => json!(((a.0 - b.0) / elapsed.as_secs_f64() * 100.0).round() / 100.0),
            _ => Value::Null,
        },
        // Cores: the machine's busy share of all of them, and the
        // simulator's own use (the server's is above).
        "machine_busy_share": match (machine_before, machine_after) {
            (Some(b), Some(a)) if a.1 > b.1 => json!((((a.0 - b.0) / (a.1 - b.1)) * 100.0).round() / 100.0),
            _ => Value::Null,
        },
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "simulator_cpu_share": match (own_before, own_after) {
            (Some(b), Some(a)) => json!(((a - b) / elapsed.as_secs_f64() * 100.0).round() / 100.0),
            _ => Value::Null,
        },
        "server_rss_mib_per_1000_hosts": usage_after.map(|a| (a.1 / per_k * 10.0).round() / 10.0),
        "database_mib_per_simulated_hour": match (db_before, db_after) {
            (Some(b), Some(a)) => json!(((a - b) / hours * 10.0).round() / 10.0),
            _ => Value::Null,
        },
    });
    anyhow::ensure!(
        api.rejected.is_empty(),
        "{} creates were refused as bad requests (the load's own fault); first: {:?}",
        api.rejected.len(),
        api.rejected.first()
    );
    anyhow::ensure!(
        heartbeat_failures == 0,
        "{heartbeat_failures} heartbeats failed: {out}"
    );
    anyhow::ensure!(ran > 0, "no VM created by the load ever ran: {out}");
    Ok(out)
}
