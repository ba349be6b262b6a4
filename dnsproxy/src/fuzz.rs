//! Entry points for the cargo-fuzz targets in `fuzz/`; not an API. Each runs the proxy's own
//! code on bytes, without sockets: the same functions the listeners and receivers call.

use std::net::SocketAddr;

use fqdnd_dnswire::{Decoded, Decoder};
use tokio::time::Instant;

use crate::answer::{self, Validated};
use crate::case;
use crate::framing::{FrameReader, Next};
use crate::ids::IdSource;
use crate::metrics::DropReason;
use crate::policy::{QueryInfo, QueryPolicy, Transport, Verdict};
use crate::query;
use crate::upstream::{Asked, Origin, ReplyTo};
use crate::upstream_socket::{Inflight, Spare, Table};
use crate::wire::{self, rcode};

/// What the query path made of a client's bytes.
#[derive(Debug)]
pub struct QueryPath {
    /// The canonical question name, when the bytes are a query the proxy would check.
    pub name: Option<String>,
    /// The policy's verdict on it.
    pub verdict: Option<Verdict>,
    /// The reply the proxy writes itself (FORMERR, NOTIMP, REFUSED for a denied name), if any.
    pub reply: Option<Vec<u8>>,
    /// For an allowed query: the bytes sent upstream (ID `0xabcd`, with `randomize_case` the
    /// name's case randomised).
    pub forwarded: Option<Vec<u8>>,
    /// Where the question ends, for an allowed query.
    pub question_end: Option<usize>,
}

/// Client bytes → parse, canonical name, policy verdict, and the reply or the forwarded bytes,
/// as [`crate::DnsProxy`] does for a UDP query from 192.0.2.1.
pub fn query_path(raw: &[u8], policy: &dyn QueryPolicy, randomize_case: bool) -> QueryPath {
    let mut out = Vec::new();
    let mut name = String::new();
    let parsed = match query::parse(raw, &mut name) {
        Ok(parsed) => parsed,
        Err(not_forwarded) => {
            let reply = not_forwarded.write_reply(&mut out, raw).map(|_| out);
            return QueryPath {
                name: None,
                verdict: None,
                reply,
                forwarded: None,
                question_end: None,
            };
        }
    };
    let info = QueryInfo {
        client: SocketAddr::from(([192, 0, 2, 1], 5353)),
        server: SocketAddr::from(([192, 0, 2, 53], 53)),
        sender: None,
        name: &name,
        qtype: parsed.qtype,
        transport: Transport::Udp,
    };
    let verdict = policy.check(&info);
    let (reply, forwarded) = match verdict {
        Verdict::Allow { .. } => {
            let mut sent = raw.to_vec();
            wire::set_id(&mut sent, 0xabcd);
            if randomize_case {
                let mut sent_name = Vec::new();
                case::randomize(
                    &mut sent,
                    parsed.question,
                    &mut IdSource::new(),
                    &mut sent_name,
                );
            }
            (None, Some(sent))
        }
        Verdict::Deny { .. } | Verdict::UnknownClient => {
            let question = Some(parsed.question);
            let (id, opt) = (parsed.client_id, parsed.opt);
            wire::write_header_reply(&mut out, raw, id, question, rcode::REFUSED, false, opt);
            (Some(out), None)
        }
    };
    QueryPath {
        name: Some(name),
        verdict: Some(verdict),
        reply,
        forwarded,
        question_end: Some(parsed.question.end()),
    }
}

/// How [`answer_path`] builds the upstream's datagram from the fuzzer's bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct AnswerShape {
    /// Forward the query with 0x20 case randomisation.
    pub randomize_case: bool,
    /// Write the query's upstream ID into the answer (the fuzzer cannot guess a random one).
    pub right_id: bool,
    /// Copy the question exactly as sent (case included) over the answer's, where it fits.
    pub echo_question: bool,
}

/// What the answer path made of an upstream's bytes.
#[derive(Debug)]
pub struct AnswerPath {
    /// The query as the client sent it.
    pub client_query: Vec<u8>,
    /// The query as sent upstream.
    pub sent_query: Vec<u8>,
    /// Where the query's question ends.
    pub question_end: usize,
    /// The upstream ID the query was sent with.
    pub upstream_id: u16,
    /// Why the answer was dropped, if it was.
    pub dropped: Option<DropReason>,
    /// What the observer is shown, if the answer was accepted.
    pub observed: Option<Decoded>,
    /// The bytes the UDP client gets, if the answer was accepted.
    pub reply: Option<Vec<u8>>,
}

