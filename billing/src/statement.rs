//! A tenant's monthly statement from its posted charges: one line per VM,
//! resource, price level and rate, in whole seconds, with the total the
//! exact sum of the lines (and so of the charges).

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, TimeZone, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::Level;

/// A posted charge, as the ledger keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    pub vm: Uuid,
    pub vm_name: String,
    pub class: String,
    pub level: Level,
    pub from: DateTime<Utc>,
    pub seconds: i64,
    pub per_hour: Decimal,
    pub amount: Decimal,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    pub vm: String,
    pub resource: String,
    pub service_level: Level,
    pub seconds: i64,
    pub rate_per_hour: Decimal,
    pub amount: Decimal,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Statement {
    pub tenant: String,
    /// `2026-11`.
    pub month: String,
    pub lines: Vec<Line>,
    pub total: Decimal,
}

/// `[first instant, first instant of the next month)`, or `None` for a
/// month that does not exist.
pub fn month_bounds(year: i32, month: u32) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let start = Utc.with_ymd_and_hms(year, month, 1, 0, 0, 0).single()?;
    let (ny, nm) = if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    };
    let end = Utc.with_ymd_and_hms(ny, nm, 1, 0, 0, 0).single()?;
    Some((start, end))
}

/// `"2026-11"` → `(2026, 11)`.
pub fn parse_month(s: &str) -> Option<(i32, u32)> {
    let (y, m) = s.split_once('-')?;
    if y.len() != 4 || m.len() != 2 {
        return None;
    }
    let (y, m) = (y.parse().ok()?, m.parse().ok()?);
    month_bounds(y, m).map(|_| (y, m))
}

/// The statement of `tenant` for the month of `start` from the charges
/// whose piece begins in it (pieces never straddle a month).
pub fn statement(tenant: &str, year: i32, month: u32, charges: &[Charge]) -> Statement {
    let bounds = month_bounds(year, month);
    type Key = (String, Uuid, String, Level, Decimal);
    let mut lines: BTreeMap<Key, (i64, Decimal)> = BTreeMap::new();
    for c in charges {
        if !bounds.is_some_and(|(s, e)| s <= c.from && c.from < e) {
            continue;
        }
        let e = lines
            .entry((
                c.vm_name.clone(),
                c.vm,
                c.class.clone(),
                c.level,
                c.per_hour,
            ))
            .or_default();
        e.0 += c.seconds;
        e.1 += c.amount;
    }
    let lines: Vec<Line> = lines
        .into_iter()
        .map(|((vm, _, class, level, rate), (seconds, amount))| Line {
            vm,
            resource: class,
            service_level: level,
            seconds,
            rate_per_hour: rate.normalize(),
            amount: amount.normalize(),
        })
        .collect();
    let total = lines.iter().map(|l| l.amount).sum::<Decimal>().normalize();
    Statement {
        tenant: tenant.to_owned(),
        month: format!("{year:04}-{month:02}"),
        lines,
        total,
    }
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// The statement as CSV: a header, a row per line, and a total row.
pub fn to_csv(s: &Statement) -> String {
    let mut out = String::from("vm,resource,service_level,seconds,rate_per_hour,amount\n");
    for l in &s.lines {
        out.push_str(&format!(
            "{},{},{},{},{},{}\n",
            csv_field(&l.vm),
            csv_field(&l.resource),
            l.service_level.as_str(),
            l.seconds,
            l.rate_per_hour,
            l.amount
        ));
    }
    out.push_str(&format!("total,,,,,{}\n", s.total));
    out
}

/// How usage is summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    Vm,
    Resource,
    Day,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    /// The VM's name, the resource class, or the UTC day (`2026-11-30`).
    pub key: String,
    pub seconds: i64,
    pub amount: Decimal,
}

