//! The ledger keeps a run's charges as *entries*: consecutive pieces of
//! one run folded together for as long as nothing that reads the ledger
//! could tell them apart. A run that lasts a month is about 30 entries per
//! resource where the minute rating posted 43,200 pieces.
//!
//! What may tell pieces apart, and so cuts an entry:
//! - the rate (a statement line is per rate);
//! - the UTC day (usage is summed by day, statements by month, both by the
//!   day of an entry's start);
//! - a change in the grants in force between two postings. A posting is a
//!   debit at the time it is made (`points::balance`); debits made while
//!   the same grants are in force may be summed into one, because the
//!   balance takes them from the same grants in the same order (and while
//!   anything is owed, every grant in force is empty). A grant made or
//!   expiring between two postings makes the second one start an entry.
//!
//! An entry's amount is the sum of its pieces' amounts, each rounded as
//! the minute rating rounds it, so every total is the minute rating's to
//! the millionth of a point.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;

use crate::meter::Piece;

/// One entry of a run's charges: `[from, to)`, the seconds charged, at one
/// rate, last debited (posted) at `posted_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub seconds: i64,
    pub per_hour: Decimal,
    pub amount: Decimal,
    pub posted_at: DateTime<Utc>,
}

impl Entry {
    fn of(p: &Piece, posted_at: DateTime<Utc>) -> Entry {
        Entry {
            from: p.from,
            to: p.to,
            seconds: p.seconds,
            per_hour: p.per_hour,
            amount: p.amount,
            posted_at,
        }
    }

    /// Whether a piece (or entry) starting at `from`, at `per_hour`, posted
    /// at `posted_at`, continues this entry. `grant_changes`: the times at
    /// which the tenant's grants in force change (grants' start and
    /// expiry), in any order.
    pub fn continues_with(
        &self,
        from: DateTime<Utc>,
        per_hour: Decimal,
        posted_at: DateTime<Utc>,
        grant_changes: &[DateTime<Utc>],
    ) -> bool {
        self.to == from
            && self.per_hour == per_hour
            && self.from.date_naive() == from.date_naive()
            && !grant_changes
                .iter()
                .any(|t| self.posted_at < *t && *t <= posted_at)
    }

    fn absorb(&mut self, to: DateTime<Utc>, seconds: i64, amount: Decimal, at: DateTime<Utc>) {
        self.to = to;
        self.seconds += seconds;
        self.amount += amount;
        self.posted_at = self.posted_at.max(at);
    }
}

/// What posting `pieces` (the run's next ones, in order) at `now` does to
/// its ledger: the run's last entry `open`, grown when the first pieces
/// continue it, and the new entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Posting {
    /// `open` grown, when it was (`None`: left as it was).
    pub grown: Option<Entry>,
    pub new: Vec<Entry>,
}

pub fn post(
    open: Option<&Entry>,
    pieces: &[Piece],
    now: DateTime<Utc>,
    grant_changes: &[DateTime<Utc>],
) -> Posting {
    let mut grown: Option<Entry> = None;
    let mut new: Vec<Entry> = Vec::new();
    for p in pieces {
        if let Some(last) = new.last_mut() {
            if last.continues_with(p.from, p.per_hour, now, grant_changes) {
                last.absorb(p.to, p.seconds, p.amount, now);
                continue;
            }
        } else {
            let current = grown.as_ref().or(open);
            if let Some(e) =
                current.filter(|e| e.continues_with(p.from, p.per_hour, now, grant_changes))
            {
                let mut e = e.clone();
                e.absorb(p.to, p.seconds, p.amount, now);
                grown = Some(e);
                continue;
            }
        }
        new.push(Entry::of(p, now));
    }
    Posting { grown, new }
}

