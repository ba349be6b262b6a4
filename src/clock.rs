//! The daemon's clock: the one place that reads the real time. Everything below the binary
//! takes `now` as a `Duration` since this clock's start.

#![allow(clippy::disallowed_types, reason = "this module is the injected clock")]

use std::time::{Duration, Instant};

/// Monotonic time since the daemon started.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    start: Instant,
}

impl Clock {
    /// Starts the clock.
    pub(crate) fn start() -> Self {
        Self {
            start: Instant::now(),
        }
    }

    /// Time since start.
    pub(crate) fn now(&self) -> Duration {
        self.start.elapsed()
    }
}

impl Clock {
    /// The wall-clock time (RFC 3339, seconds) of a moment on this clock.
    pub(crate) fn wall_time_of(&self, at: Duration) -> String {
        let wall_now = std::time::SystemTime::now();
        let now = self.now();
        let wall = if at >= now {
            wall_now + (at - now)
        } else {
            wall_now - (now - at)
        };
        humantime::format_rfc3339_seconds(wall).to_string()
    }
}
