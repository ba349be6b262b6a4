//! Memory per cached (name, IP) entry and the cost of a full GC pass.
//!
//! `cargo run --release -p fqdnd-benchmarks --bin cache_memory -- [ENTRIES] [IPS_PER_NAME]
//! [restore]` (defaults: 1,000,000 entries, 10 IPs per name; `restore`: fill the cache as a
//! restart does, every answer in one `NameManager::restore` call, instead of answer by
//! answer). Fills the engine (NameManager + IpCache,
//! every name selected, the datapath counting only — in production its maps live in the
//! kernel), reads VmRSS before and after, then times three GC passes: one that keeps
//! everything, one where a tenth of the names (TTL 60 s) expire, and one where the rest expire.
//! Each phase prints its wall time and the thread's CPU time (/proc/thread-self/schedstat):
//! on a shared machine the CPU time is the figure to compare.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "benchmark fixtures are fixed; a failure should stop the run"
)]
#![allow(clippy::disallowed_types, reason = "a benchmark measures wall time")]

use std::time::{Duration, Instant};

use fqdnd_benchmarks::{addr, rss_bytes, thread_cpu};

/// Wall and CPU time of a phase.
struct Phase {
    wall: Instant,
    cpu: Duration,
}

impl Phase {
    fn start() -> Self {
        Self {
            cpu: thread_cpu().unwrap_or_default(),
            wall: Instant::now(),
        }
    }

    /// `wall (cpu)` in milliseconds.
    fn ms(&self) -> String {
        let wall = self.wall.elapsed();
        let cpu = thread_cpu().unwrap_or_default().saturating_sub(self.cpu);
        format!(
            "{:.1} ms (cpu {:.1} ms)",
            wall.as_secs_f64() * 1e3,
            cpu.as_secs_f64() * 1e3
        )
    }
}
use fqdnd_ipcache::{CountingDatapath, EndpointId, IpCache};
use fqdnd_namemgr::{Config, FqdnSelector, NameManager, Restore};
use std::net::IpAddr;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let entries: u32 = args
        .get(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let per_name: u32 = args
        .get(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10)
        .max(1);
    let restore = args.get(3).is_some_and(|a| a == "restore");
    let mut ipcache = IpCache::new(
        fqdnd_ipcache::Config::default(),
        CountingDatapath::default(),
    );
    let config = Config {
        max_names_per_endpoint: usize::MAX,
        max_cache_entries: usize::MAX,
        ..Config::default()
    };
    let mut names = NameManager::new(config);
    let selector = FqdnSelector::match_pattern("*.s3.amazonaws.com").expect("valid pattern");
    names
        .set_selectors(&[selector], Duration::ZERO, &mut ipcache)
        .expect("selectors");
    let now = Duration::from_secs(1);
    let name_list: Vec<String> = (0..entries.div_ceil(per_name))
        .map(|i| format!("bucket{i}.s3.amazonaws.com"))
        .collect();
    let before = rss_bytes().unwrap_or(0);
    let start = Phase::start();
    let ips_of = |n: usize| {
        let first = n as u32 * per_name;
        (first..(first + per_name).min(entries)).map(addr)
    };
    let ttl_of = |n: usize| if n.is_multiple_of(10) { 60 } else { 300 };
    if restore {
        // As a restart learns its state directory again: every answer in one call.
        let all: Vec<Vec<IpAddr>> = (0..name_list.len()).map(|n| ips_of(n).collect()).collect();
        let answers: Vec<Restore<'_>> = name_list
            .iter()
            .zip(&all)
            .enumerate()
            .map(|(n, (name, addrs))| Restore {
                endpoint: EndpointId(1),
                name,
                addrs,
                ttl: ttl_of(n),
            })
            .collect();
        let start = Phase::start();
        let stats = names
            .restore(answers.as_slice(), now, &mut ipcache, |a, e| {
                panic!("{}: {e}", a.name)
            })
            .expect("restore");
        ipcache.commit().expect("commit");
        println!("restore: {} ({:?})", start.ms(), stats.one_by_one);
    } else {
        let mut ips = Vec::with_capacity(per_name as usize);
        for (n, name) in name_list.iter().enumerate() {
            ips.clear();
            ips.extend(ips_of(n));
            names
                .observe(EndpointId(1), name, &ips, ttl_of(n), now, &mut ipcache)
                .expect("learn");
            ipcache.commit().expect("commit");
        }
    }
    let fill_wall = start.wall.elapsed();
    let fill = start.ms();
    let after = rss_bytes().unwrap_or(0);
    let mappings = names.mapping_count();
    assert_eq!(mappings, entries as usize);
    let none = |_: IpAddr| false;
    let start = Phase::start();
    let kept = names.gc(now, &none, &mut ipcache).expect("gc");
    ipcache.commit().expect("commit");
    let gc_keep = start.ms();
    assert_eq!(kept.released, 0);
    let start = Phase::start();
    let tenth = names
        .gc(now + Duration::from_secs(61), &none, &mut ipcache)
        .expect("gc");
    ipcache.commit().expect("commit");
    let gc_tenth = start.ms();
    let start = Phase::start();
    let rest = names
        .gc(now + Duration::from_secs(301), &none, &mut ipcache)
        .expect("gc");
    ipcache.commit().expect("commit");
    let gc_rest = start.ms();
    assert_eq!(tenth.released + rest.released, entries as usize);
    assert_eq!(names.mapping_count(), 0);
    println!(
        "entries: {entries} ({per_name} IPs per name, {} names)",
        name_list.len()
    );
    println!(
        "fill: {fill}, {:.0} ns per entry (wall)",
        fill_wall.as_nanos() as f64 / f64::from(entries)
    );
    println!(
        "rss growth: {:.1} MiB = {:.0} bytes per entry",
        (after - before) as f64 / 1048576.0,
        (after - before) as f64 / f64::from(entries)
    );
    println!("gc pass, nothing expired: {gc_keep}");
    println!(
        "gc pass, a tenth expired and released ({} entries): {gc_tenth}",
        tenth.released
    );
    println!(
        "gc pass, the rest expired and released ({} entries): {gc_rest}",
        rest.released
    );
}
