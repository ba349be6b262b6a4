//! A structured answer (question + records) → `Answer::from_records`.
//!
//! Names are drawn from a small pool (with case and trailing-dot variants) so that chains,
//! loops and stray records actually occur. Invariants when the answer is accepted: its name is
//! the canonical question; every record's owner is on the chain; every address returned is an
//! address record of the input, appears once, and the TTL is the minimum over all records
//! (0 when there are none).
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use arbitrary::Arbitrary;
use fqdnd_namemgr::{Answer, Record, RecordData, canonicalize};
use libfuzzer_sys::fuzz_target;

const POOL: [&str; 8] = [
    "www.example.com",
    "edge.cdn.net",
    "e1.cdn.net",
    "a.",
    "b.",
    "",
    ".",
    "bank.example",
];

/// A name: from the pool, with its case and trailing dot varied, or free text.
#[derive(Debug, Arbitrary)]
enum Name {
    Pool { index: u8, upper: bool, dot: bool },
    Free(String),
}

impl Name {
    fn text(&self) -> String {
        match self {
            Self::Pool { index, upper, dot } => {
                let base = POOL[usize::from(*index) % POOL.len()];
                let mut s = if *upper {
                    base.to_ascii_uppercase()
                } else {
                    base.to_owned()
                };
                if *dot && !s.ends_with('.') {
                    s.push('.');
                }
                s
            }
            Self::Free(s) => s.clone(),
        }
    }
}

#[derive(Debug, Arbitrary)]
enum Data {
    V4(u32),
    V6(u128),
    /// An address from a tiny set, so duplicates happen.
    Small(u8),
    Cname(Name),
}

#[derive(Debug, Arbitrary)]
struct Input {
    question: Name,
    records: Vec<(Name, u32, Data)>,
}

fuzz_target!(|input: Input| {
    let question = input.question.text();
    let records: Vec<Record> = input
        .records
        .iter()
        .map(|(owner, ttl, data)| Record {
            owner: owner.text(),
            ttl: *ttl,
            data: match data {
                Data::V4(a) => RecordData::Addr(IpAddr::V4(Ipv4Addr::from(*a))),
                Data::V6(a) => RecordData::Addr(IpAddr::V6(Ipv6Addr::from(*a))),
                Data::Small(a) => RecordData::Addr(IpAddr::V4(Ipv4Addr::new(192, 0, 2, *a % 4))),
                Data::Cname(target) => RecordData::Cname(target.text()),
            },
        })
        .collect();
    let Ok(answer) = Answer::from_records(&question, &records) else {
        return;
    };
    assert_eq!(
        answer.name,
        canonicalize(&question),
        "name is not the canonical question"
    );
    // Every record is on the chain (otherwise the answer is rejected), so the chain TTL is
    // the minimum over all of them.
    let min_ttl = records.iter().map(|r| r.ttl).min().unwrap_or(0);
    assert_eq!(answer.ttl, min_ttl, "ttl is not the chain minimum");
    for record in &records {
        assert!(
            answer.ttl <= record.ttl,
            "ttl {} above a record's {}",
            answer.ttl,
            record.ttl
        );
    }
    for (i, addr) in answer.addrs.iter().enumerate() {
        assert!(
            records.iter().any(|r| r.data == RecordData::Addr(*addr)),
            "address {addr} is in no input record"
        );
        assert!(
            !answer.addrs[..i].contains(addr),
            "address {addr} returned twice"
        );
    }
    // The addresses all belong to one owner: the end of the chain.
    let owners_of = |addr: &IpAddr| -> Vec<String> {
        records
            .iter()
            .filter(|r| r.data == RecordData::Addr(*addr))
            .map(|r| canonicalize(&r.owner).into_owned())
            .collect()
    };
    if let Some((first, rest)) = answer.addrs.split_first() {
        let common: Vec<String> = owners_of(first)
            .into_iter()
            .filter(|owner| rest.iter().all(|addr| owners_of(addr).contains(owner)))
            .collect();
        assert!(
            !common.is_empty(),
            "addresses {:?} come from different owners",
            answer.addrs
        );
    }
});
