//! When a portal session ends.

use chrono::{DateTime, Utc};

/// A session idle this long ends…
pub const IDLE_SECS: i64 = 8 * 3600;
/// …and any session ends this long after login.
pub const ABSOLUTE_SECS: i64 = 7 * 24 * 3600;

/// Whether a session made at `created` and last used at `last_seen` has
/// ended by `now`.
pub fn expired(created: DateTime<Utc>, last_seen: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    (now - last_seen).num_seconds() > IDLE_SECS || outlived(created, now)
}

/// Whether a session made at `created` is past its absolute lifetime (an
/// open console is use of its session, so only this ends one).
pub fn outlived(created: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    (now - created).num_seconds() > ABSOLUTE_SECS
}
