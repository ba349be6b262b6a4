//! Restored answers kept flat: every name in one string, every address in one vector, each
//! answer a few integers into them. A million-name snapshot is read into three allocations
//! instead of three per name (its name, endpoints and addresses), and the restore borrows
//! from them.
//!
//! The snapshot is decoded straight into this form ([`ReadSnapshot`]): the same layout
//! [`Snapshot`](super::Snapshot) writes, read with serde seeds that append to the flat
//! vectors.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::fmt;
use std::net::IpAddr;
use std::thread::JoinHandle;

use fqdnd_ipcache::EndpointId;
use fqdnd_namemgr::{RestoreRoom, Sizes};
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, SeqAccess, Visitor};

mod forgets;
pub(crate) use forgets::Forgot;

/// One restored answer, borrowed from [`Answers`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoredAnswer<'a> {
    /// The endpoint or client group that asked.
    pub endpoint: EndpointId,
    /// The canonical name.
    pub name: &'a str,
    /// Its addresses.
    pub addrs: &'a [IpAddr],
    /// When they expire, in milliseconds since the Unix epoch.
    pub expires_unix_ms: u64,
}

/// Answers to learn again, in journal order.
#[derive(Debug, Default, Clone)]
pub struct Answers {
    names: String,
    addrs: Vec<IpAddr>,
    items: Vec<Item>,
    /// A snapshot's names, numbered in the order written (unique in a snapshot).
    numbers: u32,
    /// Answers without a number (the journal's).
    unnumbered: usize,
    /// Whether an answer expires later than the one before it.
    out_of_order: bool,
}

/// The number of an answer whose name has none (a journal's).
const NO_NUMBER: u32 = u32::MAX;

/// Answers are read through their places, not copied, when at most one in this many is not
/// right after the one before it (in the places' order).
const MOSTLY_IN_ORDER: usize = 8;

/// One answer: where its name and addresses are in [`Answers`].
#[derive(Debug, Clone, Copy)]
struct Item {
    endpoint: u16,
    /// For a snapshot's answer, its name's number (in what would be padding); else
    /// [`NO_NUMBER`].
    number: u32,
    name: (u32, u32),
    addrs: (u32, u32),
    expires_unix_ms: u64,
}

/// [`Answers`] the latest expiry first ([`Answers::latest_first`]): the answers themselves,
/// read in their order or through a list of their places, or a copy of them in that order.
#[derive(Debug)]
pub struct LatestFirst<'a> {
    answers: Cow<'a, Answers>,
    /// The answers' places in this order, if they are not in it.
    order: Option<Vec<u32>>,
    /// What the answers hold, each name and address once.
    sizes: Sizes,
}

impl LatestFirst<'_> {
    /// How many answers there are.
    pub fn len(&self) -> usize {
        self.answers.items.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.answers.items.is_empty()
    }

    /// The `at`-th answer in this order.
    pub fn get(&self, at: usize) -> Option<RestoredAnswer<'_>> {
        Some(self.answers.answer(self.item(at)?))
    }

    /// The number of the `at`-th answer's name if it is a snapshot's: answers numbered
    /// alike have the same name; a snapshot writes each name once, so answers numbered
    /// differently have different names (which the restore checks).
    pub fn name_number(&self, at: usize) -> Option<u32> {
        let number = self.item(at)?.number;
        (number != NO_NUMBER).then_some(number)
    }

    /// How many names are numbered: every name number is below it.
    pub fn name_numbers(&self) -> usize {
        self.answers.numbers as usize
    }

    /// The answers (by place in this order) whose names are not numbered: the journal's.
    pub fn unnumbered(&self) -> Vec<usize> {
        if self.answers.unnumbered == 0 {
            return Vec::new();
        }
        let journal = |at: &usize| self.item(*at).is_some_and(|item| item.number == NO_NUMBER);
        (0..self.len()).filter(journal).collect()
    }

    /// Bytes of names and IPv4 and IPv6 addresses the answers hold (those a name's answers
    /// for several endpoints share, once).
    pub fn sizes(&self) -> Sizes {
        self.sizes
    }

    fn item(&self, at: usize) -> Option<&Item> {
        let at = match &self.order {
            Some(order) => *order.get(at)? as usize,
            None => at,
        };
        self.answers.items.get(at)
    }
}

