//! The answer cache (dnsdist's packet cache, Blocky's cache): validated upstream answers kept
//! as bytes and served again until their TTL runs out, with the TTLs decremented.
//!
//! What the proxy guarantees around it (see `proxy::admit` and `proxy::hold`):
//! - the query's verdict runs first: a name the client may not ask is refused whatever the
//!   cache holds, and a rate-limited client is limited before the cache is asked;
//! - an answer served from the cache is shown to the [`crate::ResponseObserver`] like an
//!   upstream answer, with its remaining TTLs, and held until the observer is done (or the
//!   `response_max_delay` fallback): its IPs are in the datapath before the reply leaves;
//! - only answers released as `answered` (the observer succeeded) are stored.
//!
//! The key is what the answer depends on: the question (canonical name, type, class), the
//! query's EDNS state (OPT present, DO bit), its CD bit, its size class (UDP ≤ 512, ≤ 1232,
//! larger, or TCP) and the policy's tag (the client group or endpoint). The tag is in the key
//! although the upstream answers every group alike: a group is only ever served answers
//! fetched for its own queries, so one group cannot learn through the cache (its TTLs, its
//! speed) what another asked, and nothing one group's view of DNS holds reaches another when
//! their views come to differ. The price is one entry per group and question.
//!
//! TTLs (RFC 2308 for negative answers):
//! - a positive answer's records are stored with their TTLs raised to `min_ttl` and cut to
//!   `max_ttl`; the entry lives as long as the smallest of them;
//! - NXDOMAIN, and NOERROR without answer records (NODATA), are cached for the smaller of the
//!   SOA record's TTL and its MINIMUM field, at most `max_negative_ttl`, and not at all
//!   without an SOA in the authority section; their records' TTLs are cut to that lifetime;
//! - served answers carry each TTL minus the entry's age in whole seconds; an entry is never
//!   served once its lifetime has passed;
//! - not cached: other RCODEs, TC=1, a TTL of 0, a message with TSIG or SIG(0), a message
//!   that does not walk (a record running past the end).
//!
//! Bounded by `max_entries` (quick_cache: sharded, S3-FIFO eviction, lookups by a borrowed
//! key so a hit allocates nothing); evictions are counted.

use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::{Counter, Gauge};
use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Equivalent, Lifecycle, OptionsBuilder, UnitWeighter};
use tokio::time::Instant;

use crate::policy::Transport;
use crate::question::Question;
use crate::wire;

/// The answer cache's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Entries kept at most; past it the least useful go (S3-FIFO).
    pub max_entries: usize,
    /// Record TTLs below this are raised to it (seconds).
    pub min_ttl: u32,
    /// Record TTLs above this are cut to it (seconds).
    pub max_ttl: u32,
    /// Negative answers (NXDOMAIN, NODATA) are kept at most this long (seconds).
    pub max_negative_ttl: u32,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            max_entries: 10_000,
            min_ttl: 0,
            max_ttl: 86_400,
            max_negative_ttl: 3_600,
        }
    }
}

/// The answer cache's counters, for [`crate::ProxyStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Entries held now.
    pub entries: usize,
    /// Entries held at most.
    pub capacity: usize,
    /// Allowed queries answered from the cache.
    pub hits: u64,
    /// Allowed queries the cache could not answer (forwarded).
    pub misses: u64,
    /// Answers stored.
    pub inserts: u64,
    /// Entries pushed out to make room.
    pub evictions: u64,
    /// Entries found expired (dropped, counted as misses too).
    pub expired: u64,
}

/// Bits of [`Key::flags`].
mod flag {
    pub(super) const EDNS: u8 = 1;
    pub(super) const DO: u8 = 2;
    pub(super) const CD: u8 = 4;
    /// Two bits: the size class.
    pub(super) const SIZE_SHIFT: u8 = 3;
}

