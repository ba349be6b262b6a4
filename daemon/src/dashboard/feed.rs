//! What the dashboard learns from the proxy's query tap: queries per second by result over the
//! last hour (a ring of per-second counts), recent hold times (for p50/p99), the last queries,
//! and a broadcast of each finished query for the live tail. The proxy's thread only locks
//! briefly and never waits on a reader.

use std::collections::VecDeque;
use std::sync::Mutex;

use fqdnd_dnsproxy::{QueryLog, QueryLogEntry, QueryResult};
use serde::Serialize;
use tokio::sync::broadcast;

/// Seconds of per-second counts kept: an hour.
pub const WINDOW: u64 = 3600;
/// Queries kept to start a new tail with.
const RECENT: usize = 100;
/// Hold times kept for the percentiles.
const HOLDS: usize = 4096;
/// Hold times older than this do not count in the percentiles.
const HOLD_WINDOW_MS: u64 = 300_000;
/// Queries a slow tail reader may fall behind before it is told it missed some.
const TAIL: usize = 1024;

/// One second's counts, per result in [`QueryResult::ALL`] order.
#[derive(Debug, Clone, Copy, Default)]
struct Second {
    at: u64,
    counts: [u32; QueryResult::ALL.len()],
}

#[derive(Debug)]
struct Inner {
    seconds: Vec<Second>,
    recent: VecDeque<QueryLogEntry>,
    /// (arrival ms, hold µs) of the last queries that were held.
    holds: VecDeque<(u64, u64)>,
}

/// The dashboard's view of finished queries.
#[derive(Debug)]
pub struct Feed {
    inner: Mutex<Inner>,
    tail: broadcast::Sender<QueryLogEntry>,
}

/// Queries per second by result, oldest first (`GET /api/series`).
#[derive(Debug, Serialize, PartialEq)]
pub struct Series {
    /// Unix time of the first bucket, seconds.
    pub start: u64,
    /// Seconds per bucket.
    pub step: u64,
    /// Per result (its name): queries per second in each bucket.
    pub results: Vec<(String, Vec<f64>)>,
}

/// Hold time percentiles over the last five minutes (`GET /api/holds`).
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Holds {
    /// Held queries counted.
    pub samples: usize,
    /// Microseconds; `None` without samples.
    pub p50_us: Option<u64>,
    /// Microseconds; `None` without samples.
    pub p99_us: Option<u64>,
}

impl Default for Feed {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                seconds: vec![Second::default(); WINDOW as usize],
                recent: VecDeque::with_capacity(RECENT),
                holds: VecDeque::with_capacity(HOLDS),
            }),
            tail: broadcast::channel(TAIL).0,
        }
    }
}

impl Feed {
    /// Counts `entry` and hands it to the tail's readers.
    pub fn add(&self, entry: QueryLogEntry) {
        if let Ok(mut inner) = self.inner.lock() {
            let at = entry.time_ms / 1000;
            let slot = &mut inner.seconds[(at % WINDOW) as usize];
            if slot.at != at {
                *slot = Second {
                    at,
                    ..Second::default()
                };
            }
            let i = QueryResult::ALL
                .iter()
                .position(|r| *r == entry.result)
                .unwrap_or(0);
            slot.counts[i] = slot.counts[i].saturating_add(1);
            if entry.hold_us > 0 {
                if inner.holds.len() == HOLDS {
                    inner.holds.pop_front();
                }
                inner.holds.push_back((entry.time_ms, entry.hold_us));
            }
            if inner.recent.len() == RECENT {
                inner.recent.pop_front();
            }
            inner.recent.push_back(entry.clone());
        }
        // No reader: nothing to do.
        let _ = self.tail.send(entry);
    }

    /// The last queries, oldest first.
    pub fn recent(&self) -> Vec<QueryLogEntry> {
        self.inner
            .lock()
            .map(|i| i.recent.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// A reader of the queries finished from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<QueryLogEntry> {
        self.tail.subscribe()
    }

    /// Queries per second over the hour up to `now` (Unix seconds), in buckets of `step`
    /// seconds (1 to 600, a divisor of the hour's length is not needed).
    pub fn series(&self, now: u64, step: u64) -> Series {
        let step = step.clamp(1, 600);
        let buckets = WINDOW.div_ceil(step);
        let start = (now + 1).saturating_sub(buckets * step);
        let mut counts = vec![vec![0u64; buckets as usize]; QueryResult::ALL.len()];
        if let Ok(inner) = self.inner.lock() {
            for second in &inner.seconds {
                if second.at < start || second.at > now || second.at + WINDOW <= now {
                    continue;
                }
                let b = ((second.at - start) / step) as usize;
                for (r, n) in second.counts.iter().enumerate() {
                    counts[r][b] += u64::from(*n);
                }
            }
        }
        Series {
            start,
            step,
            results: QueryResult::ALL
                .iter()
                .zip(counts)
                .map(|(r, c)| {
                    (
                        r.as_str().to_owned(),
                        c.into_iter().map(|n| n as f64 / step as f64).collect(),
                    )
                })
                .collect(),
        }
    }

    /// Hold time percentiles over the five minutes up to `now_ms` (Unix milliseconds).
    pub fn holds(&self, now_ms: u64) -> Holds {
        let mut held: Vec<u64> = self
            .inner
            .lock()
            .map(|i| {
                i.holds
                    .iter()
                    .filter(|(at, _)| at + HOLD_WINDOW_MS >= now_ms)
                    .map(|(_, us)| *us)
                    .collect()
            })
            .unwrap_or_default();
        held.sort_unstable();
        let pick = |q: f64| {
            let last = held.len().checked_sub(1)?;
            // Nearest rank.
            let rank = ((q * held.len() as f64).ceil() as usize).clamp(1, held.len());
            held.get((rank - 1).min(last)).copied()
        };
        Holds {
            samples: held.len(),
            p50_us: pick(0.50),
            p99_us: pick(0.99),
        }
    }
}

impl QueryLog for Feed {
    fn record(&self, entry: QueryLogEntry) {
        self.add(entry);
    }
}

/// Hands each finished query to every tap (the query log file and the dashboard).
pub struct Tee(pub Vec<std::sync::Arc<dyn QueryLog>>);

impl QueryLog for Tee {
    fn record(&self, entry: QueryLogEntry) {
        if let Some((last, rest)) = self.0.split_last() {
            for tap in rest {
                tap.record(entry.clone());
            }
            last.record(entry);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "test code")]
mod tests {
    use super::*;

