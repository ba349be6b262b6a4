//! Shared by the replay tests: fixture paths and the independent oracle.

#![allow(dead_code, reason = "each test file uses a different part")]

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData};

pub(crate) fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub(crate) fn fixture(rel: &str) -> PathBuf {
    fixtures().join(rel)
}

/// Every capture under `tests/fixtures`, sorted.
pub(crate) fn all_fixtures() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in std::fs::read_dir(fixtures()).unwrap() {
        let dir = dir.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&dir).unwrap() {
            let f = f.unwrap().path();
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            if name.ends_with(".pcap") || name.ends_with(".pcapng") {
                out.push(f);
            }
        }
    }
    out.sort();
    out
}

pub(crate) fn policy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/policies/fixtures.yaml")
}

/// The selector patterns of `tests/policies/fixtures.yaml`, canonical.
pub(crate) const PATTERNS: [&str; 6] = [
    "*",
    "*.com.",
    "google.com.",
    "**.amazonaws.com.",
    "*.icanhazip.com.",
    "*.s3.amazonaws.com.",
];

/// A name as fqdnd would store it, or `None` if it would refuse it (the rules of
/// `namemgr::name`, written again here from RFC 1035 and the doc).
fn canonical(name: &Name) -> Option<String> {
    let mut out = String::new();
    let mut wire = 1;
    for label in name.iter() {
        if label.is_empty() || label.len() > 63 {
            return None;
        }
        wire += label.len() + 1;
        for &b in label {
            let b = b.to_ascii_lowercase();
            if !(b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_') {
                return None;
            }
            out.push(char::from(b));
        }
        out.push('.');
    }
    (!out.is_empty() && wire <= 255).then_some(out)
}

/// One answer as the oracle reads it.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) at: Duration,
    pub(crate) name: String,
    pub(crate) addrs: Vec<IpAddr>,
    pub(crate) ttl: u32,
}

/// Reads a DNS response with hickory-proto and follows its CNAME chain the way Cilium's proxy
/// does: every A/AAAA/CNAME record of class IN must lie on the chain from the question; the
/// addresses are those of the chain's last name; the TTL is the minimum over those records.
/// `None` for anything the engine would not learn from.
pub(crate) fn oracle_answer(bytes: &[u8]) -> Option<(String, Vec<IpAddr>, u32)> {
    let msg = Message::from_vec(bytes).ok()?;
    if msg.metadata.message_type != MessageType::Response
        || msg.metadata.op_code != OpCode::Query
        || msg.metadata.response_code != ResponseCode::NoError
        || msg.queries.len() != 1
    {
        return None;
    }
    let lower = |n: &Name| n.to_lowercase().to_ascii().trim_end_matches('.').to_owned();
    let question = lower(&msg.queries[0].name);
    let records: Vec<_> = msg
        .answers
        .iter()
        .filter(|r| r.dns_class == DNSClass::IN)
        .filter(|r| matches!(r.data, RData::A(_) | RData::AAAA(_) | RData::CNAME(_)))
        .collect();
    let mut chain = vec![question.clone()];
    loop {
        let last = chain.last().unwrap().clone();
        let next = records.iter().find_map(|r| match &r.data {
            RData::CNAME(c) if lower(&r.name) == last => Some(lower(&c.0)),
            _ => None,
        });
        match next {
            Some(n) if !chain.contains(&n) && chain.len() <= 16 => chain.push(n),
            Some(_) => return None,
            None => break,
        }
    }
    let end = chain.last().unwrap().clone();
    let mut addrs = Vec::new();
    let mut ttl = None::<u32>;
    for r in &records {
        if !chain.contains(&lower(&r.name)) {
            return None;
        }
        ttl = Some(ttl.map_or(r.ttl, |t| t.min(r.ttl)));
        let addr = match &r.data {
            RData::A(a) => IpAddr::V4(a.0),
            RData::AAAA(a) => IpAddr::V6(a.0),
            _ => continue,
        };
        if lower(&r.name) == end && !addrs.contains(&addr) {
            addrs.push(addr);
        }
    }
    if addrs.is_empty() {
        return None;
    }
    let name = canonical(&msg.queries[0].name)?;
    Some((name, addrs, ttl.unwrap_or(0)))
}

