//! What may not be durable yet: [`InDoubt`], the names whose held answers may not be; and
//! [`Journaled`], the identities whose records may not be.
//!
//! An answer that teaches new state is held until its records are durable; one that only
//! refreshes a known name is not. But "known" is the engine's memory, which runs ahead of the
//! disk: a second answer for a name whose first is still waiting for its sync (or whose sync
//! failed) would otherwise be released at once, and a crash then loses what its client was
//! told. So such a refresh is held too (its own record carries the whole answer). A name stays
//! in doubt until the journal's progress shows its records durable, or a snapshot covers them.
//!
//! An identity is journaled once, when it is created; a record of it lost in a failed batch
//! would leave its label set without its number at the next start, though later answers
//! using it were journaled fine. So after a failure the identities whose records it may have
//! hit are journaled again.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use fqdnd_checkpoint::{Settled, Ticket};

/// The records of one name's held answers: `first..=last`.
type Span = (Ticket, Ticket);

/// Names (canonical: lower case, no final dot) in doubt, with the records that decide it.
#[derive(Debug, Default)]
pub(crate) struct InDoubt {
    /// Name → the span of every held record since it was last known durable.
    names: HashMap<Arc<str>, Span>,
    /// Spans in ticket order, checked against the writer's progress as it goes.
    queue: VecDeque<(Span, Arc<str>)>,
}

fn canonical(name: &str) -> Cow<'_, str> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(name.to_ascii_lowercase())
    } else {
        Cow::Borrowed(name)
    }
}

impl InDoubt {
    /// `name`'s answer was journaled as the records `first..=last`, held until durable. A
    /// name already in doubt keeps its older records in the span: it is known durable only
    /// once all of them are.
    pub(crate) fn hold(&mut self, name: &str, first: Ticket, last: Ticket, settled: Settled) {
        self.forget_durable(settled);
        let key = canonical(name);
        let (key, span) = match self.names.get_key_value(key.as_ref()) {
            Some((known, span)) => (Arc::clone(known), (span.0.min(first), span.1.max(last))),
            None => (Arc::from(key.as_ref()), (first, last)),
        };
        self.names.insert(Arc::clone(&key), span);
        self.queue.push_back((span, key));
    }

    /// `name`'s answer was learned but its records were refused (the journal's queue full),
    /// the last record queued then being `last_queued`: in doubt until a snapshot taken after
    /// it is installed.
    pub(crate) fn refused(&mut self, name: &str, last_queued: Ticket) {
        let after = Ticket(last_queued.0.saturating_add(1));
        let key = canonical(name);
        // First ticket 0: never known durable by the writer's progress.
        let span = match self.names.get(key.as_ref()) {
            Some(span) => (Ticket(0), span.1.max(after)),
            None => (Ticket(0), after),
        };
        self.names.insert(Arc::from(key.as_ref()), span);
    }

    /// Whether an answer for `name` must be held: its earlier records are not known durable.
    pub(crate) fn contains(&mut self, name: &str, settled: Settled) -> bool {
        if self.names.is_empty() {
            return false;
        }
        self.forget_durable(settled);
        self.names.contains_key(canonical(name).as_ref())
    }

    /// Every record up to `through` is in a snapshot now installed: names whose records are
    /// all among them are no longer in doubt, durable or not on their own.
    pub(crate) fn covered(&mut self, through: Ticket) {
        self.names.retain(|_, span| span.1 > through);
        self.queue.retain(|(span, _)| span.1 > through);
    }

    /// Names in doubt, once those known durable by `settled` are dropped.
    pub(crate) fn count(&mut self, settled: Settled) -> usize {
        self.forget_durable(settled);
        self.names.len()
    }

    /// Drops the names whose span the writer settled without a failure since it began. A span
    /// settled when it cannot tell (a later batch failed) stays until a snapshot covers it.
    fn forget_durable(&mut self, settled: Settled) {
        while let Some((span, _)) = self.queue.front() {
            if span.1 > settled.through {
                break;
            }
            let Some(((first, last), name)) = self.queue.pop_front() else {
                break;
            };
            if self.names.get(&name) == Some(&(first, last)) && settled.known_durable(first, last) {
                self.names.remove(&name);
            }
        }
    }
}

/// The identities journaled (or restored): number → canonical labels, with the ticket of
/// their record until it is known durable.
#[derive(Debug, Default)]
pub(crate) struct Journaled {
    ids: HashMap<u32, (String, Option<Ticket>)>,
    /// The writer's progress at the last look.
    checked: Settled,
}

impl Journaled {
    /// Identities already durable (restored from the state directory).
    pub(crate) fn restored(ids: impl IntoIterator<Item = (u32, String)>) -> Self {
        Self {
            ids: ids
                .into_iter()
                .map(|(id, labels)| (id, (labels, None)))
                .collect(),
            checked: Settled::default(),
        }
    }

    /// Whether `id` is journaled as `labels` (or is in a record not known to have failed).
    pub(crate) fn has(&self, id: u32, labels: &str) -> bool {
        self.ids.get(&id).is_some_and(|(l, _)| l == labels)
    }

    /// `id` was journaled as `labels` in the record `ticket`.
    pub(crate) fn insert(&mut self, id: u32, labels: String, ticket: Ticket) {
        self.ids.insert(id, (labels, Some(ticket)));
    }

