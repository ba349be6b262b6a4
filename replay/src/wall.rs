//! The wall clock: the one place replay reads real time, to measure how long the engine takes
//! per response, to pace progress reports, and to send queries on time in live mode. Nothing
//! here feeds the engine: its clock is the capture's.

#![allow(
    clippy::disallowed_types,
    reason = "this module measures wall time on purpose; logic elsewhere takes `now`"
)]

use std::time::{Duration, Instant};

/// A point in wall time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct WallTime(Instant);

impl WallTime {
    /// Now.
    pub(crate) fn now() -> Self {
        Self(Instant::now())
    }

    /// Time since `self`.
    pub(crate) fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }

    /// `self` plus `d` (saturating far in the future).
    pub(crate) fn plus(&self, d: Duration) -> Self {
        Self(self.0.checked_add(d).unwrap_or(self.0))
    }

    /// Time from `self` until `later` (zero if `later` is earlier).
    pub(crate) fn until(&self, later: WallTime) -> Duration {
        later.0.saturating_duration_since(self.0)
    }
}
