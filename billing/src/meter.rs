//! Metered runs and what of them is still to be charged. A run is one
//! resource of one VM at one price level: its compute from the moment it
//! runs until it stops, or its disk from creation until deletion.
//!
//! The first charge of a run is its minimum: `[start, start + 60 s)`
//! billed as 60 seconds at the price in force at the start, posted at
//! once, whatever the run's length. After that, per second, in pieces cut
//! at every UTC minute (so at every month's start), at every rate change,
//! and at the run's end, each posted once it is complete. A piece is identified by its run and its `from`,
//! so posting the same piece twice (a restart, a second replica) is a
//! unique-key conflict, never a second charge.

use chrono::{DateTime, Duration, DurationRound, Utc};
use rust_decimal::Decimal;

use crate::rates::{Class, RateBook};
use crate::{charge, Level};

pub const MINIMUM_SECONDS: i64 = 60;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub class: Class,
    pub quantity: Decimal,
    pub level: Level,
    pub start: DateTime<Utc>,
    /// `None` while it lasts.
    pub end: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// Seconds charged: the piece's length, or the minimum for the first.
    pub seconds: i64,
    pub per_hour: Decimal,
    pub amount: Decimal,
}

fn piece(
    run: &Run,
    book: &RateBook,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    seconds: i64,
) -> Piece {
    let per_hour = book.price(from, &run.class, run.level);
    Piece {
        from,
        to,
        seconds,
        per_hour,
        amount: charge(per_hour, run.quantity, seconds),
    }
}

/// The pieces of `run` after `posted_until` (`None`: nothing posted yet)
/// up to `now`. Posting them moves `posted_until` to the last one's `to`.
pub fn due(
    run: &Run,
    posted_until: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    book: &RateBook,
) -> Vec<Piece> {
    let mut out = Vec::new();
    if now < run.start {
        return out;
    }
    let minimum_end = run.start + Duration::seconds(MINIMUM_SECONDS);
    let mut from = match posted_until {
        None => {
            out.push(piece(run, book, run.start, minimum_end, MINIMUM_SECONDS));
            minimum_end
        }
        Some(p) => p.max(minimum_end),
    };
    // Pieces end only at canonical cuts, and only once complete, so how
    // often charges are posted changes neither the pieces nor their sum.
    loop {
        let next_minute =
            from.duration_trunc(Duration::minutes(1)).unwrap_or(from) + Duration::minutes(1);
        let end = run.end.map_or(next_minute, |e| e.min(next_minute));
        let to = book.changes_within(from, end).min().unwrap_or(end);
        if to <= from || to > now {
            break;
        }
        out.push(piece(run, book, from, to, (to - from).num_seconds()));
        from = to;
    }
    out
}

