//! DNS messages on the wire, read without allocating: the header, the question and the answer
//! section decoded (names to canonical text), the other sections checked for shape. Shared by
//! the proxy (every upstream answer) and replay (every captured message), so both read an
//! answer the same way.
//!
//! This crate owns the decoding only. It must never allocate per message once a [`Decoder`]'s
//! buffers have grown to the largest message seen, never panic on any input, and never know
//! about policy, the engine or sockets.
//!
//! Names are decoded to canonical text (ASCII-lowercase, trailing dot). A label byte that
//! cannot appear in presentation form as it is (a dot, a space, a non-printable byte) is written
//! `\DDD`, so such a name never equals a valid one and the NameManager refuses to store it.
//! Compression pointers must point backwards, at most 64 of them per name, and a name is at
//! most 255 bytes on the wire (RFC 1035 §4.1.4, §3.1).
//!
//! Only records of class IN are kept with their data (A, AAAA, and names for CNAME, DNAME, NS
//! and PTR); other records keep their raw RDATA for comparisons.
#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::Range;

/// Record type A.
pub const TYPE_A: u16 = 1;
/// Record type NS.
pub const TYPE_NS: u16 = 2;
/// Record type CNAME.
pub const TYPE_CNAME: u16 = 5;
/// Record type PTR.
pub const TYPE_PTR: u16 = 12;
/// Record type AAAA.
pub const TYPE_AAAA: u16 = 28;
/// Record type DNAME.
pub const TYPE_DNAME: u16 = 39;
/// Record type OPT (EDNS, RFC 6891).
pub const TYPE_OPT: u16 = 41;
/// Class IN.
pub const CLASS_IN: u16 = 1;

/// Response code NOERROR.
pub const RCODE_NOERROR: u8 = 0;
/// Response code NXDOMAIN.
pub const RCODE_NXDOMAIN: u8 = 3;

/// The most compression pointers followed in one name.
const MAX_POINTERS: usize = 64;
/// Longest name on the wire.
const MAX_NAME_WIRE: usize = 255;

/// Why a message could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DnsError {
    /// Shorter than the 12-byte header.
    #[error("shorter than a DNS header")]
    ShortHeader,
    /// A section runs past the end of the message.
    #[error("message ends inside a record")]
    Truncated,
    /// A name is malformed: a pointer loop or a forward pointer, a reserved label type, or
    /// longer than 255 bytes.
    #[error("malformed name")]
    BadName,
    /// Not exactly one question.
    #[error("expected exactly one question")]
    QuestionCount,
    /// A record's data does not fit its type (an A record that is not 4 bytes long, …).
    #[error("record data does not fit its type")]
    BadRdata,
    /// More than one OPT record (RFC 6891 §6.1.1).
    #[error("more than one OPT record")]
    DuplicateOpt,
}

/// The fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// Transaction id.
    pub id: u16,
    /// QR: this is a response.
    pub response: bool,
    /// OPCODE.
    pub opcode: u8,
    /// TC: the message was truncated.
    pub truncated: bool,
    /// RCODE (the low 4 bits; EDNS extended codes are not decoded).
    pub rcode: u8,
    /// QDCOUNT.
    pub qdcount: u16,
    /// ANCOUNT.
    pub ancount: u16,
    /// NSCOUNT.
    pub nscount: u16,
    /// ARCOUNT.
    pub arcount: u16,
}

impl Header {
    /// Decodes the 12-byte header.
    pub fn parse(msg: &[u8]) -> Result<Self, DnsError> {
        let h = msg.get(..12).ok_or(DnsError::ShortHeader)?;
        let u16_at = |i: usize| u16::from_be_bytes([h[i], h[i + 1]]);
        Ok(Self {
            id: u16_at(0),
            response: h[2] & 0x80 != 0,
            opcode: (h[2] >> 3) & 0x0f,
            truncated: h[2] & 0x02 != 0,
            rcode: h[3] & 0x0f,
            qdcount: u16_at(4),
            ancount: u16_at(6),
            nscount: u16_at(8),
            arcount: u16_at(10),
        })
    }
}

