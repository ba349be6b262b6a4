//! The drop-event ring buffer (`fqdnd_events`), read by [`Events`].

use std::path::Path;

use aya::maps::{MapData, RingBuf};

use super::open_map;
use crate::error::Error;
use crate::sys::DropEvent;

/// The drop-event ring buffer, opened from its pin.
pub struct Events {
    ring: RingBuf<MapData>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    /// Opens `fqdnd_events` pinned in `pin_dir`.
    pub fn open(pin_dir: &Path) -> Result<Self, Error> {
        Ok(Events {
            ring: open_map(pin_dir, "fqdnd_events")?.try_into()?,
        })
    }

    /// Takes every event waiting in the ring (non-blocking).
    pub fn drain(&mut self) -> Vec<DropEvent> {
        let mut out = Vec::new();
        while let Some(item) = self.ring.next() {
            out.extend(DropEvent::from_bytes(&item));
        }
        out
    }
}