/// Whether a run has been charged in full.
pub fn settled(run: &Run, posted_until: Option<DateTime<Utc>>) -> bool {
    matches!((run.end, posted_until), (Some(end), Some(p)) if p >= end)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use chrono::TimeZone;

    use super::*;
    use crate::rates::{Price, RateCard};

    fn t(h: u32, m: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, h, m, s).unwrap()
    }

    fn d(s: &str) -> Decimal {
        s.parse().unwrap()
    }

    fn book(cards: &[(DateTime<Utc>, &str, &str)]) -> RateBook {
        RateBook::new(
            cards
                .iter()
                .map(|(at, g, s)| RateCard {
                    effective_from: *at,
                    prices: BTreeMap::from([(
                        "vcpu".to_owned(),
                        Price {
                            guaranteed: d(g),
                            spot: d(s),
                        },
                    )]),
                })
                .collect(),
        )
    }

    fn run(level: Level, start: DateTime<Utc>, end: Option<DateTime<Utc>>) -> Run {
        Run {
            class: "vcpu".into(),
            quantity: d("2"),
            level,
            start,
            end,
        }
    }

    fn total(p: &[Piece]) -> Decimal {
        p.iter().map(|x| x.amount).sum()
    }

    #[test]
    fn a_short_run_pays_the_minute_and_a_long_one_per_second() {
        let b = book(&[(t(0, 0, 0), "3600", "1800")]);
        // 10 s: billed 60 s, 2 vCPUs at 1/s each.
        let short = run(Level::Guaranteed, t(9, 0, 30), Some(t(9, 0, 40)));
        let p = due(&short, None, t(10, 0, 0), &b);
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].seconds, p[0].amount), (60, d("120")));
        // Nothing more, ever.
        assert!(due(&short, Some(p[0].to), t(11, 0, 0), &b).is_empty());
        assert!(settled(&short, Some(p[0].to)));
        assert!(!settled(&short, None));
        // 150 s at the spot price: 60 + 30 (to the minute) + 60 s.
        let long = run(Level::Spot, t(9, 0, 30), Some(t(9, 3, 0)));
        let p = due(&long, None, t(10, 0, 0), &b);
        let secs: Vec<i64> = p.iter().map(|x| x.seconds).collect();
        assert_eq!(secs, [60, 30, 60]);
        assert_eq!(total(&p), d("150"), "150 s × 2 vCPUs × 0.5");
    }

    #[test]
    fn posting_in_steps_charges_what_posting_once_does() {
        let b = book(&[(t(0, 0, 0), "100", "40")]);
        let r = run(Level::Guaranteed, t(9, 0, 7), None);
        let once = due(&r, None, t(9, 7, 13), &b);
        let mut steps = Vec::new();
        let mut posted = None;
        for now in [t(9, 0, 8), t(9, 1, 0), t(9, 1, 1), t(9, 5, 59), t(9, 7, 13)] {
            let p = due(&r, posted, now, &b);
            posted = p.last().map(|x| x.to).or(posted);
            steps.extend(p);
        }
        assert_eq!(steps, once);
        // The minimum, then whole minutes up to 9:07:00 (9:07:13 is not over).
        let seconds: i64 = steps.iter().map(|x| x.seconds).sum();
        assert_eq!(seconds, 60 + 53 + 5 * 60, "{steps:?}");
    }

    #[test]
    fn a_rate_change_mid_run_applies_from_its_time_only() {
        let b = book(&[(t(0, 0, 0), "3600", "0"), (t(9, 2, 15), "7200", "0")]);
        let r = run(Level::Guaranteed, t(9, 0, 0), Some(t(9, 4, 0)));
        let p = due(&r, None, t(9, 10, 0), &b);
        let cuts: Vec<(String, i64, Decimal)> = p
            .iter()
            .map(|x| (x.from.format("%M:%S").to_string(), x.seconds, x.per_hour))
            .collect();
        assert_eq!(
            cuts,
            [
                ("00:00".to_owned(), 60, d("3600")),
                ("01:00".to_owned(), 60, d("3600")),
                ("02:00".to_owned(), 15, d("3600")),
                ("02:15".to_owned(), 45, d("7200")),
                ("03:00".to_owned(), 60, d("7200")),
            ]
        );
        assert_eq!(total(&p), d("2") * d("135") + d("4") * d("105"));
    }

    #[test]
    fn pieces_never_straddle_a_month() {
        let b = book(&[(t(0, 0, 0), "1", "1")]);
        let r = run(Level::Spot, t(23, 58, 30), None);
        let next = Utc.with_ymd_and_hms(2026, 12, 1, 0, 1, 0).unwrap();
        let p = due(&r, None, next, &b);
        assert!(p
            .iter()
            .any(|x| x.from == Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap()));
        assert!(p
            .iter()
            .skip(1)
            .all(|x| x.from.date_naive() == (x.to - Duration::seconds(1)).date_naive()));
    }

    proptest::proptest! {
        /// A finished run is charged max(60 s, its length) whatever the
        /// posting schedule, in the same pieces.
        #[test]
        fn any_schedule_charges_the_same_pieces(
            start in 0i64..7200, length in 1i64..7200,
            change in 0i64..14400, steps in proptest::collection::vec(1i64..900, 1..40),
        ) {
            let t0 = t(0, 0, 0);
            let b = book(&[(t0, "3600", "900"), (t0 + Duration::seconds(change), "1800", "450")]);
            let r = run(Level::Spot, t0 + Duration::seconds(start), Some(t0 + Duration::seconds(start + length)));
            let after = t0 + Duration::seconds(30_000);
            let once = due(&r, None, after, &b);
            let mut now = r.start;
            let mut posted = None;
            let mut stepped = Vec::new();
            for s in steps.iter().cycle().take(200) {
                now += Duration::seconds(*s);
                let p = due(&r, posted, now.min(after), &b);
                posted = p.last().map(|x| x.to).or(posted);
                stepped.extend(p);
            }
            stepped.extend(due(&r, posted, after, &b));
            posted = stepped.last().map(|x| x.to);
            proptest::prop_assert_eq!(&stepped, &once);
            let seconds: i64 = once.iter().map(|x| x.seconds).sum();
            proptest::prop_assert_eq!(seconds, length.max(60));
            proptest::prop_assert!(settled(&r, posted));
        }
    }
}
