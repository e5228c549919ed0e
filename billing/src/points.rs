//! Prepaid points: grants with an expiry, debited by charges oldest-
//! expiring grant first. A debit that finds no points is owed, and the
//! next grant pays what is owed before anything else. What a grant still
//! holds when it expires is gone.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::Serialize;
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub id: Uuid,
    pub amount: Decimal,
    pub granted_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Debit {
    pub amount: Decimal,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrantLeft {
    pub id: Uuid,
    pub remaining: Decimal,
    pub expired: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Balance {
    /// Points left on grants in force, less what is owed.
    pub balance: Decimal,
    /// Charged with no points to pay them, not yet paid by a later grant.
    pub owed: Decimal,
    pub grants: Vec<GrantLeft>,
}

/// The balance at `now` after every debit up to then. `debits` in any order.
pub fn balance(grants: &[Grant], debits: &[Debit], now: DateTime<Utc>) -> Balance {
    let mut left: Vec<Decimal> = grants.iter().map(|g| g.amount).collect();
    let mut order: Vec<usize> = (0..grants.len()).collect();
    order.sort_by_key(|i| (grants[*i].expires_at, grants[*i].granted_at, grants[*i].id));
    let mut debits: Vec<&Debit> = debits.iter().filter(|d| d.at <= now).collect();
    debits.sort_by_key(|d| d.at);
    let mut owed = Decimal::ZERO;
    // Takes `amount` from grants in force at `t`; answers what could not be paid.
    let take = |amount: Decimal, t: DateTime<Utc>, left: &mut [Decimal]| {
        let mut due = amount;
        for &i in &order {
            if due.is_zero() {
                break;
            }
            let g = &grants[i];
            if g.granted_at <= t && t < g.expires_at && left[i] > Decimal::ZERO {
                let x = due.min(left[i]);
                left[i] -= x;
                due -= x;
            }
        }
        due
    };
    for d in debits {
        // What was owed is paid first, from grants made since.
        if owed > Decimal::ZERO {
            owed = take(owed, d.at, &mut left);
        }
        owed += take(d.amount, d.at, &mut left);
    }
    if owed > Decimal::ZERO {
        owed = take(owed, now, &mut left);
    }
    let in_force = |g: &Grant| g.granted_at <= now && now < g.expires_at;
    let available: Decimal = grants
        .iter()
        .zip(&left)
        .filter(|(g, _)| in_force(g))
        .map(|(_, l)| *l)
        .sum();
    Balance {
        balance: (available - owed).normalize(),
        owed: owed.normalize(),
        grants: grants
            .iter()
            .zip(&left)
            .map(|(g, l)| GrantLeft {
                id: g.id,
                remaining: if now >= g.expires_at {
                    Decimal::ZERO
                } else {
                    l.normalize()
                },
                expired: now >= g.expires_at,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use chrono::TimeZone;

    use super::*;

    fn t(d: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, d, 0, 0, 0).unwrap()
    }

    fn n(s: &str) -> Decimal {
        s.parse().unwrap()
    }

    fn grant(id: u128, amount: &str, from: u32, until: u32) -> Grant {
        Grant {
            id: Uuid::from_u128(id),
            amount: n(amount),
            granted_at: t(from),
            expires_at: t(until),
        }
    }

    fn debit(amount: &str, at: u32) -> Debit {
        Debit {
            amount: n(amount),
            at: t(at),
        }
    }

    #[test]
    fn the_oldest_expiring_grant_pays_first_and_expired_points_vanish() {
        let grants = [grant(1, "100", 1, 30), grant(2, "50", 2, 10)];
        // Day 3: 60 points — 50 from grant 2 (expires first), 10 from 1.
        let b = balance(&grants, &[debit("60", 3)], t(4));
        assert_eq!(b.balance, n("90"));
        assert_eq!(b.grants[1].remaining, n("0"));
        assert_eq!(b.grants[0].remaining, n("90"));
        // Without the debit, grant 2's 50 points expire on day 10.
        let b = balance(&grants, &[], t(11));
        assert_eq!(b.balance, n("100"));
        assert!(b.grants[1].expired);
    }

    #[test]
    fn a_debit_without_points_is_owed_and_the_next_grant_pays_it() {
        let grants = [grant(1, "10", 1, 5), grant(2, "100", 8, 30)];
        let debits = [debit("4", 2), debit("20", 6)];
        let b = balance(&grants, &debits, t(7));
        assert_eq!(
            (b.balance, b.owed),
            (n("-20"), n("20")),
            "grant 1 expired with 6 left"
        );
        let b = balance(&grants, &debits, t(9));
        assert_eq!((b.balance, b.owed), (n("80"), n("0")));
    }

    #[test]
    fn debits_after_now_do_not_count_and_order_does_not_matter() {
        let grants = [grant(1, "10", 1, 30)];
        let a = balance(
            &grants,
            &[debit("3", 5), debit("4", 2), debit("9", 20)],
            t(10),
        );
        let b = balance(&grants, &[debit("4", 2), debit("3", 5)], t(10));
        assert_eq!(a, b);
        assert_eq!(a.balance, n("3"));
    }
}
