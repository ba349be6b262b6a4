//! A restore into an empty cache learns every answer as `observe` does, with the IpCache's
//! claims applied in one pass at the end; when that pass could trip an IpCache breaker it
//! learns them one by one instead. Either way the state must be what learning the answers
//! one by one leaves.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::{Engine, addr, name};
use fqdnd_ipcache::{EndpointId, NotApplied};
use fqdnd_namemgr::{Config, Error, OneByOne, Restore, RestoreAnswers, RestoreRoom, Sizes};
use proptest::prelude::*;

/// An answer: endpoint, name number, address numbers, TTL.
type Answer = (u16, usize, Vec<u16>, u32);

fn engines(max_ips_per_name: usize, max_fqdn_identities: usize) -> (Engine, Engine) {
    let make = || {
        Engine::with(
            Config {
                max_zombies: 8,
                max_ips_per_name,
                max_ips_per_hostname: 3,
                max_names_per_endpoint: 150,
                ..Config::default()
            },
            fqdnd_ipcache::Config {
                max_fqdn_identities,
                ..fqdnd_ipcache::Config::default()
            },
        )
    };
    (make(), make())
}

/// Answers with the name numbers `numbers` gives them (by answer).
struct Numbered<'a> {
    answers: &'a [Restore<'a>],
    numbers: Vec<Option<u32>>,
}

impl RestoreAnswers for Numbered<'_> {
    fn len(&self) -> usize {
        self.answers.len()
    }

    fn get(&self, at: usize) -> Option<Restore<'_>> {
        self.answers.get(at).copied()
    }

    fn name_number(&self, at: usize) -> Option<u32> {
        self.numbers.get(at).copied().flatten()
    }

    fn name_numbers(&self) -> usize {
        let last = self.numbers.iter().flatten().max();
        last.map_or(0, |n| *n as usize + 1)
    }
}

/// How the answers' names are numbered for the restore.
#[derive(Debug, Clone, Copy)]
enum Numbers {
    /// Not at all.
    None,
    /// By name, but for every `.0`-th answer (from the second), which has none.
    ByName(usize),
    /// Each answer its own (wrong where a name repeats).
    ByAnswer,
    /// One for all (wrong where there are two names).
    Same,
}

/// Restores `answers` into `bulk` and learns them one by one into `steps`; returns how the
/// restore went and the names that failed in each.
fn both(
    bulk: &mut Engine,
    steps: &mut Engine,
    answers: &[Answer],
) -> (Option<OneByOne>, Vec<String>, Vec<String>) {
    both_numbered(bulk, steps, answers, Numbers::None)
}

/// [`both`], the names numbered as `numbers` says.
fn both_numbered(
    bulk: &mut Engine,
    steps: &mut Engine,
    answers: &[Answer],
    numbers: Numbers,
) -> (Option<OneByOne>, Vec<String>, Vec<String>) {
    let now = Duration::from_secs(5);
    // One name spelled three ways across the answers: canonical (the restore's labelling
    // thread works it out ahead), without the trailing dot, and in capitals (both learned
    // the ordinary way).
    let names: Vec<String> = answers
        .iter()
        .enumerate()
        .map(|(i, (_, n, _, _))| match i % 3 {
            0 => format!("{}.", name(*n)),
            1 => name(*n),
            _ => name(*n).to_uppercase(),
        })
        .collect();
    let addrs: Vec<Vec<IpAddr>> = answers
        .iter()
        .map(|(_, _, ips, _)| ips.iter().map(|i| addr(*i)).collect())
        .collect();
    let restore: Vec<Restore<'_>> = answers
        .iter()
        .zip(names.iter().zip(&addrs))
        .map(|((ep, _, _, ttl), (name, addrs))| Restore {
            endpoint: EndpointId(*ep),
            name,
            addrs,
            ttl: *ttl,
        })
        .collect();
    let numbered = Numbered {
        answers: &restore,
        numbers: answers
            .iter()
            .enumerate()
            .map(|(i, (_, n, _, _))| match numbers {
                Numbers::None => None,
                Numbers::ByName(every) if i % every == 1 => None,
                Numbers::ByName(_) => u32::try_from(*n).ok(),
                Numbers::ByAnswer => u32::try_from(i).ok(),
                Numbers::Same => Some(0),
            })
            .collect(),
    };
    let mut failed_bulk = Vec::new();
    let stats = bulk
        .names
        .restore(&numbered, now, &mut bulk.ipcache, |a, _: Error| {
            failed_bulk.push(a.name.to_owned());
        })
        .unwrap();
    bulk.ipcache.commit().unwrap();
    let mut failed_steps = Vec::new();
    for a in &restore {
        let learned =
            steps
                .names
                .observe(a.endpoint, a.name, a.addrs, a.ttl, now, &mut steps.ipcache);
        if learned.is_err() {
            failed_steps.push(a.name.to_owned());
        }
    }
    steps.ipcache.commit().unwrap();
    (stats.one_by_one, failed_bulk, failed_steps)
}

/// Learns `answers` again, a second later, each name spelled canonically.
fn again(engine: &mut Engine, answers: &[Answer]) {
    let now = Duration::from_secs(6);
    for (ep, n, ips, ttl) in answers {
        let addrs: Vec<IpAddr> = ips.iter().map(|i| addr(*i)).collect();
        let _ = engine.names.observe(
            EndpointId(*ep),
            &format!("{}.", name(*n)),
            &addrs,
            *ttl,
            now,
            &mut engine.ipcache,
        );
    }
    engine.ipcache.commit().unwrap();
}

