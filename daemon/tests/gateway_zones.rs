//! Where the gateway sends a name: a static zone's names always to its in-process server, a
//! `zoneUpstreams` zone's to its own upstreams, everything else to `upstreams` — whatever the
//! round robin (before per-zone pools, the static zones' server was one more member of the
//! pool, so a static name could go to the real upstream and a real one to the static server).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use std::net::Ipv4Addr;

use common::{addresses, ask, demo_gateway, office_dns, upstream_answering};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_name_goes_to_its_zones_upstream_every_time() {
    let public = Ipv4Addr::new(203, 0, 113, 99);
    let corp = Ipv4Addr::new(10, 9, 9, 9);
    let default_upstream = upstream_answering(public).await;
    let corp_upstream = upstream_answering(corp).await;
    // The demo's gateway (static zones example.test and example.net) with a default pool and
    // a zone of its own; the office may resolve anything.
    let gateway = demo_gateway().replace(
        "  upstreamTimeout: 2s\n",
        &format!(
            "  upstreamTimeout: 2s\n  upstreams: [\"{default_upstream}\"]\n  zoneUpstreams:\n  - zone: corp.internal\n    upstreams: [\"{corp_upstream}\"]\n"
        ),
    );
    assert!(
        gateway.contains("zoneUpstreams"),
        "the demo's layout changed"
    );
    let config = format!("{gateway}---\n{}", office_dns("all", "matchPattern: \"*\""));
    let dir = tempfile::tempdir().unwrap();
    let (running, _) = common::gateway(dir.path(), "gateway", &config, None).await;
    let server = running.udp()[0];
    // Enough rounds that a round robin over the pools would have mixed them.
    for round in 0..8 {
        let mut www = addresses(&ask(server, "www.example.test.").await);
        www.sort_unstable();
        assert_eq!(
            www,
            [Ipv4Addr::new(192, 0, 2, 10), Ipv4Addr::new(192, 0, 2, 11)],
            "round {round}: a static zone's name from the static zone"
        );
        assert_eq!(
            addresses(&ask(server, "api.example.net.").await),
            [Ipv4Addr::new(203, 0, 113, 7)],
            "round {round}"
        );
        assert_eq!(
            addresses(&ask(server, "host.corp.internal.").await),
            [corp],
            "round {round}: the zone's own upstream"
        );
        assert_eq!(
            addresses(&ask(server, "www.elsewhere.example.").await),
            [public],
            "round {round}: the default pool"
        );
    }
    running.shutdown().await.unwrap();
}
