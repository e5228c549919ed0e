//! What a tenant's balance means for it (pure): alerts as its latest
//! grant is spent (each threshold once per grant), and at a zero balance
//! the points are exhausted: new VMs and starts are refused, spot VMs
//! stop at once, guaranteed VMs once the grace is over (from exhaustion,
//! or until an admin's extension, whichever is later).

use chrono::{DateTime, Duration, Utc};
use rust_decimal::Decimal;
use uuid::Uuid;

use crate::points::{Balance, Grant};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alert {
    /// `spent-80`, `spent-100`, `exhausted`.
    pub kind: String,
    /// The grant it is about (for `exhausted`: the latest grant).
    pub subject: Uuid,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub alerts: Vec<Alert>,
    /// When the points ran out (kept from before, or now), `None` when not.
    pub exhausted_since: Option<DateTime<Utc>>,
    pub stop_spot: bool,
    pub stop_guaranteed: bool,
}

pub struct Standing<'a> {
    pub grants: &'a [Grant],
    pub balance: &'a Balance,
    pub exhausted_since: Option<DateTime<Utc>>,
    pub grace_until: Option<DateTime<Utc>>,
}

/// Whether a tenant is out of points: it has had grants (tenants never
/// granted any are not run on points) and nothing is left.
pub fn exhausted(grants: &[Grant], balance: &Balance) -> bool {
    !grants.is_empty() && balance.balance <= Decimal::ZERO
}

pub fn decide(
    s: &Standing<'_>,
    thresholds: &[u32],
    grace: Duration,
    now: DateTime<Utc>,
) -> Decision {
    let mut alerts = Vec::new();
    let latest = s.grants.iter().max_by_key(|g| (g.granted_at, g.id));
    if let Some(g) = latest {
        let left = s
            .balance
            .grants
            .iter()
            .find(|x| x.id == g.id)
            .map(|x| x.remaining)
            .unwrap_or(Decimal::ZERO);
        if g.amount > Decimal::ZERO {
            let spent = (g.amount - left) * Decimal::from(100) / g.amount;
            for t in thresholds {
                if spent >= Decimal::from(*t) {
                    alerts.push(Alert {
                        kind: format!("spent-{t}"),
                        subject: g.id,
                        message: format!(
                            "{t} % of the {} points granted on {} spent",
                            g.amount.normalize(),
                            g.granted_at.format("%Y-%m-%d")
                        ),
                    });
                }
            }
        }
    }
    if !exhausted(s.grants, s.balance) {
        return Decision {
            alerts,
            exhausted_since: None,
            stop_spot: false,
            stop_guaranteed: false,
        };
    }
    let since = s.exhausted_since.unwrap_or(now);
    let until = (since + grace).max(s.grace_until.unwrap_or(since));
    if let Some(g) = latest {
        alerts.push(Alert {
            kind: "exhausted".into(),
            subject: g.id,
            message: format!(
                "points exhausted (balance {}): new VMs and starts are refused, spot VMs stop, guaranteed VMs stop after {}",
                s.balance.balance,
                until.format("%Y-%m-%d %H:%M UTC")
            ),
        });
    }
    Decision {
        alerts,
        exhausted_since: Some(since),
        stop_spot: true,
        stop_guaranteed: now >= until,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use chrono::TimeZone;

    use super::*;
    use crate::points::{balance, Debit};

    fn t(h: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 20, h, 0, 0).unwrap()
    }

    fn run(
        spent: &str,
        exhausted_since: Option<DateTime<Utc>>,
        grace_until: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Decision {
        let grants = vec![Grant {
            id: Uuid::from_u128(7),
            amount: "100".parse().unwrap(),
            granted_at: t(0),
            expires_at: t(23),
        }];
        let b = balance(
            &grants,
            &[Debit {
                amount: spent.parse().unwrap(),
                at: t(1),
            }],
            now,
        );
        decide(
            &Standing {
                grants: &grants,
                balance: &b,
                exhausted_since,
                grace_until,
            },
            &[80, 100],
            Duration::hours(24),
            now,
        )
    }

    fn kinds(d: &Decision) -> Vec<&str> {
        d.alerts.iter().map(|a| a.kind.as_str()).collect()
    }

    #[test]
    fn thresholds_then_exhaustion_then_the_grace() {
        let d = run("79.99", None, None, t(2));
        assert!(kinds(&d).is_empty() && !d.stop_spot);
        let d = run("80", None, None, t(2));
        assert_eq!(kinds(&d), ["spent-80"]);
        let d = run("100", None, None, t(2));
        assert_eq!(kinds(&d), ["spent-80", "spent-100", "exhausted"]);
        assert_eq!(d.exhausted_since, Some(t(2)));
        assert!(d.stop_spot && !d.stop_guaranteed);
        // 24 h after exhaustion guaranteed VMs stop too — unless extended.
        let later = t(2) + Duration::hours(24);
        assert!(run("130", Some(t(2)), None, later).stop_guaranteed);
        assert!(!run("130", Some(t(2)), Some(later + Duration::hours(1)), later).stop_guaranteed);
    }

    #[test]
    fn a_tenant_never_granted_points_is_not_run_on_them() {
        let b = balance(&[], &[], t(1));
        let d = decide(
            &Standing {
                grants: &[],
                balance: &b,
                exhausted_since: None,
                grace_until: None,
            },
            &[80],
            Duration::hours(1),
            t(1),
        );
        assert!(d.alerts.is_empty() && !d.stop_spot && d.exhausted_since.is_none());
    }
}
