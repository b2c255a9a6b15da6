use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};

/// A source of the current time, so tests and imports control "now".
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time.
    fn now(&self) -> DateTime<Utc>;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that only moves when told to; clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Mutex<DateTime<Utc>>>);

impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        Self(Arc::new(Mutex::new(start)))
    }

    /// Sets the time.
    pub fn set(&self, to: DateTime<Utc>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = to;
    }

    /// Moves the time forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *t += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let start = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let c = ManualClock::new(start);
        let shared = c.clone();
        assert_eq!(c.now(), start);
        shared.advance(Duration::seconds(5));
        assert_eq!(c.now(), start + Duration::seconds(5));
    }
}
