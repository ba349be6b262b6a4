//! A programmable DNS upstream on loopback (UDP and TCP on one port): canned answers per name,
//! with faults to inject (delay, silence, TC, garbage, wrong ID, wrong question, an answer from
//! another port or address, floods of forged answers, a question in another case, an answer
//! cut short, answering twice). It records every query it receives and every answer it sends,
//! raw.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Edns, Message, ResponseCode};
use hickory_proto::rr::rdata::{A, CNAME};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio::task::JoinHandle;

/// Something sent before (or instead of) the real answer over UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Bytes that are not a DNS message, with the right ID.
    Garbage,
    /// The real answer with another ID.
    WrongId,
    /// An answer with the right ID for another name.
    WrongQuestion,
    /// A forged answer (address 6.6.6.6) with the right ID, from another socket.
    OtherSocket,
    /// A forged answer (address 6.6.6.6) with the right ID, from the upstream's port on
    /// another address (127.0.0.2).
    OtherAddress,
    /// This many forged answers (address 6.6.6.6) to the right question with random IDs, none
    /// of them the query's.
    ForgedIds(u16),
    /// This many forged answers (address 6.6.6.6) with the right ID and another question:
    /// another name, the same name with another type, or the same name in class CH.
    ForgedQuestions(u16),
}

/// How the upstream answers one name.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    pub(crate) rcode: ResponseCode,
    pub(crate) records: Vec<Record>,
    /// Wait this long before answering.
    pub(crate) delay: Duration,
    /// Never answer.
    pub(crate) silent: bool,
    /// Over UDP, answer TC=1 with no records even if the answer fits.
    pub(crate) force_tc: bool,
    /// Sent before the real answer.
    pub(crate) faults: Vec<Fault>,
    /// Send the real answer twice.
    pub(crate) twice: bool,
    /// Over UDP, write the answer's question name in lowercase (an upstream that does not
    /// preserve case, or a spoofer who guessed the ID but not the 0x20 case).
    pub(crate) lowercase_question: bool,
    /// Over UDP, cut the answer short in the middle of its last record (keeping the TC bit
    /// as `force_tc` says; the records are kept either way).
    pub(crate) cut_short: bool,
    /// The authority section (an SOA for a negative answer).
    pub(crate) authority: Vec<Record>,
}

impl Default for Rule {
    fn default() -> Self {
        Self {
            rcode: ResponseCode::NoError,
            records: Vec::new(),
            delay: Duration::ZERO,
            silent: false,
            force_tc: false,
            faults: Vec::new(),
            twice: false,
            lowercase_question: false,
            cut_short: false,
            authority: Vec::new(),
        }
    }
}

/// `name` → `ips` as A records (TTL 60).
pub(crate) fn a_records(name: &str, ips: impl IntoIterator<Item = Ipv4Addr>) -> Vec<Record> {
    let owner = Name::from_ascii(name).unwrap();
    ips.into_iter()
        .map(|ip| Record::from_rdata(owner.clone(), 60, RData::A(A(ip))))
        .collect()
}

/// `name` CNAME `target`.
pub(crate) fn cname(name: &str, target: &str) -> Record {
    Record::from_rdata(
        Name::from_ascii(name).unwrap(),
        60,
        RData::CNAME(CNAME(Name::from_ascii(target).unwrap())),
    )
}

/// A rule answering `name` with `ips`.
pub(crate) fn answer(name: &str, ips: impl IntoIterator<Item = Ipv4Addr>) -> Rule {
    Rule {
        records: a_records(name, ips),
        ..Rule::default()
    }
}

/// One query the upstream received.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) tcp: bool,
    pub(crate) raw: Vec<u8>,
    pub(crate) from: SocketAddr,
    pub(crate) name: String,
}

#[derive(Default)]
struct State {
    rules: HashMap<String, Rule>,
    down: bool,
    seen: Vec<Seen>,
    /// Real answers sent, per name, raw.
    sent: Vec<(String, Vec<u8>)>,
}

