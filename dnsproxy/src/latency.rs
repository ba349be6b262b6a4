//! The proxy's latency summaries (upstream latency, hold, observer), kept by the proxy itself
//! rather than through the `metrics` facade: every answered query records three samples, and
//! the Prometheus exporter kept each one with its time until its upkeep folded them into
//! sketches, +3 to +17 % CPU per query at saturation (docs/manual/metrics.md). Here a sample
//! is one counter bumped in a log-linear bucket array (16 buckets per power of two, so a
//! quantile is read to within 3.2 %) and a sum: no allocation, no lock, and no locked
//! instruction, because each thread writes a stripe of its own (taken on its first sample,
//! handed to the next thread when it exits) and readers add the stripes up.
//!
//! [`render_summaries`] writes the summaries of every live proxy in the Prometheus text
//! format, quantiles over a window of about a minute, as the exporter's were.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

/// Values below this many nanoseconds have a bucket each.
const LINEAR: u64 = 16;
/// Bits of a value below its leading one that choose its bucket within a power of two.
const SUB_BITS: u32 = 4;
/// The largest power of two with buckets of its own (2^47 ns, about 39 hours): anything
/// longer lands in the last bucket.
const MAX_EXP: u32 = 47;
/// Buckets per series.
const BUCKETS: usize = LINEAR as usize + (((MAX_EXP - SUB_BITS + 1) as usize) << SUB_BITS);

/// The quantiles rendered, as the exporter rendered them.
const QUANTILES: [(f64, &str); 7] = [
    (0.0, "0"),
    (0.5, "0.5"),
    (0.9, "0.9"),
    (0.95, "0.95"),
    (0.99, "0.99"),
    (0.999, "0.999"),
    (1.0, "1"),
];
/// The proxy's sweep takes a snapshot of the counts this often…
const SNAPSHOT_EVERY: Duration = Duration::from_secs(20);
/// …and keeps this many: the quantiles are over the samples since the oldest, the last 40 to
/// 60 seconds (the exporter's window was three buckets of 20 s too).
const SNAPSHOTS: usize = 3;

/// The series a proxy times, in [`LatencySet`] order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Series {
    /// Query forwarded to validated answer.
    Upstream = 0,
    /// Answer validated to reply out.
    Hold = 1,
    /// The response observer's time.
    Observer = 2,
}

/// Names of the series, in [`Series`] order (described in [`crate::metrics::SERIES`]).
const SERIES: [&str; 3] = [
    crate::metrics::UPSTREAM_LATENCY,
    crate::metrics::HOLD,
    crate::metrics::OBSERVER,
];