/// The flat vectors hold more than `u32` can index (4 GiB of names, 4 billion addresses or
/// 4 billion answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the restored answers outgrow 4 GiB of names, 4 billion addresses or 4 billion answers")]
pub struct TooLarge;

impl Answers {
    /// Answers restored.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// No answer.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Every answer, in the order pushed.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = RestoredAnswer<'_>> + '_ {
        self.items.iter().map(|item| self.answer(item))
    }

    /// Every answer, the latest expiry first (in the order pushed among equals).
    ///
    /// In a restore's order, answers read in another are scattered over the memory that
    /// holds them, a cache miss or more each, in the restore's loop and on both of its
    /// threads. So answers in that order already (a snapshot fqdnd wrote, whose names have
    /// one expiry each) are used as they are; answers mostly in it (a few names with several
    /// expiries, a journal tail) are read through a list of their places, in runs; answers
    /// in no order are copied in it first, in passes that do nothing else (a million
    /// answers in no order: 1.33 s to restore in all without the copy, 0.95 s with it;
    /// 0.45 s in order).
    pub fn latest_first(&self) -> LatestFirst<'_> {
        let v4 = self.addrs.iter().filter(|a| a.is_ipv4()).count();
        let sizes = Sizes {
            name_bytes: self.names.len(),
            v4,
            v6: self.addrs.len() - v4,
        };
        let borrowed = |order| LatestFirst {
            answers: Cow::Borrowed(self),
            order,
            sizes,
        };
        if !self.out_of_order {
            return borrowed(None);
        }
        // Each answer's place sorted with its expiry beside it (not looked up in the
        // answers: a cache miss per comparison); the place breaks ties, so the order is
        // stable. Numbered in `u32`: the pushes refuse more answers than that.
        let mut order: Vec<(Reverse<u64>, u32)> = (self.items.iter().zip(0u32..))
            .map(|(item, at)| (Reverse(item.expires_unix_ms), at))
            .collect();
        order.sort_unstable();
        let jumps = order.windows(2).filter(|w| w[1].1 != w[0].1 + 1).count();
        if jumps <= order.len() / MOSTLY_IN_ORDER {
            return borrowed(Some(order.into_iter().map(|(_, at)| at).collect()));
        }
        // The copy may hold more than these answers (a name or addresses several answers
        // share, once for each): past 4 GiB of names or 4 billion addresses, they are read
        // through their places (and are as slow as if not copied).
        match self.copy_in(order.iter().map(|&(_, at)| at)) {
            Ok(copy) => LatestFirst {
                answers: Cow::Owned(copy),
                order: None,
                sizes,
            },
            Err(TooLarge) => borrowed(Some(order.into_iter().map(|(_, at)| at).collect())),
        }
    }

    /// A copy of the answers numbered `order`, in that order: the answers first, then their
    /// names, then their addresses, passes whose reads do not wait for one another.
    fn copy_in(&self, order: impl Iterator<Item = u32>) -> Result<Answers, TooLarge> {
        let mut copy = Answers {
            names: String::with_capacity(self.names.len()),
            addrs: Vec::with_capacity(self.addrs.len()),
            items: order
                .filter_map(|at| self.items.get(at as usize).copied())
                .collect(),
            numbers: self.numbers,
            unnumbered: self.unnumbered,
            out_of_order: false,
        };
        let Answers {
            names,
            addrs,
            items,
            ..
        } = &mut copy;
        for item in items.iter_mut() {
            let name = self.names.get(range(item.name)).unwrap_or_default();
            item.name = append_str(names, name)?;
        }
        for item in items.iter_mut() {
            let from = self.addrs.get(range(item.addrs)).unwrap_or_default();
            item.addrs = append(addrs, from.iter().copied())?;
        }
        Ok(copy)
    }

    fn answer(&self, item: &Item) -> RestoredAnswer<'_> {
        RestoredAnswer {
            endpoint: EndpointId(item.endpoint),
            name: self.names.get(range(item.name)).unwrap_or_default(),
            addrs: self.addrs.get(range(item.addrs)).unwrap_or_default(),
            expires_unix_ms: item.expires_unix_ms,
        }
    }

    /// Adds one answer (a journal record).
    ///
    /// # Errors
    /// The flat vectors would outgrow `u32` indices.
    pub fn push(
        &mut self,
        endpoint: EndpointId,
        name: &str,
        addrs: &[IpAddr],
        expires_unix_ms: u64,
    ) -> Result<(), TooLarge> {
        index(self.items.len() + 1)?;
        let name = self.push_name(name)?;
        let addrs = self.push_addrs(addrs.iter().copied())?;
        self.unnumbered += 1;
        self.push_item(Item {
            endpoint: endpoint.0,
            number: NO_NUMBER,
            name,
            addrs,
            expires_unix_ms,
        });
        Ok(())
    }

    /// Adds a snapshot's name: one answer per (expiry, endpoint), the latest expiry first,
    /// each expiry's answers endpoint by endpoint (so that a snapshot written in the restore's
    /// order, as [`Taken`](super::Taken) writes it, reads in it
    /// unless a name has several expiries); a name no endpoint asked comes back for endpoint
    /// 0. `addrs` is reordered.
    fn push_snapshot_name(
        &mut self,
        name: (u32, u32),
        endpoints: &[u16],
        addrs: &mut [(IpAddr, u64)],
    ) -> Result<(), TooLarge> {
        // Most names share one expiry: then the order is left as it was.
        if addrs.windows(2).any(|w| w[0].1 != w[1].1) {
            addrs.sort_by_key(|(_, expires)| Reverse(*expires));
        }
        let endpoints = if endpoints.is_empty() {
            &[0]
        } else {
            endpoints
        };
        let groups = addrs.chunk_by(|a, b| a.1 == b.1).count();
        index(self.items.len() + groups * endpoints.len())?;
        // Numbered only while no journal answer came before (none does: a snapshot is read
        // first; after one, every answer is unnumbered).
        let numbered = self.items.last().is_none_or(|i| i.number != NO_NUMBER);
        let number = if numbered { self.numbers } else { NO_NUMBER };
        self.numbers = self.numbers.checked_add(1).ok_or(TooLarge)?;
        for group in addrs.chunk_by(|a, b| a.1 == b.1) {
            let expires_unix_ms = group.first().map_or(0, |(_, e)| *e);
            let addrs = self.push_addrs(group.iter().map(|(addr, _)| *addr))?;
            for &endpoint in endpoints {
                self.push_item(Item {
                    endpoint,
                    number,
                    name,
                    addrs,
                    expires_unix_ms,
                });
            }
        }
        if !numbered {
            self.unnumbered += groups * endpoints.len();
        }
        Ok(())
    }

    fn push_item(&mut self, item: Item) {
        if let Some(last) = self.items.last() {
            self.out_of_order |= item.expires_unix_ms > last.expires_unix_ms;
        }
        self.items.push(item);
    }

    fn push_name(&mut self, name: &str) -> Result<(u32, u32), TooLarge> {
        append_str(&mut self.names, name)
    }

    fn push_addrs(&mut self, addrs: impl Iterator<Item = IpAddr>) -> Result<(u32, u32), TooLarge> {
        append(&mut self.addrs, addrs)
    }
}

