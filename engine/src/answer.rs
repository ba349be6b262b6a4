//! What a DNS answer teaches: the addresses at the end of the question's CNAME chain, and the
//! chain's TTL. One rule, whoever decoded the message (the proxy and replay both decode with
//! the allocation-free `fqdnd-dnswire`, [`extract_decoded`]; [`extract`] takes any decoder's
//! records):
//!
//! - only records of class IN count; a record of another class teaches nothing and is not
//!   checked against the chain;
//! - A and AAAA records give addresses, CNAME records extend the chain, other types (DNAME,
//!   RRSIG, …) are ignored;
//! - every counted record must lie on the chain from the question, or the whole answer is
//!   invalid ([`AnswerError::OffChain`]): an upstream cannot slip addresses for another name
//!   into a reply;
//! - the TTL is the minimum over the chain's records, CNAMEs included;
//! - an address given twice counts once, in answer order.
//!
//! The common answer — addresses owned by the question itself, no CNAME — is read without
//! allocating; anything else goes through the NameManager's chain walk
//! ([`fqdnd_namemgr::Answer::from_records`]).

use std::net::IpAddr;

use fqdnd_dnswire::{Data as WireData, Decoded, TYPE_CNAME};
use fqdnd_namemgr::{Answer, AnswerError, Record, RecordData as ChainData};
use smallvec::SmallVec;

/// DNS class IN.
pub const CLASS_IN: u16 = 1;

/// A name as a decoder hands it over.
pub trait AnswerName {
    /// Whether two names are the same DNS name (ASCII case does not matter).
    fn same_name(&self, other: &Self) -> bool;
    /// The name as text, for the chain walk (canonicalised there).
    fn to_text(&self) -> String;
}

impl AnswerName for str {
    fn same_name(&self, other: &Self) -> bool {
        self.eq_ignore_ascii_case(other)
    }

    fn to_text(&self) -> String {
        self.to_owned()
    }
}

/// The part of a record's data the engine reads.
#[derive(Debug)]
pub enum Data<'a, N: ?Sized> {
    /// An A or AAAA record's address.
    Addr(IpAddr),
    /// A CNAME record's target.
    Cname(&'a N),
    /// Any other type.
    Other,
}

/// One answer-section record.
#[derive(Debug)]
pub struct AnswerRecord<'a, N: ?Sized> {
    /// Owner name.
    pub owner: &'a N,
    /// Class (1 = IN).
    pub class: u16,
    /// TTL in seconds.
    pub ttl: u32,
    /// Data.
    pub data: Data<'a, N>,
}

// By hand: a derive would ask `N: Clone`, which `str` is not.
impl<N: ?Sized> Clone for Data<'_, N> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<N: ?Sized> Copy for Data<'_, N> {}
impl<N: ?Sized> Clone for AnswerRecord<'_, N> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<N: ?Sized> Copy for AnswerRecord<'_, N> {}

/// What an answer teaches: its addresses and their TTL. Reused across answers, it allocates
/// only for answers with more than eight addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extracted {
    /// Addresses at the end of the chain, in answer order, without duplicates.
    pub addrs: SmallVec<[IpAddr; 8]>,
    /// Minimum TTL over the chain (0 when there is no address).
    pub ttl: u32,
}

/// Reads `records` (an answer section, any order) for the question `question` into `out`.
///
/// # Errors
/// A counted record is off the chain from the question, or the chain loops or is too long.
pub fn extract<'a, N, I>(question: &N, records: I, out: &mut Extracted) -> Result<(), AnswerError>
where
    N: AnswerName + ?Sized + 'a,
    I: IntoIterator<Item = AnswerRecord<'a, N>> + Clone,
{
    out.addrs.clear();
    out.ttl = 0;
    let mut ttl = u32::MAX;
    let mut direct = true;
    for rr in records.clone() {
        if rr.class != CLASS_IN {
            continue;
        }
        match rr.data {
            Data::Addr(addr) if rr.owner.same_name(question) => {
                if !out.addrs.contains(&addr) {
                    out.addrs.push(addr);
                }
                ttl = ttl.min(rr.ttl);
            }
            Data::Addr(_) | Data::Cname(_) => {
                direct = false;
                break;
            }
            Data::Other => {}
        }
    }
    if direct {
        if !out.addrs.is_empty() {
            out.ttl = ttl;
        }
        return Ok(());
    }
    let chain: Vec<Record> = records
        .into_iter()
        .filter(|rr| rr.class == CLASS_IN)
        .filter_map(|rr| {
            let data = match rr.data {
                Data::Addr(addr) => ChainData::Addr(addr),
                Data::Cname(target) => ChainData::Cname(target.to_text()),
                Data::Other => return None,
            };
            Some(Record {
                owner: rr.owner.to_text(),
                ttl: rr.ttl,
                data,
            })
        })
        .collect();
    let answer = Answer::from_records(&question.to_text(), &chain)?;
    out.addrs.clear();
    out.addrs.extend_from_slice(&answer.addrs);
    out.ttl = if out.addrs.is_empty() { 0 } else { answer.ttl };
    Ok(())
}