/// The bucket of `ns` nanoseconds.
fn bucket(ns: u64) -> usize {
    if ns < LINEAR {
        // Below 16: fits.
        return ns as usize;
    }
    let exp = (63 - ns.leading_zeros()).min(MAX_EXP);
    let ns = ns.min((2 << MAX_EXP) - 1);
    let sub = (ns >> (exp - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    // exp <= 47 and sub < 16: well within a usize.
    LINEAR as usize + (((exp - SUB_BITS) as usize) << SUB_BITS) + sub as usize
}

/// The value a bucket stands for, in nanoseconds: the middle of its range.
fn value(bucket: usize) -> f64 {
    if bucket < LINEAR as usize {
        return bucket as f64;
    }
    let i = bucket - LINEAR as usize;
    let exp = (i >> SUB_BITS) as u32 + SUB_BITS;
    let sub = (i & ((1 << SUB_BITS) - 1)) as u64;
    let low = ((1 << SUB_BITS) + sub) << (exp - SUB_BITS);
    let width = 1u64 << (exp - SUB_BITS);
    low as f64 + width as f64 / 2.0
}

/// One series' counts in one stripe.
struct Counts {
    buckets: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

impl Counts {
    fn new() -> Self {
        Self {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    /// Adds a sample; only the stripe's one writer calls it (a load and a store, no locked
    /// instruction).
    fn add_owned(&self, ns: u64) {
        let b = &self.buckets[bucket(ns)];
        b.store(b.load(Relaxed) + 1, Relaxed);
        self.sum_ns
            .store(self.sum_ns.load(Relaxed).wrapping_add(ns), Relaxed);
    }

    /// Adds a sample where writers may race (the shared stripe).
    fn add_shared(&self, ns: u64) {
        self.buckets[bucket(ns)].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }
}

/// Every series' counts, written by one thread at a time.
struct Stripe([Counts; 3]);

impl Stripe {
    fn new() -> Self {
        Self([Counts::new(), Counts::new(), Counts::new()])
    }
}

/// A proxy's three series: the stripes its threads write.
struct Inner {
    /// Every stripe handed out, owned or free: what readers add up.
    stripes: Mutex<Vec<Arc<Stripe>>>,
    /// Stripes whose thread exited, for the next thread.
    free: Mutex<Vec<Arc<Stripe>>>,
    /// For a thread that records while its thread-locals are being torn down.
    shared: Stripe,
    /// The window's snapshots, oldest first, and when the newest was taken.
    snapshots: Mutex<(VecDeque<Totals>, Option<Instant>)>,
}

/// A thread's stripe of one proxy's set; given back when the thread exits.
struct Held {
    set: Weak<Inner>,
    stripe: Arc<Stripe>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(set) = self.set.upgrade() {
            lock(&set.free).push(Arc::clone(&self.stripe));
        }
    }
}

thread_local! {
    /// The stripes this thread writes, one per live proxy it recorded for.
    static HELD: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The live sets, for [`render_summaries`].
static LIVE: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());

/// A proxy's latency series.
#[derive(Clone)]
pub(crate) struct LatencySet {
    inner: Arc<Inner>,
}

impl LatencySet {
    /// A new set, rendered by [`render_summaries`] while it lives.
    pub(crate) fn new() -> Self {
        let inner = Arc::new(Inner {
            stripes: Mutex::new(Vec::new()),
            free: Mutex::new(Vec::new()),
            shared: Stripe::new(),
            snapshots: Mutex::new((VecDeque::new(), None)),
        });
        let mut live = lock(&LIVE);
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&inner));
        drop(live);
        Self { inner }
    }

    /// Records `d` in `series`.
    pub(crate) fn record(&self, series: Series, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = series as usize;
        let recorded = HELD.try_with(|held| {
            let mut held = held.borrow_mut();
            let me = Arc::as_ptr(&self.inner);
            let at = match held.iter().position(|h| std::ptr::eq(h.set.as_ptr(), me)) {
                Some(at) => at,
                None => {
                    held.retain(|h| h.set.strong_count() > 0);
                    held.push(Held {
                        set: Arc::downgrade(&self.inner),
                        stripe: self.take_stripe(),
                    });
                    held.len() - 1
                }
            };
            held[at].stripe.0[i].add_owned(ns);
        });
        if recorded.is_err() {
            self.inner.shared.0[i].add_shared(ns);
        }
    }

    /// A free stripe, or a new one.
    fn take_stripe(&self) -> Arc<Stripe> {
        if let Some(stripe) = lock(&self.inner.free).pop() {
            return stripe;
        }
        let stripe = Arc::new(Stripe::new());
        lock(&self.inner.stripes).push(Arc::clone(&stripe));
        stripe
    }

    /// Takes a snapshot of the counts for the window when the last is [`SNAPSHOT_EVERY`] old
    /// (the proxy's sweep calls it on every tick).
    pub(crate) fn tick(&self, now: Instant) {
        let mut snapshots = lock(&self.inner.snapshots);
        let (kept, last) = &mut *snapshots;
        if last.is_some_and(|at| now.saturating_duration_since(at) < SNAPSHOT_EVERY) {
            return;
        }
        let mut totals = Totals::default();
        totals.add(&self.inner);
        if kept.len() == SNAPSHOTS {
            kept.pop_front();
        }
        kept.push_back(totals);
        *last = Some(now);
    }

    /// How many samples `series` holds.
    pub(crate) fn count(&self, series: Series) -> u64 {
        let mut totals = Totals::default();
        totals.add(&self.inner);
        totals.0[series as usize].count()
    }
}

/// Cumulative counts of one series.
#[derive(Clone)]
struct Total {
    buckets: Vec<u64>,
    sum_ns: u64,
}

impl Default for Total {
    fn default() -> Self {
        Self {
            buckets: vec![0; BUCKETS],
            sum_ns: 0,
        }
    }
}

impl Total {
    fn add(&mut self, c: &Counts) {
        for (t, b) in self.buckets.iter_mut().zip(c.buckets.iter()) {
            *t += b.load(Relaxed);
        }
        self.sum_ns = self.sum_ns.wrapping_add(c.sum_ns.load(Relaxed));
    }

    /// Adds `other`'s counts and sum (another set's totals) to these.
    fn merge(&mut self, other: &Total) {
        for (t, n) in self.buckets.iter_mut().zip(&other.buckets) {
            *t += n;
        }
        self.sum_ns = self.sum_ns.wrapping_add(other.sum_ns);
    }

    fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The `q` quantile of the samples counted, in seconds (`None` without samples).
    fn quantile(&self, q: f64) -> Option<f64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        // The rank of the sample wanted, 1-based: the first for 0, the last for 1.
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        self.buckets.iter().enumerate().find_map(|(i, n)| {
            seen += n;
            (seen >= rank).then(|| value(i) / 1e9)
        })
    }
}

/// Every series' cumulative counts.
#[derive(Clone, Default)]
struct Totals([Total; 3]);

impl Totals {
    fn add(&mut self, set: &Inner) {
        let stripes = lock(&set.stripes);
        for stripe in stripes.iter().map(Arc::as_ref).chain([&set.shared]) {
            for (t, c) in self.0.iter_mut().zip(&stripe.0) {
                t.add(c);
            }
        }
    }
}

/// Writes summaries of `sets` (added up) to `out`: per series the quantiles over the window
/// (each set's samples since its oldest snapshot), the sum and the count since the start.
fn render(sets: &[Arc<Inner>], out: &mut String) {
    let mut now = Totals::default();
    let mut window = Totals::default();
    for set in sets {
        let mut current = Totals::default();
        current.add(set);
        let snapshots = lock(&set.snapshots);
        let base = snapshots.0.front();
        for (i, c) in current.0.iter().enumerate() {
            let since = base.map(|b| &b.0[i]);
            for (j, n) in c.buckets.iter().enumerate() {
                window.0[i].buckets[j] += n - since.map_or(0, |b| b.buckets[j].min(*n));
            }
            now.0[i].merge(c);
        }
    }
    for (i, name) in SERIES.iter().enumerate() {
        let help = crate::metrics::SERIES
            .iter()
            .find(|s| s.name == *name)
            .map_or("", |s| s.help);
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} summary");
        for (q, label) in QUANTILES {
            match window.0[i].quantile(q) {
                Some(v) => {
                    let _ = writeln!(out, "{name}{{quantile=\"{label}\"}} {v}");
                }
                None => {
                    let _ = writeln!(out, "{name}{{quantile=\"{label}\"}} NaN");
                }
            }
        }
        let sum = now.0[i].sum_ns as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {}", now.0[i].count());
    }
}