/// Appends `name` to `names`; where it is.
fn append_str(names: &mut String, name: &str) -> Result<(u32, u32), TooLarge> {
    let start = index(names.len())?;
    names.push_str(name);
    Ok((start, index(names.len())?))
}

/// Appends `addrs` to `to`; where they are.
fn append(
    to: &mut Vec<IpAddr>,
    addrs: impl Iterator<Item = IpAddr>,
) -> Result<(u32, u32), TooLarge> {
    let start = index(to.len())?;
    to.extend(addrs);
    Ok((start, index(to.len())?))
}

fn index(n: usize) -> Result<u32, TooLarge> {
    u32::try_from(n).map_err(|_| TooLarge)
}

fn range((start, end): (u32, u32)) -> std::ops::Range<usize> {
    start as usize..end as usize
}

/// A snapshot as the restore reads it: the answers flat, the identities as written. It
/// decodes what [`Snapshot`](super::Snapshot) encodes.
#[derive(Debug, Default)]
pub struct ReadSnapshot {
    /// One answer per (name, expiry, endpoint): a name's addresses grouped by expiry, the
    /// latest first, each group for the name's endpoints in the order written (endpoint 0 for
    /// a name none asked).
    pub answers: Answers,
    /// Canonical label set → identity number, as written.
    pub identities: Vec<(String, u32)>,
    /// (name, IP) entries.
    pub entries: usize,
    /// The NameManager's room for the names, made on another core during the decode
    /// ([`ReadSnapshot::decode`]).
    pub(crate) room: Option<JoinHandle<RestoreRoom>>,
}

