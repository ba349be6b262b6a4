//! `conntrack:` lifetimes in the `Node` and `Gateway` documents, the deprecated
//! `conntrackIdleTimeout`, and `mapSizes.endpointAddresses`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::path::Path;
use std::time::Duration;

use fqdnd_config::{Conntrack, load_str};

fn file() -> &'static Path {
    Path::new("/etc/fqdnd/node.yaml")
}

fn node(spec: &str) -> Result<fqdnd_config::Node, String> {
    let text = format!("apiVersion: fqdnd.io/v1\nkind: Node\nspec:\n{spec}");
    load_str(&text, file())
        .map(|c| c.node.unwrap())
        .map_err(|e| e.to_string())
}

const S: fn(u64) -> Duration = Duration::from_secs;

#[test]
fn defaults_are_ciliums() {
    let n = node("  dnsProxyPort: 10053\n").unwrap();
    assert_eq!(
        n.daemon.conntrack,
        Conntrack {
            tcp_syn: S(60),
            tcp_established: S(21_600),
            tcp_closing: S(10),
            other: S(60),
        }
    );
    assert_eq!(n.conntrack_idle_timeout, None);
}

#[test]
fn every_lifetime_is_read() {
    let n = node(
        "  conntrack:\n    tcpSyn: 5s\n    tcpEstablished: 1h\n    tcpClosing: 2s\n    other: 30s\n",
    )
    .unwrap();
    assert_eq!(
        n.daemon.conntrack,
        Conntrack {
            tcp_syn: S(5),
            tcp_established: S(3600),
            tcp_closing: S(2),
            other: S(30),
        }
    );
    // some fields: the rest keep their defaults
    let n = node("  conntrack: {tcpClosing: 3s}\n").unwrap();
    assert_eq!(n.daemon.conntrack.tcp_closing, S(3));
    assert_eq!(n.daemon.conntrack.tcp_established, S(21_600));
}

#[test]
fn the_deprecated_idle_timeout_sets_what_conntrack_does_not() {
    let n = node("  conntrackIdleTimeout: 2m\n  conntrack: {tcpClosing: 4s}\n").unwrap();
    assert_eq!(n.conntrack_idle_timeout, Some(S(120)));
    assert_eq!(
        n.daemon.conntrack,
        Conntrack {
            tcp_syn: S(120),
            tcp_established: S(120),
            tcp_closing: S(4),
            other: S(120),
        }
    );
}

#[test]
fn bad_lifetimes_are_errors_with_their_line() {
    let e = node("  conntrack:\n    tcpSyn: 0s\n").unwrap_err();
    assert!(
        e.contains("node.yaml:5:")
            && e.contains("`conntrack.tcpSyn` must be between 1s and 30 days"),
        "{e}"
    );
    let e = node("  conntrack:\n    other: 31d\n").unwrap_err();
    assert!(
        e.contains("node.yaml:5:") && e.contains("conntrack.other"),
        "{e}"
    );
    let e = node("  conntrack:\n    tcpEstablished: soon\n").unwrap_err();
    assert!(
        e.contains("node.yaml:5:")
            && e.contains("`conntrack.tcpEstablished`")
            && e.contains("not a duration"),
        "{e}"
    );
    // a typo is an unknown field, named with its line
    let e = node("  conntrack:\n    tcpFin: 5s\n").unwrap_err();
    assert!(e.contains("node.yaml:5:") && e.contains("tcpFin"), "{e}");
    let e = node("  conntrackIdleTimeout: 500ms\n").unwrap_err();
    assert!(
        e.contains("node.yaml:4:") && e.contains("conntrackIdleTimeout"),
        "{e}"
    );
}

#[test]
fn a_gateway_takes_conntrack_too() {
    let text = "apiVersion: fqdnd.io/v1\nkind: Gateway\nspec:\n  listen: [\"127.0.0.1:53\"]\n  upstreams: [\"192.0.2.1:53\"]\n  conntrack: {tcpEstablished: 1h}\n  mapSizes: {endpointAddresses: 1024}\n";
    let g = load_str(text, file()).unwrap().gateway.unwrap();
    assert_eq!(g.daemon.conntrack.tcp_established, S(3600));
    assert_eq!(g.daemon.conntrack.other, S(60));
    assert_eq!(g.daemon.map_sizes.endpoint_addresses, Some(1024));
}
