//! Writes a synthetic S3-like capture for benchmarks:
//! `cargo run --release -p fqdnd-replay --example synth_trace -- OUT.pcap [RESPONSES] [RATE] [BUCKETS]`
//!
//! Every response follows its query (two frames per response); see
//! `fqdnd_replay::synth::s3_like_trace` for the mix of names.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a developer tool")]

use fqdnd_replay::synth::{SynthShape, s3_like_trace};

fn main() {
    let mut args = std::env::args().skip(1);
    let out = args
        .next()
        .expect("usage: synth_trace OUT.pcap [RESPONSES] [RATE]");
    let responses = args
        .next()
        .map_or(1_000_000, |n| n.parse().expect("RESPONSES is a number"));
    let rate = args
        .next()
        .map_or(10_000, |n| n.parse().expect("RATE is a number"));
    let shape = SynthShape {
        responses,
        rate,
        ..SynthShape::default()
    };
    let file = std::fs::File::create(&out).expect("OUT.pcap can be created");
    let n = s3_like_trace(file, &shape).expect("the trace is written");
    eprintln!("{out}: {n} responses at {rate}/s of capture time");
}