/// The query's flags that the answer depends on (see the module doc).
pub(crate) fn key_flags(
    query: &[u8],
    edns: Option<bool>,
    udp_limit: u16,
    transport: Transport,
) -> u8 {
    let mut flags = 0;
    if let Some(dnssec_ok) = edns {
        flags |= flag::EDNS;
        if dnssec_ok {
            flags |= flag::DO;
        }
    }
    if query.get(3).is_some_and(|b| b & 0x10 != 0) {
        flags |= flag::CD;
    }
    let size: u8 = match transport {
        Transport::Tcp | Transport::Dot | Transport::Doh => 3,
        Transport::Udp if udp_limit <= 512 => 0,
        Transport::Udp if udp_limit <= 1232 => 1,
        Transport::Udp => 2,
    };
    flags | (size << flag::SIZE_SHIFT)
}

/// A stored entry's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Key {
    name: Box<str>,
    qtype: u16,
    qclass: u16,
    flags: u8,
    tag: u64,
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_ref().hash(state);
    }
}

impl Key {
    fn as_ref(&self) -> KeyRef<'_> {
        KeyRef {
            name: &self.name,
            qtype: self.qtype,
            qclass: self.qclass,
            flags: self.flags,
            tag: self.tag,
        }
    }
}

/// A key for a lookup, borrowing the query's name (no allocation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct KeyRef<'a> {
    /// Canonical question name.
    pub(crate) name: &'a str,
    pub(crate) qtype: u16,
    pub(crate) qclass: u16,
    /// From [`key_flags`].
    pub(crate) flags: u8,
    /// The policy's tag.
    pub(crate) tag: u64,
}

impl Equivalent<Key> for KeyRef<'_> {
    fn equivalent(&self, key: &Key) -> bool {
        *self == key.as_ref()
    }
}

impl KeyRef<'_> {
    fn to_owned_key(self) -> Key {
        Key {
            name: self.name.into(),
            qtype: self.qtype,
            qclass: self.qclass,
            flags: self.flags,
            tag: self.tag,
        }
    }
}

/// One cached answer.
#[derive(Debug)]
pub(crate) struct Entry {
    /// The answer, ID 0, TTLs as clamped when stored.
    bytes: Box<[u8]>,
    /// Where the question ends in `bytes`.
    question_end: usize,
    /// Offset of every TTL field (OPT excluded) and the TTL stored there.
    ttls: Box<[(u32, u32)]>,
    stored: Instant,
    lifetime: Duration,
    /// The upstream that gave it.
    pub(crate) upstream: SocketAddr,
}

impl Entry {
    fn expired(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.stored) >= self.lifetime
    }

    /// Whole seconds since the entry was stored.
    fn age(&self, now: Instant) -> u32 {
        let age = now.saturating_duration_since(self.stored).as_secs();
        u32::try_from(age).unwrap_or(u32::MAX)
    }
}

/// Counts evictions.
#[derive(Clone)]
struct Evictions {
    count: Arc<AtomicU64>,
    metric: Counter,
}

impl Lifecycle<Key, Arc<Entry>> for Evictions {
    type RequestState = ();

    fn begin_request(&self) -> Self::RequestState {}

    fn on_evict(&self, (): &mut Self::RequestState, _key: Key, _val: Arc<Entry>) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.metric.increment(1);
    }
}

/// The metric handles of the cache.
pub(crate) struct CacheMetrics {
    pub(crate) hits: Counter,
    pub(crate) misses: Counter,
    pub(crate) inserts: Counter,
    pub(crate) evictions: Counter,
    pub(crate) expired: Counter,
    pub(crate) entries: Gauge,
}

/// The answer cache.
pub(crate) struct AnswerCache {
    config: CacheConfig,
    map: Cache<Key, Arc<Entry>, UnitWeighter, DefaultHashBuilder, Evictions>,
    hits: AtomicU64,
    misses: AtomicU64,
    inserts: AtomicU64,
    expired: AtomicU64,
    evictions: Arc<AtomicU64>,
    metrics: CacheMetrics,
}

