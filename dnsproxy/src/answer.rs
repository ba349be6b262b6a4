//! An upstream datagram's validation: a well-formed response, whose ID is outstanding on the
//! socket it came in on and whose question is the query's (with 0x20, in the very case it was
//! sent); then the client's spelling of the question is put back (also when the upstream
//! changed the case itself). Anything else is dropped
//! with its reason, and the query keeps waiting for a good answer or its timeout.
//!
//! A TC=1 answer whose records are cut mid-record (RFC 1035 lets a server cut anywhere; old
//! servers do) is kept as its header and question only: what matters in it is the TC bit,
//! which sends the query to TCP (as unbound does, on the bit alone).

use fqdnd_dnswire::Decoder;

use crate::case;
use crate::metrics::DropReason;
use crate::question::Question;
use crate::upstream_socket::{Inflight, Spare, TableAccess};
use crate::wire::{self, Opt};

/// An answer that passed validation, taken out of its socket's in-flight table; the decoder
/// that validated it holds it decoded ([`Decoder::decoded`]).
#[derive(Debug)]
pub(crate) struct Validated {
    /// The query it answers.
    pub(crate) entry: Inflight,
    /// The answer's question; `None` only for a health probe's answer.
    pub(crate) question: Option<Question>,
    /// The answer's bytes are `raw[..len]`: all of them, or the header and question of a
    /// truncated answer cut mid-record.
    pub(crate) len: usize,
}

/// Validates `raw`, an upstream's datagram from the upstream's address, against the in-flight
/// table of the socket it came in on (whose lock is held only for a lookup and for taking the
/// entry out). On success `raw` holds the client's spelling of the question and `decoder` the
/// answer decoded (names in canonical form, so the case the client gets back changes nothing
/// there); every record of the message was checked (`Decoder::decode_whole`). The buffers in
/// `spare` (of queries that ended before) go back to the table under the same lock.
pub(crate) fn validate(
    raw: &mut [u8],
    table: &impl TableAccess,
    decoder: &mut Decoder,
    spare: &mut Spare,
) -> Result<Validated, DropReason> {
    let id = match wire::id(raw) {
        Some(id) if raw.len() >= wire::HEADER_LEN && wire::is_response(raw) => id,
        _ => return Err(DropReason::Malformed),
    };
    let question = Question::parse(raw);
    // A compression pointer to offset 0 or 1 makes a name out of the ID bytes: the records
    // read differently with the upstream's ID and with the client's. The observer must see
    // what the client gets, so such a message is decoded again with the client's ID in place.
    // Decoded before the table is touched: garbage with a guessed ID must not end the query.
    let mut decoded = decoder.decode_whole(raw).map(|d| d.points_into_id);
    // After an error the decoder may have stopped short of the pointer: the bytes say.
    let may_point = match decoded {
        Ok(points) => points,
        Err(_) => may_point_into_id(raw),
    };
    if may_point && let Some(client_id) = table.with_table(|t| t.client_id(id)) {
        wire::set_id(raw, client_id);
        decoded = decoder.decode_whole(raw).map(|_| false);
    }
    let len = match decoded {
        Ok(_) => raw.len(),
        Err(_) => match question {
            Some(question) if wire::is_truncated(raw) => {
                // Header and question only: no answer, authority or additional records.
                raw[6..wire::HEADER_LEN].fill(0);
                match decoder.decode_whole(&raw[..question.end()]) {
                    Ok(_) => question.end(),
                    Err(_) => return Err(DropReason::Malformed),
                }
            }
            _ => return Err(DropReason::Malformed),
        },
    };
    let raw = &mut raw[..len];
    let entry = {
        let answer: &[u8] = raw;
        table.with_table(|t| {
            t.spare.take_all(spare);
            t.take(id, |e| e.check_question(answer, question))
        })?
    };
    // The client gets its question as it wrote it, whether the case changed on the way out
    // (0x20) or at the upstream (which may answer in another case: names compare
    // case-insensitively), so a client doing its own 0x20 check accepts the reply. Only the
    // case of the name's letters changes: the canonical names decoded stay as they are.
    if let Some(answered) = question
        && answered.bytes(raw) != entry.question.bytes(&entry.query)
    {
        case::restore(raw, answered, &entry.query, entry.question);
    }
    Ok(Validated {
        entry,
        question,
        len,
    })
}

