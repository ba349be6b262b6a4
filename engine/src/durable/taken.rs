//! [`Taken`]: the engine's state as compaction takes it, under the engine lock, and writes it,
//! outside: flat (every name in one string, every endpoint and address in one vector: no
//! allocation per name while the lock is held), written with the names in the order a
//! restore learns them, the latest expiry first, so that a restore reads the snapshot
//! straight through.

use std::cmp::Reverse;
use std::net::IpAddr;
use std::time::Duration;

use serde::ser::{Serialize, SerializeStruct, Serializer};

use crate::{Clock, Engine};

/// The engine's cached names and identities at one moment. It encodes as a
/// [`Snapshot`](super::Snapshot) does, its names the latest expiry first (each name's
/// latest; the order taken among equals); [`Taken::as_pushed`] keeps the order they came in.
#[derive(Debug, Default)]
pub struct Taken {
    names: String,
    endpoints: Vec<u16>,
    addrs: Vec<(IpAddr, u64)>,
    /// Where each name's text, endpoints and addresses end, and its latest expiry.
    ends: Vec<Ends>,
    /// Canonical label set → identity number.
    identities: Vec<(String, u32)>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Ends {
    name: usize,
    endpoints: usize,
    addrs: usize,
    latest: u64,
}

impl Taken {
    /// `engine`'s names with their addresses (live and zombie) and its identities, now;
    /// expiries converted to Unix time on `clock`. A name without addresses is left out.
    pub fn of<D>(engine: &Engine<D>, clock: &dyn Clock) -> Self {
        let mut taken = Self::default();
        for name in engine.names.cached_names() {
            let addrs = name.ips().map(|ip| {
                let expires = Duration::from_secs(u64::from(ip.expires));
                (ip.addr, clock.unix_ms_of(expires))
            });
            taken.push(name.name, name.endpoints().map(|ep| ep.0), addrs);
        }
        taken.identities = (engine.ipcache.identities_canonical().into_iter())
            .map(|(labels, id)| (labels, id.0))
            .collect();
        taken
    }

    /// Adds a name asked by `endpoints`, with `addrs` and their expiries (Unix
    /// milliseconds); one without addresses is left out.
    pub fn push(
        &mut self,
        name: &str,
        endpoints: impl IntoIterator<Item = u16>,
        addrs: impl IntoIterator<Item = (IpAddr, u64)>,
    ) {
        let first_addr = self.addrs.len();
        self.addrs.extend(addrs);
        let Some(latest) = self.addrs[first_addr..].iter().map(|&(_, e)| e).max() else {
            return;
        };
        self.names.push_str(name);
        self.endpoints.extend(endpoints);
        self.ends.push(Ends {
            name: self.names.len(),
            endpoints: self.endpoints.len(),
            addrs: self.addrs.len(),
            latest,
        });
    }

    /// (name, IP) entries.
    pub fn entries(&self) -> usize {
        self.addrs.len()
    }

    /// Names.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// No name.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// These names and identities, encoded with the names in the order pushed (for
    /// benchmarks of a snapshot in no order: an older fqdnd's).
    pub fn as_pushed(&self) -> AsPushed<'_> {
        AsPushed(self)
    }

    /// The `at`-th name pushed: its text, endpoints and addresses.
    fn name(&self, at: usize) -> NameRef<'_> {
        let start = at.checked_sub(1).and_then(|before| self.ends.get(before));
        let start = start.copied().unwrap_or_default();
        let end = self.ends.get(at).copied().unwrap_or(start);
        NameRef {
            name: self.names.get(start.name..end.name).unwrap_or_default(),
            endpoints: (self.endpoints.get(start.endpoints..end.endpoints)).unwrap_or_default(),
            addrs: self.addrs.get(start.addrs..end.addrs).unwrap_or_default(),
        }
    }

    /// Encodes as `Snapshot`: its fields in their order, the names at the places `order`
    /// (`None`: as pushed).
    fn serialize_in<S: Serializer>(
        &self,
        order: Option<&[usize]>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut fields = serializer.serialize_struct("Snapshot", 2)?;
        fields.serialize_field("names", &NamesIn { taken: self, order })?;
        fields.serialize_field("identities", &self.identities)?;
        fields.end()
    }
}