/// The data of an answer record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Data {
    /// An A or AAAA address.
    Addr(IpAddr),
    /// A CNAME, DNAME, NS or PTR target: a range of [`Decoded::text`].
    Name(Range<usize>),
    /// Any other type (or another class): a range of the message (raw RDATA).
    Raw(Range<usize>),
}

/// One answer record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rr {
    /// Owner name: a range of [`Decoded::text`].
    pub owner: Range<usize>,
    /// TYPE.
    pub rtype: u16,
    /// CLASS.
    pub class: u16,
    /// TTL in seconds (the top bit cleared, as RFC 2181 §8 asks).
    pub ttl: u32,
    /// RDATA.
    pub data: Data,
}

/// A decoded message: header, question and answers. Names live in `text`.
#[derive(Debug, Clone, Default)]
pub struct Decoded {
    /// The header.
    pub header: Header,
    /// The question name: a range of `text`.
    pub qname: Range<usize>,
    /// QTYPE.
    pub qtype: u16,
    /// QCLASS.
    pub qclass: u16,
    /// The answer section.
    pub answers: Vec<Rr>,
    /// Every decoded name, back to back; a name that is only a pointer to an earlier one
    /// shares its text.
    pub text: String,
    /// The RCODE: with [`Decoder::decode_whole`] including the upper 8 bits an OPT record
    /// carries (RFC 6891 §6.1.3), otherwise the header's 4 bits.
    pub rcode: u16,
    /// Whether a name followed a compression pointer to offset 0 or 1, making labels of the
    /// header's ID: the message then reads differently under another ID (a proxy that
    /// rewrites the ID decodes it again with the ID its client gets). Meaningful after a
    /// successful decode only: an error may come before such a pointer is reached.
    pub points_into_id: bool,
}

impl Decoded {
    /// The question name, canonical.
    pub fn qname(&self) -> &str {
        self.name(&self.qname)
    }

    /// A name decoded into `text`.
    pub fn name(&self, range: &Range<usize>) -> &str {
        self.text.get(range.clone()).unwrap_or_default()
    }
}

/// Decodes messages, reusing its buffers.
#[derive(Debug, Default)]
pub struct Decoder {
    out: Decoded,
}

impl Decoder {
    /// A decoder with empty buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// The message decoded last (empty before the first; after an error, whatever was decoded
    /// of it).
    pub fn decoded(&self) -> &Decoded {
        &self.out
    }

    /// Decodes `msg`: header, one question, and the answer section (the authority and
    /// additional sections are not read).
    ///
    /// # Errors
    /// Not exactly one question, or the header, the question or an answer is malformed.
    pub fn decode(&mut self, msg: &[u8]) -> Result<&Decoded, DnsError> {
        if Header::parse(msg)?.qdcount != 1 {
            return Err(DnsError::QuestionCount);
        }
        self.decode_sections(msg)?;
        Ok(&self.out)
    }

    /// Decodes `msg` as [`Decoder::decode`] does, with any number of questions (the first is
    /// decoded; without one, [`Decoded::qname`] is empty), and checks the authority and
    /// additional sections as well: every record's name and length (the data of A, AAAA and
    /// name-typed records of class IN as in the answer section), at most one OPT record, whose
    /// upper RCODE bits go into [`Decoded::rcode`]. So a message is taken only when every
    /// record in it is well-formed. Bytes after the last record are ignored, as hickory-proto
    /// ignores them.
    ///
    /// # Errors
    /// The header, a question or any record is malformed, or there are two OPT records.
    pub fn decode_whole(&mut self, msg: &[u8]) -> Result<&Decoded, DnsError> {
        let mut pos = self.decode_sections(msg)?;
        let out = &mut self.out;
        let rest = u32::from(out.header.nscount) + u32::from(out.header.arcount);
        let mut opt = None;
        for _ in 0..rest {
            let rr = read_rr(msg, &mut pos, Sink::Check(&mut out.points_into_id))?;
            if rr.rtype == TYPE_OPT {
                if opt.is_some() {
                    return Err(DnsError::DuplicateOpt);
                }
                opt = Some(rr.ttl_raw >> 24);
            }
        }
        if let Some(high) = opt {
            // `ttl_raw >> 24` fits in 8 bits.
            out.rcode |= u16::try_from(high).unwrap_or(0) << 4;
        }
        Ok(&self.out)
    }

