//! `kumo-load`: an open-loop load generator for a running `kumo-server`.
//!
//! `kumo-load api --url U --token T --rate 500 --seconds 30` sends requests
//! at a fixed rate whatever the server's pace (so a slow server cannot
//! slow the test down and hide its own latency): 80 % reads (a tenant, its
//! VMs, the hosts) and 20 % writes (a tenant, an API token), as an admin.
//! Latency is measured from when a request was due, not when it was sent.
//!
//! `kumo-load fleet --url U --token T --hosts 10000 --seconds 120` runs a
//! simulated fleet on the agent protocol beside a load of VM changes and
//! API reads (see `fleet.rs`).
//!
//! Each prints one JSON object.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use serde_json::{json, Value};
use tokio::sync::Mutex;

mod fleet;

#[derive(Parser)]
struct Cli {
    #[arg(long)]
    url: String,
    /// An administrator's API token.
    #[arg(long)]
    token: String,
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    Api {
        #[arg(long, default_value_t = 500)]
        rate: u32,
        #[arg(long, default_value_t = 30)]
        seconds: u64,
    },
    Fleet {
        #[arg(long, default_value_t = 10_000)]
        hosts: usize,
        /// The agent's default.
        #[arg(long, default_value_t = 5.0)]
        heartbeat_secs: f64,
        /// The agent's default.
        #[arg(long, default_value_t = 15.0)]
        telemetry_secs: f64,
        /// Seconds at the start whose requests the figures leave out (they
        /// are in `whole_run`): every host's first beat carries its
        /// inventory, a burst no steady fleet sends.
        #[arg(long, default_value_t = 0.0)]
        warmup_secs: f64,
        #[arg(long, default_value_t = 120)]
        seconds: u64,
        /// Registrations in flight at once.
        #[arg(long, default_value_t = 32)]
        parallel: usize,
        /// VM changes per second.
        #[arg(long, default_value_t = 20.0)]
        change_rate: f64,
        /// API reads per second.
        #[arg(long, default_value_t = 100.0)]
        read_rate: f64,
        /// The server's process id (its CPU time and memory); repeat it
        /// for replicas, whose figures are then summed.
        #[arg(long)]
        server_pid: Vec<u32>,
        /// The database (a SQLite file or a PostgreSQL URL), for its growth.
        #[arg(long)]
        database: Option<String>,
    },
}

#[derive(Default)]
struct Tally {
    latencies_ms: Vec<f64>,
    /// When each request was due, beside its latency.
    due: Vec<Instant>,
    ok: u64,
    non_2xx: u64,
    errors: u64,
    statuses: std::collections::BTreeMap<u16, u64>,
}

impl Tally {
    fn record_result(&mut self, due: Instant, ok: bool) {
        self.latencies_ms.push(due.elapsed().as_secs_f64() * 1000.0);
        self.due.push(due);
        if ok {
            self.ok += 1;
        } else {
            self.errors += 1;
        }
    }

    fn failures(&self) -> u64 {
        self.non_2xx + self.errors
    }

    fn record(&mut self, due: Instant, r: &Result<reqwest::Response, reqwest::Error>) {
        self.latencies_ms.push(due.elapsed().as_secs_f64() * 1000.0);
        self.due.push(due);
        match r {
            Ok(resp) if resp.status().is_success() => self.ok += 1,
            Ok(resp) => {
                self.non_2xx += 1;
                *self.statuses.entry(resp.status().as_u16()).or_default() += 1;
            }
            Err(_) => self.errors += 1,
        }
    }

    /// The requests due at `from` or later, over `elapsed` (their span);
    /// counts of failures stay those of the whole run.
    fn summary_since(&self, elapsed: Duration, from: Instant) -> Value {
        let mut t = Tally {
            ok: self.ok,
            non_2xx: self.non_2xx,
            errors: self.errors,
            statuses: self.statuses.clone(),
            ..Tally::default()
        };
        for (l, d) in self.latencies_ms.iter().zip(&self.due) {
            if *d >= from {
                t.latencies_ms.push(*l);
            }
        }
        t.summary(elapsed)
    }

