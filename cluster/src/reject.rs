//! Records refused as they are read ([`Rejections`]): anything under the cluster's prefix
//! that is not a well-formed record of the layout — a value that does not parse, a key and
//! value that disagree, a number out of range, a key outside the layout. A refused record is
//! never applied; it is counted by kind and its key logged once, so a flood of writes to one
//! bad key (or a watch that keeps delivering it) costs a counter, not a log line each.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::store::Revision;

/// Keys remembered as logged; beyond, a summary line at each power of two of the unlogged.
const REMEMBERED: usize = 4096;

/// What kind of record was refused (the `kind` label of
/// `fqdnd_cluster_records_rejected_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RecordKind {
    /// `identities/id/<n>` or `identities/labels/<labels>`.
    Identity,
    /// `endpoints/<labels>/<node>/<id>`.
    Endpoint,
    /// `nodes/<node>`.
    Node,
    /// `policies/<name>` (a value that is not text; a document that does not load is counted
    /// by the daemon, which loads it).
    Policy,
    /// `operator/leader` and `operator/next`.
    Operator,
    /// An HA gateway group's learned answers, `<prefix>-learned/<group>/…`
    /// ([`learned`](crate::learned)).
    Learned,
    /// A key under the prefix that is not the layout's.
    Key,
}

impl RecordKind {
    /// The name used in metrics and `fqdnd status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Identity => "identity",
            Self::Endpoint => "endpoint",
            Self::Node => "node",
            Self::Policy => "policy",
            Self::Operator => "operator",
            Self::Learned => "learned",
            Self::Key => "key",
        }
    }
}

impl fmt::Display for RecordKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Refused records: counts by kind, and which keys were logged.
#[derive(Debug, Clone, Default)]
pub struct Rejections {
    counts: BTreeMap<RecordKind, u64>,
    /// Key → the revision of the version last counted.
    seen: HashMap<String, Revision>,
    /// Rejections of keys not remembered (the memory is full).
    unremembered: u64,
}

impl Rejections {
    /// Refuses the version of `key` written at `revision` (0 if unknown): counted once per
    /// version, logged once per key.
    pub fn reject(&mut self, kind: RecordKind, key: &str, revision: Revision, reason: &str) {
        let room = self.seen.len() < REMEMBERED;
        match self.seen.get_mut(key) {
            Some(last) if *last == revision && revision != 0 => {}
            Some(last) => {
                *last = revision;
                *self.counts.entry(kind).or_default() += 1;
            }
            None if room => {
                self.seen.insert(key.to_owned(), revision);
                *self.counts.entry(kind).or_default() += 1;
                tracing::warn!(kind = %kind, key = %printable(key), reason, "a record in the cluster store is refused (logged once per key; counted in fqdnd_cluster_records_rejected_total)");
            }
            None => {
                *self.counts.entry(kind).or_default() += 1;
                self.unremembered += 1;
                if self.unremembered.is_power_of_two() {
                    tracing::warn!(kind = %kind, key = %printable(key), reason, unlogged = self.unremembered, "records in the cluster store are refused (too many keys to log each)");
                }
            }
        }
    }

    /// Rejections so far, by kind.
    pub fn counts(&self) -> &BTreeMap<RecordKind, u64> {
        &self.counts
    }

    /// All rejections so far.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }
}

/// `key` for a log line: at most 200 characters, control characters escaped (a key is any
/// bytes a writer chose).
fn printable(key: &str) -> String {
    let mut out: String = key.chars().take(200).flat_map(char::escape_debug).collect();
    if key.chars().count() > 200 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_version_counts_once_and_memory_is_bounded() {
        let mut r = Rejections::default();
        r.reject(RecordKind::Identity, "/p/identities/id/00300", 5, "bad");
        r.reject(RecordKind::Identity, "/p/identities/id/00300", 5, "bad");
        assert_eq!(r.total(), 1);
        r.reject(RecordKind::Identity, "/p/identities/id/00300", 6, "bad");
        assert_eq!(r.counts()[&RecordKind::Identity], 2);
        for i in 0..REMEMBERED + 10 {
            r.reject(RecordKind::Key, &format!("/p/x/{i}"), 1, "outside");
        }
        assert_eq!(r.seen.len(), REMEMBERED);
        assert_eq!(r.counts()[&RecordKind::Key], (REMEMBERED + 10) as u64);
        assert_eq!(printable("a\nb"), "a\\nb");
    }
}
