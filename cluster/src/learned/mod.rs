//! A highly available gateway group (docs/ha-gateway.md): what each gateway's DNS answers
//! taught, shared through the store so that a peer enforces it too.
//!
//! - **Keys.** `<p>-learned/<group>/<gateway>/<client>/<name>` → [`LearnedRecord`] (JSON),
//!   under a sibling of the cluster prefix (the node side's watch of `<p>/` never sees them),
//!   each part percent-encoded outside `A-Z a-z 0-9 . _ -`. One key per gateway, client group
//!   and name: peers never overwrite each other; an importer takes the union.
//! - **Leases.** A key lives under the lease of its expiry bucket ([`ShareConfig::bucket`]
//!   wide), granted to end one bucket after the bucket's end: entries expire on their own, and
//!   outlive the gateway that wrote them (a gateway joining later still imports them).
//! - **Publishing** ([`publish`]): answers come over a channel; the first of a batch starts a
//!   [`ShareConfig::batch_delay`] timer; the batch is merged by key and written in
//!   transactions of at most [`MAX_TXN_OPS`] operations. A key whose addresses and bucket were
//!   already written is skipped. On a store error the pending set is kept (bounded) and
//!   retried with backoff. `fqdnd cache forget` goes the same way ([`Publish::Forget`]): the
//!   group's keys carrying what is forgotten are deleted or rewritten without it.
//! - **Importing** ([`import`]): a range of the group's keys, then a watch after it. Every
//!   value is checked against its key and its own fields and clamped to this gateway's bounds
//!   ([`Group`]); what is refused is counted and logged once per key. Valid records (but this
//!   gateway's own, once running) go to a [`LearnedSink`] — the daemon's engine, which applies
//!   its own policy and breakers. A key deleted (or rewritten without some addresses, or
//!   overwritten with something invalid) before its record expired is a **revocation**: what
//!   only it carried is forgotten ([`Revocation`]). After every read of the whole group (at
//!   start, after a reconnection) the live answers this gateway holds that no key carries are
//!   published again ([`Group::missing`]).
//!
//! The wall clock comes through [`Wall`] (records carry wall-clock milliseconds: monotonic
//! clocks differ between hosts); timers run on tokio's clock.

mod group;
mod import;
mod publish;
mod reject;

use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::keys::Layout;

pub use group::{Applied, Group};
pub use import::{Importer, import, import_all};
pub use publish::{Forget, Publish, Publisher, Revoked, publish, revoke};
pub use reject::Rejection;

/// etcd's default `--max-txn-ops`: the most operations one transaction may carry.
pub const MAX_TXN_OPS: usize = 128;

/// What one gateway learned from one answer, as published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LearnedRecord {
    /// The canonical name asked.
    pub name: String,
    /// The client group (ClientGroup name) that asked.
    pub client: String,
    /// The addresses learned (sorted, distinct).
    pub addrs: Vec<IpAddr>,
    /// The TTL as held (the answer's, raised to the gateway's minimum).
    pub ttl: u32,
    /// Wall-clock milliseconds of the answer.
    pub learned_ms: u64,
    /// Wall-clock milliseconds when it expires (`learned_ms + ttl`).
    pub expires_ms: u64,
    /// The gateway that learned it.
    pub gateway: String,
}

/// A wall clock (Unix milliseconds).
pub trait Wall: Send + Sync + 'static {
    /// Now, in milliseconds since the Unix epoch.
    fn unix_ms(&self) -> u64;
}

/// A valid record of the group, as this gateway may hold it: what the importer hands its
/// [`LearnedSink`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    /// The client group's name.
    pub client: String,
    /// The canonical name.
    pub name: String,
    /// The addresses (sorted, distinct).
    pub addrs: Vec<IpAddr>,
    /// When it expires here, wall-clock milliseconds: the record's own expiry, never past
    /// [`ShareConfig::max_ttl`] after its answer nor after now.
    pub expires_ms: u64,
    /// When its gateway learned it (its wall clock).
    pub learned_ms: u64,
    /// The gateway that learned it.
    pub gateway: String,
}

