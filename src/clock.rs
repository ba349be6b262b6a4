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

impl Clock {
    /// Milliseconds since the Unix epoch of a moment on this clock (what a checkpoint stores,
    /// so expiries survive a restart, whose clock starts again at zero).
    pub(crate) fn unix_ms_of(&self, at: Duration) -> u64 {
        let wall_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let now = self.now();
        let wall = if at >= now {
            wall_now + (at - now)
        } else {
            wall_now.saturating_sub(now - at)
        };
        u64::try_from(wall.as_millis()).unwrap_or(u64::MAX)
    }

    /// Seconds from now until the Unix time `unix_ms` (0 if it has passed), rounded up.
    pub(crate) fn seconds_until_unix_ms(&self, unix_ms: u64) -> u32 {
        let now_ms = self.unix_ms_of(self.now());
        let left = unix_ms.saturating_sub(now_ms);
        u32::try_from(left.div_ceil(1000)).unwrap_or(u32::MAX)
    }
}

/// Blocks the calling thread for `d` (start-up steps that wait for other threads).
#[allow(
    clippy::disallowed_methods,
    reason = "the one blocking pause, for start-up steps"
)]
pub(crate) fn pause(d: Duration) {
    std::thread::sleep(d);
}
