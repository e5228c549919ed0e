//! The time billing runs on: the system's, or one a test sets and moves,
//! so metering and charging are tested without sleeping.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};

#[derive(Clone, Default)]
pub struct Clock(Option<Arc<Mutex<DateTime<Utc>>>>);

impl Clock {
    /// A clock that stands at `t` until moved.
    pub fn manual(t: DateTime<Utc>) -> Clock {
        Clock(Some(Arc::new(Mutex::new(t))))
    }

    pub fn now(&self) -> DateTime<Utc> {
        match &self.0 {
            None => Utc::now(),
            Some(t) => *t.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Moves a manual clock (a no-op on the system's).
    pub fn advance(&self, by: chrono::Duration) {
        if let Some(t) = &self.0 {
            let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
            *t += by;
        }
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            None => f.write_str("Clock::System"),
            Some(_) => write!(f, "Clock::Manual({})", self.now()),
        }
    }
}

impl PartialEq for Clock {
    fn eq(&self, other: &Clock) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}