    /// Looks at the writer's progress: returns whether a batch failed since the last look,
    /// after forgetting the identities whose records it may have held (to be journaled
    /// again). Records known durable at the last look are kept.
    pub(crate) fn check(&mut self, now: Settled) -> bool {
        let before = std::mem::replace(&mut self.checked, now);
        if now.last_failure <= before.last_failure {
            return false;
        }
        self.ids.retain(|_, (_, ticket)| match *ticket {
            None => true,
            Some(t) if before.known_durable(t, t) => {
                *ticket = None;
                true
            }
            Some(t) => t > now.last_failure,
        });
        true
    }

    /// Every record up to `through` is in a snapshot now installed.
    pub(crate) fn covered(&mut self, through: Ticket) {
        for (_, ticket) in self.ids.values_mut() {
            if ticket.is_some_and(|t| t <= through) {
                *ticket = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_a_failure_may_have_hit_are_forgotten_to_be_journaled_again() {
        let mut j = Journaled::restored([(1, "a=1".to_owned())]);
        j.insert(2, "a=2".to_owned(), Ticket(1));
        assert!(!j.check(at(1, 0)), "no failure");
        j.insert(3, "a=3".to_owned(), Ticket(2));
        j.insert(4, "a=4".to_owned(), Ticket(4));
        // Records 2..=3 failed; 4 is still queued.
        assert!(j.check(at(3, 3)));
        assert!(j.has(1, "a=1") && j.has(2, "a=2") && j.has(4, "a=4"));
        assert!(!j.has(3, "a=3"));
        assert!(!j.has(2, "a=other"));
        // Record 4 settled when a later batch failed: it cannot tell, so journaled again.
        j.insert(5, "a=5".to_owned(), Ticket(6));
        assert!(j.check(at(6, 6)));
        assert!(!j.has(4, "a=4") && !j.has(5, "a=5"));
        assert!(j.has(2, "a=2"));
        // A snapshot holds them all: no later failure forgets them.
        j.insert(4, "a=4".to_owned(), Ticket(7));
        j.covered(Ticket(7));
        assert!(j.check(at(8, 8)));
        assert!(j.has(4, "a=4"));
    }

    fn at(through: u64, last_failure: u64) -> Settled {
        Settled {
            through: Ticket(through),
            last_failure: Ticket(last_failure),
        }
    }

    #[test]
    fn a_name_is_in_doubt_until_its_records_settle_without_a_failure() {
        let mut d = InDoubt::default();
        d.hold("a.example.", Ticket(1), Ticket(2), at(0, 0));
        d.hold("b.example.", Ticket(3), Ticket(3), at(0, 0));
        // Any spelling of the same name.
        assert!(d.contains("A.Example", at(1, 0)));
        assert!(d.contains("b.example.", at(2, 0)));
        assert!(!d.contains("a.example.", at(2, 0)));
        assert!(!d.contains("c.example.", at(2, 0)));
        assert_eq!(d.count(at(2, 0)), 1);
        assert_eq!((d.count(at(3, 0)), d.queue.len()), (0, 0));
    }

    #[test]
    fn a_failure_keeps_the_names_it_may_have_hit_until_a_snapshot_covers_them() {
        let mut d = InDoubt::default();
        d.hold("a.example.", Ticket(1), Ticket(1), at(0, 0));
        d.hold("b.example.", Ticket(2), Ticket(2), at(0, 0));
        d.hold("c.example.", Ticket(4), Ticket(4), at(0, 0));
        // Records 2 and 3 failed; 1 had settled fine before.
        assert!(!d.contains("a.example.", at(1, 0)));
        assert!(d.contains("b.example.", at(3, 3)));
        // A later record of the same name does not clear the failed one.
        d.hold("b.example.", Ticket(5), Ticket(5), at(3, 3));
        assert!(d.contains("b.example.", at(5, 3)));
        assert!(!d.contains("c.example.", at(5, 3)));
        // Settled only after a later failure: it cannot tell, so it stays.
        d.hold("d.example.", Ticket(6), Ticket(6), at(5, 3));
        assert!(d.contains("d.example.", at(7, 7)));
        d.covered(Ticket(5));
        assert!(!d.contains("b.example.", at(7, 7)));
        assert!(d.contains("d.example.", at(7, 7)));
        assert_eq!(d.count(at(7, 7)), 1);
        d.covered(Ticket(6));
        assert_eq!((d.count(at(7, 7)), d.queue.len()), (0, 0));
    }

    #[test]
    fn a_refused_name_waits_for_a_snapshot_taken_after_it() {
        let mut d = InDoubt::default();
        d.hold("a.example.", Ticket(1), Ticket(1), at(0, 0));
        d.refused("a.example.", Ticket(1));
        d.refused("b.example.", Ticket(1));
        // No progress clears them, even without any failure.
        assert!(d.contains("a.example.", at(9, 0)) && d.contains("b.example.", at(9, 0)));
        // A rotation queued right after: taken before or after them, it cannot tell.
        d.covered(Ticket(1));
        assert_eq!(d.count(at(9, 0)), 2);
        // A later held answer keeps the name in doubt, the refused state not being on disk.
        d.hold("b.example.", Ticket(3), Ticket(3), at(9, 0));
        assert!(d.contains("b.example.", at(9, 0)));
        d.covered(Ticket(2));
        assert!(!d.contains("a.example.", at(9, 0)) && d.contains("b.example.", at(9, 0)));
        d.covered(Ticket(3));
        assert_eq!(d.count(at(9, 0)), 0);
    }
}
