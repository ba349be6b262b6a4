//! `kind: Gateway`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use fqdnd_config::{HoldFallback, TruncatedAction, UpstreamTimeoutAction};
use fqdnd_config::{ZoneSource, load_str};

fn gateway(spec: &str) -> String {
    format!("apiVersion: fqdnd.io/v1\nkind: Gateway\nspec:\n{spec}")
}

fn file() -> &'static Path {
    Path::new("/etc/fqdnd/gateway.yaml")
}

#[test]
fn every_field_is_read_and_paths_are_relative_to_the_file() {
    let text = gateway(
        "  listen: [\"127.0.0.1:5353\", \"[::1]:5353\"]\n  upstreams: [\"192.0.2.53:53\"]\n  staticZones:\n  - origin: Example.TEST.\n    file: zones/example.zone\n  - origin: inline.test\n    records: |\n      @ 60 IN A 192.0.2.1\n  lists:\n    deny: [lists/ads.txt]\n    allowNames: [\"ok.example\"]\n  adminSocket: admin.sock\n  metrics: 127.0.0.1:9967\n  queryLog: /var/log/q.jsonl\n  upstreamTimeout: 2s\n  onUpstreamTimeout: noReply\n  onHoldTimeout: servfail\n  onTruncated: passThrough\n  rateLimit: {qps: 50, action: refused}\n",
    );
    let config = load_str(&text, file()).unwrap();
    let g = config.gateway.unwrap();
    assert_eq!(g.listen.len(), 2);
    assert_eq!(g.upstreams, vec!["192.0.2.53:53".parse().unwrap()]);
    assert_eq!(g.static_zones[0].origin, "example.test.");
    assert_eq!(
        g.static_zones[0].source,
        ZoneSource::File(PathBuf::from("/etc/fqdnd/zones/example.zone"))
    );
    assert!(matches!(&g.static_zones[1].source, ZoneSource::Inline(t) if t.contains("192.0.2.1")));
    assert_eq!(
        g.daemon.lists.deny,
        vec![PathBuf::from("/etc/fqdnd/lists/ads.txt")]
    );
    assert_eq!(g.daemon.lists.allow_names, vec!["ok.example".to_owned()]);
    assert_eq!(
        g.daemon.admin_socket,
        PathBuf::from("/etc/fqdnd/admin.sock")
    );
    assert_eq!(g.daemon.metrics, Some("127.0.0.1:9967".parse().unwrap()));
    assert_eq!(g.daemon.query_log, Some(PathBuf::from("/var/log/q.jsonl")));
    assert_eq!(g.daemon.upstream_timeout, Duration::from_secs(2));
    assert_eq!(g.daemon.on_upstream_timeout, UpstreamTimeoutAction::NoReply);
    assert_eq!(g.daemon.on_hold_timeout, HoldFallback::ServFail);
    assert_eq!(g.daemon.on_truncated, TruncatedAction::PassThrough);
    let rate = g.daemon.rate_limit.unwrap();
    assert_eq!(
        (rate.qps, rate.burst, rate.action),
        (50, 50, fqdnd_config::RateLimitAction::Refused)
    );
}

#[test]
fn no_gateway_document_means_none() {
    let config = load_str(
        "apiVersion: fqdnd.io/v1\nkind: Settings\nspec: {}\n",
        file(),
    )
    .unwrap();
    assert!(config.gateway.is_none());
}

#[test]
fn mistakes_are_located_errors() {
    let bad = gateway(
        "  listen: [\"127.0.0.1\"]\n  upstreams: [\"192.0.2.53:53\"]\n  onHoldTimeout: drop\n",
    );
    let text = load_str(&bad, file()).unwrap_err().to_string();
    assert!(text.contains("gateway.yaml:4:"), "{text}");
    assert!(text.contains("not an address with a port"), "{text}");
    assert!(
        text.contains("gateway.yaml:6:") && text.contains("`release` or `servfail`"),
        "{text}"
    );

    let no_upstream = gateway("  listen: [\"127.0.0.1:53\"]\n");
    let text = load_str(&no_upstream, file()).unwrap_err().to_string();
    assert!(
        text.contains("needs `upstreams`, `zoneUpstreams` or `staticZones`"),
        "{text}"
    );

    let both = gateway(
        "  listen: [\"127.0.0.1:53\"]\n  staticZones:\n  - origin: a.test\n    file: a\n    records: x\n",
    );
    let text = load_str(&both, file()).unwrap_err().to_string();
    assert!(
        text.contains("exactly one of `file` and `records`"),
        "{text}"
    );

    let typo = gateway("  listen: [\"127.0.0.1:53\"]\n  upstream: [\"192.0.2.53:53\"]\n");
    let text = load_str(&typo, file()).unwrap_err().to_string();
    assert!(text.contains("unknown field `upstream`"), "{text}");

    let twice = format!(
        "{}---\n{}",
        gateway("  listen: [\"127.0.0.1:53\"]\n  upstreams: [\"192.0.2.53:53\"]\n"),
        gateway("  listen: [\"127.0.0.1:54\"]\n  upstreams: [\"192.0.2.53:53\"]\n")
    );
    let text = load_str(&twice, file()).unwrap_err().to_string();
    assert!(text.contains("at most one is allowed"), "{text}");
}

