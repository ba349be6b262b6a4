//! A client's query, from raw bytes to what the policy and the forwarder need — or to the
//! reply the proxy makes up itself when the bytes are not a query it can forward.

use hickory_proto::op::{Message, MessageType, OpCode};
use hickory_proto::rr::RecordType;

use crate::question::Question;
use crate::wire::{self, Opt, rcode};

/// A query that can be checked against policy and forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParsedQuery {
    /// The client's ID, written back into the reply.
    pub(crate) client_id: u16,
    /// The client's OPT record, if it sent one.
    pub(crate) opt: Option<Opt>,
    /// Its one question.
    pub(crate) question: Question,
    pub(crate) qtype: RecordType,
    /// The client's UDP payload size (EDNS0, at least 512).
    pub(crate) udp_limit: u16,
}

/// Bytes that are not a query the proxy forwards, and what it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotForwarded {
    /// Nothing: shorter than a DNS header (12 bytes). Any reply would be larger than the
    /// message, a reflection amplifier towards a spoofed source (BIND and Unbound drop these
    /// too); it is not even counted as a query.
    Runt,
    /// Nothing: a response sent to the listener (no reflection loops).
    Drop,
    /// FORMERR with the header only: the message does not parse.
    Unparsable { id: u16 },
    /// A reply made of the header (and the question when there is exactly one): FORMERR for
    /// a question count other than one, NOTIMP for an opcode other than QUERY.
    Reply {
        id: u16,
        question: Option<Question>,
        qtype: Option<RecordType>,
        code: u8,
        opt: Option<Opt>,
    },
}

impl NotForwarded {
    /// Writes the reply into `out`; returns its RCODE, or `None` when nothing is sent.
    pub(crate) fn write_reply(self, out: &mut Vec<u8>, raw: &[u8]) -> Option<u8> {
        match self {
            Self::Runt | Self::Drop => None,
            Self::Unparsable { id } => {
                wire::write_formerr(out, raw, id);
                Some(rcode::FORMERR)
            }
            Self::Reply {
                id,
                question,
                code,
                opt,
                ..
            } => {
                wire::write_header_reply(out, raw, id, question, code, false, opt);
                Some(code)
            }
        }
    }

    /// The question type, when it was readable.
    pub(crate) fn qtype(self) -> Option<RecordType> {
        match self {
            Self::Reply { qtype, .. } => qtype,
            _ => None,
        }
    }
}

/// Parses a client's message once and walks its question on the wire: the common shape (see
/// [`parse_plain`]) on the wire alone, anything else with hickory-proto. For a query, its
/// question name in canonical form (see [`Question::canonical_name`]) is written into `name`
/// (emptied first: a buffer the caller keeps, so the common shape allocates nothing).
pub(crate) fn parse(raw: &[u8], name: &mut String) -> Result<ParsedQuery, NotForwarded> {
    if raw.len() < wire::HEADER_LEN {
        return Err(NotForwarded::Runt);
    }
    let parsed = match parse_plain(raw) {
        Some(parsed) => parsed,
        None => parse_hickory(raw),
    }?;
    name.clear();
    parsed.question.canonical_name(raw, name);
    Ok(parsed)
}

/// The query shape nearly every client sends, read without hickory-proto (which allocates a
/// message, its question and its name): QR=0, one question whose name is uncompressed and at
/// most 255 bytes on the wire, no answer or authority records, and either no additional
/// record or a single OPT record owned by the root with no options (RDLENGTH 0). For such
/// bytes the result is exactly [`parse_hickory`]'s (a test compares them); `None` for any
/// other message, which then goes to [`parse_hickory`].
fn parse_plain(raw: &[u8]) -> Option<Result<ParsedQuery, NotForwarded>> {
    let header = raw.get(..wire::HEADER_LEN)?;
    let count = |i: usize| u16::from_be_bytes([header[i], header[i + 1]]);
    if wire::is_response(raw) || count(4) != 1 || count(6) != 0 || count(8) != 0 {
        return None;
    }
    let question = Question::parse(raw)?;
    // hickory-proto refuses a name longer than 255 bytes on the wire (root label included).
    if question.name(raw).len() > 255 {
        return None;
    }
    let (opt, udp_limit) = match count(10) {
        0 => (None, 512),
        1 => {
            // Root owner, TYPE OPT, CLASS = payload size, TTL = ext-RCODE/version/flags,
            // RDLENGTH 0.
            let rr = raw.get(question.end()..question.end() + 11)?;
            if rr[0] != 0 || u16::from_be_bytes([rr[1], rr[2]]) != 41 || rr[9..11] != [0, 0] {
                return None;
            }
            let payload = u16::from_be_bytes([rr[3], rr[4]]).max(512);
            let opt = Opt {
                dnssec_ok: rr[7] & 0x80 != 0,
                rcode_high: 0,
            };
            (Some(opt), payload)
        }
        _ => return None,
    };
    let id = wire::id(raw)?;
    let qtype = RecordType::from(question.qtype(raw));
    if (raw[2] >> 3) & 0x0f != 0 {
        return Some(Err(NotForwarded::Reply {
            id,
            question: Some(question),
            qtype: Some(qtype),
            code: rcode::NOTIMP,
            opt,
        }));
    }
    Some(Ok(ParsedQuery {
        client_id: id,
        opt,
        question,
        qtype,
        udp_limit,
    }))
}