/// What a key deleted (or rewritten without some addresses) before its record expired takes
/// away: what no other live key of the group carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    /// The client group's name.
    pub client: String,
    /// The canonical name.
    pub name: String,
    /// Addresses of the name no live key of the group carries any more (for any client
    /// group): forgotten for everyone (the DNS cache is shared).
    pub addrs: Vec<IpAddr>,
    /// Whether no live key carries the name for this client group any more: the group's
    /// record of the name goes too.
    pub record: bool,
}

/// A live answer a gateway holds: a name a client group has a record of, with the name's
/// live addresses and their expiries (wall-clock milliseconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The client group's name.
    pub client: String,
    /// The canonical name.
    pub name: String,
    /// Its live addresses, each with its expiry.
    pub addrs: Vec<(IpAddr, u64)>,
}

/// The gateway's engine, as the importer uses it.
pub trait LearnedSink: Send + Sync + 'static {
    /// Learns `records`; returns how many were imported (the rest were refused by the local
    /// policy or breakers, or named an unknown client group). Called from a blocking thread,
    /// one call at a time.
    fn import(&self, records: &[Import]) -> usize;
    /// Forgets what `revocations` take away (at once, not as zombies). Called as
    /// [`LearnedSink::import`] is.
    fn revoke(&self, revocations: &[Revocation]);
    /// The live answers the gateway holds (learned or imported), to publish those the
    /// group lacks. Called as [`LearnedSink::import`] is.
    fn held(&self) -> Vec<Held>;
}

/// How a gateway shares its answers.
#[derive(Debug, Clone)]
pub struct ShareConfig {
    /// This gateway's name.
    pub gateway: String,
    /// The group it shares with.
    pub group: String,
    /// The cluster's key layout.
    pub layout: Layout,
    /// How long a batch collects after its first answer.
    pub batch_delay: Duration,
    /// The width of an expiry bucket (one lease per bucket).
    pub bucket: Duration,
    /// The most keys waiting to be written (more are dropped and counted).
    pub max_pending: usize,
    /// The longest an imported record is held here, seconds: past its answer and past now
    /// (the gateway's answer-cache `maxTTL`, else a day).
    pub max_ttl: u32,
    /// How far ahead of this gateway's clock a record's answer may be (clock offset between
    /// the gateways); a record learned later than that is refused.
    pub max_skew: Duration,
    /// The largest value accepted under a key (more is refused unread).
    pub max_value: usize,
}

impl ShareConfig {
    /// The defaults of docs/ha-gateway.md: 5 ms batches, 30 s buckets, 65,536 pending keys,
    /// imports held a day at most, 60 s of clock offset, values of at most 256 KiB.
    pub fn new(gateway: &str, group: &str, layout: Layout) -> Self {
        Self {
            gateway: gateway.to_owned(),
            group: group.to_owned(),
            layout,
            batch_delay: Duration::from_millis(5),
            bucket: Duration::from_secs(30),
            max_pending: 65_536,
            max_ttl: 86_400,
            max_skew: Duration::from_secs(60),
            max_value: 256 << 10,
        }
    }

    /// `<p>-learned/<group>/`: every record of the group.
    pub fn group_prefix(&self) -> String {
        format!("{}-learned/{}/", self.layout.prefix(), encode(&self.group))
    }

    /// The key of a record of this gateway.
    pub fn key(&self, client: &str, name: &str) -> String {
        self.key_of(&self.gateway, client, name)
    }

    /// The key of a record of `gateway`.
    pub fn key_of(&self, gateway: &str, client: &str, name: &str) -> String {
        format!(
            "{}{}/{}/{}",
            self.group_prefix(),
            encode(gateway),
            encode(client),
            encode(name)
        )
    }