/// Fewest names worth a thread making room for them (below, their slots are a few MB).
const ROOM_MIN_NAMES: usize = 1 << 16;

/// Room is made once this share of the names (1 in ...) tells what they hold, about.
const ROOM_SAMPLE: usize = 64;

/// Fewest bytes a name takes in a snapshot: empty name, endpoints and addresses.
const MIN_NAME_BYTES: usize = 3;

/// Fewest bytes an address takes in a snapshot: its family, four bytes, its expiry.
const MIN_ADDR_BYTES: usize = 6;

impl ReadSnapshot {
    /// Decodes a snapshot's `body`. Once it knows how many names the snapshot holds (a
    /// length at the start, bounded by what `body` can hold) and, from the first of them,
    /// about what they hold, a second thread makes the NameManager's room for them while
    /// this one decodes the rest (with more than one core, and many names).
    ///
    /// # Errors
    /// `body` is not a snapshot.
    pub fn decode(body: &[u8]) -> Result<Self, String> {
        let visitor = SnapshotVisitor {
            body_bytes: body.len(),
        };
        fqdnd_checkpoint::format::decode_seed(visitor, body)
    }
}

/// A thread making room for `names` names holding about `sizes` (`None`: too few to be
/// worth it, one core, or no thread to be had).
fn make_room(names: usize, sizes: Sizes) -> Option<JoinHandle<RestoreRoom>> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    if names < ROOM_MIN_NAMES || cores < 2 {
        return None;
    }
    std::thread::Builder::new()
        .name("restore-room".into())
        .spawn(move || RestoreRoom::new(names, sizes))
        .ok()
}

/// What `names` names hold, about, if the first `read` of them held `sampled`; bounded by
/// what a body of `body_bytes` can hold.
fn estimate(sampled: Sizes, read: usize, names: usize, body_bytes: usize) -> Sizes {
    let scale = |n: usize, most: usize| {
        let n = n as u128 * names as u128 / read.max(1) as u128;
        usize::try_from(n).unwrap_or(usize::MAX).min(most)
    };
    let addrs = body_bytes / MIN_ADDR_BYTES;
    Sizes {
        name_bytes: scale(sampled.name_bytes, body_bytes),
        v4: scale(sampled.v4, addrs),
        v6: scale(sampled.v6, addrs),
    }
}

/// What a name's fields are, for decoding errors.
const EXPECTING: &str = "a cached name (name, endpoints, addresses)";

// The fields of `Snapshot` and `SnapshotName`, in their order.
const SNAPSHOT: &[&str] = &["names", "identities"];
const SNAPSHOT_NAME: &[&str] = &["name", "endpoints", "addrs"];

/// The whole snapshot, of `body_bytes` bytes (what bounds the room made for its names).
struct SnapshotVisitor {
    body_bytes: usize,
}

impl<'de> DeserializeSeed<'de> for SnapshotVisitor {
    type Value = ReadSnapshot;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<ReadSnapshot, D::Error> {
        d.deserialize_struct("Snapshot", SNAPSHOT, self)
    }
}