    fn summary(mut self, elapsed: Duration) -> Value {
        self.latencies_ms.sort_by(f64::total_cmp);
        let n = self.latencies_ms.len();
        let at = |q: f64| {
            if n == 0 {
                0.0
            } else {
                let i = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
                (self.latencies_ms[i] * 100.0).round() / 100.0
            }
        };
        json!({
            "requests": n,
            "achieved_rate": (n as f64 / elapsed.as_secs_f64()).round(),
            "ok": self.ok,
            "non_2xx": self.non_2xx,
            "non_2xx_by_status": self.statuses,
            "errors": self.errors,
            "p50_ms": at(0.50),
            "p90_ms": at(0.90),
            "p99_ms": at(0.99),
            "max_ms": at(1.0),
        })
    }
}

async fn api(c: &Cli, rate: u32, seconds: u64) -> anyhow::Result<Value> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(256)
        .build()?;
    let base = c.url.trim_end_matches('/').to_owned();
    let tenant = format!("load-{}", std::process::id());
    let r = http
        .post(format!("{base}/api/v1/tenants"))
        .bearer_auth(&c.token)
        .json(&json!({ "name": tenant }))
        .send()
        .await?;
    anyhow::ensure!(
        r.status().is_success(),
        "cannot create {tenant}: {}",
        r.status()
    );
    let tally = Arc::new(Mutex::new(Tally::default()));
    let every = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let start = Instant::now();
    let total = u64::from(rate) * seconds;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..total {
        let due = start + every * i as u32;
        tokio::time::sleep_until(due.into()).await;
        let (http, base, token, tenant, tally) = (
            http.clone(),
            base.clone(),
            c.token.clone(),
            tenant.clone(),
            tally.clone(),
        );
        tasks.spawn(async move {
            let req = match i % 10 {
                0..=3 => http.get(format!("{base}/api/v1/tenants/{tenant}")),
                4 | 5 => http.get(format!("{base}/api/v1/tenants/{tenant}/vms")),
                6 | 7 => http.get(format!("{base}/api/v1/hosts?limit=50")),
                8 => http
                    .post(format!("{base}/api/v1/tenants"))
                    .json(&json!({ "name": format!("{tenant}-{i}") })),
                _ => http
                    .post(format!("{base}/api/v1/tokens"))
                    .json(&json!({ "description": format!("load {i}") })),
            };
            let r = req.bearer_auth(token).send().await;
            tally.lock().await.record(due, &r);
        });
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = start.elapsed();
    let t = std::mem::take(&mut *tally.lock().await);
    let mut out = t.summary(elapsed);
    out["target_rate"] = json!(rate);
    out["mix"] =
        json!("40% tenant, 20% VM list, 20% host list, 10% create tenant, 10% create token");
    Ok(out)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let c = Cli::parse();
    let out = match &c.what {
        What::Api { rate, seconds } => api(&c, *rate, *seconds).await,
        What::Fleet {
            hosts,
            heartbeat_secs,
            telemetry_secs,
            warmup_secs,
            seconds,
            parallel,
            change_rate,
            read_rate,
            server_pid,
            database,
        } => {
            let args = fleet::FleetArgs {
                hosts: *hosts,
                heartbeat: Duration::from_secs_f64(heartbeat_secs.max(0.1)),
                telemetry: Duration::from_secs_f64(telemetry_secs.max(0.1)),
                warmup: Duration::from_secs_f64(warmup_secs.max(0.0)),
                seconds: *seconds,
                parallel: *parallel,
                change_rate: *change_rate,
                read_rate: *read_rate,
                server_pids: server_pid.clone(),
                database: database.clone(),
            };
            fleet::run(&c.url, &c.token, args).await
        }
    };
    match out {
        Ok(v) => {
            println!("{v}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kumo-load: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
