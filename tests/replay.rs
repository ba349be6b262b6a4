//! `fqdnd replay` as a user runs it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed step should panic"
)]

mod common;

use common::{TestDir, assert_each_cause_once, fqdnd, json_of, repo_path as path, stdout_of, text};

const POLICY: &str = "replay/tests/policies/fixtures.yaml";

#[test]
fn json_report_parses_and_compare_holds_both_modes() {
    let out = fqdnd(&[
        "replay",
        &path("replay/tests/fixtures/debsrc-dnscap/dnso1tcp.pcap"),
        &path("replay/tests/fixtures/debian-pathspider/dns_valid_response.pcap"),
        "--policy",
        &path(POLICY),
        "--compare",
        "--json",
        "--min-ttl",
        "86400",
        "--progress",
        "0",
    ]);
    let v = json_of(&out);
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["responses"], 42);
    assert_eq!(v["identity_mode"], "selector");
    assert_eq!(v["compare"]["identity_mode"], "per-ip");
    // google.com's IP and the eight soundcloud IPs are selected; per IP, each is an identity.
    assert_eq!(v["selected_ips"], 9);
    assert_eq!(v["compare"]["selected_ips"], 9);
    // Cilium ≤ 1.15 had no FQDN selector identities: per-ip mode pre-allocates none, so its
    // FQDN identities are exactly the selected IPs (it used to add two per selector).
    assert_eq!(v["compare"]["fqdn_identities_live_end"], 9);
    assert_eq!(v["compare"]["identities_live_end"], 9);
    assert!(v["label_sets_live_end"].as_u64().unwrap() <= 2);
    for key in [
        "processing_ns_p50",
        "processing_ns_p99",
        "breaker_trips",
        "gc_evictions",
    ] {
        assert!(v[key].is_number(), "{key}");
    }
}

#[test]
fn summary_plot_and_time_series() {
    let dir = TestDir::new("cli-replay");
    let svg = dir.join("ids.svg");
    let csv = dir.join("ts.csv");
    let out = fqdnd(&[
        "replay",
        &path("replay/tests/fixtures/debsrc-dnscap/dns.pcap"),
        "--policy",
        &path(POLICY),
        "--identity-mode",
        "per-ip",
        "--compare",
        "--plot",
        svg.to_str().unwrap(),
        "--csv-timeseries",
        csv.to_str().unwrap(),
        "--gc-interval",
        "10s",
    ]);
    let stdout = stdout_of(&out);
    assert!(stdout.starts_with("Statistics:"), "{stdout}");
    assert!(stdout.contains("Responses:             41"), "{stdout}");
    let modes = stdout
        .lines()
        .find(|l| l.contains("Identity mode:"))
        .unwrap();
    assert!(modes.find("per-ip") < modes.find("selector"), "{modes}");
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.matches("<path ").count() == 2);
    assert!(
        std::fs::read_to_string(&csv)
            .unwrap()
            .starts_with("second,mode,")
    );
}

#[test]
fn bad_input_is_an_error_with_the_file_named() {
    let out = fqdnd(&["replay", &path(POLICY), "--policy", &path(POLICY)]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("fixtures.yaml"),
        "{}",
        text(&out.stderr)
    );
    let out = fqdnd(&[
        "replay",
        &path("replay/tests/fixtures/debsrc-dnscap/dns.pcap"),
    ]);
    assert!(!out.status.success(), "--policy is required");
    let out = fqdnd(&[
        "replay",
        &path("replay/tests/fixtures/debsrc-dnscap/dns.pcap"),
        "--policy",
        &path(POLICY),
        "--gc-interval",
        "200ms",
    ]);
    assert!(!out.status.success());
    // A capture cut off in its last record: used up to there, with a warning.
    let out = fqdnd(&[
        "replay",
        &path("replay/tests/fixtures/debian-python3-dpkt/truncated_dns_2.pcap"),
        "--policy",
        &path(POLICY),
    ]);
    stdout_of(&out);
    assert!(
        text(&out.stderr).contains("cut off"),
        "{}",
        text(&out.stderr)
    );
}

/// Errors exit 1 with one line that prints each cause once (a missing capture printed its
/// OS error twice: "No such file or directory (os error 2): No such file or directory (os
/// error 2)"); a usage error exits 2.
#[test]
fn a_missing_capture_or_policy_exits_1_naming_the_file_once() {
    for (trace, policy, file) in [
        (
            "/nonexistent/trace.pcap",
            path(POLICY),
            "/nonexistent/trace.pcap",
        ),
        (
            &*path("replay/tests/fixtures/debsrc-dnscap/dns.pcap"),
            "/nonexistent/policy.yaml".to_owned(),
            "/nonexistent/policy.yaml",
        ),
    ] {
        let out = fqdnd(&["replay", trace, "--policy", &policy]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&format!("{file}: No such file or directory")),
            "{stderr}"
        );
        assert_each_cause_once(&stderr);
    }
    let out = fqdnd(&["replay", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}
