//! Decoding what every answer brings: its names, label by label, and the whole message.
//! `cargo bench -p fqdnd-benchmarks --bench wire`

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "benchmark fixtures are fixed; a failure should stop the run"
)]
#![allow(clippy::disallowed_types, reason = "a benchmark measures wall time")]

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::str::FromStr;

use criterion::{Criterion, criterion_group, criterion_main};
use fqdnd_dnswire::{Decoder, push_label};
use hickory_proto::op::{Message, MessageType, Query};
use hickory_proto::rr::rdata::{A, CNAME};
use hickory_proto::rr::{Name, RData, Record, RecordType};

/// An answer as `benchmarks/vs-peers.sh`'s NSD sends it: the question and one A record.
fn answer(cname: bool) -> Vec<u8> {
    let name = Name::from_str("H03596.example.test.").unwrap();
    let mut msg = Message::new(
        0x1234,
        MessageType::Response,
        hickory_proto::op::OpCode::Query,
    );
    msg.add_query(Query::query(name.clone(), RecordType::A));
    let mut owner = name;
    if cname {
        let target = Name::from_str("edge-42.cdn.example.net.").unwrap();
        msg.add_answer(Record::from_rdata(
            owner,
            300,
            RData::CNAME(CNAME(target.clone())),
        ));
        owner = target;
    }
    msg.add_answer(Record::from_rdata(
        owner,
        300,
        RData::A(A(Ipv4Addr::new(192, 0, 2, 7))),
    ));
    msg.to_vec().unwrap()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("wire");
    group.bench_function("push-label/3-labels", |b| {
        let mut text = String::with_capacity(64);
        b.iter(|| {
            text.clear();
            for label in [&b"H03596"[..], b"example", b"test"] {
                push_label(&mut text, black_box(label));
            }
            text.len()
        })
    });
    for (kind, cname) in [("a", false), ("cname-a", true)] {
        let msg = answer(cname);
        let mut decoder = Decoder::new();
        assert_eq!(
            decoder.decode_whole(&msg).unwrap().qname(),
            "h03596.example.test."
        );
        group.bench_function(format!("decode-whole/{kind}"), |b| {
            b.iter(|| {
                decoder
                    .decode_whole(black_box(&msg))
                    .map(|d| d.qname().len())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
