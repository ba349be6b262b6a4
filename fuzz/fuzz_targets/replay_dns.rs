//! One DNS message → the replay crate's DNS decoder (`dns::Decoder`, `is_whole_message`,
//! `plausible_header`), which reads every message found in a capture.
//!
//! Invariants: never panics; every name range of a decoded message is a valid range of its
//! text, every raw RDATA range lies inside the message, and only class-IN A/AAAA records carry
//! addresses; decoding is deterministic and the decoder reuses its buffers without leaking
//! state from one message into the next; `decode_whole` (how the proxy reads answers) agrees
//! with `decode` on the answers and takes nothing `decode` refuses but for the question count.
#![no_main]

use fqdnd_replay::dns::{Data, Decoder, is_whole_message, plausible_header};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = is_whole_message(data);
    let _ = plausible_header(data, data.len());
    let mut decoder = Decoder::new();
    // Decode something else first so stale buffer contents would show.
    let _ = decoder.decode(b"\x00\x01\x81\x80\x00\x01\x00\x01\x00\x00\x00\x00\x01a\x00\x00\x01\x00\x01\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x05\x00\x04\xc0\x00\x02\x01");
    let first = decoder.decode(data).map(|d| (d.clone(), d.text.clone()));
    let mut fresh = Decoder::new();
    let second = fresh.decode(data).map(|d| (d.clone(), d.text.clone()));
    // What the proxy reads answers with: the same answers whenever both take the message,
    // and never a message whose answers `decode` refuses.
    let simple = fresh.decode(data).map(|d| d.clone());
    match (decoder.decode_whole(data), simple) {
        (Ok(whole), Ok(simple)) => {
            assert_eq!(whole.answers, simple.answers);
            assert_eq!(whole.text, simple.text);
            assert_eq!(whole.rcode & 0x0f, u16::from(simple.header.rcode));
        }
        (Ok(whole), Err(e)) => assert!(
            whole.header.qdcount != 1,
            "decode_whole took what decode refused: {e:?}"
        ),
        (Err(_), _) => {}
    }
    match (first, second) {
        (Ok((a, at)), Ok((b, bt))) => {
            assert_eq!(at, bt, "decoder state leaked between messages");
            assert_eq!(a.answers, b.answers);
            assert_eq!(a.qname, b.qname);
            assert!(
                a.text.get(a.qname.clone()).is_some(),
                "qname range out of text"
            );
            for rr in &a.answers {
                assert!(
                    a.text.get(rr.owner.clone()).is_some(),
                    "owner range out of text"
                );
                match &rr.data {
                    Data::Addr(ip) => {
                        assert_eq!(rr.class, 1, "address in class {}", rr.class);
                        assert!(
                            (rr.rtype == 1 && ip.is_ipv4()) || (rr.rtype == 28 && ip.is_ipv6()),
                            "address {ip} in a record of type {}",
                            rr.rtype
                        );
                    }
                    Data::Name(range) => {
                        assert!(
                            a.text.get(range.clone()).is_some(),
                            "target range out of text"
                        );
                    }
                    Data::Raw(range) => {
                        assert!(
                            data.get(range.clone()).is_some(),
                            "raw rdata out of the message"
                        );
                    }
                }
                assert!(rr.ttl <= 0x7fff_ffff, "ttl top bit not cleared");
            }
        }
        (Err(a), Err(b)) => assert_eq!(a, b, "decoding is not deterministic"),
        (a, b) => panic!(
            "decoding is not deterministic: {:?} vs {:?}",
            a.is_ok(),
            b.is_ok()
        ),
    }
});