/// Whether a name of `raw`, which did not decode, may be a compression pointer to offset 0 or 1
/// (the ID): the bytes `C0 00` or `C0 01` after the header (also found in RDATA, e.g. an
/// address 192.0.x.x: then the answer is merely decoded again with the client's ID).
fn may_point_into_id(raw: &[u8]) -> bool {
    raw.get(wire::HEADER_LEN..)
        .is_some_and(|rest| rest.windows(2).any(|w| w[0] == 0xc0 && w[1] < 2))
}

/// The reply to a UDP client: the answer with the client's ID (rewritten in `raw`), or, when
/// it is longer than the client's payload size `udp_limit`, its header and question (`raw`'s
/// `question`) with TC=1 written into `out`, with the answer's RCODE and the client's OPT
/// record (`opt`) carrying the RCODE's upper bits.
pub(crate) fn fit_udp<'a>(
    raw: &'a mut [u8],
    out: &'a mut Vec<u8>,
    client_id: u16,
    udp_limit: u16,
    opt: Option<Opt>,
    question: Question,
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
    wire::write_header_reply(out, raw, client_id, Some(question), low, true, opt);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::IdSource;
    use crate::upstream_socket::Table;
    use fqdnd_dnswire::Decoded;

    /// `time.windows.com. AAAA` as a client wrote it.
    fn client_query() -> Vec<u8> {
        let mut q = vec![0x56, 0xa9, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        q.extend_from_slice(b"\x04time\x07windows\x03com\x00\x00\x1c\x00\x01");
        q
    }

    /// Validates `answer` (its ID set to the query's) against `query` forwarded on a table.
    fn run(
        query: &[u8],
        answer: Vec<u8>,
        randomize: bool,
    ) -> Result<(Vec<u8>, Validated, Decoded), DropReason> {
        run_with(query, |_| answer, randomize)
    }

    /// [`run`], with the answer made from the query as it was sent upstream.
    fn run_with(
        query: &[u8],
        answer: impl FnOnce(&[u8]) -> Vec<u8>,
        randomize: bool,
    ) -> Result<(Vec<u8>, Validated, Decoded), DropReason> {
        let mut table = Table::new();
        let mut ids = IdSource::new();
        let slot = table.insert(&mut ids).unwrap();
        let id = slot.id();
        let question = Question::parse(query).unwrap();
        let mut sent = query.to_vec();
        wire::set_id(&mut sent, id);
        let stored = sent.clone();
        let mut sent_name = Vec::new();
        if randomize {
            case::randomize(&mut sent, question, &mut ids, &mut sent_name);
        }
        let mut answer = answer(&sent);
        slot.fill(Inflight {
            query: stored,
            question,
            sent_name,
            sent: tokio::time::Instant::now(),
            origin: None,
        });
        wire::set_id(&mut answer, id);
        let mut decoder = Decoder::new();
        let v = validate(
            &mut answer,
            &std::cell::RefCell::new(table),
            &mut decoder,
            &mut Spare::default(),
        )?;
        answer.truncate(v.len);
        Ok((answer, v, decoder.decoded().clone()))
    }

    /// Regression (fuzz `dns_answer`, `fuzz/regressions/dns_answer/upstream-changes-question-case`):
    /// without 0x20, an upstream that answers `time.windowS.com` to `time.windows.com` was
    /// accepted (names compare case-insensitively) and its spelling reached the client, which
    /// would drop it if it checks the case itself.
    #[test]
    fn the_client_gets_its_spelling_back_when_the_upstream_changes_the_case() {
        let query = client_query();
        let end = Question::parse(&query).unwrap().end();
        let mut answer = query.clone();
        answer[2] |= 0x80;
        answer[HEADER_NAME_S] = b'S';
        let (reply, _, decoded) = run(&query, answer, false).unwrap();
        assert_eq!(reply[wire::HEADER_LEN..end], query[wire::HEADER_LEN..end]);
        assert_eq!(decoded.qname(), "time.windows.com.");
    }

    /// Where the `s` of `windows` is in [`client_query`].
    const HEADER_NAME_S: usize = 12 + 5 + 7;

    /// Regression (fuzz `dns_answer`, `fuzz/regressions/dns_answer/answer-with-three-questions`):
    /// an answer with QDCOUNT 3 whose first question was the query's was accepted, and the
    /// observer shown three questions.
    #[test]
    fn an_answer_with_more_than_one_question_is_dropped() {
        let query = client_query();
        let mut answer = query.clone();
        answer[2] |= 0x80;
        answer[5] = 2; // QDCOUNT
        answer.extend_from_slice(b"\x01x\x00\x00\x01\x00\x01");
        assert!(matches!(
            run(&query, answer, false),
            Err(DropReason::QuestionMismatch)
        ));
    }

    /// Regression (fuzz `dns_answer`, `fuzz/regressions/dns_answer/pointer-into-the-id`): a
    /// name pointing at offset 0 reads the ID bytes as labels, so the observer (upstream ID)
    /// and the client (client ID) were shown different records; the client's reply did not
    /// even parse.
    #[test]
    fn a_name_pointing_into_the_id_is_read_with_the_clients_id() {
        let query = client_query();
        let mut answer = query.clone();
        answer[2] |= 0x80;
        answer[7] = 1; // ANCOUNT: an A record owned by the name at offset 0
        answer.extend_from_slice(&[0xc0, 0x00, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 1]);
        let shape = crate::fuzz::AnswerShape {
            right_id: true,
            ..Default::default()
        };
        // The client's ID 0x56a9: 0x56 is no label length, so the client could not parse the
        // answer; nor may the observer then (whatever the upstream ID).
        let path = crate::fuzz::answer_path(&query, &answer, shape).unwrap();
        assert_eq!(path.dropped, Some(DropReason::Malformed));
        // With a client ID whose bytes read as a name (0x00: the root), observer and client
        // parse the same bytes, whatever the upstream ID.
        let mut query = query;
        query[..2].copy_from_slice(&[0x00, 0x00]);
        let path = crate::fuzz::answer_path(&query, &answer, shape).unwrap();
        let reply = path.reply.unwrap();
        assert_eq!(reply[..2], [0x00, 0x00]);
        let mut decoder = Decoder::new();
        let observed = path.observed.unwrap();
        assert_eq!(
            decoder.decode_whole(&reply).unwrap().answers,
            observed.answers
        );
        assert_eq!(decoder.decoded().text, observed.text);
        assert_eq!(observed.name(&observed.answers[0].owner), ".");
    }

    #[test]
    fn with_0x20_only_the_exact_case_is_accepted() {
        let query = client_query();
        // The name exactly as sent: accepted, and the client gets its own spelling back.
        let (reply, _, _) = run_with(
            &query,
            |sent| {
                let mut answer = sent.to_vec();
                answer[2] |= 0x80;
                answer
            },
            true,
        )
        .unwrap();
        let end = Question::parse(&query).unwrap().end();
        assert_eq!(reply[wire::HEADER_LEN..end], query[wire::HEADER_LEN..end]);
        // One letter in another case than sent (whatever the random case was): dropped.
        let flipped = run_with(
            &query,
            |sent| {
                let mut answer = sent.to_vec();
                answer[2] |= 0x80;
                answer[HEADER_NAME_S] ^= 0x20;
                answer
            },
            true,
        );
        assert!(matches!(flipped, Err(DropReason::CaseMismatch)));
    }

    #[test]
    fn a_truncated_answer_cut_mid_record_keeps_its_header_and_question() {
        let query = client_query();
        let end = Question::parse(&query).unwrap().end();
        let mut answer = query.clone();
        answer[2] |= 0x82; // QR, TC
        answer[7] = 1; // ANCOUNT
        answer.extend_from_slice(&[0xc0, 12, 0, 28, 0, 1, 0, 0, 0, 60, 0, 16, 0x20, 0x01]);
        let (reply, v, decoded) = run(&query, answer.clone(), false).unwrap();
        assert_eq!(v.len, end);
        assert_eq!(reply.len(), end);
        assert!(decoded.header.truncated && decoded.answers.is_empty());
        // Without TC it is garbage.
        answer[2] &= !0x02;
        assert!(matches!(
            run(&query, answer, false),
            Err(DropReason::Malformed)
        ));
    }
}
