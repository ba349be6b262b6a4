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
    // A capture that is not there: its name and the cause, once.
    let out = fqdnd(&["replay", "/nonexistent.pcap", "--policy", &path(POLICY)]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr).trim_end(),
        "fqdnd: /nonexistent.pcap: No such file or directory (os error 2)"
    );
    let out = fqdnd(&[
        "replay",
        &path("replay/tests/fixtures/debsrc-dnscap/dns.pcap"),
        "--policy",
        &path(POLICY),
        "--gc-interval",
        "200ms",
    ]);
    assert!(!out.status.success());
    // A capture cut off in its last record: used up to there, with a warning (and, as its
    // one frame before the damage is no DNS message, exit 3: nothing was replayed).
    let out = fqdnd(&[
        "replay",
        &path("replay/tests/fixtures/debian-python3-dpkt/truncated_dns_2.pcap"),
        "--policy",
        &path(POLICY),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("Statistics:"));
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

/// A capture with no DNS response — a header-only pcap, one damaged at its first record, one
/// whose DNS is on another port — judges nothing: the preview and the replay say so and exit 3,
/// never 0 with "endpoints that change: 0" (issue 36, item 11). So does a preview none of
/// whose responses is to a client in `--endpoints`.
#[test]
fn a_capture_without_responses_judges_nothing_and_exits_3() {
    let dir = TestDir::new("cli-replay-nothing");
    // pcap, microseconds, link type RAW (101).
    let mut header = Vec::new();
    for field in [
        0xa1b2_c3d4_u32.to_le_bytes().as_slice(),
        &2u16.to_le_bytes(),
        &4u16.to_le_bytes(),
    ] {
        header.extend_from_slice(field);
    }
    for field in [0u32, 0, 65_535, 101] {
        header.extend_from_slice(&field.to_le_bytes());
    }
    let empty = dir.write("empty.pcap", &header);
    // A record header promising 100 bytes, 10 of which follow.
    let mut damaged = header.clone();
    for field in [1u32, 0, 100, 100] {
        damaged.extend_from_slice(&field.to_le_bytes());
    }
    damaged.extend_from_slice(&[0x45; 10]);
    let damaged = dir.write("damaged.pcap", &damaged);
    let traces = path("replay/tests/fixtures/debsrc-dnscap/dns.pcap");
    let policy = path(POLICY);
    let preview = |trace: &str, extra: &[&str]| {
        let mut args = vec!["replay", trace, "--policy", &policy, "--baseline", &policy];
        args.extend_from_slice(extra);
        fqdnd(&args)
    };
    let expect = |out: &std::process::Output, what: &str, why: &str| {
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(3), "{stdout}{stderr}");
        let said = format!("fqdnd: warning: nothing was {what}: {why}");
        assert_eq!(stderr.matches(&said).count(), 1, "{stderr}");
        stdout
    };
    let none_on_53 = "the captures hold no DNS response on port 53";
    for trace in [empty.to_str().unwrap(), damaged.to_str().unwrap()] {
        let stdout = expect(&preview(trace, &[]), "judged", none_on_53);
        assert!(stdout.contains("nothing was judged"), "{stdout}");
        // --json: the report is whole on stdout, the exit code the same.
        let stdout = expect(&preview(trace, &["--json"]), "judged", none_on_53);
        assert_eq!(json_of_text(&stdout)["responses"], 0);
        let plain = fqdnd(&["replay", trace, "--policy", &policy, "--progress", "0"]);
        expect(&plain, "replayed", none_on_53);
    }
    let out = preview(empty.to_str().unwrap(), &[]);
    assert!(!text(&out.stderr).contains("damaged"));
    let out = preview(damaged.to_str().unwrap(), &[]);
    assert!(
        text(&out.stderr).contains("cut off before its first packet"),
        "{}",
        text(&out.stderr)
    );
    // DNS elsewhere: the port is named.
    expect(
        &preview(&traces, &["--port", "5353"]),
        "judged",
        "the captures hold no DNS response on port 5353",
    );
    // Responses, but to no declared client.
    let endpoints = dir.write(
        "endpoints.yaml",
        "apiVersion: fqdnd.io/v1\nkind: ClientGroup\nmetadata: {name: nobody}\nspec: {id: 9, addresses: [\"198.51.100.0/24\"]}\n",
    );
    let out = preview(&traces, &["--endpoints", endpoints.to_str().unwrap()]);
    expect(
        &out,
        "judged",
        "none of the 41 DNS responses is to a client in an endpoint",
    );
    // Live: no query to send.
    let live = fqdnd(&["replay", empty.to_str().unwrap(), "--live", "127.0.0.1:9"]);
    expect(&live, "sent", "the captures hold no DNS query on port 53");
    // Something judged: exit 0.
    assert_eq!(preview(&traces, &[]).status.code(), Some(0));
}

fn json_of_text(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}