impl AnswerCache {
    pub(crate) fn new(config: CacheConfig, metrics: CacheMetrics) -> Self {
        // Few shards for a small cache: each shard holds an equal share of the bound, so the
        // bound is rounded down to a multiple of the shards (never above `max_entries`).
        let shards = (config.max_entries / 1024).clamp(1, 64).next_power_of_two();
        let capacity = (config.max_entries / shards * shards).max(1);
        let evictions = Arc::new(AtomicU64::new(0));
        let options = OptionsBuilder::new()
            .estimated_items_capacity(capacity)
            .weight_capacity(u64::try_from(capacity).unwrap_or(u64::MAX))
            .shards(shards)
            .build();
        let lifecycle = Evictions {
            count: evictions.clone(),
            metric: metrics.evictions.clone(),
        };
        let map = match options {
            Ok(options) => Cache::with_options(
                options,
                UnitWeighter,
                DefaultHashBuilder::default(),
                lifecycle,
            ),
            Err(_) => Cache::with(
                capacity,
                u64::try_from(capacity).unwrap_or(u64::MAX),
                UnitWeighter,
                DefaultHashBuilder::default(),
                lifecycle,
            ),
        };
        Self {
            config,
            map,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            inserts: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            evictions,
            metrics,
        }
    }

    /// The live entry for `key`, counted as a hit; `None` (a miss) if there is none or it
    /// expired (then it is dropped).
    pub(crate) fn lookup(&self, key: &KeyRef<'_>, now: Instant) -> Option<Arc<Entry>> {
        match self.map.get(key) {
            Some(entry) if !entry.expired(now) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                self.metrics.hits.increment(1);
                Some(entry)
            }
            found => {
                if let Some(old) = found {
                    // Only this entry: a fresh one stored meanwhile stays.
                    self.map.remove_if(key, |e| Arc::ptr_eq(e, &old));
                    self.expired.fetch_add(1, Ordering::Relaxed);
                    self.metrics.expired.increment(1);
                    self.sample_len();
                }
                self.misses.fetch_add(1, Ordering::Relaxed);
                self.metrics.misses.increment(1);
                None
            }
        }
    }

    /// Writes `entry` as the reply to a query with ID `client_id` whose question is
    /// `question` (the client's bytes, its case): TTLs decremented by the entry's age. `false`
    /// if the question does not fit (it always does for an entry found by the query's key).
    pub(crate) fn serve(
        entry: &Entry,
        now: Instant,
        question: &[u8],
        client_id: u16,
        out: &mut Vec<u8>,
    ) -> bool {
        if entry.question_end != wire::HEADER_LEN + question.len() {
            return false;
        }
        out.clear();
        out.extend_from_slice(&entry.bytes);
        wire::set_id(out, client_id);
        out[wire::HEADER_LEN..entry.question_end].copy_from_slice(question);
        let age = entry.age(now);
        for &(offset, ttl) in &entry.ttls {
            let at = offset as usize;
            if let Some(field) = out.get_mut(at..at + 4) {
                field.copy_from_slice(&ttl.saturating_sub(age).to_be_bytes());
            }
        }
        true
    }

    /// Stores `answer` (a validated answer from `upstream`, its question in the client's
    /// case) under `key`, if it is cacheable; returns whether it was stored.
    pub(crate) fn insert(
        &self,
        key: KeyRef<'_>,
        answer: &[u8],
        upstream: SocketAddr,
        now: Instant,
    ) -> bool {
        let Some(plan) = plan(answer, &self.config) else {
            return false;
        };
        let mut bytes: Box<[u8]> = answer[..plan.end].into();
        wire::set_id(&mut bytes, 0);
        for &(offset, ttl) in &plan.ttls {
            let at = offset as usize;
            bytes[at..at + 4].copy_from_slice(&ttl.to_be_bytes());
        }
        let entry = Entry {
            bytes,
            question_end: plan.question_end,
            ttls: plan.ttls.into_boxed_slice(),
            stored: now,
            lifetime: Duration::from_secs(u64::from(plan.lifetime)),
            upstream,
        };
        self.map.insert(key.to_owned_key(), Arc::new(entry));
        self.inserts.fetch_add(1, Ordering::Relaxed);
        self.metrics.inserts.increment(1);
        self.sample_len();
        true
    }

    fn sample_len(&self) {
        #[allow(clippy::cast_precision_loss, reason = "a gauge")]
        self.metrics.entries.set(self.map.len() as f64);
    }

    pub(crate) fn stats(&self) -> CacheStats {
        CacheStats {
            entries: self.map.len(),
            capacity: usize::try_from(self.map.capacity()).unwrap_or(usize::MAX),
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            inserts: self.inserts.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            expired: self.expired.load(Ordering::Relaxed),
        }
    }
}