/// The running upstream; dropping it stops it.
pub(crate) struct TestUpstream {
    pub(crate) addr: SocketAddr,
    state: Arc<Mutex<State>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for TestUpstream {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl TestUpstream {
    /// Starts on 127.0.0.1 with a fresh port (UDP and TCP).
    pub(crate) async fn start() -> Self {
        // Find a port free for both UDP and TCP.
        let (udp, tcp) = loop {
            let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let addr = udp.local_addr().unwrap();
            if let Ok(tcp) = TcpListener::bind(addr).await {
                break (udp, tcp);
            }
        };
        let addr = udp.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let udp = Arc::new(udp);
        let other = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
        let tasks = vec![
            tokio::spawn(serve_udp(udp, other, state.clone())),
            tokio::spawn(serve_tcp(tcp, state.clone())),
        ];
        Self { addr, state, tasks }
    }

    /// Sets how `name` (any case, trailing dot optional) is answered.
    pub(crate) fn rule(&self, name: &str, rule: Rule) {
        self.state.lock().unwrap().rules.insert(key(name), rule);
    }

    /// While down, nothing is answered (probes included).
    pub(crate) fn set_down(&self, down: bool) {
        self.state.lock().unwrap().down = down;
    }

    /// Every query received so far.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    /// Queries received so far, health probes (`. NS`) left out.
    pub(crate) fn queries(&self) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.name != ".").collect()
    }

    /// Queries for `name` received over UDP / TCP.
    pub(crate) fn count(&self, name: &str, tcp: bool) -> usize {
        let k = key(name);
        self.state
            .lock()
            .unwrap()
            .seen
            .iter()
            .filter(|s| s.name == k && s.tcp == tcp)
            .count()
    }

    /// The last real answer sent for `name`.
    pub(crate) fn last_sent(&self, name: &str) -> Option<Vec<u8>> {
        let k = key(name);
        self.state
            .lock()
            .unwrap()
            .sent
            .iter()
            .rev()
            .find(|(n, _)| *n == k)
            .map(|(_, r)| r.clone())
    }
}

fn key(name: &str) -> String {
    let mut k = name.to_ascii_lowercase();
    if !k.ends_with('.') {
        k.push('.');
    }
    k
}

/// Builds the answer to `query` under `rule`; over UDP it is truncated (TC=1, no records) when
/// it exceeds the query's payload size, like a real server.
fn respond(query: &Message, rule: &Rule, udp: bool) -> Vec<u8> {
    let mut resp = Message::response(query.metadata.id, query.metadata.op_code);
    resp.metadata.recursion_desired = query.metadata.recursion_desired;
    resp.metadata.recursion_available = true;
    resp.metadata.response_code = rule.rcode;
    resp.add_queries(query.queries.clone());
    resp.add_answers(rule.records.clone());
    resp.add_authorities(rule.authority.clone());
    if let Some(e) = &query.edns {
        let mut edns = Edns::new();
        edns.set_max_payload(1232);
        edns.set_dnssec_ok(e.flags().dnssec_ok);
        resp.set_edns(edns);
    }
    let full = resp.to_vec().unwrap();
    let mut out = if udp && rule.cut_short {
        // Mid-record: the last record loses its last byte (and the TC bit is as configured).
        let mut cut = full[..full.len() - 1].to_vec();
        if rule.force_tc {
            cut[2] |= 0x02;
        }
        cut
    } else if udp && (rule.force_tc || full.len() > usize::from(query.max_payload())) {
        resp.truncate().to_vec().unwrap()
    } else {
        full
    };
    if udp && rule.lowercase_question {
        let end = question_name_end(&out);
        out[12..end].make_ascii_lowercase();
    }
    out
}

/// Where the question name starting at offset 12 ends (after its root label).
pub(crate) fn question_name_end(raw: &[u8]) -> usize {
    let mut pos = 12;
    while raw[pos] != 0 {
        pos += 1 + usize::from(raw[pos]);
    }
    pos + 1
}

/// A random ID other than `not`.
fn random_id(not: u16) -> u16 {
    loop {
        let mut b = [0u8; 2];
        getrandom::fill(&mut b).unwrap();
        let id = u16::from_be_bytes(b);
        if id != not {
            return id;
        }
    }
}

