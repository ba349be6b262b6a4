//! An upstream's raw bytes → the proxy's answer path (`fqdnd_dnsproxy::fuzz::answer_path`): a
//! client query is forwarded on an in-flight table as the proxy does, then the answer is
//! validated (response, outstanding ID, same question, with 0x20 the exact case), the client's
//! spelling restored, and the reply fitted to the client's UDP payload size.
//!
//! Input: byte 0 = flags (bit 0: 0x20, bit 1: write the right ID into the answer, bit 2: copy
//! the question as sent over the answer's), bytes 1–2 = the query's length (big-endian), then
//! the query, then the answer.
//!
//! Invariants: never panics; an accepted answer is a response with one question that is the
//! query's (with 0x20, byte for byte as sent), and the observer gets it; the client's reply
//! carries the client's ID and its question byte for byte, and is either the answer (within the
//! client's payload size) or its header and question with TC=1; a dropped answer gives the
//! observer and the client nothing.
#![no_main]

use fqdnd_dnsproxy::DropReason;
use fqdnd_dnsproxy::fuzz::{AnswerShape, answer_path};
use fqdnd_dnswire::Decoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [flags, hi, lo, rest @ ..] = data else {
        return;
    };
    let qlen = usize::from(u16::from_be_bytes([*hi, *lo])).min(rest.len());
    let (query, answer) = rest.split_at(qlen);
    let shape = AnswerShape {
        randomize_case: flags & 1 != 0,
        right_id: flags & 2 != 0,
        echo_question: flags & 4 != 0,
    };
    let Some(path) = answer_path(query, answer, shape) else {
        return;
    };
    let end = path.question_end;
    match (&path.dropped, &path.observed, &path.reply) {
        (Some(reason), None, None) => {
            if !shape.right_id && answer.len() >= 2 {
                let id = u16::from_be_bytes([answer[0], answer[1]]);
                if id != path.upstream_id {
                    assert!(
                        matches!(reason, DropReason::UnknownId | DropReason::Malformed),
                        "{reason:?} for a wrong ID"
                    );
                }
            }
        }
        (None, Some(msg), Some(reply)) => {
            assert!(msg.header.response);
            assert_eq!(msg.header.qdcount, 1, "one question, the query's");
            assert!(shape.right_id || answer[..2] == path.sent_query[..2]);
            if shape.randomize_case {
                // Accepted only if the answer echoed the name exactly as it was sent.
                let echoed = if shape.echo_question {
                    &path.sent_query[12..end]
                } else {
                    &answer[12..end]
                };
                assert_eq!(echoed[..end - 16], path.sent_query[12..end - 4]);
            }
            assert_eq!(reply[..2], path.client_query[..2], "the client's ID");
            assert_eq!(
                reply[12..end],
                path.client_query[12..end],
                "the client's question"
            );
            // Whole and well-formed as the proxy reads messages (record types and classes
            // hickory-proto does not know, such as type 0, are no reason to drop an answer).
            let mut decoder = Decoder::new();
            let parsed = decoder.decode_whole(reply).expect("the reply decodes");
            assert!(parsed.header.response);
            if !parsed.header.truncated || reply.len() > end {
                assert!(reply.len() <= answer.len(), "never longer than the answer");
            }
        }
        other => panic!("inconsistent outcome {other:?}"),
    }
});
