//! A client's TCP byte stream → the proxy's DNS-over-TCP frame reader
//! (`fqdnd_dnsproxy::fuzz::tcp_frames`), fed in reads of fuzzer-chosen sizes, against a naive
//! reading of the whole stream.
//!
//! Input: byte 0 = number of read sizes n (up to 16), then n big-endian u16 read sizes, then
//! the stream.
//!
//! Invariants: never panics; however the stream is cut into reads, the messages are exactly
//! the length-prefixed messages of the stream up to a zero length prefix (which closes it) or
//! an incomplete message at the end; the reader never holds more than one message's worth
//! unhandled and always has room to read when it needs more.
#![no_main]

use fqdnd_dnsproxy::fuzz::tcp_frames;
use libfuzzer_sys::fuzz_target;

/// The stream's messages read at once, and whether a zero length prefix ended it.
fn naive(mut stream: &[u8]) -> (Vec<Vec<u8>>, bool) {
    let mut out = Vec::new();
    while let [hi, lo, rest @ ..] = stream {
        let len = usize::from(u16::from_be_bytes([*hi, *lo]));
        if len == 0 {
            return (out, true);
        }
        let Some(msg) = rest.get(..len) else { break };
        out.push(msg.to_vec());
        stream = &rest[len..];
    }
    (out, false)
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 17).min(rest.len() / 2);
    let (sizes, stream) = rest.split_at(2 * n);
    let reads: Vec<u16> = sizes
        .chunks_exact(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    assert_eq!(tcp_frames(stream, &reads), naive(stream));
});
