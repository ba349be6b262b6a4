//! The gateway in-process (no child process, no kernel: the DNS-only gateway over the memory
//! datapath): reload applies a changed policy, a configuration that does not load is refused
//! whole and the policy in force stays, and shutdown joins every task.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use common::{demo_gateway, office_dns, rcode};
use hickory_proto::op::ResponseCode;

/// The demo gateway with `allowed` as the one name the office may resolve.
fn config(allowed: &str) -> String {
    format!(
        "{}---\n{}",
        demo_gateway(),
        office_dns("office-egress", &format!("matchName: \"{allowed}\""))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_a_change_and_refuses_a_broken_file_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (gateway, file) =
        common::gateway(dir.path(), "gateway", &config("api.example.net"), None).await;
    let server = gateway.udp()[0];
    assert_eq!(
        rcode(server, "api.example.net.").await,
        ResponseCode::NoError
    );
    assert_eq!(
        rcode(server, "other.example.net.").await,
        ResponseCode::Refused
    );

    // A changed policy: in force as soon as reload returns.
    std::fs::write(&file, config("other.example.net")).unwrap();
    let reload = gateway.reload();
    assert!(reload.ok, "{:?}", reload.errors);
    assert_eq!(
        rcode(server, "other.example.net.").await,
        ResponseCode::NoError
    );
    assert_eq!(
        rcode(server, "api.example.net.").await,
        ResponseCode::Refused
    );

    // A file that does not load: refused whole, with its location; the policy in force stays.
    std::fs::write(
        &file,
        config("other.example.net").replace("matchName", "matchNmae"),
    )
    .unwrap();
    let reload = gateway.reload();
    assert!(!reload.ok);
    assert!(
        reload.errors.iter().any(|e| e.contains("gateway.yaml:")),
        "{:?}",
        reload.errors
    );
    assert_eq!(
        rcode(server, "other.example.net.").await,
        ResponseCode::NoError
    );
    assert_eq!(
        rcode(server, "api.example.net.").await,
        ResponseCode::Refused
    );

    gateway.shutdown().await.unwrap();
    assert!(
        std::net::UdpSocket::bind(server).is_ok(),
        "the listener is closed once shutdown returns"
    );
}