    /// A key of the group as (gateway, client, name), if it is one: three parts after the
    /// group's prefix, each as [`encode`] writes it (and nothing else) and not empty.
    pub fn parse_key(&self, key: &str) -> Option<(String, String, String)> {
        let rest = key.strip_prefix(&self.group_prefix())?;
        let mut parts = rest.split('/');
        let (gateway, client, name) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        Some((decode(gateway)?, decode(client)?, decode(name)?))
    }
}

/// `s` with every byte outside `A-Z a-z 0-9 . _ -` as `%XX`.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// What [`encode`] made `part` from, if it made it (non-empty UTF-8; `%XX` only where
/// [`encode`] writes one, in capitals).
pub fn decode(part: &str) -> Option<String> {
    let bytes = part.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while let Some(&b) = bytes.get(at) {
        if b == b'%' {
            let hex = bytes.get(at + 1..at + 3)?;
            if !hex
                .iter()
                .all(|h| h.is_ascii_digit() || (b'A'..=b'F').contains(h))
            {
                return None;
            }
            let value = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
            out.push(value);
            at += 3;
        } else {
            out.push(b);
            at += 1;
        }
    }
    let decoded = String::from_utf8(out).ok()?;
    (!decoded.is_empty() && encode(&decoded) == part).then_some(decoded)
}

/// What sharing reports (`fqdnd status`, metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ShareStatus {
    /// The group.
    pub group: String,
    /// Whether writes succeed: false from a failed write until one succeeds (a gateway that
    /// has nothing to write is not failing; [`ShareStatus::new`] starts it true).
    pub publishing: bool,
    /// Whether the import watch runs.
    pub importing: bool,
    /// Whether the first import (before serving) completed.
    pub initial_import_done: bool,
    /// Records written.
    pub published: u64,
    /// Transactions written.
    pub transactions: u64,
    /// Keys waiting to be written.
    pub pending: usize,
    /// Answers dropped (the pending set or the channel was full).
    pub dropped: u64,
    /// The last batch's publication lag (its oldest answer to the commit), in milliseconds.
    pub publish_lag_ms: u64,
    /// The largest publication lag seen, in milliseconds.
    pub publish_lag_max_ms: u64,
    /// Live answers published again because the group lacked them (after a read of the
    /// whole group: at start, after a reconnection).
    pub republished: u64,
    /// Records imported into the engine.
    pub imported: u64,
    /// Records the engine refused (unknown client group, refused name, breakers, expired).
    pub import_refused: u64,
    /// Values under the group's keys refused before the engine saw them (outside the key
    /// layout, oversized, not a record, a key and value that disagree, fields that
    /// disagree, an answer from the future): `fqdnd_cluster_records_rejected_total{kind="learned"}`.
    pub rejected: u64,
    /// Revocations applied (keys deleted or rewritten before their record expired).
    pub revoked: u64,
    /// The last import of new records: from the oldest one's answer to the end of its
    /// import into the engine (wall clocks), in milliseconds. Records read again (at start,
    /// after a reconnection) that had not changed are not new.
    pub import_lag_ms: u64,
    /// The largest import lag seen, in milliseconds.
    pub import_lag_max_ms: u64,
    /// The import of the group's state at start: records read.
    pub startup_records: u64,
    /// The import at start: how long the read and the import took, in milliseconds.
    pub startup_import_ms: u64,
    /// `fqdnd cache forget`s whose keys wait for the store.
    pub forgets_pending: usize,
    /// The last error.
    pub last_error: Option<String>,
}

impl ShareStatus {
    /// The status of a gateway of `group` that has not done anything yet.
    pub fn new(group: &str) -> Self {
        Self {
            group: group.to_owned(),
            publishing: true,
            ..Self::default()
        }
    }
}

/// An answer to publish, from the proxy's observer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The client group's name.
    pub client: String,
    /// The canonical name.
    pub name: String,
    /// The addresses learned.
    pub addrs: Vec<IpAddr>,
    /// The TTL as held.
    pub ttl: u32,
    /// Wall-clock milliseconds of the answer.
    pub learned_ms: u64,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