/// Every learnable answer of a capture on the engine's clock (seconds since the first frame,
/// never going back), with the time of the last frame.
pub(crate) fn oracle_trace(path: &Path, ports: &[u16]) -> (Vec<Seen>, Duration) {
    let bytes = std::fs::read(path).unwrap();
    let mut first = None;
    let mut last = Duration::ZERO;
    let mut reader = fqdnd_replay::CaptureReader::new(std::io::Cursor::new(bytes.clone())).unwrap();
    let _ = reader.for_each(|f| {
        first.get_or_insert(f.ts);
        last = last.max(f.ts);
    });
    let origin = first.unwrap_or_default();
    let mut now = Duration::ZERO;
    let mut seen = Vec::new();
    let _ = fqdnd_replay::extract_bytes(&bytes, ports, &mut |p| {
        now = now.max(p.ts.saturating_sub(origin));
        if let Some((name, addrs, ttl)) = oracle_answer(p.bytes) {
            seen.push(Seen {
                at: now,
                name,
                addrs,
                ttl,
            });
        }
    });
    (seen, now.max(last.saturating_sub(origin)))
}

/// What the engine must hold at the end of a replay of `seen` (a GC pass at `end`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Expected {
    pub(crate) cache_names: usize,
    pub(crate) cache_ips: usize,
    pub(crate) selected_ips: usize,
    pub(crate) label_sets: usize,
    pub(crate) identities_selector: usize,
    pub(crate) identities_per_ip: usize,
}

pub(crate) fn expected(seen: &[Seen], end: Duration, min_ttl: u32, patterns: &[&str]) -> Expected {
    let selectors: Vec<fqdnd_namemgr::FqdnSelector> = patterns
        .iter()
        .map(|p| fqdnd_namemgr::FqdnSelector::match_pattern(p).unwrap())
        .collect();
    // Latest expiry of each (name, IP): alive at the end iff it is after the last GC.
    let mut expiry: HashMap<(String, IpAddr), u64> = HashMap::new();
    for s in seen {
        for a in &s.addrs {
            let e = s.at.as_secs() + u64::from(s.ttl.max(min_ttl));
            let slot = expiry.entry((s.name.clone(), *a)).or_insert(0);
            *slot = (*slot).max(e);
        }
    }
    let end = end.as_secs();
    let mut labels_of_ip: HashMap<IpAddr, BTreeSet<usize>> = HashMap::new();
    let mut names = HashSet::new();
    for ((name, ip), e) in &expiry {
        if *e <= end {
            continue;
        }
        names.insert(name.clone());
        let labels = labels_of_ip.entry(*ip).or_default();
        for (i, sel) in selectors.iter().enumerate() {
            if sel.matches(name) {
                labels.insert(i);
            }
        }
    }
    let cache_ips = labels_of_ip.len();
    let selected: Vec<(&IpAddr, &BTreeSet<usize>)> =
        labels_of_ip.iter().filter(|(_, l)| !l.is_empty()).collect();
    let label_sets: HashSet<&BTreeSet<usize>> = selected.iter().map(|(_, l)| *l).collect();
    // Identities: the pre-allocated {S, world-v4/v6} plus one per (label set, family).
    let mut identities: HashSet<(BTreeSet<usize>, bool)> = HashSet::new();
    for i in 0..selectors.len() {
        identities.insert(([i].into(), true));
        identities.insert(([i].into(), false));
    }
    for (ip, l) in &selected {
        identities.insert(((*l).clone(), ip.is_ipv4()));
    }
    Expected {
        cache_names: names.len(),
        cache_ips,
        selected_ips: selected.len(),
        label_sets: label_sets.len(),
        identities_selector: identities.len(),
        // Cilium ≤ 1.15 had no selector identities: per IP, nothing is pre-allocated.
        identities_per_ip: selected.len(),
    }
}
