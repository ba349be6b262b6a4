//! An upstream datagram's validation: a well-formed response, whose ID is outstanding on the
//! socket it came in on and whose question is the query's (with 0x20, in the very case it was
//! sent); then the client's spelling of the question is put back. Anything else is dropped
//! with its reason, and the query keeps waiting for a good answer or its timeout.
//!
//! A TC=1 answer whose records are cut mid-record (RFC 1035 lets a server cut anywhere; old
//! servers do) is kept as its header and question only: what matters in it is the TC bit,
//! which sends the query to TCP (as unbound does, on the bit alone).

use hickory_proto::op::Message;

use crate::case;
use crate::metrics::DropReason;
use crate::upstream_socket::Inflight;
use crate::wire::{self, Opt};

/// An answer that passed validation, taken out of its socket's in-flight table.
#[derive(Debug)]
pub(crate) struct Validated {
    /// The answer as the client will see it (question in the client's case).
    pub(crate) msg: Message,
    /// The query it answers.
    pub(crate) entry: Inflight,
    /// Where the answer's question ends; `None` only for a health probe's answer.
    pub(crate) question_end: Option<usize>,
    /// The answer's bytes are `raw[..len]`: all of them, or the header and question of a
    /// truncated answer cut mid-record.
    pub(crate) len: usize,
}

/// Validates `raw`, an upstream's datagram from the upstream's address. `take` looks the ID
/// up in the socket's table and takes the entry out if the check it is given accepts it (the
/// table's lock is held only for that). On success `raw` holds the client's spelling of the
/// question.
pub(crate) fn validate(
    raw: &mut [u8],
    take: impl FnOnce(u16, &dyn Fn(&Inflight) -> Result<(), DropReason>) -> Result<Inflight, DropReason>,
) -> Result<Validated, DropReason> {
    let id = match wire::id(raw) {
        Some(id) if raw.len() >= wire::HEADER_LEN && wire::is_response(raw) => id,
        _ => return Err(DropReason::Malformed),
    };
    let question_end = wire::question_end(raw);
    // Parsed before the table is touched: garbage with a guessed ID must not end the query.
    let (msg, len) = match Message::from_vec(raw) {
        Ok(msg) => (msg, raw.len()),
        Err(_) => match question_end {
            Some(end) if wire::is_truncated(raw) => {
                // Header and question only: no answer, authority or additional records.
                raw[6..wire::HEADER_LEN].fill(0);
                match Message::from_vec(&raw[..end]) {
                    Ok(msg) => (msg, end),
                    Err(_) => return Err(DropReason::Malformed),
                }
            }
            _ => return Err(DropReason::Malformed),
        },
    };
    let raw = &mut raw[..len];
    let entry = {
        let answer: &[u8] = raw;
        take(id, &|e: &Inflight| e.check_question(answer, question_end))?
    };
    let msg = match (&entry.sent_name, question_end) {
        (Some(_), Some(end)) => {
            case::restore(raw, &entry.query, end);
            // Only the case of the name's letters changed: it parses as before.
            Message::from_vec(raw).unwrap_or(msg)
        }
        _ => msg,
    };
    Ok(Validated {
        msg,
        entry,
        question_end,
        len,
    })
}

/// The reply to a UDP client: the answer with the client's ID (rewritten in `raw`), or, when
/// it is longer than the client's payload size `udp_limit`, its header and question with TC=1
/// written into `out`, with the answer's RCODE and the client's OPT record (`opt`) carrying
/// the RCODE's upper bits.
pub(crate) fn fit_udp<'a>(
    raw: &'a mut [u8],
    out: &'a mut Vec<u8>,
    client_id: u16,
    udp_limit: u16,
    opt: Option<Opt>,
    question_end: usize,
    code: u16,
) -> &'a [u8] {
    if raw.len() <= usize::from(udp_limit) {
        wire::set_id(raw, client_id);
        return raw;
    }
    let opt = opt.map(|o| Opt {
        rcode_high: u8::try_from(code >> 4).unwrap_or(u8::MAX),
        ..o
    });
    #[allow(
        clippy::cast_possible_truncation,
        reason = "the low 4 bits of the RCODE"
    )]
    let low = (code & 0x0f) as u8;
    wire::write_header_reply(out, raw, client_id, Some(question_end), low, true, opt);
    out
}