/// Charges summed by VM, resource or UTC day of their piece's start,
/// sorted by key.
pub fn usage(charges: &[Charge], by: GroupBy) -> Vec<UsageRow> {
    let mut rows: BTreeMap<String, (i64, Decimal)> = BTreeMap::new();
    for c in charges {
        let key = match by {
            GroupBy::Vm => c.vm_name.clone(),
            GroupBy::Resource => c.class.clone(),
            GroupBy::Day => c.from.format("%Y-%m-%d").to_string(),
        };
        let e = rows.entry(key).or_default();
        e.0 += c.seconds;
        e.1 += c.amount;
    }
    rows.into_iter()
        .map(|(key, (seconds, amount))| UsageRow {
            key,
            seconds,
            amount: amount.normalize(),
        })
        .collect()
}

/// Today's month, for defaults.
pub fn month_of(t: DateTime<Utc>) -> (i32, u32) {
    (t.year(), t.month())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn c(
        vm: &str,
        class: &str,
        from: DateTime<Utc>,
        seconds: i64,
        rate: &str,
        amount: &str,
    ) -> Charge {
        Charge {
            vm: Uuid::from_u128(vm.len() as u128),
            vm_name: vm.into(),
            class: class.into(),
            level: Level::Guaranteed,
            from,
            seconds,
            per_hour: rate.parse().unwrap(),
            amount: amount.parse().unwrap(),
        }
    }

    #[test]
    fn lines_group_charges_and_the_total_is_their_sum() {
        let nov = |d, h| Utc.with_ymd_and_hms(2026, 11, d, h, 0, 0).unwrap();
        let charges = [
            c("train", "gpu:H100", nov(1, 0), 60, "400", "6.666667"),
            c("train", "gpu:H100", nov(1, 1), 30, "400", "3.333333"),
            c("train", "gpu:H100", nov(2, 0), 60, "500", "8.333333"),
            c("web, front", "vcpu", nov(3, 0), 60, "1.5", "0.025"),
            // December: not in November's statement.
            c(
                "train",
                "gpu:H100",
                Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap(),
                60,
                "500",
                "8.333333",
            ),
        ];
        let s = statement("lab", 2026, 11, &charges);
        assert_eq!(s.month, "2026-11");
        assert_eq!(s.lines.len(), 3);
        assert_eq!(
            (s.lines[0].seconds, s.lines[0].amount.to_string().as_str()),
            (90, "10")
        );
        assert_eq!(s.total, "18.358333".parse::<Decimal>().unwrap());
        assert_eq!(s.total, s.lines.iter().map(|l| l.amount).sum::<Decimal>());
        let csv = to_csv(&s);
        assert!(
            csv.contains("\"web, front\",vcpu,guaranteed,60,1.5,0.025\n"),
            "{csv}"
        );
        assert!(csv.ends_with("total,,,,,18.358333\n"), "{csv}");
    }

    #[test]
    fn usage_sums_by_vm_resource_or_day() {
        let at = |d, h| Utc.with_ymd_and_hms(2026, 11, d, h, 0, 0).unwrap();
        let charges = [
            c("a", "vcpu", at(1, 0), 60, "1", "1"),
            c("a", "gpu:H100", at(1, 23), 60, "1", "2"),
            c("bb", "vcpu", at(2, 0), 30, "1", "0.5"),
        ];
        let by = |g| {
            usage(&charges, g)
                .into_iter()
                .map(|r| (r.key, r.seconds, r.amount.to_string()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            by(GroupBy::Vm),
            [
                ("a".into(), 120, "3".into()),
                ("bb".into(), 30, "0.5".into())
            ]
        );
        assert_eq!(by(GroupBy::Resource)[1], ("vcpu".into(), 90, "1.5".into()));
        assert_eq!(
            by(GroupBy::Day),
            [
                ("2026-11-01".into(), 120, "3".into()),
                ("2026-11-02".into(), 30, "0.5".into())
            ]
        );
    }

    #[test]
    fn months_parse_strictly() {
        assert_eq!(parse_month("2026-02"), Some((2026, 2)));
        for bad in ["2026-13", "2026-2", "26-02", "2026/02", ""] {
            assert_eq!(parse_month(bad), None, "{bad}");
        }
        let (s, e) = month_bounds(2026, 12).unwrap();
        assert_eq!((e - s).num_days(), 31);
    }
}
