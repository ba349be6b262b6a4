//! Arbitrary bytes as a snapshot body → the restore's flat decoder (`ReadSnapshot`) against
//! the derived decoder of the type the daemon writes (`Snapshot`).
//!
//! Invariants: never panics; both accept or both refuse the bytes; what both accept gives the
//! same answers (one per name, expiry and endpoint: the latest expiry first, each for the
//! endpoints in order, endpoint 0 for a name none asked, addresses in their order within one),
//! the same identities and the same entry count.
#![no_main]

use std::collections::BTreeMap;
use std::net::IpAddr;

use fqdnd_checkpoint::format::decode_value;
use fqdnd_engine::durable::{ReadSnapshot, Snapshot};
use libfuzzer_sys::fuzz_target;

type Answer = (u16, String, Vec<IpAddr>, u64);

/// The answers of a snapshot, built the plain way.
fn reference(snapshot: &Snapshot) -> Vec<Answer> {
    let mut out = Vec::new();
    for n in &snapshot.names {
        let mut groups: BTreeMap<u64, Vec<IpAddr>> = BTreeMap::new();
        for (addr, expires) in &n.addrs {
            groups.entry(*expires).or_default().push(*addr);
        }
        let endpoints = if n.endpoints.is_empty() { vec![0] } else { n.endpoints.clone() };
        for (expires, addrs) in groups.iter().rev() {
            for &ep in &endpoints {
                out.push((ep, n.name.clone(), addrs.clone(), *expires));
            }
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let plain = decode_value::<Snapshot>(data);
    let flat = ReadSnapshot::decode(data);
    match (plain, flat) {
        (Ok(plain), Ok(flat)) => {
            let got: Vec<Answer> = flat
                .answers
                .iter()
                .map(|a| (a.endpoint.0, a.name.to_owned(), a.addrs.to_vec(), a.expires_unix_ms))
                .collect();
            assert_eq!(got, reference(&plain));
            assert_eq!(flat.identities, plain.identities);
            assert_eq!(flat.entries, plain.entries());
        }
        (Err(_), Err(_)) => {}
        (a, b) => panic!("decoders disagree: {:?} / {:?}", a.map(|s| s.names.len()), b.map(|s| s.answers.len())),
    }
});