    fn entry(time_ms: u64, result: QueryResult, hold_us: u64) -> QueryLogEntry {
        QueryLogEntry {
            time_ms,
            client: "127.0.0.1:5000".parse().unwrap(),
            transport: fqdnd_dnsproxy::Transport::Udp,
            name: "a.example.".to_owned(),
            qtype: "A".to_owned(),
            result,
            rcode: "NOERROR".to_owned(),
            upstream: None,
            total_us: hold_us + 10,
            hold_us,
            answers: 1,
        }
    }

    fn of<'a>(s: &'a Series, name: &str) -> &'a [f64] {
        &s.results.iter().find(|(n, _)| n == name).unwrap().1
    }

    #[test]
    fn series_counts_each_second_by_result_and_forgets_past_the_hour() {
        let feed = Feed::default();
        let t0 = 1_700_000_000u64;
        for _ in 0..3 {
            feed.add(entry(t0 * 1000 + 5, QueryResult::Answered, 0));
        }
        feed.add(entry(t0 * 1000 + 900, QueryResult::Denied, 0));
        feed.add(entry((t0 + 2) * 1000, QueryResult::Answered, 0));
        let s = feed.series(t0 + 2, 1);
        assert_eq!(s.step, 1);
        assert_eq!(of(&s, "answered").len(), WINDOW as usize);
        assert_eq!(s.start, t0 + 2 + 1 - WINDOW);
        let answered = of(&s, "answered");
        assert_eq!(&answered[answered.len() - 3..], &[3.0, 0.0, 1.0]);
        assert_eq!(of(&s, "denied").iter().sum::<f64>(), 1.0);
        // Ten-second buckets: rates.
        let s10 = feed.series(t0 + 2, 10);
        assert_eq!(of(&s10, "answered").iter().sum::<f64>(), 0.4);
        // An hour later the counts are gone, and a slot reused for a new second is reset.
        let later = t0 + WINDOW;
        assert_eq!(
            of(&feed.series(later + 10, 1), "answered")
                .iter()
                .sum::<f64>(),
            0.0
        );
        // `later` takes t0's slot: its 3 queries are gone; t0 + 2's one is still in the hour.
        feed.add(entry(later * 1000, QueryResult::Answered, 0));
        let s = feed.series(later, 1);
        let answered = of(&s, "answered");
        assert_eq!(answered[answered.len() - 1], 1.0);
        assert_eq!(answered.iter().sum::<f64>(), 2.0);
    }

    #[test]
    fn hold_percentiles_over_the_last_five_minutes() {
        let feed = Feed::default();
        assert_eq!(
            feed.holds(0),
            Holds {
                samples: 0,
                p50_us: None,
                p99_us: None
            }
        );
        let now = 10_000_000u64;
        feed.add(entry(now - 400_000, QueryResult::Answered, 1_000_000)); // too old
        for us in 1..=100 {
            feed.add(entry(now - 1000, QueryResult::Answered, us));
        }
        feed.add(entry(now, QueryResult::Denied, 0)); // not held
        let h = feed.holds(now);
        assert_eq!(h.samples, 100);
        assert_eq!(h.p50_us, Some(50));
        assert_eq!(h.p99_us, Some(99));
    }

    #[tokio::test]
    async fn the_tail_gets_each_query_and_recent_keeps_the_last() {
        let feed = Feed::default();
        let mut rx = feed.subscribe();
        for i in 0..(RECENT as u64 + 5) {
            feed.add(entry(i, QueryResult::Answered, 0));
        }
        assert_eq!(rx.recv().await.unwrap().time_ms, 0);
        let recent = feed.recent();
        assert_eq!(recent.len(), RECENT);
        assert_eq!(recent[0].time_ms, 5);
    }
}
