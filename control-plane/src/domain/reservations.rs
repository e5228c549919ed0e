//! Reservations' rules: a window a request may ask for, where a
//! reservation stands at a time, and how many GPUs may be promised.

use chrono::{DateTime, Duration, Utc};
use kumo_api_types::ReservationState;

use crate::error::ApiError;

/// The shortest window worth holding hosts for.
pub const MIN_WINDOW: Duration = Duration::minutes(10);
/// How far ahead, and for how long, a reservation may hold capacity.
pub const MAX_AHEAD: Duration = Duration::days(366);
/// Reservations a tenant may hold at once (not ended): each is a row every
/// pass reads, and hosts taken from everyone else.
pub const MAX_PER_TENANT: usize = 16;
/// Reservations a tenant keeps, ended ones included (deleting an ended one
/// forgets it).
pub const MAX_KEPT: usize = 64;
/// Most GPUs one reservation asks for.
pub const MAX_GPUS: u32 = 4096;

/// Checks a requested window at `now`: it starts no earlier than now, is
/// at least [`MIN_WINDOW`] long and lies within [`MAX_AHEAD`].
pub fn check_window(
    starts_at: DateTime<Utc>,
    ends_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<(), ApiError> {
    // A minute's slack for a request made "now" by a slow client.
    if starts_at < now - Duration::minutes(1) {
        return Err(ApiError::field(
            "starts_at",
            format!("in the past (it is {})", now.to_rfc3339()),
        ));
    }
    if ends_at - starts_at < MIN_WINDOW {
        return Err(ApiError::field(
            "ends_at",
            format!(
                "at least {} minutes after starts_at",
                MIN_WINDOW.num_minutes()
            ),
        ));
    }
    if ends_at > now + MAX_AHEAD {
        return Err(ApiError::field(
            "ends_at",
            format!("at most {} days ahead", MAX_AHEAD.num_days()),
        ));
    }
    Ok(())
}

pub fn check_gpus(gpus: u32) -> Result<(), ApiError> {
    if !(1..=MAX_GPUS).contains(&gpus) {
        return Err(ApiError::field("gpus", format!("between 1 and {MAX_GPUS}")));
    }
    Ok(())
}

/// Where a reservation of `[starts_at, ends_at)` stands at `now`, held
/// from `lead` before its start (time for the VMs on its hosts to have
/// their notice).
pub fn state_at(
    starts_at: DateTime<Utc>,
    ends_at: DateTime<Utc>,
    lead: Duration,
    now: DateTime<Utc>,
) -> ReservationState {
    if now >= ends_at {
        ReservationState::Ended
    } else if now >= starts_at {
        ReservationState::Active
    } else if now >= starts_at - lead {
        ReservationState::Preparing
    } else {
        ReservationState::Scheduled
    }
}

/// The order states come in: a reservation only moves forwards.
pub fn rank(s: ReservationState) -> u8 {
    match s {
        ReservationState::Scheduled => 0,
        ReservationState::Preparing => 1,
        ReservationState::Active => 2,
        ReservationState::Ended => 3,
    }
}

/// A reservation's window and GPUs, for promise checks.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub gpus: u64,
}

impl Window {
    fn overlaps(&self, other: &Window) -> bool {
        self.starts_at < other.ends_at && other.starts_at < self.ends_at
    }
}

/// The most GPUs `others` hold at any one moment of `w`: the peak of
/// their sum over the window (checked at each start inside it).
pub fn peak_during(w: &Window, others: &[Window]) -> u64 {
    let overlapping: Vec<&Window> = others.iter().filter(|o| o.overlaps(w)).collect();
    std::iter::once(w.starts_at)
        .chain(
            overlapping
                .iter()
                .map(|o| o.starts_at)
                .filter(|t| *t > w.starts_at),
        )
        .map(|t| {
            overlapping
                .iter()
                .filter(|o| o.starts_at <= t && t < o.ends_at)
                .map(|o| o.gpus)
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn at(h: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap() + Duration::hours(h)
    }

    fn w(from: i64, to: i64, gpus: u64) -> Window {
        Window {
            starts_at: at(from),
            ends_at: at(to),
            gpus,
        }
    }

    #[test]
    fn a_reservation_is_prepared_before_its_start_and_ends_at_its_end() {
        let lead = Duration::minutes(10);
        let s = |m: i64| state_at(at(1), at(3), lead, at(1) + Duration::minutes(m));
        assert_eq!(s(-11), ReservationState::Scheduled);
        assert_eq!(s(-10), ReservationState::Preparing);
        assert_eq!(s(-1), ReservationState::Preparing);
        assert_eq!(s(0), ReservationState::Active);
        assert_eq!(s(119), ReservationState::Active);
        assert_eq!(s(120), ReservationState::Ended);
    }

    #[test]
    fn the_peak_counts_only_what_overlaps_at_one_moment() {
        // 16 from 0 to 2 and 16 from 2 to 4 never overlap each other; 8
        // from 1 to 3 overlaps both.
        let others = [w(0, 2, 16), w(2, 4, 16), w(1, 3, 8)];
        assert_eq!(peak_during(&w(0, 4, 1), &others), 24);
        assert_eq!(
            peak_during(&w(4, 5, 1), &others),
            0,
            "touching is not overlapping"
        );
        assert_eq!(peak_during(&w(0, 1, 1), &others), 16);
    }

    #[test]
    fn windows_start_now_or_later_and_stay_within_a_year() {
        let now = at(0);
        assert!(check_window(at(1), at(2), now).is_ok());
        assert!(check_window(now, now + MIN_WINDOW, now).is_ok());
        assert!(check_window(at(-1), at(2), now).is_err());
        assert!(check_window(at(1), at(1) + Duration::minutes(9), now).is_err());
        assert!(check_window(at(1), now + Duration::days(367), now).is_err());
        assert!(
            check_gpus(0).is_err() && check_gpus(MAX_GPUS + 1).is_err() && check_gpus(8).is_ok()
        );
    }
}
