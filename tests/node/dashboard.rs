//! The node agent's dashboard: its status says `node`, and the Drops page's data — the drop
//! log and the live stream of drops — carries a policy drop as it happens.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use super::{A_PORTS, DROPPED, node_config_with, setup_with, tcp_reaches};
use crate::topology::in_netns;

/// The dashboard's address in the host namespace (each topology has its own).
const DASHBOARD: &str = "127.0.0.1:9968";

fn get(stream: &mut TcpStream, path: &str) {
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
}

/// The body of one GET on the dashboard, from the host namespace.
fn fetch(host: &str, path: &'static str) -> String {
    in_netns(host, move || {
        let mut s = TcpStream::connect(DASHBOARD.parse::<SocketAddr>().unwrap()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        get(&mut s, path);
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out.split_once("\r\n\r\n").unwrap().1.to_owned()
    })
}

#[test]
fn the_nodes_dashboard_streams_its_drops() {
    let Some(t) = setup_with("dashboard", |t| {
        node_config_with(
            t,
            A_PORTS,
            &format!("  dashboard: {{address: \"{DASHBOARD}\"}}\n"),
        )
    }) else {
        return;
    };
    let status: serde_json::Value = serde_json::from_str(&fetch(&t.host, "/api/status")).unwrap();
    assert_eq!(status["mode"], "node");

    // A drop before the stream opens: in the log the page starts from.
    let nowhere = SocketAddr::new(t.v4(10, 3), 8080);
    assert!(!tcp_reaches(&t.ep_a, nowhere, DROPPED), "{nowhere} reached");
    let before = super::enforcement::drops(&t);
    let last_seq = before.last().expect("the drop is in the log")["seq"]
        .as_u64()
        .unwrap();

    // The stream: the kept drops, then new ones as they come.
    let (tx, rx) = mpsc::channel();
    let host = t.host.clone();
    let reader = std::thread::spawn(move || {
        in_netns(&host, move || {
            let mut s = TcpStream::connect(DASHBOARD.parse::<SocketAddr>().unwrap()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            get(&mut s, "/api/events/drops");
            let mut seen = Vec::new();
            for line in BufReader::new(s).lines() {
                let Ok(line) = line else { break };
                if let Some(data) = line.strip_prefix("data: ") {
                    let drop: serde_json::Value = serde_json::from_str(data).unwrap();
                    let live = drop["seq"].as_u64().unwrap() > last_seq;
                    seen.push(drop);
                    if live {
                        break;
                    }
                }
            }
            let _ = tx.send(());
            seen
        })
    });
    // New drops until the stream has one (bounded).
    crate::common::poll_until(Duration::from_secs(60), "a live drop on the stream", || {
        if rx.try_recv().is_ok() {
            return Some(());
        }
        assert!(!tcp_reaches(&t.ep_a, nowhere, DROPPED), "{nowhere} reached");
        None
    });
    let seen = reader.join().unwrap();
    assert!(
        seen.iter().any(|d| d["seq"].as_u64() == Some(last_seq)),
        "the kept drop first: {seen:?}"
    );
    let live = seen.last().unwrap();
    assert!(
        live["seq"].as_u64().unwrap() > last_seq,
        "a new drop, live: {seen:?}"
    );
    assert_eq!(live["reason"], "policy-denied", "{live}");
    assert!(
        live["dst"]
            .as_str()
            .unwrap()
            .contains(&nowhere.ip().to_string()),
        "{live}"
    );
    assert_eq!(live["endpoint_name"], "a", "{live}");
}