/// A run's stored entries (oldest first) folded where the rules allow:
/// how an old ledger of one row per piece migrates. Answers the groups to
/// merge, each as the indices of its entries (two or more, consecutive)
/// and the entry they become.
pub fn compact(entries: &[Entry], grant_changes: &[DateTime<Utc>]) -> Vec<(Vec<usize>, Entry)> {
    let mut out: Vec<(Vec<usize>, Entry)> = Vec::new();
    let mut current: Option<(Vec<usize>, Entry)> = None;
    for (i, e) in entries.iter().enumerate() {
        match current.as_mut() {
            Some((members, c))
                if c.continues_with(e.from, e.per_hour, e.posted_at, grant_changes) =>
            {
                c.absorb(e.to, e.seconds, e.amount, e.posted_at);
                members.push(i);
            }
            _ => {
                if let Some(done) = current.take().filter(|(m, _)| m.len() > 1) {
                    out.push(done);
                }
                current = Some((vec![i], e.clone()));
            }
        }
    }
    if let Some(done) = current.filter(|(m, _)| m.len() > 1) {
        out.push(done);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use chrono::{Duration, TimeZone};
    use uuid::Uuid;

    use super::*;
    use crate::meter::{due, Run};
    use crate::points::{balance, Debit, Grant};
    use crate::rates::{Price, RateBook, RateCard};
    use crate::statement::{month_bounds, statement, usage, Charge, GroupBy};
    use crate::Level;

    fn d(s: &str) -> Decimal {
        s.parse().unwrap()
    }

    fn t0() -> DateTime<Utc> {
        // Two days before December: runs cross a day and a month.
        Utc.with_ymd_and_hms(2026, 11, 29, 22, 0, 0).unwrap()
    }

    fn book(changes: &[(i64, &str)]) -> RateBook {
        let mut cards = vec![RateCard {
            effective_from: t0(),
            prices: BTreeMap::from([(
                "vcpu".to_owned(),
                Price {
                    guaranteed: d("7.77"),
                    spot: d("2.9"),
                },
            )]),
        }];
        for (at, g) in changes {
            cards.push(RateCard {
                effective_from: t0() + Duration::seconds(*at),
                prices: BTreeMap::from([(
                    "vcpu".to_owned(),
                    Price {
                        guaranteed: d(g),
                        spot: d("1.3"),
                    },
                )]),
            });
        }
        RateBook::new(cards)
    }

    #[test]
    fn a_day_of_minutes_is_one_entry_and_a_rate_change_cuts_it() {
        let b = book(&[(7200 + 30, "9.5")]);
        let run = Run {
            class: "vcpu".into(),
            quantity: d("3"),
            level: Level::Guaranteed,
            start: t0() + Duration::seconds(17),
            end: None,
        };
        // Posted every minute for five hours (into November 30th).
        let mut open: Option<Entry> = None;
        let mut entries: Vec<Entry> = Vec::new();
        let mut posted = None;
        let mut pieces = 0;
        for m in 1..=300 {
            let now = t0() + Duration::minutes(m) + Duration::seconds(3);
            let p = due(&run, posted, now, &b);
            posted = p.last().map(|x| x.to).or(posted);
            pieces += p.len();
            let step = post(open.as_ref(), &p, now, &[]);
            if let Some(g) = step.grown {
                *entries.last_mut().unwrap() = g;
            }
            entries.extend(step.new);
            open = entries.last().cloned();
        }
        // 22:00:17 → 00:00 (the day), 00:00 → 00:00:30 (the rate), then on.
        let cuts: Vec<String> = entries
            .iter()
            .map(|e| e.from.format("%d %H:%M:%S").to_string())
            .collect();
        assert_eq!(cuts, ["29 22:00:17", "30 00:00:00", "30 00:00:30"]);
        assert_eq!(
            pieces,
            1 + 1 + 298 + 1,
            "the minimum, to 22:02, minutes to 03:00, a cut by the rate"
        );
        let seconds: i64 = entries.iter().map(|e| e.seconds).sum();
        assert_eq!(seconds, (posted.unwrap() - run.start).num_seconds());
    }

    #[test]
    fn old_rows_compact_into_the_same_entries() {
        let b = book(&[]);
        let run = Run {
            class: "vcpu".into(),
            quantity: d("1"),
            level: Level::Spot,
            start: t0(),
            end: Some(t0() + Duration::minutes(10)),
        };
        let rows: Vec<Entry> = due(&run, None, t0() + Duration::hours(1), &b)
            .iter()
            .enumerate()
            .map(|(i, p)| Entry::of(p, t0() + Duration::minutes(i as i64 + 1)))
            .collect();
        assert_eq!(rows.len(), 10);
        // A grant expiring at 22:05:30 parts the postings of 22:05 and 22:06.
        let merged = compact(&rows, &[t0() + Duration::seconds(330)]);
        let groups: Vec<Vec<usize>> = merged.iter().map(|(m, _)| m.clone()).collect();
        assert_eq!(groups, [vec![0, 1, 2, 3, 4], vec![5, 6, 7, 8, 9]]);
        let total: Decimal = merged.iter().map(|(_, e)| e.amount).sum();
        assert_eq!(total, rows.iter().map(|r| r.amount).sum::<Decimal>());
        assert_eq!(merged[1].1.posted_at, rows[9].posted_at);
        // Compacting what is compact changes nothing.
        let once: Vec<Entry> = merged.into_iter().map(|(_, e)| e).collect();
        assert!(compact(&once, &[t0() + Duration::seconds(330)]).is_empty());
    }

    fn as_charge(vm: Uuid, run: &Run, e: &Entry) -> Charge {
        Charge {
            vm,
            vm_name: format!("vm-{}", vm.as_u128()),
            class: run.class.clone(),
            level: run.level,
            from: e.from,
            seconds: e.seconds,
            per_hour: e.per_hour,
            amount: e.amount,
        }
    }

    fn debit(e: &Entry) -> Debit {
        Debit {
            amount: e.amount,
            at: e.posted_at,
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Random runs, price changes, grants and posting times across a
        /// month's end: statements, usage by VM, resource and day, and the
        /// balance after every posting read the same from the ledger as
        /// from the minute rating, to the millionth of a point.
        #[test]
        fn the_ledger_reads_as_the_minute_rating_to_the_point(
            runs in proptest::collection::vec((0i64..10_000, 1i64..20_000, proptest::bool::ANY, 1u32..9), 1..5),
            prices in proptest::collection::vec((0i64..30_000, 1u32..2_000), 0..4),
            grants in proptest::collection::vec((0i64..30_000, 1i64..20_000, 1u32..5_000), 0..5),
            gaps in proptest::collection::vec(1i64..400, 1..60),
        ) {
            let prices: Vec<(i64, String)> = prices
                .iter()
                .map(|(at, p)| (*at, format!("{}.{:02}", p / 100, p % 100)))
                .collect();
            let b = book(&prices.iter().map(|(a, p)| (*a, p.as_str())).collect::<Vec<_>>());
            let runs: Vec<(Uuid, Run)> = runs
                .iter()
                .enumerate()
                .map(|(i, (start, length, spot, q))| {
                    let start = t0() + Duration::seconds(*start);
                    (
                        Uuid::from_u128(i as u128 % 3),
                        Run {
                            class: "vcpu".into(),
                            quantity: Decimal::from(*q),
                            level: if *spot { Level::Spot } else { Level::Guaranteed },
                            start,
                            end: (*length < 18_000).then(|| start + Duration::seconds(*length)),
                        },
                    )
                })
                .collect();
            let grants: Vec<Grant> = grants
                .iter()
                .enumerate()
                .map(|(i, (at, life, amount))| Grant {
                    id: Uuid::from_u128(i as u128),
                    amount: Decimal::from(*amount),
                    granted_at: t0() + Duration::seconds(*at),
                    expires_at: t0() + Duration::seconds(at + life),
                })
                .collect();
            let changes: Vec<DateTime<Utc>> = grants
                .iter()
                .flat_map(|g| [g.granted_at, g.expires_at])
                .collect();
            // Postings at uneven times, up to ~33 h in.
            let mut posts = Vec::new();
            let mut now = t0();
            for g in gaps.iter().cycle().take(600) {
                now += Duration::seconds(*g);
                posts.push(now);
            }
            // Every run posted at each time, as the poster does; the
            // balance read after each posting (the budget pass) from the
            // minute rating's debits and from the ledger as it stands then.
            let mut minute: Vec<(Charge, Debit)> = Vec::new();
            let mut ledgers: Vec<Vec<Entry>> = vec![Vec::new(); runs.len()];
            let mut posted: Vec<Option<DateTime<Utc>>> = vec![None; runs.len()];
            let mut pieces = 0;
            for at in &posts {
                for (i, (vm, run)) in runs.iter().enumerate() {
                    let p = due(run, posted[i], *at, &b);
                    posted[i] = p.last().map(|x| x.to).or(posted[i]);
                    pieces += p.len();
                    for piece in &p {
                        let e = Entry::of(piece, *at);
                        minute.push((as_charge(*vm, run, &e), debit(&e)));
                    }
                    let step = post(ledgers[i].last(), &p, *at, &changes);
                    if let Some(g) = step.grown {
                        if let Some(last) = ledgers[i].last_mut() {
                            *last = g;
                        }
                    }
                    ledgers[i].extend(step.new);
                }
                let dm: Vec<Debit> = minute.iter().map(|x| x.1.clone()).collect();
                let dl: Vec<Debit> = ledgers.iter().flatten().map(debit).collect();
                proptest::prop_assert_eq!(balance(&grants, &dm, *at), balance(&grants, &dl, *at), "at {}", at);
            }
            let later = now + Duration::days(30);
            let dm: Vec<Debit> = minute.iter().map(|x| x.1.clone()).collect();
            let dl: Vec<Debit> = ledgers.iter().flatten().map(debit).collect();
            proptest::prop_assert_eq!(balance(&grants, &dm, later), balance(&grants, &dl, later));
            let rows: usize = ledgers.iter().map(Vec::len).sum();
            proptest::prop_assert!(rows <= pieces);
            let minute: Vec<Charge> = minute.into_iter().map(|x| x.0).collect();
            let ledger: Vec<Charge> = runs
                .iter()
                .zip(&ledgers)
                .flat_map(|((vm, run), es)| es.iter().map(|e| as_charge(*vm, run, e)))
                .collect();
            for (y, m) in [(2026, 11), (2026, 12)] {
                proptest::prop_assert!(month_bounds(y, m).is_some());
                proptest::prop_assert_eq!(statement("t", y, m, &minute), statement("t", y, m, &ledger));
            }
            for by in [GroupBy::Vm, GroupBy::Resource, GroupBy::Day] {
                proptest::prop_assert_eq!(usage(&minute, by), usage(&ledger, by));
            }
        }
    }
}
