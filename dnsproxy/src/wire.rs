//! Raw DNS wire helpers for the fast path: header bits and the few small messages the proxy
//! writes itself (error replies, truncated replies, health probes). The question section is
//! [`crate::question`]'s.
//!
//! Nothing here re-serialises a message: a forwarded query or answer only ever has its two ID
//! bytes rewritten.

use crate::question::Question;

/// Length of the fixed DNS header.
pub(crate) const HEADER_LEN: usize = 12;

/// RCODE values the proxy writes itself.
pub(crate) mod rcode {
    /// Format error.
    pub(crate) const FORMERR: u8 = 1;
    /// Server failure.
    pub(crate) const SERVFAIL: u8 = 2;
    /// Non-existent domain.
    pub(crate) const NXDOMAIN: u8 = 3;
    /// Not implemented.
    pub(crate) const NOTIMP: u8 = 4;
    /// Refused.
    pub(crate) const REFUSED: u8 = 5;
}

/// The message ID, if the message is long enough to have one.
pub(crate) fn id(raw: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes([*raw.first()?, *raw.get(1)?]))
}

/// Overwrites the message ID (the only change the proxy makes to forwarded messages).
pub(crate) fn set_id(raw: &mut [u8], id: u16) {
    if let Some(bytes) = raw.get_mut(..2) {
        bytes.copy_from_slice(&id.to_be_bytes());
    }
}

/// The QR bit: true for a response.
pub(crate) fn is_response(raw: &[u8]) -> bool {
    raw.get(2).is_some_and(|b| b & 0x80 != 0)
}

/// The TC bit: the sender cut the message short.
pub(crate) fn is_truncated(raw: &[u8]) -> bool {
    raw.get(2).is_some_and(|b| b & 0x02 != 0)
}

/// QDCOUNT.
pub(crate) fn qdcount(raw: &[u8]) -> u16 {
    match raw.get(4..6) {
        Some(b) => u16::from_be_bytes([b[0], b[1]]),
        None => 0,
    }
}

/// The EDNS0 state of a client's query, echoed in replies the proxy writes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Opt {
    /// The DO bit.
    pub(crate) dnssec_ok: bool,
    /// Upper 8 bits of an extended RCODE.
    pub(crate) rcode_high: u8,
}

/// UDP payload size the proxy advertises in the OPT records it writes (RFC 9715's 1232).
const OPT_PAYLOAD: u16 = 1232;

/// The offset after the (possibly compressed) name at `pos`.
pub(crate) fn skip_name(msg: &[u8], mut pos: usize) -> Option<usize> {
    loop {
        let len = *msg.get(pos)?;
        match len {
            0 => return Some(pos + 1),
            l if l & 0xc0 == 0xc0 => {
                msg.get(pos + 1)?;
                return Some(pos + 2);
            }
            l if l & 0xc0 != 0 => return None,
            l => pos += 1 + usize::from(l),
        }
    }
}

/// The smallest TTL of the answer and authority records of a one-question message (OPT
/// aside), without decoding the records: how long a DoH response may be cached (RFC 8484
/// §5.1). `None` for a message that does not parse that far; 0 when it has no such record.
pub(crate) fn min_ttl(msg: &[u8]) -> Option<u32> {
    let header = msg.get(..HEADER_LEN)?;
    if qdcount(msg) != 1 {
        return None;
    }
    let count = |i: usize| u32::from(u16::from_be_bytes([header[i], header[i + 1]]));
    let records = count(6) + count(8);
    let mut pos = skip_name(msg, HEADER_LEN)? + 4;
    let mut min: Option<u32> = None;
    for _ in 0..records {
        pos = skip_name(msg, pos)?;
        let fixed = msg.get(pos..pos + 10)?;
        let rtype = u16::from_be_bytes([fixed[0], fixed[1]]);
        let ttl = u32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]) & 0x7fff_ffff;
        if rtype != 41 {
            min = Some(min.map_or(ttl, |m| m.min(ttl)));
        }
        pos += 10 + usize::from(u16::from_be_bytes([fixed[8], fixed[9]]));
    }
    Some(min.unwrap_or(0))
}

/// Writes a reply made of `src`'s header and question only: the ID `id`, QR=1, `src`'s opcode,
/// RD and CD bits, RA=1, TC as given, and `rcode`; `src`'s question is copied when given; an
/// OPT record is added when `opt` is given. `src` is the query (for replies the
/// proxy makes up) or the upstream's answer (for truncated replies).
pub(crate) fn write_header_reply(
    out: &mut Vec<u8>,
    src: &[u8],
    id: u16,
    question: Option<Question>,
    rcode: u8,
    truncated: bool,
    opt: Option<Opt>,
) {
    out.clear();
    let flags = src.get(2).copied().unwrap_or(0);
    let flags2 = src.get(3).copied().unwrap_or(0);
    out.extend_from_slice(&id.to_be_bytes());
    // QR, opcode, RD from the source; AA=0; TC as asked.
    out.push(0x80 | (flags & 0x78) | (flags & 0x01) | if truncated { 0x02 } else { 0 });
    // RA=1, CD from the source, RCODE.
    out.push(0x80 | (flags2 & 0x10) | (rcode & 0x0f));
    let qd: u16 = question.is_some().into();
    let ar: u16 = opt.is_some().into();
    for count in [qd, 0, 0, ar] {
        out.extend_from_slice(&count.to_be_bytes());
    }
    if let Some(question) = question {
        out.extend_from_slice(question.bytes(src));
    }
    if let Some(opt) = opt {
        out.push(0); // root owner name
        out.extend_from_slice(&41u16.to_be_bytes()); // TYPE OPT
        out.extend_from_slice(&OPT_PAYLOAD.to_be_bytes()); // CLASS = payload size
        out.push(opt.rcode_high); // extended RCODE
        out.push(0); // version
        out.push(if opt.dnssec_ok { 0x80 } else { 0 }); // DO
        out.push(0);
        out.extend_from_slice(&0u16.to_be_bytes()); // RDLENGTH
    }
}

