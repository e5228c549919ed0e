//! `kumo-server bench billing`: a month of synthetic lifecycle events for
//! many tenants, each VM starting and stopping in sessions, rated into
//! the same canonical pieces the poster writes, and every tenant's
//! statement built from them. Streams tenant by tenant (pieces are summed
//! into statement lines as they come), as the statements query would.

use std::collections::BTreeMap;
use std::time::Instant;

use chrono::{Duration, TimeZone, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rust_decimal::Decimal;
use serde::Serialize;
use uuid::Uuid;

use crate::ledger;
use crate::meter::{due, Run};
use crate::rates::{Price, RateBook, RateCard};
use crate::statement::{statement, Charge};
use crate::Level;

#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub tenants: usize,
    pub vms_per_tenant: usize,
    pub days: u32,
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub tenants: usize,
    pub vms: usize,
    pub days: u32,
    /// Start and stop events of the month.
    pub lifecycle_events: u64,
    /// Runs (a resource of a VM from a start to a stop).
    pub runs: u64,
    /// Charge pieces rated (what the minute rating wrote, a row each).
    pub pieces: u64,
    /// Ledger entries the pieces fold into (what the poster writes now).
    pub ledger_rows: u64,
    /// `ledger_rows / pieces`.
    pub ledger_ratio: f64,
    pub rating_s: f64,
    pub events_rated_per_s: f64,
    pub pieces_per_s: f64,
    /// Building every tenant's statement from its pieces.
    pub statements_s: f64,
    pub statement_lines: u64,
    /// Sum of every statement (a checksum across runs).
    pub grand_total: String,
}

fn price(g: &str, s: &str) -> Price {
    Price {
        guaranteed: g.parse().unwrap_or_default(),
        spot: s.parse().unwrap_or_default(),
    }
}

pub fn run(cfg: &BenchConfig) -> Report {
    let start = Utc
        .with_ymd_and_hms(2026, 10, 1, 0, 0, 0)
        .single()
        .unwrap_or_default();
    let end = start + Duration::days(i64::from(cfg.days));
    // A card, and a price change mid-month.
    let card = |at, k: &str| RateCard {
        effective_from: at,
        prices: BTreeMap::from([
            ("gpu:H100-SXM5-80GB".to_owned(), price(k, "120")),
            ("vcpu".to_owned(), price("2", "0.6")),
            ("memory_gib".to_owned(), price("0.2", "0.06")),
            ("disk_gib".to_owned(), price("0.01", "0.01")),
        ]),
    };
    let book = RateBook::new(vec![
        card(start, "400"),
        card(start + Duration::days(i64::from(cfg.days / 2)), "380"),
    ]);
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let (mut events, mut runs, mut pieces, mut lines) = (0u64, 0u64, 0u64, 0u64);
    let mut ledger_rows = 0u64;
    let mut rating = std::time::Duration::ZERO;
    let mut building = std::time::Duration::ZERO;
    let mut grand = Decimal::ZERO;
    for _ in 0..cfg.tenants {
        let mut charges: Vec<Charge> = Vec::new();
        for v in 0..cfg.vms_per_tenant {
            let vm = Uuid::from_u128(rng.gen());
            let gpus = [0u32, 1, 2, 4, 8][rng.gen_range(0..5)];
            let level = if rng.gen_bool(0.3) {
                Level::Spot
            } else {
                Level::Guaranteed
            };
            let mut resources = vec![
                ("vcpu".to_owned(), Decimal::from(8 * gpus.max(1))),
                ("memory_gib".to_owned(), Decimal::from(48 * gpus.max(1))),
            ];
            if gpus > 0 {
                resources.push(("gpu:H100-SXM5-80GB".to_owned(), Decimal::from(gpus)));
            }
            // Sessions: up to 10 h on, up to 14 h off.
            let mut sessions = Vec::new();
            let mut t = start + Duration::minutes(rng.gen_range(0..600));
            while t < end {
                let on = Duration::seconds(rng.gen_range(30..36_000));
                sessions.push((t, (t + on).min(end)));
                t = t + on + Duration::seconds(rng.gen_range(60..50_400));
            }
            let began = Instant::now();
            let mut all_runs: Vec<Run> = vec![Run {
                class: "disk_gib".into(),
                quantity: Decimal::from(100),
                level,
                start,
                end: Some(end),
            }];
            for (a, b) in &sessions {
                events += 2;
                for (class, quantity) in &resources {
                    all_runs.push(Run {
                        class: class.clone(),
                        quantity: *quantity,
                        level,
                        start: *a,
                        end: Some(*b),
                    });
                }
            }
            for r in &all_runs {
                runs += 1;
                let rated = due(r, None, end, &book);
                // Posted at once: with no grant changing (none here), the
                // entries are the same however often the poster runs.
                ledger_rows += ledger::post(None, &rated, end, &[]).new.len() as u64;
                for p in rated {
                    pieces += 1;
                    charges.push(Charge {
                        vm,
                        vm_name: format!("vm-{v}"),
                        class: r.class.clone(),
                        level: r.level,
                        from: p.from,
                        seconds: p.seconds,
                        per_hour: p.per_hour,
                        amount: p.amount,
                    });
                }
            }
            rating += began.elapsed();
        }
        let began = Instant::now();
        let s = statement("t", 2026, 10, &charges);
        building += began.elapsed();
        lines += s.lines.len() as u64;
        grand += s.total;
    }
    let rating_s = rating.as_secs_f64();
    Report {
        tenants: cfg.tenants,
        vms: cfg.tenants * cfg.vms_per_tenant,
        days: cfg.days,
        lifecycle_events: events,
        runs,
        pieces,
        ledger_rows,
        ledger_ratio: ledger_rows as f64 / (pieces.max(1) as f64),
        rating_s,
        events_rated_per_s: events as f64 / rating_s.max(1e-9),
        pieces_per_s: pieces as f64 / rating_s.max(1e-9),
        statements_s: building.as_secs_f64(),
        statement_lines: lines,
        grand_total: grand.normalize().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_month_rates_and_reconciles() {
        let r = run(&BenchConfig {
            tenants: 2,
            vms_per_tenant: 3,
            days: 2,
            seed: 7,
        });
        assert_eq!(r.vms, 6);
        assert!(r.lifecycle_events > 0 && r.pieces > r.runs);
        assert!(
            r.ledger_rows >= r.runs && r.ledger_rows * 20 < r.pieces,
            "{r:?}"
        );
        // Deterministic for a seed.
        let again = run(&BenchConfig {
            tenants: 2,
            vms_per_tenant: 3,
            days: 2,
            seed: 7,
        });
        assert_eq!(r.grand_total, again.grand_total);
        assert_eq!(r.pieces, again.pieces);
    }
}