    /// Header, questions (the first decoded, the others checked) and answers; returns where
    /// the authority section begins.
    fn decode_sections(&mut self, msg: &[u8]) -> Result<usize, DnsError> {
        let out = &mut self.out;
        out.answers.clear();
        out.text.clear();
        out.header = Header::parse(msg)?;
        out.rcode = u16::from(out.header.rcode);
        out.qname = 0..0;
        out.qtype = 0;
        out.qclass = 0;
        out.points_into_id = false;
        let mut pos = 12;
        let mut seen = Seen::default();
        for i in 0..out.header.qdcount {
            let start = out.text.len();
            let name = if i == 0 {
                seen.read_name(msg, &mut pos, &mut out.text)?
            } else {
                let walked = read_name_counted(msg, &mut pos, Some(&mut out.text))?;
                seen.into_id |= walked.into_id;
                walked.range
            };
            let q = msg.get(pos..pos + 4).ok_or(DnsError::Truncated)?;
            pos += 4;
            if i == 0 {
                out.qname = name;
                out.qtype = u16::from_be_bytes([q[0], q[1]]);
                out.qclass = u16::from_be_bytes([q[2], q[3]]);
            } else {
                out.text.truncate(start);
            }
        }
        for _ in 0..out.header.ancount {
            let rr = read_rr(msg, &mut pos, Sink::Text(&mut out.text, &mut seen))?;
            out.answers.push(rr.rr);
        }
        out.points_into_id = seen.into_id;
        Ok(pos)
    }
}

/// A record as read, with its TTL field as sent (for OPT, the extended RCODE and flags).
struct ReadRr {
    rr: Rr,
    rtype: u16,
    ttl_raw: u32,
}

/// Where the names of the records read go.
enum Sink<'a> {
    /// Decoded into the text, through the names seen so far.
    Text(&'a mut String, &'a mut Seen),
    /// Only checked: nothing of the record is kept but its type and TTL field (the sections
    /// past the answers); its names' ranges are empty. Set when a name points into the ID.
    Check(&'a mut bool),
}

/// Reads one record.
fn read_rr(msg: &[u8], pos: &mut usize, mut sink: Sink<'_>) -> Result<ReadRr, DnsError> {
    let mut name = |p: &mut usize| match &mut sink {
        Sink::Text(text, seen) => seen.read_name(msg, p, text),
        Sink::Check(into_id) => read_name_counted(msg, p, None).map(|walked| {
            **into_id |= walked.into_id;
            walked.range
        }),
    };
    let owner = name(pos)?;
    let f = msg.get(*pos..*pos + 10).ok_or(DnsError::Truncated)?;
    let rtype = u16::from_be_bytes([f[0], f[1]]);
    let class = u16::from_be_bytes([f[2], f[3]]);
    let ttl_raw = u32::from_be_bytes([f[4], f[5], f[6], f[7]]);
    let ttl = ttl_raw & 0x7fff_ffff;
    let rdlen = usize::from(u16::from_be_bytes([f[8], f[9]]));
    let start = *pos + 10;
    let end = start + rdlen;
    let rdata = msg.get(start..end).ok_or(DnsError::Truncated)?;
    let data = match (class, rtype) {
        (CLASS_IN, TYPE_A) => {
            let b: [u8; 4] = rdata.try_into().map_err(|_| DnsError::BadRdata)?;
            Data::Addr(IpAddr::V4(Ipv4Addr::from(b)))
        }
        (CLASS_IN, TYPE_AAAA) => {
            let b: [u8; 16] = rdata.try_into().map_err(|_| DnsError::BadRdata)?;
            Data::Addr(IpAddr::V6(Ipv6Addr::from(b)))
        }
        (CLASS_IN, TYPE_CNAME | TYPE_DNAME | TYPE_NS | TYPE_PTR) => {
            let mut p = start;
            let target = name(&mut p)?;
            if p != end {
                return Err(DnsError::BadRdata);
            }
            Data::Name(target)
        }
        _ => Data::Raw(start..end),
    };
    *pos = end;
    Ok(ReadRr {
        rr: Rr {
            owner,
            rtype,
            class,
            ttl,
            data,
        },
        rtype,
        ttl_raw,
    })
}