/// How an answer is stored: its TTL fields with their clamped values, its lifetime.
#[derive(Debug, PartialEq, Eq)]
struct Plan {
    question_end: usize,
    /// The message's end (bytes after the last record are not kept).
    end: usize,
    ttls: Vec<(u32, u32)>,
    lifetime: u32,
}

const TYPE_SOA: u16 = 6;
const TYPE_SIG: u16 = 24;
const TYPE_OPT: u16 = 41;
const TYPE_TSIG: u16 = 250;

/// Whether and how `answer` is cached (see the module doc for the rules).
fn plan(answer: &[u8], config: &CacheConfig) -> Option<Plan> {
    let header = answer.get(..wire::HEADER_LEN)?;
    let (flags, flags2) = (header[2], header[3]);
    let opcode = (flags >> 3) & 0x0f;
    if flags & 0x80 == 0 || opcode != 0 || flags & 0x02 != 0 || wire::qdcount(answer) != 1 {
        return None;
    }
    let rcode = flags2 & 0x0f;
    let count = |i: usize| u16::from_be_bytes([header[i], header[i + 1]]);
    let (an, ns, ar) = (count(6), count(8), count(10));
    let negative = match rcode {
        0 => an == 0,
        3 => true,
        _ => return None,
    };
    let question_end = Question::parse(answer)?.end();
    let mut pos = question_end;
    let mut ttls = Vec::with_capacity(usize::from(an) + usize::from(ns) + usize::from(ar));
    let mut negative_ttl: Option<u32> = None;
    for i in 0..u32::from(an) + u32::from(ns) + u32::from(ar) {
        let in_authority = i >= u32::from(an) && i < u32::from(an) + u32::from(ns);
        pos = wire::skip_name(answer, pos)?;
        let fixed = answer.get(pos..pos + 10)?;
        let rtype = u16::from_be_bytes([fixed[0], fixed[1]]);
        let ttl = u32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]);
        let rdlen = usize::from(u16::from_be_bytes([fixed[8], fixed[9]]));
        let rdata = answer.get(pos + 10..pos + 10 + rdlen)?;
        if matches!(rtype, TYPE_TSIG | TYPE_SIG) && !in_authority && i >= u32::from(an) {
            return None;
        }
        if rtype != TYPE_OPT {
            let offset = u32::try_from(pos + 4).ok()?;
            ttls.push((offset, ttl));
        }
        if negative && in_authority && rtype == TYPE_SOA && rdata.len() >= 20 {
            let m = &rdata[rdata.len() - 4..];
            let minimum = u32::from_be_bytes([m[0], m[1], m[2], m[3]]);
            negative_ttl = Some(ttl.min(minimum));
        }
        pos += 10 + rdlen;
    }
    let lifetime = if negative {
        let lifetime = negative_ttl?.min(config.max_negative_ttl);
        for (_, ttl) in &mut ttls {
            *ttl = (*ttl).min(lifetime);
        }
        lifetime
    } else {
        let mut lifetime = u32::MAX;
        for (_, ttl) in &mut ttls {
            *ttl = (*ttl).max(config.min_ttl).min(config.max_ttl);
            lifetime = lifetime.min(*ttl);
        }
        lifetime
    };
    if lifetime == 0 || ttls.is_empty() {
        return None;
    }
    Some(Plan {
        question_end,
        end: pos,
        ttls,
        lifetime,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Message;

    /// An answer to `name. A` (ID 0x1234) with `records` A records (TTL `ttl`, 192.0.2.i).
    pub(crate) fn a_answer(name: &[u8], records: u8, ttl: u32) -> Vec<u8> {
        let mut m = vec![0x12, 0x34, 0x81, 0x80, 0, 1, 0, records, 0, 0, 0, 0];
        m.extend_from_slice(name);
        m.extend_from_slice(&[0, 1, 0, 1]);
        for i in 0..records {
            m.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
            m.extend_from_slice(&ttl.to_be_bytes());
            m.extend_from_slice(&[0, 4, 192, 0, 2, i]);
        }
        m
    }

    /// NXDOMAIN for `name. A` with an SOA (TTL `soa_ttl`, MINIMUM `minimum`) and an OPT record.
    fn nxdomain(name: &[u8], soa_ttl: u32, minimum: u32) -> Vec<u8> {
        let mut m = vec![0x12, 0x34, 0x81, 0x83, 0, 1, 0, 0, 0, 1, 0, 1];
        m.extend_from_slice(name);
        m.extend_from_slice(&[0, 1, 0, 1]);
        // SOA owned by the root: mname ".", rname ".", 5 numbers.
        m.extend_from_slice(&[0, 0, 6, 0, 1]);
        m.extend_from_slice(&soa_ttl.to_be_bytes());
        m.extend_from_slice(&[0, 22, 0, 0]);
        for n in [1u32, 2, 3, 4, minimum] {
            m.extend_from_slice(&n.to_be_bytes());
        }
        m.extend_from_slice(&[0, 0, 41, 4, 0xd0, 0, 0, 0x80, 0, 0, 0]);
        m
    }

    fn ttls_of(msg: &[u8]) -> Vec<u32> {
        let config = CacheConfig {
            min_ttl: 0,
            max_ttl: u32::MAX,
            max_negative_ttl: u32::MAX,
            ..CacheConfig::default()
        };
        plan(msg, &config)
            .map(|p| {
                p.ttls
                    .iter()
                    .map(|&(o, _)| {
                        let o = o as usize;
                        u32::from_be_bytes([msg[o], msg[o + 1], msg[o + 2], msg[o + 3]])
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn cache(config: CacheConfig) -> AnswerCache {
        AnswerCache::new(
            config,
            CacheMetrics {
                hits: Counter::noop(),
                misses: Counter::noop(),
                inserts: Counter::noop(),
                evictions: Counter::noop(),
                expired: Counter::noop(),
                entries: Gauge::noop(),
            },
        )
    }

    fn key(name: &str, tag: u64) -> KeyRef<'_> {
        KeyRef {
            name,
            qtype: 1,
            qclass: 1,
            flags: 0,
            tag,
        }
    }

    const UPSTREAM: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
        std::net::Ipv4Addr::new(192, 0, 2, 53),
        53,
    ));

    #[test]
    fn positive_ttls_are_clamped_and_the_entry_lives_as_long_as_the_smallest() {
        let msg = a_answer(b"\x01a\x00", 2, 30);
        let config = CacheConfig {
            min_ttl: 60,
            max_ttl: 600,
            ..CacheConfig::default()
        };
        let p = plan(&msg, &config).unwrap();
        assert_eq!(p.lifetime, 60, "raised to min_ttl");
        assert_eq!(p.ttls.len(), 2);
        let long = a_answer(b"\x01a\x00", 1, 100_000);
        assert_eq!(
            plan(&long, &config).unwrap().lifetime,
            600,
            "cut to max_ttl"
        );
        let zero = a_answer(b"\x01a\x00", 1, 0);
        assert!(
            plan(&zero, &CacheConfig::default()).is_none(),
            "TTL 0: not cached"
        );
    }

    #[test]
    fn negative_answers_live_min_of_soa_ttl_and_minimum_bounded() {
        let config = CacheConfig {
            max_negative_ttl: 3600,
            ..CacheConfig::default()
        };
        let p = plan(&nxdomain(b"\x01a\x00", 900, 300), &config).unwrap();
        assert_eq!(p.lifetime, 300, "SOA MINIMUM below its TTL");
        let p = plan(&nxdomain(b"\x01a\x00", 120, 300), &config).unwrap();
        assert_eq!(p.lifetime, 120, "SOA TTL below MINIMUM");
        let p = plan(&nxdomain(b"\x01a\x00", 90_000, 90_000), &config).unwrap();
        assert_eq!(p.lifetime, 3600, "bounded by max_negative_ttl");
        assert_eq!(p.ttls.len(), 1, "the OPT record has no TTL");
        // NXDOMAIN without an SOA: not cached (RFC 2308 §5).
        let mut bare = vec![0x12, 0x34, 0x81, 0x83, 0, 1, 0, 0, 0, 0, 0, 0];
        bare.extend_from_slice(b"\x01a\x00\x00\x01\x00\x01");
        assert!(plan(&bare, &config).is_none());
        // SERVFAIL, TC=1: never.
        let mut servfail = a_answer(b"\x01a\x00", 1, 60);
        servfail[3] = 0x82;
        assert!(plan(&servfail, &config).is_none());
        let mut tc = a_answer(b"\x01a\x00", 1, 60);
        tc[2] |= 0x02;
        assert!(plan(&tc, &config).is_none());
        // A record running past the end: not cached.
        let msg = a_answer(b"\x01a\x00", 1, 60);
        assert!(plan(&msg[..msg.len() - 1], &config).is_none());
    }

    #[test]
    fn served_answers_have_the_client_id_and_case_and_decremented_ttls() {
        let c = cache(CacheConfig::default());
        let t0 = Instant::now();
        assert!(c.insert(key("a.", 1), &a_answer(b"\x01a\x00", 2, 100), UPSTREAM, t0));
        assert!(c.lookup(&key("a.", 2), t0).is_none(), "another tag");
        let entry = c.lookup(&key("a.", 1), t0).unwrap();
        let mut out = Vec::new();
        let question = b"\x01A\x00\x00\x01\x00\x01";
        assert!(AnswerCache::serve(
            &entry,
            t0 + Duration::from_millis(41_900),
            question,
            0x4242,
            &mut out
        ));
        assert_eq!(&out[..2], &[0x42, 0x42]);
        assert_eq!(&out[12..12 + question.len()], question);
        assert_eq!(ttls_of(&out), vec![59, 59], "100 s less 41 whole seconds");
        assert!(
            c.lookup(&key("a.", 1), t0 + Duration::from_secs(100))
                .is_none(),
            "expired at its lifetime"
        );
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.expired, s.entries), (1, 2, 1, 0));
    }

    #[test]
    fn served_bytes_carry_the_clients_id_and_ttls_less_the_age() {
        let c = cache(CacheConfig::default());
        let mut decoder = fqdnd_dnswire::Decoder::new();
        let t0 = Instant::now();
        let answers = [
            (key("a.", 1), a_answer(b"\x01a\x00", 3, 100)),
            (key("b.", 1), nxdomain(b"\x01b\x00", 900, 300)),
        ];
        for (k, answer) in &answers {
            assert!(c.insert(*k, answer, UPSTREAM, t0));
            let entry = c.lookup(k, t0).unwrap();
            let question = Question::parse(answer).unwrap().bytes(answer).to_vec();
            let now = t0 + Duration::from_millis(61_500);
            let mut out = Vec::new();
            assert!(AnswerCache::serve(&entry, now, &question, 0x4242, &mut out));
            let served = decoder.decode_whole(&out).unwrap();
            assert_eq!(served.header.id, 0x4242);
            assert!(served.answers.iter().all(|r| r.ttl == 100 - 61));
            let stored = Message::from_vec(answer).unwrap();
            let parsed = Message::from_vec(&out).unwrap();
            assert_eq!(parsed.answers.len(), stored.answers.len());
            assert_eq!(parsed.authorities.len(), stored.authorities.len());
        }
    }

    #[test]
    fn the_bound_holds_and_evictions_are_counted() {
        let c = cache(CacheConfig {
            max_entries: 100,
            ..CacheConfig::default()
        });
        let t0 = Instant::now();
        let names: Vec<String> = (0..1000).map(|i| format!("h{i}.")).collect();
        for (i, name) in names.iter().enumerate() {
            let mut wire_name = vec![u8::try_from(name.len() - 1).unwrap()];
            wire_name.extend_from_slice(&name.as_bytes()[..name.len() - 1]);
            wire_name.push(0);
            assert!(c.insert(key(name, 1), &a_answer(&wire_name, 1, 60), UPSTREAM, t0));
            assert!(c.stats().entries <= 100, "after {i} inserts");
        }
        let s = c.stats();
        assert_eq!(s.inserts, 1000);
        assert!(s.evictions >= 900, "{s:?}");
        assert_eq!(s.entries as u64 + s.evictions, 1000);
    }
}
