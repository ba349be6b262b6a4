//! The per-second time series: one CSV row per second of capture time in which something
//! happened (seconds without a packet are not written), per identity mode; and a bounded
//! in-memory copy of the identity counts for the plot.

use std::io::{self, Write};

use crate::engine::IdentityMode;

/// The CSV header line (columns documented in `docs/replay.md`).
pub const CSV_HEADER: &str = "second,mode,responses,identities,identities_from_dns,\
identities_created,identities_released,cache_names,cache_ips,ipcache_prefixes,\
ipcache_upserts,ipcache_deletes,gc_evictions,breaker_trips";

/// One second of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Whole seconds of capture time since the first frame.
    pub t: u64,
    /// The run's identity mode.
    pub mode: IdentityMode,
    /// Answers learned in this second.
    pub responses: u64,
    /// Identities alive at the end of the second.
    pub identities: usize,
    /// Of them, created by DNS answers.
    pub identities_from_dns: usize,
    /// Identities created in this second.
    pub identities_created: u64,
    /// Identities released in this second.
    pub identities_released: u64,
    /// Names in the DNS cache.
    pub cache_names: usize,
    /// Distinct IPs in the DNS cache.
    pub cache_ips: usize,
    /// Prefixes with IpCache metadata.
    pub ipcache_prefixes: usize,
    /// Datapath ipcache upserts in this second.
    pub ipcache_upserts: u64,
    /// Datapath ipcache deletes in this second.
    pub ipcache_deletes: u64,
    /// Mappings released by GC in this second.
    pub gc_evictions: u64,
    /// Breaker trips in this second.
    pub breaker_trips: u64,
}

impl Row {
    /// Writes the row as one CSV line.
    pub fn write_csv(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            self.t,
            self.mode.name(),
            self.responses,
            self.identities,
            self.identities_from_dns,
            self.identities_created,
            self.identities_released,
            self.cache_names,
            self.cache_ips,
            self.ipcache_prefixes,
            self.ipcache_upserts,
            self.ipcache_deletes,
            self.gc_evictions,
            self.breaker_trips
        )
    }
}

/// Points kept per series at most; past it neighbours are merged (keeping the larger value).
pub const MAX_POINTS: usize = 4096;

/// Identities over time for one run, with bounded memory.
#[derive(Debug, Clone)]
pub struct Series {
    /// The run's identity mode.
    pub mode: IdentityMode,
    /// (second, identities alive), ascending in time.
    pub points: Vec<(u64, usize)>,
}

impl Series {
    /// An empty series.
    pub fn new(mode: IdentityMode) -> Self {
        Self {
            mode,
            points: Vec::new(),
        }
    }

    /// Adds a point; halves the resolution when full.
    pub fn push(&mut self, t: u64, identities: usize) {
        self.points.push((t, identities));
        if self.points.len() >= MAX_POINTS {
            let merged: Vec<(u64, usize)> = self
                .points
                .chunks(2)
                .map(|pair| {
                    let t = pair.last().map_or(0, |p| p.0);
                    let v = pair.iter().map(|p| p.1).max().unwrap_or(0);
                    (t, v)
                })
                .collect();
            self.points = merged;
        }
    }
}
