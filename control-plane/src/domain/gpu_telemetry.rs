//! GPU figures from inside guests, rolled up: readings fold into one
//! [`Minute`] per VM and GPU; minutes fold into the API's points of any
//! step. Unknown values stay unknown (a GPU that cannot say how busy it is
//! never reads as idle).

use chrono::{DateTime, Duration, DurationRound, Utc};
use kumo_api_types::GpuPoint;
use kumo_topology::gpu_telemetry::{throttle_reason_names, GpuSample};

/// How long figures are kept (by the minute for `[telemetry]
/// minutes_days`, by the hour after that).
pub const RETENTION_DAYS: i64 = 30;
/// The most points a series has unless a step is asked for.
pub const MAX_POINTS: i64 = 1440;

/// One VM's GPU over one minute: sums and extremes of its readings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Minute {
    pub samples: u32,
    pub util_n: u32,
    pub util_sum: Option<f64>,
    pub util_max: Option<f64>,
    pub mem_used_max: Option<u64>,
    pub mem_total: Option<u64>,
    pub temp_max: Option<f64>,
    pub power_n: u32,
    pub power_sum: Option<f64>,
    pub ecc_max: Option<u64>,
    pub throttle: Option<u64>,
}

fn add(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    }
}

fn max<T: PartialOrd + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b > a { b } else { a }),
        (a, b) => a.or(b),
    }
}

impl Minute {
    /// The minute with one more reading.
    pub fn with(&self, s: &GpuSample) -> Minute {
        Minute {
            samples: self.samples + 1,
            util_n: self.util_n + u32::from(s.utilization_pct.is_some()),
            util_sum: add(self.util_sum, s.utilization_pct),
            util_max: max(self.util_max, s.utilization_pct),
            mem_used_max: max(self.mem_used_max, s.memory_used_mib),
            mem_total: s.memory_total_mib.or(self.mem_total),
            temp_max: max(self.temp_max, s.temperature_c),
            power_n: self.power_n + u32::from(s.power_w.is_some()),
            power_sum: add(self.power_sum, s.power_w),
            ecc_max: max(self.ecc_max, s.ecc_uncorrected),
            throttle: match (self.throttle, s.throttle_reasons) {
                (Some(a), Some(b)) => Some(a | b),
                (a, b) => a.or(b),
            },
        }
    }

    /// Two minutes (or steps) as one.
    pub fn merge(&self, o: &Minute) -> Minute {
        Minute {
            samples: self.samples + o.samples,
            util_n: self.util_n + o.util_n,
            util_sum: add(self.util_sum, o.util_sum),
            util_max: max(self.util_max, o.util_max),
            mem_used_max: max(self.mem_used_max, o.mem_used_max),
            mem_total: o.mem_total.or(self.mem_total),
            temp_max: max(self.temp_max, o.temp_max),
            power_n: self.power_n + o.power_n,
            power_sum: add(self.power_sum, o.power_sum),
            ecc_max: max(self.ecc_max, o.ecc_max),
            throttle: match (self.throttle, o.throttle) {
                (Some(a), Some(b)) => Some(a | b),
                (a, b) => a.or(b),
            },
        }
    }

    /// Mean utilisation, where any reading had one.
    pub fn utilization(&self) -> Option<f64> {
        self.util_sum
            .filter(|_| self.util_n > 0)
            .map(|s| s / f64::from(self.util_n))
    }

