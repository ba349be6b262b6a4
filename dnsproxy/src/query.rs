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
    /// The question name, canonical (see [`Question::canonical_name`]).
    pub(crate) name: String,
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

/// Parses a client's message once (hickory-proto) and walks its question on the wire.
pub(crate) fn parse(raw: &[u8]) -> Result<ParsedQuery, NotForwarded> {
    if raw.len() < wire::HEADER_LEN {
        return Err(NotForwarded::Runt);
    }
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
    let mut name = String::with_capacity(question.name(raw).len());
    question.canonical_name(raw, &mut name);
    Ok(ParsedQuery {
        client_id: id,
        opt,
        question,
        qtype,
        udp_limit: msg.max_payload(),
        name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(flags: [u8; 2], qdcount: u8, name: &[u8]) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, flags[0], flags[1], 0, qdcount, 0, 0, 0, 0, 0, 0];
        q.extend_from_slice(name);
        q.extend_from_slice(&[0, 1, 0, 1]);
        q
    }

    #[test]
    fn a_query_parses_to_its_canonical_name() {
        let q = query([0x01, 0], 1, b"\x03WWW\x07Example\x00");
        let parsed = parse(&q).unwrap();
        assert_eq!(parsed.name, "www.example.");
        assert_eq!(parsed.client_id, 0x1234);
        assert_eq!(parsed.question.end(), q.len());
        assert_eq!(parsed.qtype, RecordType::A);
        assert_eq!(parsed.udp_limit, 512);
    }

    #[test]
    fn what_is_not_forwarded_gets_formerr_notimp_or_nothing() {
        let mut out = Vec::new();
        // A response: never answered.
        let r = query([0x81, 0x80], 1, b"\x01a\x00");
        assert_eq!(parse(&r), Err(NotForwarded::Drop));
        // Garbage after a header: FORMERR, header only.
        let junk = [0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0x3f];
        let e = parse(&junk).unwrap_err();
        assert_eq!(e, NotForwarded::Unparsable { id: 0x1234 });
        assert_eq!(e.write_reply(&mut out, &junk), Some(rcode::FORMERR));
        assert_eq!(wire::id(&out), Some(0x1234));
        // No question: FORMERR.
        let none = vec![0x12, 0x34, 0x01, 0x00, 0, 0, 0, 0, 0, 0, 0, 0];
        let e = parse(&none).unwrap_err();
        assert_eq!(e.write_reply(&mut out, &none), Some(rcode::FORMERR));
        // Shorter than a header: nothing, whatever the bytes.
        for n in 0..wire::HEADER_LEN {
            let e = parse(&none[..n]).unwrap_err();
            assert_eq!(e, NotForwarded::Runt, "{n} bytes");
            assert_eq!(e.write_reply(&mut out, &none[..n]), None);
        }
        // An opcode other than QUERY (NOTIFY = 4): NOTIMP with the question.
        let notify = query([0x20, 0], 1, b"\x01a\x00");
        let e = parse(&notify).unwrap_err();
        assert_eq!(e.qtype(), Some(RecordType::A));
        assert_eq!(e.write_reply(&mut out, &notify), Some(rcode::NOTIMP));
        assert_eq!(out.len(), notify.len());
    }
}