async fn serve_udp(socket: Arc<UdpSocket>, other: Arc<UdpSocket>, state: Arc<Mutex<State>>) {
    let mut buf = vec![0u8; 65_536];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        let raw = buf[..n].to_vec();
        let Ok(query) = Message::from_vec(&raw) else {
            continue;
        };
        let name = query
            .queries
            .first()
            .map(|q| key(&q.name.to_ascii()))
            .unwrap_or_default();
        let rule = {
            let mut st = state.lock().unwrap();
            st.seen.push(Seen {
                tcp: false,
                raw: raw.clone(),
                from,
                name: name.clone(),
            });
            if st.down {
                continue;
            }
            st.rules.get(&name).cloned().unwrap_or(Rule {
                rcode: ResponseCode::NXDomain,
                ..Rule::default()
            })
        };
        if rule.silent {
            continue;
        }
        let (socket, other, state) = (socket.clone(), other.clone(), state.clone());
        tokio::spawn(async move {
            if !rule.delay.is_zero() {
                tokio::time::sleep(rule.delay).await;
            }
            let real = respond(&query, &rule, true);
            for fault in &rule.faults {
                match fault {
                    Fault::Garbage => {
                        let mut junk = real[..2].to_vec();
                        junk.extend_from_slice(&[0x81, 0x80, 0xff, 0xff, 0x00]);
                        socket.send_to(&junk, from).await.unwrap();
                    }
                    Fault::WrongId => {
                        let mut wrong = real.clone();
                        wrong[0] ^= 0x5a;
                        wrong[1] ^= 0xa5;
                        socket.send_to(&wrong, from).await.unwrap();
                    }
                    Fault::WrongQuestion => {
                        let mut q = query.clone();
                        q.queries[0].name = Name::from_ascii("other.example.").unwrap();
                        let wrong = respond(
                            &q,
                            &answer("other.example.", [Ipv4Addr::new(6, 6, 6, 6)]),
                            true,
                        );
                        socket.send_to(&wrong, from).await.unwrap();
                    }
                    Fault::OtherSocket => {
                        let forged_rule = answer(&name, [Ipv4Addr::new(6, 6, 6, 6)]);
                        let forged = respond(&query, &forged_rule, true);
                        other.send_to(&forged, from).await.unwrap();
                    }
                    Fault::OtherAddress => {
                        let port = socket.local_addr().unwrap().port();
                        let elsewhere = UdpSocket::bind(("127.0.0.2", port)).await.unwrap();
                        let forged_rule = answer(&name, [Ipv4Addr::new(6, 6, 6, 6)]);
                        let forged = respond(&query, &forged_rule, true);
                        elsewhere.send_to(&forged, from).await.unwrap();
                    }
                    Fault::ForgedIds(n) => {
                        let forged_rule = answer(&name, [Ipv4Addr::new(6, 6, 6, 6)]);
                        let mut forged = respond(&query, &forged_rule, true);
                        for _ in 0..*n {
                            let id = random_id(query.metadata.id);
                            forged[..2].copy_from_slice(&id.to_be_bytes());
                            socket.send_to(&forged, from).await.unwrap();
                        }
                    }
                    Fault::ForgedQuestions(n) => {
                        for i in 0..*n {
                            let mut q = query.clone();
                            match i % 3 {
                                0 => {
                                    q.queries[0].name =
                                        Name::from_ascii(format!("forged{i}.example.")).unwrap();
                                }
                                1 => q.queries[0].query_type = RecordType::AAAA,
                                _ => q.queries[0].query_class = DNSClass::CH,
                            }
                            let forged_rule = answer(&name, [Ipv4Addr::new(6, 6, 6, 6)]);
                            let forged = respond(&q, &forged_rule, true);
                            socket.send_to(&forged, from).await.unwrap();
                        }
                    }
                }
            }
            if !rule.faults.is_empty() {
                // Let the faults arrive first.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            state.lock().unwrap().sent.push((name, real.clone()));
            socket.send_to(&real, from).await.unwrap();
            if rule.twice {
                socket.send_to(&real, from).await.unwrap();
            }
        });
    }
}

async fn serve_tcp(listener: TcpListener, state: Arc<Mutex<State>>) {
    loop {
        let Ok((mut stream, from)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            loop {
                let mut len = [0u8; 2];
                if stream.read_exact(&mut len).await.is_err() {
                    return;
                }
                let mut raw = vec![0u8; usize::from(u16::from_be_bytes(len))];
                if stream.read_exact(&mut raw).await.is_err() {
                    return;
                }
                let Ok(query) = Message::from_vec(&raw) else {
                    return;
                };
                let name = query
                    .queries
                    .first()
                    .map(|q| key(&q.name.to_ascii()))
                    .unwrap_or_default();
                let rule = {
                    let mut st = state.lock().unwrap();
                    st.seen.push(Seen {
                        tcp: true,
                        raw: raw.clone(),
                        from,
                        name: name.clone(),
                    });
                    if st.down {
                        continue;
                    }
                    st.rules.get(&name).cloned().unwrap_or(Rule {
                        rcode: ResponseCode::NXDomain,
                        ..Rule::default()
                    })
                };
                if rule.silent {
                    continue;
                }
                if !rule.delay.is_zero() {
                    tokio::time::sleep(rule.delay).await;
                }
                let real = respond(&query, &rule, false);
                state.lock().unwrap().sent.push((name, real.clone()));
                let mut framed = (u16::try_from(real.len()).unwrap()).to_be_bytes().to_vec();
                framed.extend_from_slice(&real);
                if stream.write_all(&framed).await.is_err() {
                    return;
                }
            }
        });
    }
}
