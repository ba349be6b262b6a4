//! Recordings of `fqdnd record` read back by replay and the policy preview: each message's note
//! (its pcapng comment) says the transport it came by and the endpoint that asked, and both
//! decide what the preview judges and for whom replay learns.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use fqdnd_replay::record::{Bounds, Encryption, Note, Packet, Recording, Way};
use fqdnd_replay::{
    IdentityMode, Limits, Options, PreviewOptions, PreviewReport, SettingsOverrides, Transport,
    preview, replay,
};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};

/// The resolver every query asks.
const SERVER: &str = "10.0.0.53:53";
/// A host process's socket, as the node's proxy sees it after the cgroup programs redirected
/// it: loopback, whatever the endpoint.
const HOST_PROCESS: &str = "127.0.0.1:40001";

/// The runner endpoint (host processes of a cgroup, id 7) and a container (id 3, 10.1.0.5).
const ENDPOINTS: &str = "apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {name: runner}
spec: {id: 7, cgroup: /runner, labels: {app: runner}}
---
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {name: web}
spec: {id: 3, addresses: [\"10.1.0.5/32\"], labels: {app: web}}
";

/// A policy for both endpoints: DNS to the resolver on port 53 over `protocol` for the names
/// `dns` allows.
fn policy(dir: &Path, file: &str, protocol: &str, dns: &str) -> PathBuf {
    let path = dir.join(format!("{file}.yaml"));
    let text = format!(
        "apiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata: {{name: {file}}}\n\
         spec:\n  endpointSelector: {{}}\n  egress:\n  - toCIDR: [10.0.0.53/32]\n    toPorts:\n    \
         - ports: [{{port: \"53\", protocol: {protocol}}}]\n      rules:\n        dns: [{dns}]\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// One query and its reply, as the proxy recorded them.
struct Exchange {
    client: &'static str,
    name: &'static str,
    transport: Transport,
    /// The endpoint the note names, and whether the kernel named it by socket.
    endpoint: Option<(u16, bool)>,
    /// DoT or DoH, when the query came encrypted (a gateway's `tls` listeners).
    encrypted: Option<Encryption>,
    /// The answer's address; `None`: REFUSED (the policy in force refused the query).
    answer: Option<Ipv4Addr>,
}

fn message(id: u16, name: &str, answer: Option<Option<Ipv4Addr>>) -> Vec<u8> {
    let kind = if answer.is_some() {
        MessageType::Response
    } else {
        MessageType::Query
    };
    let mut m = Message::new(id, kind, OpCode::Query);
    let owner = Name::from_ascii(name).unwrap();
    m.queries.push(Query::query(owner.clone(), RecordType::A));
    match answer {
        Some(Some(ip)) => m
            .answers
            .push(Record::from_rdata(owner, 300, RData::A(A(ip)))),
        Some(None) => m.metadata.response_code = ResponseCode::Refused,
        None => {}
    }
    m.to_vec().unwrap()
}

/// Writes `exchanges` as `fqdnd record` does, into one file of `dir`.
fn record(dir: &Path, exchanges: &[Exchange]) -> PathBuf {
    let bounds = Bounds {
        max_file_bytes: 1 << 20,
        max_files: 1,
    };
    let mut rec = Recording::new(dir, "rec", bounds).unwrap();
    let server: SocketAddr = SERVER.parse().unwrap();
    for (i, e) in exchanges.iter().enumerate() {
        let client: SocketAddr = e.client.parse().unwrap();
        let id = u16::try_from(i).unwrap();
        let at = 1_700_000_000_000_000 + u64::from(id) * 1000;
        let note = |way, verdict| Note {
            way,
            transport: e.transport,
            encrypted: e.encrypted,
            endpoint: e.endpoint.map(|(id, _)| id),
            by_socket: e.endpoint.is_some_and(|(_, by_socket)| by_socket),
            verdict,
        };
        let (said, ended) = if e.answer.is_some() {
            ("allow", "answered")
        } else {
            ("deny", "denied")
        };
        let query = message(id, e.name, None);
        let reply = message(id, e.name, Some(e.answer));
        for (src, dst, bytes, note) in [
            (client, server, &query, note(Way::Query, said)),
            (server, client, &reply, note(Way::Reply, ended)),
        ] {
            rec.write(&Packet {
                unix_us: at,
                src,
                dst,
                bytes,
                note,
            })
            .unwrap();
        }
    }
    rec.close().unwrap();
    let files: Vec<PathBuf> = rec.files().map(Path::to_path_buf).collect();
    assert_eq!(files.len(), 1);
    files[0].clone()
}

fn run_preview(
    trace: PathBuf,
    policy: PathBuf,
    baseline: PathBuf,
    endpoints: &Path,
) -> PreviewReport {
    preview(&PreviewOptions {
        traces: vec![trace],
        policy: vec![policy],
        baseline: vec![baseline],
        endpoints: vec![endpoints.to_path_buf()],
        ports: vec![53],
        settings: SettingsOverrides::default(),
        limits: Limits::default(),
    })
    .unwrap()
}

/// The runner (host processes, all 127.0.0.1) asked for api over UDP and TCP, and for evil;
/// the web container for evil too.
fn exchanges() -> Vec<Exchange> {
    let runner = Some((7, true));
    let api = Some(Ipv4Addr::new(192, 0, 2, 1));
    let evil = Some(Ipv4Addr::new(192, 0, 2, 3));
    vec![
        Exchange {
            client: HOST_PROCESS,
            name: "api.example.test.",
            transport: Transport::Udp,
            endpoint: runner,
            encrypted: None,
            answer: api,
        },
        Exchange {
            client: HOST_PROCESS,
            name: "api.example.test.",
            transport: Transport::Tcp,
            endpoint: runner,
            encrypted: None,
            answer: api,
        },
        Exchange {
            client: HOST_PROCESS,
            name: "evil.example.test.",
            transport: Transport::Udp,
            endpoint: runner,
            encrypted: None,
            answer: evil,
        },
        Exchange {
            client: "10.1.0.5:40002",
            name: "evil.example.test.",
            transport: Transport::Udp,
            endpoint: Some((3, false)),
            encrypted: None,
            answer: evil,
        },
    ]
}

/// A node's recording: host processes' queries are their endpoint's, as the kernel named it
/// (issue 36, item 10), and each query is judged by the transport it came by (item 9).
#[test]
fn the_preview_judges_each_query_for_its_socket_named_endpoint_by_its_transport() {
    let dir = tempfile::tempdir().unwrap();
    let trace = record(dir.path(), &exchanges());
    let endpoints = dir.path().join("endpoints.yaml");
    std::fs::write(&endpoints, ENDPOINTS).unwrap();
    let baseline = policy(dir.path(), "baseline", "ANY", "{matchPattern: \"*\"}");
    let new = policy(dir.path(), "new", "UDP", "{matchName: api.example.test}");
    let report = run_preview(trace, new, baseline, &endpoints);
    assert_eq!(report.baseline.queries_unknown_client, 0, "{report:?}");
    assert_eq!(report.baseline.queries_allowed, 4, "{report:?}");
    // Under the new policy: api over UDP only.
    assert_eq!(report.policy.queries_allowed, 1, "{report:?}");
    assert_eq!(report.policy.queries_refused, 3, "{report:?}");
    let changes: Vec<(u16, &str, &[String], &[String])> = report
        .endpoints
        .iter()
        .map(|c| {
            (
                c.endpoint,
                c.name.as_str(),
                c.names_now_refused.as_slice(),
                c.names_mixed.as_slice(),
            )
        })
        .collect();
    let (api, evil) = (
        "api.example.test.".to_owned(),
        "evil.example.test.".to_owned(),
    );
    assert_eq!(
        changes,
        [
            (3, "web", [evil.clone()].as_slice(), [].as_slice()),
            (7, "runner", [evil].as_slice(), [api].as_slice()),
        ],
        "{report:?}"
    );
}

/// A gateway's recording of DoT and DoH queries (`encrypted=dot|doh` in the note): the preview
/// judges them as the services on TCP 853 and 443, as the gateway does (issue 40).
#[test]
fn the_preview_judges_dot_and_doh_queries_as_tcp_853_and_443() {
    let dir = tempfile::tempdir().unwrap();
    let web = |encrypted| Exchange {
        client: "10.1.0.5:40002",
        name: "api.example.test.",
        transport: Transport::Tcp,
        endpoint: Some((3, false)),
        encrypted,
        answer: Some(Ipv4Addr::new(192, 0, 2, 1)),
    };
    let trace = record(
        dir.path(),
        &[
            web(None),
            web(Some(Encryption::Dot)),
            web(Some(Encryption::Doh)),
        ],
    );
    let endpoints = dir.path().join("endpoints.yaml");
    std::fs::write(&endpoints, ENDPOINTS).unwrap();
    let baseline = policy(dir.path(), "baseline", "ANY", "{matchPattern: \"*\"}");
    // Port 53 only: plain TCP allowed, DoT and DoH refused.
    let plain = policy(dir.path(), "plain", "ANY", "{matchName: api.example.test}");
    let report = run_preview(trace.clone(), plain, baseline.clone(), &endpoints);
    assert_eq!(report.baseline.queries_allowed, 1, "{report:?}");
    assert_eq!(report.policy.queries_allowed, 1, "{report:?}");
    assert_eq!(report.policy.queries_refused, 2, "{report:?}");
    // DoT's port too: plain and DoT allowed, DoH refused.
    let dot = dir.path().join("dot.yaml");
    std::fs::write(
        &dot,
        "apiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata: {name: dot}\n\
         spec:\n  endpointSelector: {}\n  egress:\n  - toCIDR: [10.0.0.53/32]\n    toPorts:\n    \
         - ports: [{port: \"53\", protocol: ANY}, {port: \"853\", protocol: TCP}]\n      rules:\n        \
         dns: [{matchName: api.example.test}]\n",
    )
    .unwrap();
    let report = run_preview(trace, dot, baseline, &endpoints);
    assert_eq!(report.policy.queries_allowed, 2, "{report:?}");
    assert_eq!(report.policy.queries_refused, 1, "{report:?}");
}

/// Recordings made before TCP was written as TCP hold a query that came over TCP as a
/// datagram with `transport=tcp` in its note: it is judged as TCP (issue 36, item 9).
#[test]
fn an_older_recording_of_tcp_queries_as_datagrams_is_judged_as_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let udp: Vec<Exchange> = exchanges()
        .into_iter()
        .filter(|e| e.name.starts_with("api") && e.transport == Transport::Udp)
        .collect();
    let trace = record(dir.path(), &udp);
    // The older writer's file: the same datagrams, their notes saying TCP.
    let bytes = std::fs::read(&trace).unwrap();
    let text = bytes.windows(13).filter(|w| w == b"transport=udp").count();
    assert_eq!(text, 2);
    let mut old = bytes.clone();
    for i in 0..old.len().saturating_sub(13) {
        if &old[i..i + 13] == b"transport=udp" {
            old[i + 10..i + 13].copy_from_slice(b"tcp");
        }
    }
    std::fs::write(&trace, &old).unwrap();
    let endpoints = dir.path().join("endpoints.yaml");
    std::fs::write(&endpoints, ENDPOINTS).unwrap();
    let baseline = policy(dir.path(), "baseline", "ANY", "{matchPattern: \"*\"}");
    let new = policy(dir.path(), "new", "UDP", "{matchName: api.example.test}");
    let report = run_preview(trace.clone(), new, baseline, &endpoints);
    assert_eq!(report.policy.queries_refused, 1, "{report:?}");
    assert_eq!(
        report.endpoints[0].names_now_refused,
        ["api.example.test."],
        "{report:?}"
    );
    // Plain replay counts it as a response over TCP.
    let (run, _) = replay(
        &Options {
            traces: vec![trace],
            policy: vec![dir.path().join("baseline.yaml")],
            endpoints: vec![endpoints],
            ports: vec![53],
            modes: vec![IdentityMode::Selector],
            settings: SettingsOverrides::default(),
            limits: Limits::default(),
            csv_timeseries: None,
            progress_interval: None,
        },
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(run.input.responses_tcp, 1, "{run:?}");
}

/// Plain replay with `--endpoints` learns a host process's answers for its socket-named
/// endpoint (issue 36, item 10); an endpoint the files do not declare learns nothing.
#[test]
fn replay_learns_for_the_socket_named_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut all = exchanges();
    all.push(Exchange {
        client: HOST_PROCESS,
        name: "api.example.test.",
        transport: Transport::Udp,
        endpoint: Some((99, true)),
        encrypted: None,
        answer: Some(Ipv4Addr::new(192, 0, 2, 1)),
    });
    let trace = record(dir.path(), &all);
    let endpoints = dir.path().join("endpoints.yaml");
    std::fs::write(&endpoints, ENDPOINTS).unwrap();
    let (run, _) = replay(
        &Options {
            traces: vec![trace],
            policy: vec![policy(dir.path(), "p", "ANY", "{matchPattern: \"*\"}")],
            endpoints: vec![endpoints],
            ports: vec![53],
            modes: vec![IdentityMode::Selector],
            settings: SettingsOverrides::default(),
            limits: Limits::default(),
            csv_timeseries: None,
            progress_interval: None,
        },
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(run.run.responses_learned, 4, "{run:?}");
    assert_eq!(run.run.responses_without_endpoint, 1, "{run:?}");
}