fn answers() -> impl Strategy<Value = Vec<Answer>> {
    prop::collection::vec(
        (
            1u16..4,
            0usize..300,
            prop::collection::vec(0u16..200, 0..6),
            0u32..300,
        ),
        1..400,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// With room for every identity, the restore takes the bulk path (with slots made ahead
    /// for its names or without) and ends where learning
    /// one by one ends (the NameManager's bounds hit in the same order).
    #[test]
    fn a_bulk_restore_equals_learning_one_by_one(
        answers in answers(),
        max_ips_per_name in 2usize..8,
        numbers in prop_oneof![
            Just(Numbers::None),
            (1usize..6).prop_map(Numbers::ByName),
        ],
        room in prop::option::of((0usize..400, 0usize..800, 0usize..200)),
    ) {
        let (mut bulk, mut steps) = engines(max_ips_per_name, 10_000);
        // Made ahead for some number of names and addresses (too few, enough, or too many),
        // or not.
        if let Some((names, v4, v6)) = room {
            let sizes = Sizes { name_bytes: names * 12, v4, v6 };
            bulk.names.adopt_room(RestoreRoom::new(names, sizes));
        }
        let (one_by_one, failed_bulk, failed_steps) =
            both_numbered(&mut bulk, &mut steps, &answers, numbers);
        prop_assert_eq!(one_by_one, None);
        prop_assert_eq!(failed_bulk, failed_steps);
        prop_assert_eq!(bulk.state(), steps.state());
        prop_assert_eq!(bulk.names.stats(), steps.names.stats());
        prop_assert_eq!(bulk.ipcache.stats(), steps.ipcache.stats());
        // Every restored name is found by name afterwards (the restore indexes its new
        // names at its end): learning the answers again adds no name to either.
        again(&mut bulk, &answers);
        again(&mut steps, &answers);
        prop_assert_eq!(bulk.state(), steps.state());
        prop_assert_eq!(bulk.names.stats(), steps.names.stats());
        // And it goes on as the other does: a GC pass past every TTL.
        let none = std::collections::BTreeSet::new();
        bulk.gc(400, &none);
        steps.gc(400, &none);
        prop_assert_eq!(bulk.state(), steps.state());
    }

    /// Where the FQDN identity breaker could trip, which mappings it refuses depends on the
    /// order: the restore learns one by one, and ends as learning one by one does.
    #[test]
    fn a_restore_that_may_trip_the_identity_breaker_goes_one_by_one(answers in answers()) {
        let (mut bulk, mut steps) = engines(6, 1);
        let (one_by_one, failed_bulk, failed_steps) = both(&mut bulk, &mut steps, &answers);
        // Names of both selected kinds (`name`): two label sets at least, past the limit.
        let kind = |k: &[usize]| answers.iter().any(|(_, n, ips, _)| k.contains(&(n % 5)) && !ips.is_empty());
        if kind(&[1, 2]) && kind(&[3, 4]) {
            prop_assert_eq!(one_by_one, Some(OneByOne::IpCache(NotApplied::FqdnIdentities)));
        }
        prop_assert_eq!(failed_bulk, failed_steps);
        prop_assert_eq!(bulk.state(), steps.state());
        prop_assert_eq!(bulk.names.stats(), steps.names.stats());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Names numbered wrongly (one name under two numbers, two names under one) are caught:
    /// the restore takes back what it applied and learns one by one, and ends as learning
    /// one by one does.
    #[test]
    fn names_numbered_wrongly_are_learned_one_by_one(
        answers in answers(),
        numbers in prop_oneof![Just(Numbers::ByAnswer), Just(Numbers::Same)],
    ) {
        let (mut bulk, mut steps) = engines(6, 10_000);
        let (one_by_one, failed_bulk, failed_steps) =
            both_numbered(&mut bulk, &mut steps, &answers, numbers);
        prop_assert!(matches!(one_by_one, None | Some(OneByOne::SharedName)), "{one_by_one:?}");
        prop_assert_eq!(failed_bulk, failed_steps);
        prop_assert_eq!(bulk.state(), steps.state());
        prop_assert_eq!(bulk.names.stats(), steps.names.stats());
    }
}

/// One name under two numbers (answers 0 and 3: every third is spelled canonically), the
/// second answer adding it again, or adding nothing to the cache (no address: it only
/// records that endpoint 2 asked): caught either way.
#[test]
fn one_name_under_two_numbers_goes_one_by_one() {
    for second in [vec![4], vec![]] {
        let (mut bulk, mut steps) = engines(6, 10_000);
        let answers = [
            (1, 7, vec![1], 60),
            (1, 8, vec![2], 60),
            (1, 9, vec![3], 60),
            (2, 7, second, 90),
        ];
        let (one_by_one, _, _) = both_numbered(&mut bulk, &mut steps, &answers, Numbers::ByAnswer);
        assert_eq!(one_by_one, Some(OneByOne::SharedName), "{answers:?}");
        assert_eq!(bulk.state(), steps.state());
        assert_eq!(bulk.names.stats(), steps.names.stats());
        assert_eq!(bulk.ipcache.prefix_count(), steps.ipcache.prefix_count());
    }
}

/// A restore into a cache that holds names already learns one by one.
#[test]
fn a_restore_into_a_filled_cache_goes_one_by_one() {
    let (mut bulk, mut steps) = engines(6, 10_000);
    let first = [(1, 1, vec![1, 2], 60)];
    both(&mut bulk, &mut steps, &first);
    let (one_by_one, _, _) = both(&mut bulk, &mut steps, &[(1, 2, vec![2, 3], 60)]);
    assert_eq!(one_by_one, Some(OneByOne::NotEmpty));
    assert_eq!(bulk.state(), steps.state());
}