/// Reads the name at `*pos` into `text` (canonical form) and moves `*pos` past it.
/// Names decoded so far from the question and answer sections, by the offset where each
/// starts: a name that is nothing but a pointer to one of them is the same text, taken again
/// instead of decoded again (most owner names point at the question, or at a CNAME's target).
/// A few, on the stack.
#[derive(Default)]
struct Seen {
    /// `(offset, text start, text end, pointers followed)`.
    names: [(usize, usize, usize, usize); SEEN],
    len: usize,
    /// Whether a name read pointed into the header's ID ([`Decoded::points_into_id`]).
    into_id: bool,
}

/// Names remembered per message by [`Seen`].
const SEEN: usize = 8;

impl Seen {
    /// [`read_name`], taking a name decoded before when the name at `pos` is a lone pointer
    /// to it — with the same checks: the pointer goes backwards and the pointers followed stay
    /// within [`MAX_POINTERS`] (the wire length is the earlier name's, already checked).
    fn read_name(
        &mut self,
        msg: &[u8],
        pos: &mut usize,
        text: &mut String,
    ) -> Result<Range<usize>, DnsError> {
        let at = *pos;
        if let Some(&[high, low]) = msg.get(at..at + 2)
            && high & 0xc0 == 0xc0
        {
            let target = (usize::from(high & 0x3f) << 8) | usize::from(low);
            let earlier = self.names[..self.len].iter().find(|n| n.0 == target);
            if let Some(&(_, start, end, pointers)) = earlier
                && target < at
                && pointers < MAX_POINTERS
            {
                *pos = at + 2;
                return Ok(start..end);
            }
        }
        let Walked {
            range,
            pointers,
            into_id,
        } = read_name_counted(msg, pos, Some(text))?;
        self.into_id |= into_id;
        if let Some(slot) = self.names.get_mut(self.len) {
            *slot = (at, range.start, range.end, pointers);
            self.len += 1;
        }
        Ok(range)
    }
}

/// A name read: its text (a range of the text it was decoded into; empty when only checked),
/// the pointers followed, and whether one of them led into the header's ID (offset 0 or 1).
struct Walked {
    range: Range<usize>,
    pointers: usize,
    into_id: bool,
}