/// Parses a client's message with hickory-proto and walks its question on the wire.
fn parse_hickory(raw: &[u8]) -> Result<ParsedQuery, NotForwarded> {
    let Ok(msg) = Message::from_vec(raw) else {
        return Err(match wire::id(raw) {
            // Never answer something that claims to be a response.
            Some(id) if !wire::is_response(raw) => NotForwarded::Unparsable { id },
            _ => NotForwarded::Drop,
        });
    };
    if msg.metadata.message_type != MessageType::Query {
        return Err(NotForwarded::Drop);
    }
    let id = msg.metadata.id;
    let opt = msg.edns.as_ref().map(|e| Opt {
        dnssec_ok: e.flags().dnssec_ok,
        rcode_high: 0,
    });
    let question = match msg.queries.len() {
        1 => Question::parse(raw),
        _ => None,
    };
    let Some(question) = question else {
        return Err(NotForwarded::Reply {
            id,
            question: None,
            qtype: None,
            code: rcode::FORMERR,
            opt,
        });
    };
    let qtype = msg.queries[0].query_type;
    if msg.metadata.op_code != OpCode::Query {
        return Err(NotForwarded::Reply {
            id,
            question: Some(question),
            qtype: Some(qtype),
            code: rcode::NOTIMP,
            opt,
        });
    }
    Ok(ParsedQuery {
        client_id: id,
        opt,
        question,
        qtype,
        udp_limit: msg.max_payload(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A query of the common shape or near it: header flags (QR and OPCODE often clear), one question (labels of any
    /// bytes, any length up to 70), any type and class, no OPT or an OPT record with any
    /// owner byte, type, payload, flags and RDLENGTH, trailing bytes; counts sometimes off.
    fn near_plain() -> impl Strategy<Value = Vec<u8>> {
        (
            any::<[u8; 4]>(),
            prop::collection::vec(
                prop_oneof![
                    8 => prop::collection::vec(any::<u8>(), 1..20),
                    1 => prop::collection::vec(any::<u8>(), 0..70),
                ],
                0..6,
            ),
            prop_oneof![2 => Just(0x07u8), 1 => Just(0x7fu8), 1 => Just(0xffu8)],
            any::<[u8; 4]>(),
            prop::option::of((
                prop_oneof![3 => Just(0u8), 1 => any::<u8>()],
                prop_oneof![3 => Just(41u16), 1 => any::<u16>()],
                any::<[u8; 6]>(),
                prop_oneof![3 => Just(0u16), 1 => 0u16..8],
            )),
            prop::collection::vec(any::<u8>(), 0..12),
            prop_oneof![
                6 => Just(None),
                1 => Just(Some(0u8)),
                1 => Just(Some(2u8)),
                1 => any::<u8>().prop_map(Some),
            ],
        )
            .prop_map(|(head, labels, qr_mask, tc, opt, trailing, miscount)| {
                let flags = head[2] & qr_mask;
                let mut m = vec![head[0], head[1], flags, head[3], 0, 1, 0, 0, 0, 0, 0, 0];
                m[11] = u8::from(opt.is_some());
                for label in &labels {
                    m.push(u8::try_from(label.len()).unwrap());
                    m.extend_from_slice(label);
                }
                m.push(0);
                m.extend_from_slice(&tc);
                if let Some((owner, rtype, rest, rdlen)) = opt {
                    m.push(owner);
                    m.extend_from_slice(&rtype.to_be_bytes());
                    m.extend_from_slice(&rest);
                    m.extend_from_slice(&rdlen.to_be_bytes());
                }
                m.extend_from_slice(&trailing);
                if let Some(count) = miscount {
                    let at = 5 + 2 * usize::from(count % 4);
                    m[at] = count;
                }
                m
            })
    }

    proptest! {
        #[test]
        fn the_plain_path_agrees_with_hickory(raw in near_plain()) {
            if let Some(plain) = parse_plain(&raw) {
                prop_assert_eq!(plain, parse_hickory(&raw));
            }
        }
    }

    #[test]
    fn common_queries_take_the_plain_path() {
        let mut q = query([0x01, 0], 1, b"\x03www\x07example\x00");
        assert!(parse_plain(&q).is_some_and(|p| p == parse_hickory(&q)));
        // dig's EDNS query: OPT, payload 1232, DO.
        q[11] = 1;
        q.extend_from_slice(&[0, 0, 41, 0x04, 0xd0, 0, 0, 0x80, 0, 0, 0]);
        let plain = parse_plain(&q).unwrap().unwrap();
        assert_eq!(plain, parse_hickory(&q).unwrap());
        assert_eq!(plain.udp_limit, 1232);
        assert_eq!(plain.opt.map(|o| o.dnssec_ok), Some(true));
        // An OPT with options goes to hickory.
        let last = q.len() - 1;
        q[last] = 4;
        q.extend_from_slice(&[0, 8, 0, 0]);
        assert!(parse_plain(&q).is_none());
        // Names of 255 (the most hickory-proto reads) and 256 bytes on the wire.
        for (last, plain) in [(61, true), (62, false)] {
            let name: Vec<u8> = [63, 63, 63, last]
                .into_iter()
                .flat_map(|n| std::iter::once(n).chain(std::iter::repeat_n(b'a', usize::from(n))))
                .chain([0])
                .collect();
            let q = query([0x01, 0], 1, &name);
            assert_eq!(parse_plain(&q).is_some(), plain, "{} bytes", name.len());
            if let Some(p) = parse_plain(&q) {
                assert_eq!(p, parse_hickory(&q));
            }
        }
    }

    fn query(flags: [u8; 2], qdcount: u8, name: &[u8]) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, flags[0], flags[1], 0, qdcount, 0, 0, 0, 0, 0, 0];
        q.extend_from_slice(name);
        q.extend_from_slice(&[0, 1, 0, 1]);
        q
    }

    #[test]
    fn a_query_parses_to_its_canonical_name() {
        let q = query([0x01, 0], 1, b"\x03WWW\x07Example\x00");
        let mut name = "left over".to_owned();
        let parsed = parse(&q, &mut name).unwrap();
        assert_eq!(name, "www.example.");
        assert_eq!(parsed.client_id, 0x1234);
        assert_eq!(parsed.question.end(), q.len());
        assert_eq!(parsed.qtype, RecordType::A);
        assert_eq!(parsed.udp_limit, 512);
    }

    #[test]
    fn what_is_not_forwarded_gets_formerr_notimp_or_nothing() {
        let mut out = Vec::new();
        let name = &mut String::new();
        // A response: never answered.
        let r = query([0x81, 0x80], 1, b"\x01a\x00");
        assert_eq!(parse(&r, name), Err(NotForwarded::Drop));
        // Garbage after a header: FORMERR, header only.
        let junk = [0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0x3f];
        let e = parse(&junk, name).unwrap_err();
        assert_eq!(e, NotForwarded::Unparsable { id: 0x1234 });
        assert_eq!(e.write_reply(&mut out, &junk), Some(rcode::FORMERR));
        assert_eq!(wire::id(&out), Some(0x1234));
        // No question: FORMERR.
        let none = vec![0x12, 0x34, 0x01, 0x00, 0, 0, 0, 0, 0, 0, 0, 0];
        let e = parse(&none, name).unwrap_err();
        assert_eq!(e.write_reply(&mut out, &none), Some(rcode::FORMERR));
        // Shorter than a header: nothing, whatever the bytes.
        for n in 0..wire::HEADER_LEN {
            let e = parse(&none[..n], name).unwrap_err();
            assert_eq!(e, NotForwarded::Runt, "{n} bytes");
            assert_eq!(e.write_reply(&mut out, &none[..n]), None);
        }
        // An opcode other than QUERY (NOTIFY = 4): NOTIMP with the question.
        let notify = query([0x20, 0], 1, b"\x01a\x00");
        let e = parse(&notify, name).unwrap_err();
        assert_eq!(e.qtype(), Some(RecordType::A));
        assert_eq!(e.write_reply(&mut out, &notify), Some(rcode::NOTIMP));
        assert_eq!(out.len(), notify.len());
    }
}
