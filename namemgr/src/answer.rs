//! A DNS answer reduced to what the NameManager learns from it: the queried name, the
//! addresses at the end of its CNAME chain, and the chain's TTL (its minimum).
//!
//! As Cilium's proxy does, every answer record must lie on the chain that starts at the
//! question: a record for some other name makes the whole answer invalid, so an upstream
//! cannot slip addresses for an unrelated name into a reply.

use std::net::IpAddr;

use crate::name::canonicalize;

/// Longest CNAME chain followed.
const MAX_CHAIN: usize = 16;

/// The data of one answer record that matters here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordData {
    /// A or AAAA.
    Addr(IpAddr),
    /// CNAME target.
    Cname(String),
}

/// One answer record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Owner name as received.
    pub owner: String,
    /// TTL in seconds.
    pub ttl: u32,
    /// Its data.
    pub data: RecordData,
}

/// What an answer teaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The question's name, canonical (lowercase, trailing dot).
    pub name: String,
    /// Addresses of the chain's last name, in answer order, without duplicates.
    pub addrs: Vec<IpAddr>,
    /// Minimum TTL over every record on the chain, CNAMEs included (0 when empty).
    pub ttl: u32,
}

/// Why an answer was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AnswerError {
    /// A record's owner is not on the chain from the question.
    #[error("answer record for {owner:?} is not on the CNAME chain of {question:?}")]
    OffChain {
        /// The question.
        question: String,
        /// The stray record's owner.
        owner: String,
    },
    /// The CNAME chain is longer than fqdnd follows, or loops.
    #[error("CNAME chain of {question:?} is longer than {MAX_CHAIN} or loops")]
    ChainTooLong {
        /// The question.
        question: String,
    },
}

impl Answer {
    /// Follows the CNAME chain from `question` through `records`.
    pub fn from_records(question: &str, records: &[Record]) -> Result<Self, AnswerError> {
        let question = canonicalize(question).into_owned();
        let owners: Vec<String> = records
            .iter()
            .map(|r| canonicalize(&r.owner).into_owned())
            .collect();
        let mut chain = vec![question.clone()];
        let mut ttl: Option<u32> = None;
        loop {
            let current = chain.last().cloned().unwrap_or_default();
            let next = records
                .iter()
                .zip(&owners)
                .find_map(|(r, owner)| match &r.data {
                    RecordData::Cname(target) if *owner == current => {
                        Some(canonicalize(target).into_owned())
                    }
                    _ => None,
                });
            let Some(next) = next else { break };
            if chain.len() > MAX_CHAIN || chain.contains(&next) {
                return Err(AnswerError::ChainTooLong { question });
            }
            chain.push(next);
        }
        let last = chain.last().cloned().unwrap_or_default();
        let mut addrs = Vec::new();
        for (record, owner) in records.iter().zip(&owners) {
            if !chain.contains(owner) {
                return Err(AnswerError::OffChain {
                    question,
                    owner: owner.clone(),
                });
            }
            ttl = Some(ttl.map_or(record.ttl, |t| t.min(record.ttl)));
            if let RecordData::Addr(addr) = record.data
                && *owner == last
                && !addrs.contains(&addr)
            {
                addrs.push(addr);
            }
        }
        Ok(Self {
            name: question,
            addrs,
            ttl: ttl.unwrap_or(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(owner: &str, ttl: u32, ip: &str) -> Record {
        Record {
            owner: owner.into(),
            ttl,
            data: RecordData::Addr(ip.parse().unwrap()),
        }
    }

    fn cname(owner: &str, ttl: u32, target: &str) -> Record {
        Record {
            owner: owner.into(),
            ttl,
            data: RecordData::Cname(target.into()),
        }
    }

    #[test]
    fn chain_ttl_is_its_minimum_and_addresses_come_from_its_end() {
        let a = Answer::from_records(
            "WWW.Example.com",
            &[
                cname("www.example.com.", 300, "edge.cdn.net."),
                cname("edge.cdn.net", 60, "e1.cdn.net"),
                addr("e1.cdn.net.", 20, "192.0.2.1"),
                addr("E1.cdn.net.", 120, "192.0.2.2"),
                addr("e1.cdn.net.", 120, "192.0.2.2"),
            ],
        )
        .unwrap();
        assert_eq!(a.name, "www.example.com.");
        assert_eq!(a.ttl, 20);
        assert_eq!(
            a.addrs,
            vec![
                "192.0.2.1".parse::<IpAddr>().unwrap(),
                "192.0.2.2".parse().unwrap()
            ]
        );
    }

    #[test]
    fn records_off_the_chain_reject_the_answer() {
        let err = Answer::from_records(
            "a.example.",
            &[
                addr("a.example.", 5, "192.0.2.1"),
                addr("bank.example.", 5, "192.0.2.9"),
            ],
        )
        .unwrap_err();
        assert!(matches!(err, AnswerError::OffChain { owner, .. } if owner == "bank.example."));
    }

    #[test]
    fn loops_are_rejected_and_empty_answers_are_empty() {
        let err =
            Answer::from_records("a.", &[cname("a.", 5, "b."), cname("b.", 5, "a.")]).unwrap_err();
        assert!(matches!(err, AnswerError::ChainTooLong { .. }));
        let empty = Answer::from_records("a.", &[]).unwrap();
        assert!(empty.addrs.is_empty() && empty.ttl == 0);
    }
}