impl<'de> Visitor<'de> for SnapshotVisitor {
    type Value = ReadSnapshot;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a snapshot (names, identities)")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ReadSnapshot, A::Error> {
        let mut out = ReadSnapshot::default();
        seq.next_element_seed(NamesSeed(&mut out, self.body_bytes))?
            .ok_or_else(|| de::Error::invalid_length(0, &self))?;
        out.identities = seq
            .next_element()?
            .ok_or_else(|| de::Error::invalid_length(1, &self))?;
        Ok(out)
    }
}

/// The snapshot's names, appended to its answers (`.1`: the body's bytes).
struct NamesSeed<'a>(&'a mut ReadSnapshot, usize);

impl<'de> DeserializeSeed<'de> for NamesSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for NamesSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of cached names")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Self(out, body_bytes) = self;
        let names = seq
            .size_hint()
            .unwrap_or(0)
            .min(body_bytes / MIN_NAME_BYTES);
        // A length from the file, trusted only up to a megabyte of answers (serde's own
        // caution for a `Vec`): a bad length cannot reserve much.
        out.answers
            .items
            .reserve(names.min((1 << 20) / size_of::<Item>()));
        // Reused for every name.
        let mut scratch = Scratch::default();
        let next = |seq: &mut A, out: &mut ReadSnapshot, scratch: &mut Scratch| {
            Ok::<_, A::Error>(seq.next_element_seed(NameSeed { out, scratch })?.is_some())
        };
        // The first names, counted: room is made for all of them as they tell.
        let sample = if names >= ROOM_MIN_NAMES {
            names / ROOM_SAMPLE
        } else {
            0
        };
        let mut sampled = Sizes::default();
        let mut read = 0;
        while read < sample && next(&mut seq, out, &mut scratch)? {
            read += 1;
            for (addr, _) in &scratch.addrs {
                match addr {
                    IpAddr::V4(_) => sampled.v4 += 1,
                    IpAddr::V6(_) => sampled.v6 += 1,
                }
            }
        }
        if read > 0 {
            sampled.name_bytes = out.answers.names.len();
            out.room = make_room(names, estimate(sampled, read, names, body_bytes));
        }
        while next(&mut seq, out, &mut scratch)? {}
        Ok(())
    }
}

#[derive(Default)]
struct Scratch {
    endpoints: Vec<u16>,
    addrs: Vec<(IpAddr, u64)>,
}

/// One `SnapshotName`: its name appended to the answers' names, its endpoints and addresses
/// read into the scratch vectors, then its answers added.
struct NameSeed<'a> {
    out: &'a mut ReadSnapshot,
    scratch: &'a mut Scratch,
}

impl<'de> DeserializeSeed<'de> for NameSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_struct("SnapshotName", SNAPSHOT_NAME, self)
    }
}

impl<'de> Visitor<'de> for NameSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a cached name (name, endpoints, addresses)")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let answers = &mut self.out.answers;
        let too_large = || de::Error::custom("the snapshot's names outgrow 4 GiB");
        let start = index(answers.names.len()).map_err(|_| too_large())?;
        seq.next_element_seed(AppendStr(&mut answers.names))?
            .ok_or_else(|| de::Error::invalid_length(0, &EXPECTING))?;
        let name = (start, index(answers.names.len()).map_err(|_| too_large())?);
        self.scratch.endpoints.clear();
        seq.next_element_seed(Extend(&mut self.scratch.endpoints))?
            .ok_or_else(|| de::Error::invalid_length(1, &EXPECTING))?;
        self.scratch.addrs.clear();
        seq.next_element_seed(Extend(&mut self.scratch.addrs))?
            .ok_or_else(|| de::Error::invalid_length(2, &EXPECTING))?;
        self.out.entries += self.scratch.addrs.len();
        answers
            .push_snapshot_name(name, &self.scratch.endpoints, &mut self.scratch.addrs)
            .map_err(|_| too_large())
    }
}

/// A string appended to a `String`, without one of its own.
struct AppendStr<'a>(&'a mut String);

impl<'de> DeserializeSeed<'de> for AppendStr<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for AppendStr<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.0.push_str(v);
        Ok(())
    }
}

