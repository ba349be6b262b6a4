//! The dashboard of a gateway in-process: its API serves what the daemon counts (the admin
//! API's status, the hour's series), the live tail carries the queries, the token guards the
//! API, and stopping the daemon does not wait for an open live stream.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{demo_gateway, office_dns, rcode, until};
use hickory_proto::op::ResponseCode;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const TOKEN: &str = "in-process-token";

fn request(path: &str, token: Option<&str>) -> String {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}\r\n")
}

/// The status code and body of one GET.
async fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request(path, token).as_bytes()).await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut out))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    (head[9..12].parse().unwrap(), body.to_owned())
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_serves_the_gateways_figures_and_its_live_tail() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), format!("{TOKEN}\n")).unwrap();
    let gateway_doc = demo_gateway().replace(
        "  upstreamTimeout: 2s\n",
        "  upstreamTimeout: 2s\n  dashboard: {address: \"127.0.0.1:0\", tokenFile: token}\n",
    );
    assert!(
        gateway_doc.contains("dashboard:"),
        "the demo has upstreamTimeout"
    );
    let config = format!(
        "{gateway_doc}---\n{}",
        office_dns("office-egress", "matchName: \"api.example.net\"")
    );
    let (mut gateway, _) = common::gateway(dir.path(), "gateway", &config, None).await;
    let dash = fqdnd_daemon::dashboard::spawn(&mut gateway)
        .unwrap()
        .expect("the document has a dashboard");
    let server = gateway.udp()[0];
    assert_eq!(
        rcode(server, "api.example.net.").await,
        ResponseCode::NoError
    );
    assert_eq!(
        rcode(server, "other.example.net.").await,
        ResponseCode::Refused
    );

    // The token guards the API.
    assert_eq!(get(dash, "/api/status", None).await.0, 401);
    assert_eq!(get(dash, "/api/status", Some("other")).await.0, 401);

    // The status is the admin API's: the proxy's counts.
    let count = |status: &serde_json::Value, result: &str| {
        status["queries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q[0] == result)
            .map_or(0, |q| q[1].as_u64().unwrap())
    };
    let (code, body) = get(dash, "/api/status", Some(TOKEN)).await;
    assert_eq!(code, 200, "{body}");
    let status = json(&body);
    assert_eq!(status["mode"], "gateway");
    assert_eq!(
        (count(&status, "answered"), count(&status, "denied")),
        (1, 1)
    );

    // The hour's series counts them (the tap records a query as it ends: poll).
    until("the series counts both queries", || async {
        let series = json(&get(dash, "/api/series?step=60", Some(TOKEN)).await.1);
        let sum = |name: &str| -> f64 {
            series["results"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r[0] == name)
                .map_or(0.0, |r| {
                    r[1].as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_f64().unwrap())
                        .sum()
                })
                * 60.0
        };
        (sum("answered") - 1.0).abs() < 1e-9 && (sum("denied") - 1.0).abs() < 1e-9
    })
    .await;

    // The policy listing has the client group and the rule selecting it.
    let policy = json(&get(dash, "/api/policy", Some(TOKEN)).await.1);
    assert_eq!(policy[0]["name"], "office");
    assert_eq!(policy[0]["sections"][0]["section"], "egress[0]");

    // The live tail: the queries so far, then a new one.
    let mut tail = TcpStream::connect(dash).await.unwrap();
    tail.write_all(request("/api/events/queries", Some(TOKEN)).as_bytes())
        .await
        .unwrap();
    let mut lines = BufReader::new(tail).lines();
    let mut next_query = async || loop {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("an event within 10 s")
            .unwrap()
            .expect("the stream stays open");
        if let Some(data) = line.strip_prefix("data: ") {
            return json(data);
        }
    };
    let first = next_query().await;
    assert_eq!(first["name"], "api.example.net.");
    assert_eq!(first["group"], "office", "the client group of 127.0.0.1");
    let denied = next_query().await;
    assert_eq!(
        (denied["name"].as_str(), denied["result"].as_str()),
        (Some("other.example.net."), Some("denied"))
    );
    assert_eq!(
        rcode(server, "api.example.net.").await,
        ResponseCode::NoError
    );
    let live = next_query().await;
    assert_eq!(
        (live["name"].as_str(), live["rcode"].as_str()),
        (Some("api.example.net."), Some("NOERROR"))
    );

    // Stopping ends the open stream instead of waiting for it.
    tokio::time::timeout(Duration::from_secs(10), gateway.shutdown())
        .await
        .expect("shutdown within 10 s with a live stream open")
        .unwrap();
}
