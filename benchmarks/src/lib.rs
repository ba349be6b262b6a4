//! Shared fixtures for fqdnd's benchmarks: synthetic selector sets, names and addresses, so
//! each benchmark states its workload once.

#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr};

/// A mixed set of `n` FQDN patterns: half exact names, 40 % `*.suffix`, 10 % general
/// patterns (a `*` inside a label, a leading `**.`, or a `*` prefix).
pub fn mixed_selectors(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| match i % 10 {
            0..=4 => format!("host{i}.svc{}.example.com", i % 97),
            5..=8 => format!("*.tenant{i}.example.net"),
            _ => match i % 3 {
                0 => format!("api-*.region{i}.example.org"),
                1 => format!("**.zone{i}.corp.example"),
                _ => format!("*cdn{i}.example.io"),
            },
        })
        .collect()
}

/// Names to look up against [`mixed_selectors`]: one hit of each kind and a miss, canonical.
pub fn probe_names(n: usize) -> [(&'static str, String); 4] {
    // Indices from the middle of the set, one of each kind (see `mixed_selectors`).
    let base = n / 2 - (n / 2) % 10;
    let (exact, suffix, general) = (base, base + 5, base + 9);
    [
        (
            "exact",
            format!("host{exact}.svc{}.example.com.", exact % 97),
        ),
        ("suffix", format!("bucket.tenant{suffix}.example.net.")),
        ("general", general_name(general)),
        ("miss", "www.not-selected.example.".to_owned()),
    ]
}

fn general_name(i: usize) -> String {
    match i % 3 {
        0 => format!("api-eu.region{i}.example.org."),
        1 => format!("a.b.zone{i}.corp.example."),
        _ => format!("edgecdn{i}.example.io."),
    }
}

/// The `i`-th address of a large IPv4 pool (never repeats below 2^32).
pub fn addr(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0b00_0000_u32.wrapping_add(i)))
}

/// Resident set size of this process in bytes, from /proc/self/status.
pub fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// CPU time this thread has run, from /proc/thread-self/schedstat (nanoseconds): on a shared
/// machine, what a phase cost without the time spent waiting for a CPU.
pub fn thread_cpu() -> Option<std::time::Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = stat.split_whitespace().next()?.parse().ok()?;
    Some(std::time::Duration::from_nanos(ns))
}
