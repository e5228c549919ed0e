//! Kumo's billing core, as plain functions over plain data: rate cards
//! (`rates`), the pieces of metered runs still to be charged (`meter`),
//! monthly statements (`statement`), prepaid points (`points`) and what a
//! balance means for a tenant (`budget`).
//! Amounts are exact decimals, rounded once per charge to [`SCALE`]
//! places (half to even), so every sum of charges is exact.

pub mod bench;
pub mod budget;
pub mod ledger;
pub mod meter;
pub mod points;
pub mod rates;
pub mod statement;

use serde::{Deserialize, Serialize};

pub use rust_decimal::Decimal;

/// Decimal places of a charge.
pub const SCALE: u32 = 6;

/// The price column a VM pays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Guaranteed,
    Spot,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Guaranteed => "guaranteed",
            Level::Spot => "spot",
        }
    }
}

/// `amount × quantity × seconds / 3600`, rounded to [`SCALE`] places.
pub fn charge(per_hour: Decimal, quantity: Decimal, seconds: i64) -> Decimal {
    (per_hour * quantity * Decimal::from(seconds) / Decimal::from(3600))
        .round_dp_with_strategy(SCALE, rust_decimal::RoundingStrategy::MidpointNearestEven)
}

/// An amount in millionths of a point (amounts have [`SCALE`] places);
/// saturates far beyond any real balance.
pub fn to_micro(amount: Decimal) -> i64 {
    use rust_decimal::prelude::ToPrimitive;
    (amount * Decimal::from(1_000_000))
        .trunc()
        .to_i64()
        .unwrap_or(if amount.is_sign_negative() {
            i64::MIN
        } else {
            i64::MAX
        })
}

pub fn from_micro(micro: i64) -> Decimal {
    Decimal::new(micro, SCALE)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_charge_is_rounded_once_half_to_even() {
        let d = |s: &str| s.parse::<Decimal>().unwrap();
        assert_eq!(charge(d("360"), d("1"), 1), d("0.1"));
        // 100/3600 = 0.0277777…
        assert_eq!(charge(d("100"), d("1"), 1), d("0.027778"));
        assert_eq!(charge(d("100"), d("2"), 3600), d("200"));
        assert_eq!(charge(d("0.0000036"), d("1"), 1), d("0"));
        assert_eq!(charge(d("0.009"), d("1"), 1), d("0.000002"));
    }

    #[test]
    fn micro_points_round_trip() {
        for s in ["0", "0.000001", "123.456789", "6.576"] {
            let x = s.parse::<Decimal>().unwrap();
            assert_eq!(from_micro(to_micro(x)), x);
        }
    }
}