/// Writes `reply` cut down to its header and question with TC=1 (its ID, flags and low RCODE
/// kept), for a reply that cannot be sent whole: the client retries over TCP.
pub(crate) fn write_truncated(out: &mut Vec<u8>, reply: &[u8]) {
    let id = id(reply).unwrap_or(0);
    let low = reply.get(3).map_or(0, |b| b & 0x0f);
    write_header_reply(out, reply, id, Question::parse(reply), low, true, None);
}

/// Writes a FORMERR for a message that could not be parsed: its ID, its opcode when the
/// header is complete, no sections.
pub(crate) fn write_formerr(out: &mut Vec<u8>, raw: &[u8], id: u16) {
    let header: &[u8] = if raw.len() >= HEADER_LEN { raw } else { &[] };
    write_header_reply(out, header, id, None, rcode::FORMERR, false, None);
}

/// Writes the health probe: `. NS IN` with RD=1 and the given ID; returns its question (always
/// there: the probe is well-formed).
pub(crate) fn write_probe(out: &mut Vec<u8>, id: u16) -> Option<Question> {
    out.clear();
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&[0, 0, 2, 0, 1]);
    Question::parse(out)
}

/// Name of a response code for logs, e.g. `NOERROR`.
pub(crate) fn rcode_name(code: u16) -> &'static str {
    match code {
        0 => "NOERROR",
        1 => "FORMERR",
        2 => "SERVFAIL",
        3 => "NXDOMAIN",
        4 => "NOTIMP",
        5 => "REFUSED",
        6 => "YXDOMAIN",
        7 => "YXRRSET",
        8 => "NXRRSET",
        9 => "NOTAUTH",
        10 => "NOTZONE",
        16 => "BADVERS",
        23 => "BADCOOKIE",
        _ => "OTHER",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &[u8], qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        q.extend_from_slice(name);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&1u16.to_be_bytes());
        q
    }

    #[test]
    fn min_ttl_is_the_smallest_of_answers_and_authority_but_opt() {
        use hickory_proto::op::{Edns, Message};
        use hickory_proto::rr::{Name, RData, Record, rdata::A};
        let name = Name::from_ascii("www.example.").unwrap();
        let mut m = Message::response(7, hickory_proto::op::OpCode::Query);
        m.add_query(hickory_proto::op::Query::query(
            name.clone(),
            hickory_proto::rr::RecordType::A,
        ));
        for ttl in [300, 60, 3600] {
            m.add_answer(Record::from_rdata(
                name.clone(),
                ttl,
                RData::A(A::new(192, 0, 2, 1)),
            ));
        }
        m.set_edns(Edns::new());
        let bytes = m.to_vec().unwrap();
        assert_eq!(min_ttl(&bytes), Some(60));
        // No record: nothing to keep it for.
        assert_eq!(min_ttl(&query(b"\x01a\x00", 1)), Some(0));
        // Cut in a record: not a message.
        assert_eq!(min_ttl(&bytes[..bytes.len() - 20]), None);
    }

    #[test]
    fn header_reply_echoes_the_question_and_opt() {
        let q = query(b"\x01a\x00", 1);
        let question = Question::parse(&q).unwrap();
        let end = question.end();
        let mut out = Vec::new();
        let opt = Opt {
            dnssec_ok: true,
            rcode_high: 0,
        };
        write_header_reply(
            &mut out,
            &q,
            7,
            Some(question),
            rcode::REFUSED,
            false,
            Some(opt),
        );
        assert_eq!(id(&out), Some(7));
        assert!(is_response(&out));
        assert_eq!(out[3] & 0x0f, rcode::REFUSED);
        assert_eq!(&out[HEADER_LEN..end], &q[HEADER_LEN..end]);
        assert_eq!(out.len(), end + 11);
        assert_eq!(out[end + 7], 0x80);
        let mut probe = Vec::new();
        let question = write_probe(&mut probe, 9).unwrap();
        assert_eq!(question.end(), probe.len());
        assert_eq!(question.name(&probe), b"\x00");
    }

    #[test]
    fn truncated_keeps_header_and_question_only() {
        // An answer to `a. A` (NXDOMAIN, RD) with one record and an OPT record.
        let mut reply = query(b"\x01a\x00", 1);
        reply[2] |= 0x80;
        reply[3] = 0x80 | rcode::NXDOMAIN;
        let end = Question::parse(&reply).unwrap().end();
        reply[7] = 1; // ANCOUNT
        reply[11] = 1; // ARCOUNT
        reply.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 1]);
        reply.extend_from_slice(&[0, 0, 41, 4, 0xd0, 0, 0, 0x80, 0, 0, 0]);
        let mut out = Vec::new();
        write_truncated(&mut out, &reply);
        let msg = hickory_proto::op::Message::from_vec(&out).unwrap();
        assert!(msg.metadata.truncation);
        assert_eq!(msg.metadata.id, 0x1234);
        assert_eq!(
            msg.metadata.response_code,
            hickory_proto::op::ResponseCode::NXDomain
        );
        assert!(msg.metadata.recursion_desired);
        assert_eq!(msg.queries.len(), 1);
        assert!(msg.answers.is_empty() && msg.additionals.is_empty());
        assert_eq!(&out[HEADER_LEN..end], &reply[HEADER_LEN..end]);
        assert_eq!(out.len(), end);
    }
}