/// Writes the summaries of every live proxy's latency series (added up) to `out` in the
/// Prometheus text format: quantiles 0, 0.5, 0.9, 0.95, 0.99, 0.999 and 1 over the last 40 to
/// 60 seconds (since the start in a proxy's first 40 s), `NaN` when there were no samples; the
/// sum and count since the start. Nothing when no proxy lives.
pub fn render_summaries(out: &mut String) {
    let live: Vec<Arc<Inner>> = {
        let mut live = lock(&LIVE);
        live.retain(|w| w.strong_count() > 0);
        live.iter().filter_map(Weak::upgrade).collect()
    };
    if !live.is_empty() {
        render(&live, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_values_fall_in_their_own() {
        let mut last = 0;
        for ns in 0..100_000u64 {
            let b = bucket(ns);
            assert!(b >= last, "{ns}: bucket {b} below {last}");
            last = b;
        }
        for ns in (0..64).map(|s| 1u64 << s).chain([u64::MAX]) {
            assert!(bucket(ns) < BUCKETS, "{ns}");
        }
        for ns in [1u64, 15, 16, 17, 100, 1_000, 123_456, 9_999_999, 1 << 40] {
            let v = value(bucket(ns));
            let err = (v - ns as f64).abs() / ns as f64;
            assert!(err <= 1.0 / 32.0 + 1e-9, "{ns} read back as {v}");
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    /// `set`'s summaries alone (other tests' sets live in the process too).
    fn page(set: &LatencySet) -> String {
        let mut out = String::new();
        render(&[Arc::clone(&set.inner)], &mut out);
        out
    }

    /// The value of `line` (`name{quantile="q"}` or `name_count`) in `text`, the last block
    /// rendered for it.
    fn read(text: &str, line: &str) -> String {
        text.lines()
            .filter_map(|l| l.strip_prefix(line)?.strip_prefix(' '))
            .next_back()
            .unwrap_or_else(|| panic!("{line} in {text}"))
            .to_owned()
    }

    #[test]
    fn threads_record_into_stripes_that_add_up_and_outlive_them() {
        let set = LatencySet::new();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let set = set.clone();
                s.spawn(move || {
                    for i in 0..1_000 {
                        set.record(Series::Hold, Duration::from_micros(10 + t + i % 3));
                    }
                });
            }
        });
        assert_eq!(set.count(Series::Hold), 4_000);
        assert_eq!(set.count(Series::Upstream), 0);
        // The exited threads' stripes went back to the free list: the next threads reuse
        // them instead of adding more.
        let before = lock(&set.inner.stripes).len();
        std::thread::scope(|s| {
            for _ in 0..2 {
                let set = set.clone();
                s.spawn(move || set.record(Series::Hold, Duration::from_micros(1)));
            }
        });
        assert_eq!(lock(&set.inner.stripes).len(), before);
        assert_eq!(set.count(Series::Hold), 4_002);
    }

    #[test]
    fn summaries_give_quantiles_over_the_last_minute_and_totals_since_the_start() {
        let set = LatencySet::new();
        let t0 = Instant::now();
        // The sweep's first tick comes at the start, before any sample.
        set.tick(t0);
        for ms in 1..=100u64 {
            set.record(Series::Observer, Duration::from_millis(ms));
        }
        let quantile = |text: &str, q: &str| -> f64 {
            read(
                text,
                &format!("fqdnd_dns_observer_seconds{{quantile=\"{q}\"}}"),
            )
            .parse()
            .unwrap()
        };
        let first = page(&set);
        assert!(first.contains("# TYPE fqdnd_dns_observer_seconds summary"));
        let p50 = quantile(&first, "0.5");
        assert!((p50 - 0.050).abs() <= 0.050 / 32.0, "p50 {p50}");
        let max = quantile(&first, "1");
        assert!((max - 0.100).abs() <= 0.100 / 32.0, "max {max}");
        // Ticks in between: a tick sooner than 20 s after the last takes no snapshot.
        for s in [5, 20, 40, 60] {
            set.tick(t0 + Duration::from_secs(s));
        }
        assert_eq!(lock(&set.inner.snapshots).0.len(), SNAPSHOTS);
        // A minute on, ten slow samples: the window holds them only.
        for _ in 0..10 {
            set.record(Series::Observer, Duration::from_secs(2));
        }
        let later = page(&set);
        let p0 = quantile(&later, "0");
        assert!(
            (p0 - 2.0).abs() <= 2.0 / 32.0,
            "p0 {p0}: the old samples left the window"
        );
        assert_eq!(read(&later, "fqdnd_dns_observer_seconds_count"), "110");
        let sum: f64 = read(&later, "fqdnd_dns_observer_seconds_sum")
            .parse()
            .unwrap();
        assert!((sum - 25.05).abs() < 1e-9, "the exact sum: {sum}");
        // A minute with nothing: no quantile, the count stays.
        for s in [80, 100, 120] {
            set.tick(t0 + Duration::from_secs(s));
        }
        let idle = page(&set);
        assert_eq!(
            read(&idle, "fqdnd_dns_observer_seconds{quantile=\"0.99\"}"),
            "NaN"
        );
        assert_eq!(read(&idle, "fqdnd_dns_observer_seconds_count"), "110");
        assert_eq!(read(&idle, "fqdnd_dns_hold_seconds_count"), "0");
    }

    #[test]
    fn the_process_render_adds_up_the_live_sets_and_forgets_dropped_ones() {
        let (a, b) = (LatencySet::new(), LatencySet::new());
        a.record(Series::Upstream, Duration::from_millis(1));
        b.record(Series::Upstream, Duration::from_millis(1));
        let count = |text: &str| -> u64 {
            read(text, "fqdnd_dns_upstream_latency_seconds_count")
                .parse()
                .unwrap()
        };
        let mut out = String::new();
        render_summaries(&mut out);
        // Other tests' sets may live too: at least these two samples.
        let both = count(&out);
        assert!(both >= 2, "{out}");
        assert!(!lock(&LIVE).iter().all(|w| w.strong_count() == 0));
        let weak = Arc::downgrade(&a.inner);
        drop(a);
        assert_eq!(weak.strong_count(), 0, "the render holds no set");
    }
}