#[test]
fn zone_upstreams_are_read_canonical_and_checked() {
    let text = gateway(
        "  listen: [\"127.0.0.1:5353\"]\n  zoneUpstreams:\n  - zone: Corp.Example.\n    upstreams: [\"10.0.0.53:53\", \"10.0.1.53:53\"]\n  - zone: .\n    upstreams: [\"192.0.2.53:53\"]\n",
    );
    let g = load_str(&text, file()).unwrap().gateway.unwrap();
    assert!(g.upstreams.is_empty(), "zone upstreams alone are enough");
    assert_eq!(g.zone_upstreams[0].zone, "corp.example.");
    assert_eq!(g.zone_upstreams[0].upstreams.len(), 2);
    assert_eq!(g.zone_upstreams[1].zone, ".");

    for (spec, says) in [
        (
            "  zoneUpstreams:\n  - zone: a..b\n    upstreams: [\"10.0.0.53:53\"]\n",
            "is not a zone name",
        ),
        (
            "  zoneUpstreams:\n  - zone: corp.example\n    upstreams: []\n",
            "needs at least one upstream",
        ),
        (
            "  zoneUpstreams:\n  - zone: corp.example\n    upstreams: [\"10.0.0.53:53\"]\n  - zone: CORP.example.\n    upstreams: [\"10.0.0.54:53\"]\n",
            "listed twice",
        ),
        (
            "  zoneUpstreams:\n  - zone: example.test\n    upstreams: [\"10.0.0.53:53\"]\n  staticZones:\n  - origin: example.test\n    records: |\n      @ 60 IN A 192.0.2.1\n",
            "both a static zone and in `zoneUpstreams`",
        ),
        (
            "  zoneUpstreams:\n  - zone: corp.example\n    upstreams: [\"10.0.0.53\"]\n",
            "zoneUpstreams[].upstreams",
        ),
    ] {
        let text = gateway(&format!("  listen: [\"127.0.0.1:5353\"]\n{spec}"));
        let errors = load_str(&text, file()).unwrap_err().to_string();
        assert!(errors.contains(says), "{spec}: {errors}");
        assert!(errors.contains("gateway.yaml:"), "located: {errors}");
    }
    let node = "apiVersion: fqdnd.io/v1\nkind: Node\nspec:\n  zoneUpstreams:\n  - zone: corp.example\n    upstreams: [\"10.0.0.53:53\"]\n";
    let errors = load_str(node, file()).unwrap_err().to_string();
    assert!(errors.contains("`zoneUpstreams`"), "{errors}");
}

#[test]
fn encrypted_upstreams_and_their_trust_store_are_read_and_located() {
    let text = gateway(
        "  listen: [\"127.0.0.1:5353\"]\n  upstreams: [\"tls://192.0.2.53#dns.example\", \"https://192.0.2.54:8443/q\", \"192.0.2.55:53\"]\n  upstreamCA: certs/ca.pem\n  zoneUpstreams:\n  - zone: corp.example\n    upstreams: [\"tls://[2001:db8::53]:8853\"]\n",
    );
    let g = load_str(&text, file()).unwrap().gateway.unwrap();
    let shown: Vec<String> = g.upstreams.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "tls://192.0.2.53:853#dns.example",
            "https://192.0.2.54:8443/q",
            "192.0.2.55:53"
        ]
    );
    assert_eq!(
        g.zone_upstreams[0].upstreams[0].to_string(),
        "tls://[2001:db8::53]:8853"
    );
    let ca = g.upstream_ca.unwrap();
    assert!(ca.ends_with("certs/ca.pem") && ca.is_absolute(), "{ca:?}");

    let bad = gateway(
        "  listen: [\"127.0.0.1:5353\"]\n  upstreams:\n  - tls://dns.example:853\n  zoneUpstreams:\n  - zone: corp.example\n    upstreams: [\"https://192.0.2.1/q#not a name\"]\n",
    );
    let errors = load_str(&bad, file()).unwrap_err().to_string();
    assert!(errors.contains("must be an IP address"), "{errors}");
    assert!(errors.contains("gateway.yaml:6:5"), "located: {errors}");
    assert!(errors.contains("is not a server name"), "{errors}");

    let node = "apiVersion: fqdnd.io/v1\nkind: Node\nspec:\n  upstreamCA: ca.pem\n";
    let errors = load_str(node, file()).unwrap_err().to_string();
    assert!(errors.contains("`upstreamCA`"), "{errors}");
}
