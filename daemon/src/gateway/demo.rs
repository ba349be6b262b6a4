//! `fqdnd gateway --demo`: the README's main job. Starts the gateway on loopback with the
//! embedded demo configuration (a static zone as its only upstream, so no network is needed),
//! asks it a few questions as a client would, and prints the answers and the identities the
//! allowed answers created.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use crate::{Context, Result};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::net::UdpSocket;

/// The questions the demo asks, with why.
const QUESTIONS: &[(&str, RecordType, &str)] = &[
    (
        "www.example.test.",
        RecordType::A,
        "allowed by *.example.test",
    ),
    (
        "shop.example.test.",
        RecordType::A,
        "a CNAME chain into the CDN",
    ),
    ("api.example.net.", RecordType::A, "allowed by matchName"),
    ("other.example.net.", RecordType::A, "no DNS rule allows it"),
    ("ads.example.test.", RecordType::A, "on the deny list"),
    (
        "missing.example.test.",
        RecordType::A,
        "allowed, but does not exist",
    ),
];

async fn ask(server: SocketAddr, id: u16, name: &str, qtype: RecordType) -> Result<Message> {
    let socket = UdpSocket::bind("127.0.0.1:0").await?;
    let mut query = Message::new(id, MessageType::Query, OpCode::Query);
    query.metadata.recursion_desired = true;
    query
        .queries
        .push(Query::query(Name::from_ascii(name)?, qtype));
    socket.send_to(&query.to_vec()?, server).await?;
    let mut buf = vec![0u8; 4096];
    let (n, _) = tokio::time::timeout(Duration::from_secs(3), socket.recv_from(&mut buf))
        .await
        .context("no answer within 3 s")??;
    Ok(Message::from_vec(&buf[..n])?)
}

/// The short name dig prints for a response code.
fn rcode_name(code: ResponseCode) -> String {
    match code {
        ResponseCode::NoError => "NOERROR".to_owned(),
        ResponseCode::FormErr => "FORMERR".to_owned(),
        ResponseCode::ServFail => "SERVFAIL".to_owned(),
        ResponseCode::NXDomain => "NXDOMAIN".to_owned(),
        ResponseCode::Refused => "REFUSED".to_owned(),
        other => other.to_string(),
    }
}

/// Runs the demo and returns its report.
pub async fn run() -> Result<String> {
    let gateway = crate::gateway::start(crate::skeleton::StartOptions {
        paths: Vec::new(),
        demo: true,
        admin_socket: None,
        strict_restore: false,
        cluster_store: None,
    })
    .await?;
    let server = *gateway
        .udp()
        .first()
        .context("the demo gateway listens nowhere")?;
    let mut out = String::new();
    writeln!(
        out,
        "fqdnd gateway (demo) on {server}, upstream: the embedded static zones\n"
    )?;
    for (i, (name, qtype, why)) in QUESTIONS.iter().enumerate() {
        let answer = ask(server, 0x4000 + i as u16, name, *qtype).await?;
        let addrs: Vec<String> = answer
            .answers
            .iter()
            .filter_map(|rr| match &rr.data {
                RData::A(a) => Some(a.0.to_string()),
                RData::AAAA(a) => Some(a.0.to_string()),
                RData::CNAME(c) => Some(format!("CNAME {}", c.0)),
                _ => None,
            })
            .collect();
        writeln!(
            out,
            "{:<24} {:<5} → {:<9} {:<44} ({why})",
            name,
            qtype.to_string(),
            rcode_name(answer.metadata.response_code),
            addrs.join(" ")
        )?;
    }
    writeln!(
        out,
        "\nidentities (one per label set; the fqdn ones were pre-allocated from policy):"
    )?;
    let (identities, ipcache) = {
        let engine = crate::skeleton::lock(&gateway.shared.engine, "engine")?;
        (engine.identity_rows(), engine.ipcache_rows())
    };
    for row in identities {
        writeln!(
            out,
            "  {:<9} refs {:<3} {}",
            row.identity,
            row.refs,
            row.labels.join(",")
        )?;
    }
    writeln!(out, "\nipcache (what the datapath now knows):")?;
    for row in ipcache {
        writeln!(
            out,
            "  {:<22} {:<9} {}",
            row.prefix,
            row.identity,
            row.owners.join(" ")
        )?;
    }
    gateway.shutdown().await?;
    Ok(out)
}
