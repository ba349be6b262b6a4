//! The daemon's clock: the one place that reads the real time. Everything below the binary
//! takes `now` as a `Duration` since this clock's start, and wall time through
//! [`fqdnd_engine::Clock`].

#![allow(clippy::disallowed_types, reason = "this module is the injected clock")]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Monotonic time since the daemon started.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    /// Starts the clock.
    pub fn start() -> Self {
        Self {
            start: Instant::now(),
        }
    }

    /// `at` as this clock's time (zero if before its start): an instant read elsewhere,
    /// such as an answer's arrival, without another read of the clock.
    pub fn at(&self, at: tokio::time::Instant) -> Duration {
        at.into_std().saturating_duration_since(self.start)
    }
}

impl fqdnd_engine::Clock for Clock {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Read against the wall clock at each call, so a wall-clock step moves future
    /// conversions with it.
    fn unix_ms_of(&self, at: Duration) -> u64 {
        let wall_now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let now = self.now();
        let wall = if at >= now {
            wall_now + (at - now)
        } else {
            wall_now.saturating_sub(now - at)
        };
        u64::try_from(wall.as_millis()).unwrap_or(u64::MAX)
    }
}

/// Blocks the calling thread for `d` (start-up steps that wait for other threads).
#[allow(
    clippy::disallowed_methods,
    reason = "the one blocking pause, for start-up steps"
)]
pub fn pause(d: Duration) {
    std::thread::sleep(d);
}

/// Wall-clock time since the Unix epoch (certificate validity is written in it).
pub fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instant_read_elsewhere_is_this_clocks_time() {
        let before = tokio::time::Instant::now();
        let clock = Clock::start();
        assert_eq!(clock.at(before), Duration::ZERO, "before the start: zero");
        let later = tokio::time::Instant::now() + Duration::from_secs(5);
        let at = clock.at(later);
        assert!(at >= Duration::from_secs(5), "{at:?}");
        assert!(at < Duration::from_secs(6), "{at:?}");
    }
}