    pub fn point(&self, at: DateTime<Utc>) -> GpuPoint {
        GpuPoint {
            at,
            samples: self.samples,
            utilization_pct: self.utilization(),
            utilization_max_pct: self.util_max,
            memory_used_mib: self.mem_used_max,
            memory_total_mib: self.mem_total,
            temperature_c: self.temp_max,
            power_w: self
                .power_sum
                .filter(|_| self.power_n > 0)
                .map(|s| s / f64::from(self.power_n)),
            ecc_uncorrected: self.ecc_max,
            throttle_reasons: self
                .throttle
                .map(|t| {
                    throttle_reason_names(t)
                        .into_iter()
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

/// The hour a moment falls in.
pub fn hour_of(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(Duration::hours(1)).unwrap_or(t)
}

/// The minute a moment falls in.
pub fn minute_of(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(Duration::minutes(1)).unwrap_or(t)
}

/// The window and step of a metrics query: `to` defaults to now, `from`
/// to a day before it, and is never more than the retention back (then
/// rounded down to a whole step); the step keeps the points at
/// [`MAX_POINTS`] unless one is asked for.
pub fn window(
    now: DateTime<Utc>,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    step: Option<u32>,
) -> Result<(DateTime<Utc>, DateTime<Utc>, u32), String> {
    let to = to.unwrap_or(now);
    let from = from.unwrap_or(to - Duration::hours(24));
    if from >= to {
        return Err("`from` must be before `to`".into());
    }
    let oldest = now - Duration::days(RETENTION_DAYS);
    let from = from.max(oldest);
    if from >= to {
        return Err(format!("figures are kept {RETENTION_DAYS} days"));
    }
    let minutes = (to - from).num_minutes().max(1);
    let step = match step {
        Some(s) if (1..=1440).contains(&s) => s,
        Some(_) => return Err("`step_minutes` is 1 to 1440".into()),
        None => u32::try_from(((minutes + MAX_POINTS - 1) / MAX_POINTS).max(1)).unwrap_or(1440),
    };
    // Steps start at multiples of the step since the epoch, so that a
    // chart's points stay put as its window moves.
    let from = from
        .duration_trunc(Duration::minutes(i64::from(step)))
        .unwrap_or(from);
    Ok((from, to, step))
}

/// Minutes (in time order or not) folded into steps of `step` minutes
/// from `from`; steps without a reading are left out.
pub fn points(
    minutes: &[(DateTime<Utc>, Minute)],
    from: DateTime<Utc>,
    step: u32,
) -> Vec<GpuPoint> {
    let mut steps: std::collections::BTreeMap<i64, Minute> = Default::default();
    for (at, m) in minutes {
        let i = (*at - from)
            .num_minutes()
            .div_euclid(i64::from(step.max(1)));
        let e = steps.entry(i).or_default();
        *e = e.merge(m);
    }
    steps
        .into_iter()
        .map(|(i, m)| m.point(from + Duration::minutes(i * i64::from(step))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(util: Option<f64>, mem: u64, throttle: u64) -> GpuSample {
        GpuSample {
            bus_id: "0000:11:00.0".into(),
            utilization_pct: util,
            memory_used_mib: Some(mem),
            memory_total_mib: Some(81559),
            temperature_c: Some(40.0),
            memory_temperature_c: None,
            power_w: Some(100.0),
            ecc_uncorrected: Some(0),
            throttle_reasons: Some(throttle),
        }
    }

    #[test]
    fn readings_fold_into_minutes_and_unknown_stays_unknown() {
        let m = Minute::default()
            .with(&sample(Some(90.0), 1000, 0x4))
            .with(&sample(None, 3000, 0x1))
            .with(&sample(Some(30.0), 2000, 0));
        assert_eq!(m.samples, 3);
        assert_eq!(
            m.utilization(),
            Some(60.0),
            "the unknown reading is not a zero"
        );
        let p = m.point(DateTime::from_timestamp(0, 0).unwrap());
        assert_eq!(p.utilization_max_pct, Some(90.0));
        assert_eq!(p.memory_used_mib, Some(3000));
        assert_eq!(p.power_w, Some(100.0));
        assert_eq!(p.throttle_reasons, vec!["gpu_idle", "sw_power_cap"]);
        let unknown = Minute::default().with(&sample(None, 0, 0));
        assert_eq!(unknown.utilization(), None);
    }

    #[test]
    fn minutes_fold_into_steps_and_windows_are_bounded() {
        let t0 = DateTime::from_timestamp(1_900_000_020, 0).unwrap();
        let now = t0 + Duration::hours(1);
        let (from, to, step) = window(now, Some(t0), None, None).unwrap();
        assert_eq!((from, to, step), (minute_of(t0), now, 1));
        let (_, _, step) = window(now, None, None, None).unwrap();
        assert_eq!(step, 1, "a day is 1440 minutes");
        let (from, _, step) = window(now, Some(now - Duration::days(90)), None, None).unwrap();
        assert_eq!(step, 30);
        let oldest = now - Duration::days(30);
        assert!(
            from <= oldest && oldest - from < Duration::minutes(30),
            "kept 30 days: {from}"
        );
        assert_eq!(from.timestamp() % 1800, 0, "steps start on whole steps");
        assert!(window(now, Some(now), Some(now), None).is_err());
        assert!(window(now, None, None, Some(0)).is_err());
        let m = |u: f64| Minute::default().with(&sample(Some(u), 1, 0));
        let from = minute_of(t0);
        let rows = vec![
            (from + Duration::minutes(4), m(40.0)),
            (from, m(10.0)),
            (from + Duration::minutes(1), m(30.0)),
        ];
        let p = points(&rows, from, 2);
        assert_eq!(p.len(), 2, "the empty step is left out");
        assert_eq!(p[0].at, from);
        assert_eq!(p[0].utilization_pct, Some(20.0));
        assert_eq!(p[1].at, from + Duration::minutes(4));
        assert_eq!(p[1].samples, 1);
    }
}
