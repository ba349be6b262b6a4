//! Raw capture bytes (pcap / pcapng, possibly gzipped) → `fqdnd_replay::extract_bytes`, the
//! whole path `fqdnd replay` runs over a capture file: capture framing, link layers, IP
//! fragments, UDP, TCP reassembly. Every extracted DNS message then goes through the replay
//! DNS decoder, as the engine does.
//!
//! Invariants: never panics; every message handed out is at most 65535 bytes (the UDP and TCP
//! framing bound).
#![no_main]

use fqdnd_replay::dns::Decoder;
use fqdnd_replay::extract_bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut decoder = Decoder::new();
    let (_counters, _error) = extract_bytes(data, &[53, 5353], &mut |payload| {
        assert!(
            payload.bytes.len() <= 65535,
            "a DNS message longer than 65535 bytes"
        );
        if let Ok(decoded) = decoder.decode(payload.bytes) {
            let _ = decoded.qname();
            for rr in &decoded.answers {
                let _ = decoded.name(&rr.owner);
            }
        }
    });
});