/// Decodes the name at `pos` into `text` (only checks it without), moving `pos` past it.
fn read_name_counted(
    msg: &[u8],
    pos: &mut usize,
    mut text: Option<&mut String>,
) -> Result<Walked, DnsError> {
    let start = text.as_ref().map_or(0, |t| t.len());
    let mut at = *pos;
    let mut end_of_name = None;
    let mut pointers = 0;
    let mut into_id = false;
    let mut wire = 0usize;
    loop {
        let len = *msg.get(at).ok_or(DnsError::Truncated)?;
        match len & 0xc0 {
            0x00 => {
                let len = usize::from(len);
                wire += len + 1;
                if wire > MAX_NAME_WIRE {
                    return Err(DnsError::BadName);
                }
                if len == 0 {
                    if end_of_name.is_none() {
                        end_of_name = Some(at + 1);
                    }
                    break;
                }
                let label = msg.get(at + 1..at + 1 + len).ok_or(DnsError::Truncated)?;
                if let Some(text) = text.as_deref_mut() {
                    push_label(text, label);
                }
                at += 1 + len;
            }
            0xc0 => {
                let low = *msg.get(at + 1).ok_or(DnsError::Truncated)?;
                let target = (usize::from(len & 0x3f) << 8) | usize::from(low);
                if end_of_name.is_none() {
                    end_of_name = Some(at + 2);
                }
                pointers += 1;
                // Backwards only: no loops, and every hop lands on earlier bytes.
                if target >= at || pointers > MAX_POINTERS {
                    return Err(DnsError::BadName);
                }
                // Offsets 0 and 1 are the ID: such a name reads the ID's bytes as labels.
                into_id |= target < 2;
                at = target;
            }
            _ => return Err(DnsError::BadName),
        }
    }
    *pos = end_of_name.unwrap_or(at + 1);
    let Some(text) = text else {
        return Ok(Walked {
            range: 0..0,
            pointers,
            into_id,
        });
    };
    if text.len() == start {
        text.push('.');
    }
    Ok(Walked {
        range: start..text.len(),
        pointers,
        into_id,
    })
}

/// Appends one label (its bytes, without the length) to `text` in canonical form, then a dot:
/// ASCII lowercase; `.` and `\` inside the label escaped as `\.` and `\\`, bytes that are not
/// printable ASCII as `\DDD`, so that distinct names stay distinct. How every name this crate
/// decodes is written, and how the proxy writes a query's name.
pub fn push_label(text: &mut String, label: &[u8]) {
    // The common label: printable ASCII with nothing to escape, lowercased as it is copied, in
    // one pass (a call to copy a few bytes, a check that they are UTF-8 and a pass to
    // lowercase them cost three times as much: `cargo bench --bench wire -- push-label`).
    // Anything else is written again by the escaping path.
    text.reserve(label.len() + 1);
    let start = text.len();
    for &b in label {
        if !matches!(b, 0x21..=0x7e) || b == b'.' || b == b'\\' {
            text.truncate(start);
            return push_label_escaped(text, label);
        }
        text.push(char::from(b.to_ascii_lowercase()));
    }
    text.push('.');
}

/// [`push_label`] byte by byte, escaping what presentation form cannot hold as it is.
fn push_label_escaped(text: &mut String, label: &[u8]) {
    for &b in label {
        match b {
            b'A'..=b'Z' => text.push(char::from(b.to_ascii_lowercase())),
            b'.' | b'\\' => {
                text.push('\\');
                text.push(char::from(b));
            }
            0x21..=0x7e => text.push(char::from(b)),
            _ => {
                text.push('\\');
                text.push(char::from(b'0' + b / 100));
                text.push(char::from(b'0' + (b / 10) % 10));
                text.push(char::from(b'0' + b % 10));
            }
        }
    }
    text.push('.');
}

/// Whether `msg` is a whole, well-formed DNS message: every section decodes and the last
/// record ends exactly at the end. Used to find message boundaries in a TCP stream after a gap.
pub fn is_whole_message(msg: &[u8]) -> bool {
    let Ok(header) = Header::parse(msg) else {
        return false;
    };
    let mut pos = 12;
    for _ in 0..header.qdcount {
        if read_name_counted(msg, &mut pos, None).is_err() {
            return false;
        }
        pos += 4;
        if pos > msg.len() {
            return false;
        }
    }
    let records = u32::from(header.ancount) + u32::from(header.nscount) + u32::from(header.arcount);
    for _ in 0..records {
        if read_name_counted(msg, &mut pos, None).is_err() {
            return false;
        }
        let Some(f) = msg.get(pos..pos + 10) else {
            return false;
        };
        pos += 10 + usize::from(u16::from_be_bytes([f[8], f[9]]));
        if pos > msg.len() {
            return false;
        }
    }
    pos == msg.len()
}

