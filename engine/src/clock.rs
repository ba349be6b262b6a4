//! Wall time, injected: the engine keeps monotonic `now` (a `Duration` since its owner's start)
//! for every decision and needs wall time only to store expiries that outlive a restart.

use std::time::Duration;

/// The owner's clock, as the engine reads it.
///
/// The daemon implements it on `Instant` + `SystemTime`; tests implement it on fixed values.
pub trait Clock: Send + Sync {
    /// Monotonic time since the owner started.
    fn now(&self) -> Duration;

    /// Milliseconds since the Unix epoch of the moment `at` on this clock.
    fn unix_ms_of(&self, at: Duration) -> u64;

    /// Seconds from now until the Unix time `unix_ms` (0 if it has passed), rounded up.
    fn seconds_until_unix_ms(&self, unix_ms: u64) -> u32 {
        seconds_between(self.unix_ms_of(self.now()), unix_ms)
    }
}

/// Seconds from the Unix time `from_ms` until `unix_ms` (0 if it is not later), rounded up:
/// for many expiries against one clock reading.
pub(crate) fn seconds_between(from_ms: u64, unix_ms: u64) -> u32 {
    let left = unix_ms.saturating_sub(from_ms);
    u32::try_from(left.div_ceil(1000)).unwrap_or(u32::MAX)
}