/// Forwards `client_query` (if it is a query the proxy forwards) on an in-flight table as the
/// proxy does, then validates `answer` against it — ID, question (and case), the client's
/// spelling restored — and fits the reply to the client's UDP payload size.
pub fn answer_path(client_query: &[u8], answer: &[u8], shape: AnswerShape) -> Option<AnswerPath> {
    let mut name = String::new();
    let parsed = query::parse(client_query, &mut name).ok()?;
    let question = parsed.question;
    let qend = question.end();
    let mut ids = IdSource::new();
    let mut table = Table::new();
    let slot = table.insert(&mut ids)?;
    let upstream_id = slot.id();
    let mut sent_query = client_query.to_vec();
    wire::set_id(&mut sent_query, upstream_id);
    let query = sent_query.clone();
    let mut sent_name = Vec::new();
    if shape.randomize_case {
        case::randomize(&mut sent_query, question, &mut ids, &mut sent_name);
    }
    let now = Instant::now();
    let client = SocketAddr::from(([192, 0, 2, 1], 5353));
    let server = SocketAddr::from(([192, 0, 2, 53], 53));
    slot.fill(Inflight {
        query,
        question,
        sent_name,
        sent: now,
        origin: Some(Origin {
            reply: ReplyTo::Udp {
                listener: 0,
                server,
            },
            asked: Asked {
                client,
                server,
                transport: Transport::Udp,
                client_id: parsed.client_id,
                name,
                qtype: parsed.qtype,
                tag: 0,
                redirected: false,
                udp_limit: parsed.udp_limit,
                opt: parsed.opt,
                cache_flags: 0,
                received: now,
            },
        }),
    });

    let mut raw = answer.to_vec();
    if shape.right_id {
        wire::set_id(&mut raw, upstream_id);
    }
    // The fuzzer's answer is not the query: its bytes at the query's question offsets are
    // overwritten where they exist.
    if shape.echo_question
        && let Some(dst) = raw.get_mut(wire::HEADER_LEN..qend)
    {
        dst.copy_from_slice(question.bytes(&sent_query));
    }
    let mut path = AnswerPath {
        client_query: client_query.to_vec(),
        sent_query,
        question_end: qend,
        upstream_id,
        dropped: None,
        observed: None,
        reply: None,
    };
    let mut decoder = Decoder::new();
    match answer::validate(
        &mut raw,
        &std::cell::RefCell::new(table),
        &mut decoder,
        &mut Spare::default(),
    ) {
        Err(reason) => path.dropped = Some(reason),
        Ok(Validated {
            entry,
            question: answer_question,
            len,
        }) => {
            raw.truncate(len);
            // Accepted answers to a query always have a question (checked by validation).
            let (Some(origin), Some(answer_question)) = (entry.origin, answer_question) else {
                return Some(path);
            };
            let asked = origin.asked;
            let msg = decoder.decoded();
            let code = msg.rcode;
            let mut out = Vec::new();
            let reply = answer::fit_udp(
                &mut raw,
                &mut out,
                asked.client_id,
                asked.udp_limit,
                asked.opt,
                answer_question,
                code,
            )
            .to_vec();
            path.observed = Some(msg.clone());
            path.reply = Some(reply);
        }
    }
    Some(path)
}

/// Feeds `stream` to the proxy's TCP frame reader in reads of the given sizes (cycled; a size
/// of 0 counts as 1) and returns the messages it cut out, and whether it met a zero length
/// prefix (the connection is closed there).
pub fn tcp_frames(stream: &[u8], reads: &[u16]) -> (Vec<Vec<u8>>, bool) {
    let mut reader = FrameReader::default();
    let mut messages = Vec::new();
    let mut rest = stream;
    let mut sizes = reads.iter().cycle();
    loop {
        loop {
            match reader.next() {
                Next::Message(len) => {
                    messages.push(reader.message(len).to_vec());
                    reader.consume(len);
                }
                Next::Empty => return (messages, true),
                Next::NeedMore => break,
            }
        }
        if rest.is_empty() {
            assert!(reader.pending() < 2 + 65_535, "more held than one message");
            return (messages, false);
        }
        let spare = reader.spare();
        assert!(!spare.is_empty(), "no room to read after NeedMore");
        let want = sizes.next().map_or(usize::MAX, |&n| usize::from(n).max(1));
        let n = want.min(spare.len()).min(rest.len());
        spare[..n].copy_from_slice(&rest[..n]);
        reader.filled(n);
        rest = &rest[n..];
    }
}