/// Whether the 12 bytes at the start of `msg` could begin a DNS message of `len` bytes: a
/// standard query or its response with one question and record counts that fit.
pub fn plausible_header(msg: &[u8], len: usize) -> bool {
    let Ok(h) = Header::parse(msg) else {
        return false;
    };
    let z = msg.get(3).is_some_and(|b| b & 0x40 != 0);
    let fits = |n: u16| usize::from(n) * 11 <= len;
    h.opcode == 0
        && !z
        && h.qdcount == 1
        && len >= 17
        && fits(h.ancount)
        && fits(h.nscount)
        && fits(h.arcount)
        && usize::from(h.ancount) + usize::from(h.nscount) + usize::from(h.arcount) <= len / 11
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(labels: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for l in labels {
            out.push(l.len() as u8);
            out.extend_from_slice(l);
        }
        out.push(0);
        out
    }

    fn response(qname: &[u8], answers: &[Vec<u8>]) -> Vec<u8> {
        let mut m = vec![
            0x12,
            0x34,
            0x81,
            0x80,
            0,
            1,
            0,
            answers.len() as u8,
            0,
            0,
            0,
            0,
        ];
        m.extend_from_slice(qname);
        m.extend_from_slice(&[0, 1, 0, 1]);
        for a in answers {
            m.extend_from_slice(a);
        }
        m
    }

    fn a_rr_ptr(to: u16, ttl: u32, ip: [u8; 4]) -> Vec<u8> {
        let mut r = vec![0xc0 | (to >> 8) as u8, to as u8, 0, 1, 0, 1];
        r.extend_from_slice(&ttl.to_be_bytes());
        r.extend_from_slice(&[0, 4]);
        r.extend_from_slice(&ip);
        r
    }

    #[test]
    fn decodes_compressed_answers_in_canonical_form() {
        let q = name(&[b"WWW", b"Example", b"com"]);
        let m = response(
            &q,
            &[
                a_rr_ptr(12, 60, [192, 0, 2, 1]),
                a_rr_ptr(12, 30, [192, 0, 2, 2]),
            ],
        );
        let mut d = Decoder::new();
        let out = d.decode(&m).unwrap();
        assert!(out.header.response);
        assert_eq!(out.qname(), "www.example.com.");
        assert_eq!(out.answers.len(), 2);
        assert_eq!(out.name(&out.answers[1].owner), "www.example.com.");
        assert_eq!(out.answers[1].ttl, 30);
        assert_eq!(
            out.answers[0].data,
            Data::Addr("192.0.2.1".parse().unwrap())
        );
        assert!(is_whole_message(&m));
        assert!(!is_whole_message(&m[..m.len() - 1]));
    }

    /// A record of `rtype` whose owner points at `owner` and whose RDATA is `rdata`.
    fn rr_ptr(owner: u16, rtype: u16, rdata: &[u8]) -> Vec<u8> {
        let mut r = vec![0xc0 | (owner >> 8) as u8, owner as u8];
        r.extend_from_slice(&rtype.to_be_bytes());
        r.extend_from_slice(&[0, 1, 0, 0, 0, 60]);
        r.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        r.extend_from_slice(rdata);
        r
    }

    #[test]
    fn a_name_taken_again_keeps_the_pointer_bound() {
        // Question "a.test." at 12 (8 bytes + 4): the first record starts at 24. Its RDATA
        // (type 99: raw, not decoded) is a chain of lone pointers: the one at `chain + 2j`
        // points at the previous (the first at the question), so a name starting there follows
        // j + 1 pointers.
        let q = name(&[b"a", b"test"]);
        let chain = 24 + 12;
        let mut raw = Vec::new();
        for j in 0..70u16 {
            let to = if j == 0 { 12 } else { chain + 2 * (j - 1) };
            raw.extend_from_slice(&[0xc0 | (to >> 8) as u8, to as u8]);
        }
        let first = rr_ptr(12, 99, &raw);
        let cname_at = 24 + first.len() as u16 + 12;
        for (j, ok) in [(61u16, true), (62, false)] {
            // The CNAME's target follows j + 2 pointers (63 or 64); the next owner, a lone
            // pointer to that target, one more: 64 is the most allowed.
            let to = chain + 2 * j;
            let cname = rr_ptr(12, TYPE_CNAME, &[0xc0 | (to >> 8) as u8, to as u8]);
            let m = response(
                &q,
                &[first.clone(), cname, a_rr_ptr(cname_at, 60, [192, 0, 2, 1])],
            );
            let mut d = Decoder::new();
            match d.decode(&m) {
                Ok(out) => {
                    assert!(ok, "a name of 65 pointers was taken");
                    let Data::Name(target) = &out.answers[1].data else {
                        panic!("a CNAME's target is a name");
                    };
                    assert_eq!(out.name(target), "a.test.");
                    assert_eq!(
                        &out.answers[2].owner, target,
                        "taken again, not decoded again"
                    );
                }
                Err(e) => {
                    assert!(!ok, "refused: {e}");
                    assert_eq!(e, DnsError::BadName);
                }
            }
        }
    }

    #[test]
    fn pointer_loops_and_forward_pointers_are_rejected() {
        let mut m = vec![0, 0, 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0];
        m.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
        assert_eq!(Decoder::new().decode(&m).unwrap_err(), DnsError::BadName);
        let mut m = vec![0, 0, 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0];
        m.extend_from_slice(&[0xc0, 14, 0, 0, 1, 0, 1]);
        assert_eq!(Decoder::new().decode(&m).unwrap_err(), DnsError::BadName);
    }

    #[test]
    fn odd_label_bytes_are_escaped() {
        let q = name(&[b"a.b", b"c d"]);
        let m = response(&q, &[]);
        let mut d = Decoder::new();
        assert_eq!(d.decode(&m).unwrap().qname(), "a\\.b.c\\032d.");
        let root = response(&[0], &[]);
        assert_eq!(d.decode(&root).unwrap().qname(), ".");
    }

    /// An OPT record (root owner, payload size 1232) with `ttl` as the extended-RCODE field.
    fn opt(ttl: u32) -> Vec<u8> {
        let mut r = vec![0, 0, 41, 0x04, 0xd0];
        r.extend_from_slice(&ttl.to_be_bytes());
        r.extend_from_slice(&[0, 0]);
        r
    }

    fn with_additional(mut m: Vec<u8>, records: &[Vec<u8>]) -> Vec<u8> {
        m[11] = u8::try_from(records.len()).unwrap();
        for r in records {
            m.extend_from_slice(r);
        }
        m
    }

    #[test]
    fn decode_whole_reads_the_extended_rcode_from_opt() {
        let q = name(&[b"a", b"test"]);
        // BADVERS = 16: upper bits 1 in the OPT, lower bits 0 in the header.
        let m = with_additional(response(&q, &[]), &[opt(1 << 24)]);
        let mut d = Decoder::new();
        assert_eq!(d.decode_whole(&m).unwrap().rcode, 16);
        assert_eq!(d.decode(&m).unwrap().rcode, 0);
        let two = with_additional(response(&q, &[]), &[opt(0), opt(0)]);
        assert_eq!(d.decode_whole(&two).unwrap_err(), DnsError::DuplicateOpt);
    }

    #[test]
    fn says_when_a_name_points_into_the_id() {
        let q = name(&[b"a", b"test"]);
        let mut d = Decoder::new();
        // Owners pointing at the question: nothing in the ID.
        let plain = response(&q, &[a_rr_ptr(12, 60, [192, 0, 2, 1])]);
        assert!(!d.decode_whole(&plain).unwrap().points_into_id);
        // ID 0x0000: offset 0 reads as the root name; offset 1 as well.
        for to in [0, 1] {
            let mut m = response(&q, &[a_rr_ptr(to, 60, [192, 0, 2, 1])]);
            m[..2].copy_from_slice(&[0, 0]);
            let out = d.decode_whole(&m).unwrap();
            assert!(out.points_into_id, "pointer to {to}");
            assert_eq!(out.name(&out.answers[0].owner), ".");
            // Decoding the next message starts afresh.
            assert!(!d.decode_whole(&plain).unwrap().points_into_id);
        }
        // Offset 2 (the flags) is not the ID.
        let mut m = response(&q, &[a_rr_ptr(2, 60, [192, 0, 2, 1])]);
        m[2] = 0; // a flags byte read as the root label
        assert!(!d.decode_whole(&m).unwrap().points_into_id);
        // In a section only checked (the additional records).
        let mut m = with_additional(plain.clone(), &[a_rr_ptr(0, 60, [192, 0, 2, 1])]);
        m[..2].copy_from_slice(&[0, 0]);
        assert!(d.decode_whole(&m).unwrap().points_into_id);
    }

    #[test]
    fn decode_whole_refuses_a_malformed_record_after_the_answers() {
        let q = name(&[b"a", b"test"]);
        let good = response(&q, &[a_rr_ptr(12, 60, [192, 0, 2, 1])]);
        let mut d = Decoder::new();
        // An additional A record of 3 bytes.
        let mut bad = a_rr_ptr(12, 60, [192, 0, 2, 1]);
        bad.truncate(bad.len() - 1);
        bad[11] = 3;
        let m = with_additional(good.clone(), &[bad]);
        assert!(d.decode(&m).is_ok(), "decode reads the answers only");
        assert_eq!(d.decode_whole(&m).unwrap_err(), DnsError::BadRdata);
        // An additional record whose owner points forwards: checked, though not kept.
        let m = with_additional(good.clone(), &[a_rr_ptr(0x3fff, 60, [192, 0, 2, 1])]);
        assert_eq!(d.decode_whole(&m).unwrap_err(), DnsError::BadName);
        assert!(!is_whole_message(&m));
        // Cut inside the additional section.
        let m = with_additional(good.clone(), &[opt(0)]);
        assert_eq!(
            d.decode_whole(&m[..m.len() - 3]).unwrap_err(),
            DnsError::Truncated
        );
        // Trailing bytes are ignored; the answers' names are all that is in `text` (the
        // owner, a pointer to the question, shares its text).
        let mut m = with_additional(good, &[opt(0)]);
        m.extend_from_slice(&[1, 2, 3]);
        let out = d.decode_whole(&m).unwrap();
        assert_eq!(out.text, "a.test.");
        assert_eq!(out.answers.len(), 1);
        assert_eq!(out.answers[0].owner, out.qname);
    }

    #[test]
    fn decode_whole_takes_any_number_of_questions() {
        let mut d = Decoder::new();
        let none = vec![0, 0, 0x81, 0x80, 0, 0, 0, 0, 0, 0, 0, 0];
        let out = d.decode_whole(&none).unwrap();
        assert_eq!((out.qname(), out.qtype), ("", 0));
        let mut two = response(&name(&[b"a"]), &[]);
        two[5] = 2;
        two.extend_from_slice(&name(&[b"b"]));
        two.extend_from_slice(&[0, 28, 0, 1]);
        let out = d.decode_whole(&two).unwrap();
        assert_eq!((out.qname(), out.qtype, out.text.as_str()), ("a.", 1, "a."));
        assert_eq!(d.decode(&two).unwrap_err(), DnsError::QuestionCount);
    }

    proptest::proptest! {
        /// The one-pass path writes exactly what the escaping path writes.
        #[test]
        fn plain_labels_are_written_as_escaping_writes_them(
            label in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            plain in "[!-~]{0,63}",
        ) {
            for label in [label.as_slice(), plain.as_bytes()] {
                let (mut fast, mut slow) = (String::from("x."), String::from("x."));
                push_label(&mut fast, label);
                push_label_escaped(&mut slow, label);
                proptest::prop_assert_eq!(fast, slow);
            }
        }
    }
}