/// A sequence appended to a `Vec`, without one of its own.
struct Extend<'a, T>(&'a mut Vec<T>);

impl<'de, T: Deserialize<'de>> DeserializeSeed<'de> for Extend<'_, T> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for Extend<'_, T> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(value) = seq.next_element()? {
            self.0.push(value);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::{Snapshot, SnapshotName, Taken, test_support};

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([192, 0, 2, last])
    }

    /// `snapshot` written to a state directory and read back as a restore reads it.
    fn write_and_read(snapshot: &(impl serde::Serialize + ?Sized)) -> ReadSnapshot {
        test_support::write_and_read(snapshot, ReadSnapshot::decode)
    }

    /// Asserts the names and expiries of `answers`, latest first.
    fn assert_latest_first(answers: &Answers, expected: &[(&str, u64)]) {
        let latest_first = answers.latest_first();
        let order: Vec<(&str, u64)> = (0..latest_first.len())
            .filter_map(|at| latest_first.get(at))
            .map(|a| (a.name, a.expires_unix_ms))
            .collect();
        assert_eq!(order, expected);
    }

    /// The restore's order: the latest expiry first, the order pushed among equals.
    #[test]
    fn answers_come_latest_first_and_in_order_among_equals() {
        let mut answers = Answers::default();
        for (name, expires) in [("a.", 5), ("b.", 9), ("c.", 5), ("d.", 7), ("e.", 9)] {
            answers
                .push(EndpointId(1), name, &[ip(1)], expires)
                .unwrap();
        }
        let latest_first = answers.latest_first();
        assert_eq!(latest_first.len(), 5);
        assert!(latest_first.get(5).is_none());
        assert_latest_first(
            &answers,
            &[("b.", 9), ("e.", 9), ("d.", 7), ("a.", 5), ("c.", 5)],
        );
        // In order already, or in the reverse order.
        for (pushed, expected) in [
            ([9, 9, 7, 5], [("a.", 9), ("b.", 9), ("c.", 7), ("d.", 5)]),
            ([5, 7, 9, 9], [("c.", 9), ("d.", 9), ("b.", 7), ("a.", 5)]),
        ] {
            let mut answers = Answers::default();
            for (name, expires) in ["a.", "b.", "c.", "d."].into_iter().zip(pushed) {
                answers
                    .push(EndpointId(1), name, &[ip(1)], expires)
                    .unwrap();
            }
            assert_latest_first(&answers, &expected);
        }
    }

    /// Answers in the restore's order are read as they are; mostly in it, through their
    /// places; in no order, from a copy: the same order each way.
    #[test]
    fn answers_are_read_in_place_through_their_places_or_copied() {
        let push_all = |expiries: &[u64]| {
            let mut answers = Answers::default();
            for (at, &expires) in expiries.iter().enumerate() {
                let name = format!("n{at}.");
                let addr = ip(u8::try_from(at).unwrap());
                answers
                    .push(EndpointId(1), &name, &[addr], expires)
                    .unwrap();
            }
            answers
        };
        let names = |expected: &[usize]| -> Vec<(String, u64)> {
            expected.iter().map(|&at| (format!("n{at}."), 0)).collect()
        };
        let read = |order: &LatestFirst<'_>| -> Vec<(String, u64)> {
            (0..order.len())
                .map(|at| (order.get(at).unwrap().name.to_owned(), 0))
                .collect()
        };
        // 17 answers, the latest expiring last: one jump in 17.
        let mut expiries: Vec<u64> = (0..16).rev().collect();
        expiries.push(100);
        let answers = push_all(&expiries);
        let order = answers.latest_first();
        assert!(matches!(order.answers, Cow::Borrowed(_)));
        assert!(order.order.is_some(), "read through the places");
        let expected: Vec<usize> = std::iter::once(16).chain(0..16).collect();
        assert_eq!(read(&order), names(&expected));
        assert_eq!(order.get(0).unwrap().addrs, [ip(16)]);
        assert_eq!(order.unnumbered(), (0..17).collect::<Vec<_>>());
        assert_eq!(order.name_number(0), None);
        assert!(order.get(17).is_none());
        // In order: as they are.
        let answers = push_all(&expiries[..16]);
        let order = answers.latest_first();
        assert!(matches!(order.answers, Cow::Borrowed(_)) && order.order.is_none());
        assert_eq!(read(&order), names(&(0..16).collect::<Vec<_>>()));
        // In reverse order: copied.
        let answers = push_all(&(0..16).collect::<Vec<_>>());
        let order = answers.latest_first();
        assert!(matches!(order.answers, Cow::Owned(_)) && order.order.is_none());
        assert_eq!(read(&order), names(&(0..16).rev().collect::<Vec<_>>()));
        assert_eq!(order.get(0).unwrap().addrs, [ip(15)]);
    }

    /// A snapshot put in the restore's order reads back in it, numbered; a journal answer
    /// after it that expires later is read first, through the answers' places.
    #[test]
    fn a_snapshot_in_restore_order_reads_in_it() {
        let mut taken = Taken::default();
        for i in 0..20u8 {
            // In no order of expiry.
            taken.push(
                &format!("n{i}.test."),
                [1, 2],
                [(ip(i), u64::from(i * 7 % 20))],
            );
        }
        let read = write_and_read(&taken);
        let mut answers = read.answers;
        let order = answers.latest_first();
        assert!(matches!(order.answers, Cow::Borrowed(_)) && order.order.is_none());
        let expiries: Vec<u64> = (0..order.len())
            .map(|at| order.get(at).unwrap().expires_unix_ms)
            .collect();
        let expected: Vec<u64> = (0..20).rev().flat_map(|e| [e, e]).collect();
        assert_eq!(
            expiries, expected,
            "each expiry for both endpoints, latest first"
        );
        answers
            .push(EndpointId(3), "late.test.", &[ip(99)], 1_000)
            .unwrap();
        let order = answers.latest_first();
        assert!(order.order.is_some(), "read through the places");
        assert_eq!(order.get(0).unwrap().name, "late.test.");
        assert_eq!(order.unnumbered(), [0]);
        for at in 1..order.len() {
            let answer = order.get(at).unwrap();
            let number = order.name_number(at).unwrap();
            let name = 19 - (number as usize);
            assert_eq!(answer.name, format!("n{}.test.", name * 3 % 20));
            assert_eq!(answer.endpoint, EndpointId(if at % 2 == 1 { 1 } else { 2 }));
        }
    }

    /// What a snapshot written with `Snapshot` reads back as, for names with no endpoint,
    /// several endpoints and several expiries.
    #[test]
    fn a_snapshot_reads_back_flat_in_the_order_of_its_names() {
        let snapshot = Snapshot {
            names: vec![
                SnapshotName {
                    name: "one.test.".into(),
                    endpoints: vec![7],
                    addrs: vec![(ip(1), 500), (ip(2), 500)],
                },
                SnapshotName {
                    name: "mixed.test.".into(),
                    endpoints: vec![3, 4],
                    addrs: vec![(ip(3), 900), (ip(4), 100), (ip(5), 900), (ip(6), 100)],
                },
                SnapshotName {
                    name: "nobody.test.".into(),
                    endpoints: vec![],
                    addrs: vec![(IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, 1]), 42)],
                },
                SnapshotName {
                    name: "empty.test.".into(),
                    endpoints: vec![9],
                    addrs: vec![],
                },
            ],
            identities: vec![("k8s:app=web".into(), 300)],
        };
        let read = write_and_read(&snapshot);
        let v6 = [IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, 1])];
        let got: Vec<(u16, &str, Vec<IpAddr>, u64)> = read
            .answers
            .iter()
            .map(|a| (a.endpoint.0, a.name, a.addrs.to_vec(), a.expires_unix_ms))
            .collect();
        assert_eq!(
            got,
            [
                (7, "one.test.", vec![ip(1), ip(2)], 500),
                (3, "mixed.test.", vec![ip(3), ip(5)], 900),
                (4, "mixed.test.", vec![ip(3), ip(5)], 900),
                (3, "mixed.test.", vec![ip(4), ip(6)], 100),
                (4, "mixed.test.", vec![ip(4), ip(6)], 100),
                (0, "nobody.test.", v6.to_vec(), 42),
            ]
        );
        assert_eq!(read.entries, 7);
        assert_eq!(read.identities, [("k8s:app=web".to_owned(), 300)]);
        // Each name numbered as written (the empty one too, though it has no answer); a
        // journal answer after them is not numbered.
        let mut answers = read.answers;
        answers
            .push(EndpointId(1), "one.test.", &[ip(9)], 950)
            .unwrap();
        let order = answers.latest_first();
        let numbered: Vec<(&str, u64, Option<u32>)> = (0..order.len())
            .map(|at| {
                let a = order.get(at).unwrap();
                (a.name, a.expires_unix_ms, order.name_number(at))
            })
            .collect();
        assert_eq!(
            numbered,
            [
                ("one.test.", 950, None),
                ("mixed.test.", 900, Some(1)),
                ("mixed.test.", 900, Some(1)),
                ("one.test.", 500, Some(0)),
                ("mixed.test.", 100, Some(1)),
                ("mixed.test.", 100, Some(1)),
                ("nobody.test.", 42, Some(2)),
            ]
        );
        assert_eq!(order.name_numbers(), 4);
        assert_eq!(order.unnumbered(), [0]);
    }

    /// A snapshot of many names is decoded while another core makes the NameManager's room
    /// for them, as much as its first names tell; of a few, or with one core, without.
    #[test]
    fn a_large_snapshot_comes_with_room_for_its_names() {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        for count in [ROOM_MIN_NAMES - 1, ROOM_MIN_NAMES + 10] {
            let snapshot = Snapshot {
                names: (0..count)
                    .map(|i| SnapshotName {
                        name: format!("n{i}.test."),
                        endpoints: vec![1],
                        addrs: vec![
                            (ip(1), 500),
                            (IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, 1]), 500),
                        ],
                    })
                    .collect(),
                identities: Vec::new(),
            };
            let read = write_and_read(&snapshot);
            assert_eq!(read.answers.len(), count);
            let room = read.room.map(|room| room.join().unwrap());
            let expected = count >= ROOM_MIN_NAMES && cores > 1;
            assert_eq!(room.is_some(), expected, "{count} names, {cores} cores");
            let Some(room) = room else { continue };
            assert!(room.capacity() >= count);
            let sizes = room.sizes();
            assert_eq!((sizes.v4, sizes.v6), (count, count));
            // The first names are the shortest (n0. to n1023.): most of the text, not all.
            let text = read.answers.names.len();
            assert!(
                (text * 8 / 10..text).contains(&sizes.name_bytes),
                "{sizes:?} for {text}"
            );
        }
    }

    /// Room made for what the first names hold is bounded by what the body can hold.
    #[test]
    fn room_is_estimated_from_the_first_names_within_the_body() {
        let sampled = Sizes {
            name_bytes: 1_000,
            v4: 100,
            v6: 10,
        };
        let sizes = estimate(sampled, 100, 10_000, 1 << 20);
        assert_eq!(
            (sizes.name_bytes, sizes.v4, sizes.v6),
            (100_000, 10_000, 1_000)
        );
        let sizes = estimate(sampled, 100, usize::MAX, 600);
        assert_eq!((sizes.name_bytes, sizes.v4, sizes.v6), (600, 100, 100));
    }

    #[test]
    fn journal_answers_keep_their_order() {
        let mut answers = Answers::default();
        answers
            .push(EndpointId(1), "b.test.", &[ip(2)], 20)
            .unwrap();
        answers.push(EndpointId(2), "a.test.", &[], 10).unwrap();
        let got: Vec<RestoredAnswer<'_>> = answers.iter().collect();
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[0],
            RestoredAnswer {
                endpoint: EndpointId(1),
                name: "b.test.",
                addrs: &[ip(2)],
                expires_unix_ms: 20,
            }
        );
        assert_eq!((got[1].name, got[1].addrs.len()), ("a.test.", 0));
    }
}
