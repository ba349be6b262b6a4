//! [`Group`]: the group's records as one gateway's importer sees them — each value checked
//! against its key and its own fields and clamped to the gateway's bounds before anything is
//! imported; deletes (and rewrites) turned into revocations of what nothing else carries; and
//! what the gateway holds that no key carries.
//!
//! Trust: a value is what anyone with write access to etcd put there. A valid record only
//! ever adds what the importing gateway's own policy and breakers allow (the sink checks),
//! for no longer than its own fields say and the gateway's `max_ttl` allows; everything else
//! is refused, counted and logged once per key; a key that loses its valid record before it
//! expires takes away what only it carried (fail closed).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use super::reject::{Rejection, cut};
use super::{Answer, Held, Import, LearnedRecord, Revocation, ShareConfig};
use crate::reject::{RecordKind, Rejections};
use crate::store::{Event, Kv, Revision, Snapshot, WatchBatch};

/// A valid record of the group.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    gateway: String,
    client: String,
    name: String,
    /// Sorted, distinct.
    addrs: Vec<IpAddr>,
    learned_ms: u64,
    /// As written.
    expires_ms: u64,
    /// As held here: clamped to the gateway's bounds when it was read.
    until_ms: u64,
    mod_revision: Revision,
}

/// What the importer does after a batch of changes (or a read of the whole group).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Valid records to import.
    pub imports: Vec<Import>,
    /// The oldest answer among the new records imported (wall-clock milliseconds): the
    /// import lag is measured from it. `None`: nothing new (a read at start, or of records
    /// that had not changed).
    pub new_since_ms: Option<u64>,
    /// What keys deleted or rewritten before their record expired take away.
    pub revocations: Vec<Revocation>,
    /// This gateway's own keys deleted or rewritten by someone else: the publisher forgets
    /// it wrote them (a later answer writes them again).
    pub unwritten: Vec<String>,
    /// Values refused.
    pub rejected: u64,
}

/// A key's record going away (deleted, rewritten with fewer addresses, or overwritten with
/// something invalid).
#[derive(Debug)]
struct Gone {
    client: String,
    name: String,
    addrs: Vec<IpAddr>,
    until_ms: u64,
}

/// The group's records as one gateway sees them.
#[derive(Debug)]
pub struct Group {
    config: ShareConfig,
    entries: BTreeMap<String, Entry>,
    /// Name → keys with a valid record of it.
    by_name: HashMap<String, BTreeSet<String>>,
    /// Refusals: counted once per version of a key (a read of the whole group does not count
    /// an unchanged one again), logged once per key.
    rejections: Rejections,
    /// The last revision applied (0: nothing read yet).
    revision: Revision,
}

impl Group {
    /// Nothing read yet.
    pub fn new(config: ShareConfig) -> Self {
        Self {
            config,
            entries: BTreeMap::new(),
            by_name: HashMap::new(),
            rejections: Rejections::default(),
            revision: 0,
        }
    }

    /// The group's sharing configuration.
    pub fn config(&self) -> &ShareConfig {
        &self.config
    }

    /// The revision of the last read or change applied.
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// Valid records held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Checks `kv` against its key and its own fields, and clamps it.
    fn validate(&self, kv: &Kv, now_ms: u64) -> Result<Entry, Rejection> {
        let (gateway, client, name) = self.config.parse_key(&kv.key).ok_or(Rejection::Layout)?;
        if kv.value.len() > self.config.max_value {
            return Err(Rejection::Oversized {
                bytes: kv.value.len(),
                limit: self.config.max_value,
            });
        }
        let r: LearnedRecord = serde_json::from_slice(&kv.value)
            .map_err(|e| Rejection::Malformed(cut(&e.to_string())))?;
        for (field, key, value) in [
            ("gateway", &gateway, &r.gateway),
            ("client", &client, &r.client),
            ("name", &name, &r.name),
        ] {
            if key != value {
                return Err(Rejection::Mismatch {
                    field,
                    value: cut(value),
                });
            }
        }
        if r.addrs.is_empty() {
            return Err(Rejection::NoAddresses);
        }
        let expiry = Rejection::Expiry {
            learned_ms: r.learned_ms,
            ttl: r.ttl,
            expires_ms: r.expires_ms,
        };
        if r.learned_ms.checked_add(u64::from(r.ttl) * 1000) != Some(r.expires_ms) {
            return Err(expiry);
        }
        let skew = super::millis(self.config.max_skew);
        if r.learned_ms > now_ms.saturating_add(skew) {
            return Err(Rejection::Future {
                ahead_ms: r.learned_ms - now_ms,
                allowed_ms: skew,
            });
        }
        let max_ms = u64::from(self.config.max_ttl) * 1000;
        let until_ms = r
            .learned_ms
            .saturating_add(u64::from(r.ttl).min(u64::from(self.config.max_ttl)) * 1000)
            .min(now_ms.saturating_add(max_ms));
        let mut addrs = r.addrs;
        addrs.sort_unstable();
        addrs.dedup();
        Ok(Entry {
            gateway,
            client,
            name,
            addrs,
            learned_ms: r.learned_ms,
            expires_ms: r.expires_ms,
            until_ms,
            mod_revision: kv.mod_revision,
        })
    }