/// [`extract`] for a message decoded by `fqdnd-dnswire`; a message without a question
/// teaches nothing.
///
/// # Errors
/// As [`extract`].
pub fn extract_decoded(msg: &Decoded, out: &mut Extracted) -> Result<(), AnswerError> {
    if msg.header.qdcount == 0 {
        out.addrs.clear();
        out.ttl = 0;
        return Ok(());
    }
    let records = msg.answers.iter().map(|rr| AnswerRecord {
        owner: msg.name(&rr.owner),
        class: rr.class,
        ttl: rr.ttl,
        data: match (&rr.data, rr.rtype) {
            (WireData::Addr(a), _) => Data::Addr(*a),
            (WireData::Name(target), TYPE_CNAME) => Data::Cname(msg.name(target)),
            _ => Data::Other,
        },
    });
    extract(msg.qname(), records, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Message, MessageType, OpCode, Query};
    use hickory_proto::rr::rdata::{A, AAAA, CNAME, TXT};
    use hickory_proto::rr::{DNSClass, Name, RData, Record as Rr, RecordType};

    fn name(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    fn message(records: Vec<Rr>) -> Message {
        let mut m = Message::new(1, MessageType::Response, OpCode::Query);
        m.queries
            .push(Query::query(name("www.example.test."), RecordType::A));
        m.answers = records;
        m
    }

    fn a(owner: &str, ttl: u32, last: u8) -> Rr {
        Rr::from_rdata(name(owner), ttl, RData::A(A::new(192, 0, 2, last)))
    }

    fn cname(owner: &str, ttl: u32, target: &str) -> Rr {
        Rr::from_rdata(name(owner), ttl, RData::CNAME(CNAME(name(target))))
    }

    /// Encoded by hickory-proto, decoded as the proxy decodes.
    fn extracted(records: Vec<Rr>) -> Result<Extracted, AnswerError> {
        let wire = message(records).to_vec().unwrap();
        let mut decoder = fqdnd_dnswire::Decoder::new();
        let mut out = Extracted::default();
        extract_decoded(decoder.decode_whole(&wire).unwrap(), &mut out).map(|()| out)
    }

    fn v4(last: u8) -> IpAddr {
        IpAddr::from([192, 0, 2, last])
    }

    #[test]
    fn direct_answers_keep_order_drop_duplicates_and_take_the_minimum_ttl() {
        let out = extracted(vec![
            a("WWW.example.test.", 60, 2),
            a("www.example.test.", 30, 1),
            a("www.example.test.", 90, 2),
        ])
        .unwrap();
        assert_eq!(out.addrs.as_slice(), [v4(2), v4(1)]);
        assert_eq!(out.ttl, 30);
    }

    #[test]
    fn a_chain_is_followed_and_its_cname_ttl_counts() {
        let aaaa = Rr::from_rdata(
            name("edge.cdn.test."),
            300,
            RData::AAAA(AAAA::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
        );
        let out = extracted(vec![
            cname("www.example.test.", 20, "edge.cdn.test."),
            a("edge.cdn.test.", 300, 7),
            aaaa,
        ])
        .unwrap();
        assert_eq!(out.addrs.len(), 2);
        assert_eq!(out.ttl, 20);
    }

    #[test]
    fn an_address_off_the_chain_invalidates_the_answer() {
        assert!(matches!(
            extracted(vec![a("www.example.test.", 60, 1), a("bank.test.", 60, 9)]),
            Err(AnswerError::OffChain { .. })
        ));
    }

    #[test]
    fn records_of_another_class_teach_nothing_and_are_not_checked() {
        let mut chaos = a("bank.test.", 60, 9);
        chaos.dns_class = DNSClass::CH;
        let mut chaos_own = a("www.example.test.", 60, 8);
        chaos_own.dns_class = DNSClass::CH;
        let out = extracted(vec![chaos, chaos_own, a("www.example.test.", 60, 1)]).unwrap();
        assert_eq!(out.addrs.as_slice(), [v4(1)]);
    }

    #[test]
    fn other_types_are_ignored_and_nodata_teaches_nothing() {
        let txt = Rr::from_rdata(
            name("elsewhere.test."),
            60,
            RData::TXT(TXT::new(vec!["x".into()])),
        );
        let out = extracted(vec![txt]).unwrap();
        assert!(out.addrs.is_empty());
        assert_eq!(out.ttl, 0);
        let out = extracted(vec![cname("www.example.test.", 20, "edge.cdn.test.")]).unwrap();
        assert!(out.addrs.is_empty());
        assert_eq!(out.ttl, 0);
    }

    #[test]
    fn text_names_follow_the_same_rule() {
        let records = [
            AnswerRecord {
                owner: "www.example.test.",
                class: CLASS_IN,
                ttl: 40,
                data: Data::Cname("edge.cdn.test."),
            },
            AnswerRecord {
                owner: "edge.cdn.test.",
                class: CLASS_IN,
                ttl: 300,
                data: Data::Addr(v4(5)),
            },
        ];
        let mut out = Extracted::default();
        extract("www.example.test.", records, &mut out).unwrap();
        assert_eq!((out.addrs.as_slice(), out.ttl), ([v4(5)].as_slice(), 40));
    }
}
