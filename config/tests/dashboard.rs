//! The `dashboard` block of `kind: Gateway` and `kind: Node`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::path::{Path, PathBuf};

use fqdnd_config::{DEFAULT_DASHBOARD_ADDRESS, Dashboard, load_str};

fn gateway(extra: &str) -> String {
    format!(
        "apiVersion: fqdnd.io/v1\nkind: Gateway\nspec:\n  listen: [\"127.0.0.1:5353\"]\n  upstreams: [\"192.0.2.53:53\"]\n{extra}"
    )
}

fn file() -> &'static Path {
    Path::new("/etc/fqdnd/gateway.yaml")
}

fn dashboard_of(extra: &str) -> Option<Dashboard> {
    load_str(&gateway(extra), file())
        .unwrap()
        .gateway
        .unwrap()
        .daemon
        .dashboard
}

#[test]
fn the_dashboard_is_off_unless_given_and_on_loopback_by_default() {
    assert_eq!(dashboard_of(""), None, "off by default");
    assert_eq!(
        dashboard_of("  dashboard: {}\n"),
        Some(Dashboard {
            address: DEFAULT_DASHBOARD_ADDRESS,
            token_file: None
        })
    );
    assert!(DEFAULT_DASHBOARD_ADDRESS.ip().is_loopback());
    assert_eq!(
        dashboard_of("  dashboard: {enabled: false, address: 0.0.0.0:80}\n"),
        None
    );
    assert_eq!(
        dashboard_of("  dashboard: {address: \"[::1]:8080\"}\n")
            .unwrap()
            .address,
        "[::1]:8080".parse().unwrap()
    );
    // Off loopback with a token: allowed; the file is relative to the document.
    assert_eq!(
        dashboard_of("  dashboard: {address: 0.0.0.0:9968, tokenFile: secrets/dash}\n"),
        Some(Dashboard {
            address: "0.0.0.0:9968".parse().unwrap(),
            token_file: Some(PathBuf::from("/etc/fqdnd/secrets/dash")),
        })
    );
}

#[test]
fn the_node_has_the_same_block() {
    let text = "apiVersion: fqdnd.io/v1\nkind: Node\nspec:\n  dashboard: {address: 127.0.0.1:9000, tokenFile: /run/t}\n";
    let node = load_str(text, file()).unwrap().node.unwrap();
    assert_eq!(
        node.daemon.dashboard,
        Some(Dashboard {
            address: "127.0.0.1:9000".parse().unwrap(),
            token_file: Some(PathBuf::from("/run/t")),
        })
    );
}

#[test]
fn dashboard_mistakes_are_located_errors() {
    for (extra, says, line) in [
        (
            "  dashboard: {address: 0.0.0.0:9968}\n",
            "is not a loopback address",
            6,
        ),
        (
            "  dashboard:\n    address: \"[2001:db8::1]:80\"\n",
            "set `dashboard.tokenFile`",
            7,
        ),
        (
            "  dashboard: {address: localhost}\n",
            "not an address with a port",
            6,
        ),
        (
            "  dashboard: {tokenFile: \" \"}\n",
            "`dashboard.tokenFile` is empty",
            6,
        ),
        ("  dashboard: {port: 80}\n", "unknown field `port`", 6),
    ] {
        let error = load_str(&gateway(extra), file()).unwrap_err().to_string();
        assert!(error.contains(says), "{extra}: {error}");
        assert!(
            error.contains(&format!("gateway.yaml:{line}")),
            "{extra}: located at line {line}: {error}"
        );
    }
}