    fn insert(&mut self, key: &str, entry: Entry) -> Option<Entry> {
        self.by_name
            .entry(entry.name.clone())
            .or_default()
            .insert(key.to_owned());
        self.entries.insert(key.to_owned(), entry)
    }

    fn remove(&mut self, key: &str) -> Option<Entry> {
        let entry = self.entries.remove(key)?;
        if let Some(keys) = self.by_name.get_mut(&entry.name) {
            keys.remove(key);
            if keys.is_empty() {
                self.by_name.remove(&entry.name);
            }
        }
        Some(entry)
    }

    /// Applies a change of `key`: its new value (`None`: deleted).
    fn change(
        &mut self,
        key: &str,
        kv: Option<&Kv>,
        now_ms: u64,
        (import_own, new): (bool, bool),
        applied: &mut Applied,
        gone: &mut Vec<Gone>,
    ) {
        let old = self.remove(key);
        let own = old
            .as_ref()
            .is_some_and(|e| e.gateway == self.config.gateway);
        let gone_all = |e: &Entry| Gone {
            client: e.client.clone(),
            name: e.name.clone(),
            addrs: e.addrs.clone(),
            until_ms: e.until_ms,
        };
        let Some(kv) = kv else {
            if let Some(old) = old {
                gone.push(gone_all(&old));
                if own {
                    applied.unwritten.push(key.to_owned());
                }
            }
            return;
        };
        match self.validate(kv, now_ms) {
            Err(why) => {
                let before = self.rejections.total();
                self.rejections
                    .reject(RecordKind::Learned, key, kv.mod_revision, &why.to_string());
                applied.rejected += self.rejections.total() - before;
                // What was valid under the key is gone: the key holds nothing valid now.
                if let Some(old) = old {
                    gone.push(gone_all(&old));
                    if own {
                        applied.unwritten.push(key.to_owned());
                    }
                }
            }
            Ok(entry) => {
                if let Some(old) = &old
                    && old.learned_ms == entry.learned_ms
                    && old.expires_ms == entry.expires_ms
                {
                    // The same answer with addresses taken out: an edit (`cache forget`),
                    // not a newer answer (which replaces addresses without revoking them).
                    let removed: Vec<IpAddr> = old
                        .addrs
                        .iter()
                        .filter(|a| entry.addrs.binary_search(a).is_err())
                        .copied()
                        .collect();
                    if !removed.is_empty() {
                        gone.push(Gone {
                            client: old.client.clone(),
                            name: old.name.clone(),
                            addrs: removed,
                            until_ms: old.until_ms,
                        });
                        if own {
                            applied.unwritten.push(key.to_owned());
                        }
                    }
                }
                let unchanged = old
                    .as_ref()
                    .is_some_and(|o| o.mod_revision == entry.mod_revision);
                let mine = entry.gateway == self.config.gateway;
                if entry.until_ms > now_ms && (!mine || import_own) {
                    if new && !unchanged && entry.mod_revision > self.revision {
                        applied.new_since_ms = Some(
                            applied
                                .new_since_ms
                                .map_or(entry.learned_ms, |m| m.min(entry.learned_ms)),
                        );
                    }
                    applied.imports.push(Import {
                        client: entry.client.clone(),
                        name: entry.name.clone(),
                        addrs: entry.addrs.clone(),
                        expires_ms: entry.until_ms,
                        learned_ms: entry.learned_ms,
                        gateway: entry.gateway.clone(),
                    });
                }
                self.insert(key, entry);
            }
        }
    }

    /// Whether a live record of the group carries `addr` for `name` (any client group).
    fn carried(&self, name: &str, addr: IpAddr, now_ms: u64) -> bool {
        self.live_of(name, now_ms)
            .any(|e| e.addrs.binary_search(&addr).is_ok())
    }