impl Serialize for Taken {
    /// The names the latest expiry first: only their places are sorted (a million: tens of
    /// milliseconds), then read in that order from the flat vectors.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut order: Vec<(Reverse<u64>, usize)> = (self.ends.iter().enumerate())
            .map(|(at, ends)| (Reverse(ends.latest), at))
            .collect();
        order.sort_unstable();
        let order: Vec<usize> = order.into_iter().map(|(_, at)| at).collect();
        self.serialize_in(Some(&order), serializer)
    }
}

/// A [`Taken`] encoded with its names in the order pushed ([`Taken::as_pushed`]).
#[derive(Debug)]
pub struct AsPushed<'a>(&'a Taken);

impl Serialize for AsPushed<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize_in(None, serializer)
    }
}

/// The names of a [`Taken`] at the places `order` (`None`: as pushed), as a sequence.
struct NamesIn<'a> {
    taken: &'a Taken,
    order: Option<&'a [usize]>,
}

impl Serialize for NamesIn<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let taken = self.taken;
        match self.order {
            Some(order) => serializer.collect_seq(order.iter().map(|&at| taken.name(at))),
            None => serializer.collect_seq((0..taken.len()).map(|at| taken.name(at))),
        }
    }
}

/// One name as `SnapshotName` encodes it (its fields in their order).
#[derive(serde::Serialize)]
#[serde(rename = "SnapshotName")]
struct NameRef<'a> {
    name: &'a str,
    endpoints: &'a [u16],
    addrs: &'a [(IpAddr, u64)],
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::{Snapshot, test_support};

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([192, 0, 2, last])
    }

    /// `value` written as a snapshot and read back as `fqdnd checkpoint inspect` reads it.
    fn round_trip(value: &impl Serialize) -> Snapshot {
        test_support::write_and_read(value, fqdnd_checkpoint::format::decode_value)
    }

    /// A name as pushed: its text, endpoints and addresses.
    type Pushed<'a> = (&'a str, &'a [u16], &'a [(IpAddr, u64)]);

    /// What each name was pushed with, in the order written.
    fn names(snapshot: &Snapshot) -> Vec<Pushed<'_>> {
        let names = snapshot.names.iter();
        names
            .map(|n| (&*n.name, &*n.endpoints, &*n.addrs))
            .collect()
    }

    /// A taken state encodes as a `Snapshot`, its names the latest expiry first (each
    /// name's latest) or as pushed; a name without addresses is left out.
    #[test]
    fn taken_names_are_written_latest_expiry_first_or_as_pushed() {
        let mut taken = Taken::default();
        taken.push("early.test.", [1], [(ip(1), 100)]);
        taken.push("none.test.", [1], []);
        taken.push("mixed.test.", [2, 3], [(ip(2), 50), (ip(3), 900)]);
        taken.push("middle.test.", [], [(ip(4), 500)]);
        taken.identities.push(("k8s:app=web".into(), 300));
        assert_eq!((taken.len(), taken.entries()), (3, 4));
        let mixed: Pushed<'_> = ("mixed.test.", &[2, 3], &[(ip(2), 50), (ip(3), 900)]);
        let early: Pushed<'_> = ("early.test.", &[1], &[(ip(1), 100)]);
        let middle: Pushed<'_> = ("middle.test.", &[], &[(ip(4), 500)]);
        let written = round_trip(&taken);
        assert_eq!(names(&written), [mixed, middle, early]);
        assert_eq!(written.identities, [("k8s:app=web".to_owned(), 300)]);
        let as_pushed = round_trip(&taken.as_pushed());
        assert_eq!(names(&as_pushed), [early, mixed, middle]);
        assert_eq!(round_trip(&Taken::default()).names.len(), 0);
    }
}