    fn live_of<'a>(&'a self, name: &str, now_ms: u64) -> impl Iterator<Item = &'a Entry> + 'a {
        self.by_name
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(|k| self.entries.get(k))
            .filter(move |e| e.until_ms > now_ms)
    }

    /// What the records gone take away, against the records left: nothing for a record
    /// that had expired anyway (a lease running out deletes keys after their records
    /// expired).
    fn revocations(&self, gone: Vec<Gone>, now_ms: u64) -> Vec<Revocation> {
        let mut out: BTreeMap<(String, String), Revocation> = BTreeMap::new();
        for g in gone {
            if g.until_ms <= now_ms {
                continue;
            }
            let addrs: Vec<IpAddr> = g
                .addrs
                .iter()
                .filter(|a| !self.carried(&g.name, **a, now_ms))
                .copied()
                .collect();
            let record = !self.live_of(&g.name, now_ms).any(|e| e.client == g.client);
            if addrs.is_empty() && !record {
                continue;
            }
            let r = out
                .entry((g.client.clone(), g.name.clone()))
                .or_insert_with(|| Revocation {
                    client: g.client,
                    name: g.name,
                    addrs: Vec::new(),
                    record: false,
                });
            r.addrs.extend(addrs);
            r.addrs.sort_unstable();
            r.addrs.dedup();
            r.record |= record;
        }
        out.into_values().collect()
    }

    /// Applies a watch batch (its records are new: their lag is measured).
    pub fn apply(&mut self, batch: &WatchBatch, now_ms: u64) -> Applied {
        let mut applied = Applied::default();
        let mut gone = Vec::new();
        for event in &batch.events {
            match event {
                Event::Put(kv) => self.change(
                    &kv.key,
                    Some(kv),
                    now_ms,
                    (false, true),
                    &mut applied,
                    &mut gone,
                ),
                Event::Delete { key, .. } => {
                    self.change(key, None, now_ms, (false, true), &mut applied, &mut gone);
                }
            }
        }
        applied.revocations = self.revocations(gone, now_ms);
        self.revision = self.revision.max(batch.revision);
        applied
    }

    /// Replaces the view with a read of the whole group: keys gone since the last read are
    /// deletes, the others changes. `start`: the gateway's first read — its own records are
    /// imported too (what it learned before a restart), and nothing is new (the start-up
    /// import is reported apart). Later reads (after a reconnection): records changed since
    /// the last revision seen are new.
    pub fn reload(&mut self, snapshot: &Snapshot, now_ms: u64, start: bool) -> Applied {
        let mut applied = Applied::default();
        let mut gone = Vec::new();
        let present: HashSet<&str> = snapshot.kvs.iter().map(|kv| kv.key.as_str()).collect();
        let vanished: Vec<String> = self
            .entries
            .keys()
            .filter(|k| !present.contains(k.as_str()))
            .cloned()
            .collect();
        for key in vanished {
            self.change(&key, None, now_ms, (start, !start), &mut applied, &mut gone);
        }
        let before = self.revision;
        for kv in &snapshot.kvs {
            self.change(
                &kv.key,
                Some(kv),
                now_ms,
                (start, !start && before > 0),
                &mut applied,
                &mut gone,
            );
        }
        applied.revocations = self.revocations(gone, now_ms);
        self.revision = snapshot.revision;
        applied
    }

    /// The live answers in `held` that no live record of the group carries, as answers this
    /// gateway publishes again: per client group and name, the addresses missing (a name's
    /// address any record carries, for any client group, is not missing) with the addresses
    /// this gateway's own record of them still carries, until the latest expiry among them.
    pub fn missing(&self, held: &[Held], now_ms: u64) -> Vec<Answer> {
        let mut out = Vec::new();
        for h in held {
            let lacking: Vec<(IpAddr, u64)> = h
                .addrs
                .iter()
                .filter(|(addr, until)| *until > now_ms && !self.carried(&h.name, *addr, now_ms))
                .copied()
                .collect();
            let Some(latest) = lacking.iter().map(|(_, until)| *until).max() else {
                continue;
            };
            let mut addrs: Vec<IpAddr> = lacking.iter().map(|(a, _)| *a).collect();
            let mut until = latest;
            if let Some(own) = self.entries.get(&self.config.key(&h.client, &h.name))
                && own.until_ms > now_ms
            {
                addrs.extend(own.addrs.iter().copied());
                until = until.max(own.until_ms);
            }
            addrs.sort_unstable();
            addrs.dedup();
            let ttl = until.saturating_sub(now_ms).div_ceil(1000);
            out.push(Answer {
                client: h.client.clone(),
                name: h.name.clone(),
                addrs,
                ttl: u32::try_from(ttl)
                    .unwrap_or(u32::MAX)
                    .min(self.config.max_ttl),
                learned_ms: now_ms,
            });
        }
        out
    }
}
