//! Replays through the engine, checked against an independent computation: each response read
//! with hickory-proto, its CNAME chain followed by the oracle's own code, the selectors'
//! labels and the distinct label sets counted by hand.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{PATTERNS, all_fixtures, expected, fixture, oracle_trace, policy};
use fqdnd_replay::synth::{SynthShape, s3_like_trace};
use fqdnd_replay::{IdentityMode, Limits, Options, Report, SettingsOverrides, replay};

fn options(traces: Vec<PathBuf>, modes: Vec<IdentityMode>, min_ttl: Option<u32>) -> Options {
    Options {
        traces,
        policy: vec![policy()],
        endpoints: vec![],
        ports: vec![53],
        modes,
        settings: SettingsOverrides {
            min_ttl,
            ..SettingsOverrides::default()
        },
        limits: Limits::default(),
        csv_timeseries: None,
        progress_interval: None,
    }
}

fn run(path: &Path, min_ttl: Option<u32>) -> Report {
    let opts = options(
        vec![path.to_path_buf()],
        vec![IdentityMode::Selector, IdentityMode::PerIp],
        min_ttl,
    );
    replay(&opts, &mut |_| {}).unwrap().0
}

fn check_against_oracle(path: &Path, min_ttl: u32) -> usize {
    let (seen, end) = oracle_trace(path, &[53]);
    let want = expected(&seen, end, min_ttl, &PATTERNS);
    let report = run(path, Some(min_ttl));
    let sel = &report.run;
    let per_ip = report.compare.as_ref().unwrap();
    let what = format!("{} (min TTL {min_ttl})", path.display());
    assert_eq!(
        sel.responses_learned as usize,
        seen.len() + sel.invalid_names as usize,
        "{what}"
    );
    assert_eq!(sel.cache_names_end, want.cache_names, "{what}: names");
    assert_eq!(sel.cache_ips_end, want.cache_ips, "{what}: cached IPs");
    assert_eq!(sel.selected_ips, want.selected_ips, "{what}: selected IPs");
    assert_eq!(
        sel.label_sets_live_end, want.label_sets,
        "{what}: label sets"
    );
    assert_eq!(
        sel.identities_live_end, want.identities_selector,
        "{what}: identities"
    );
    assert_eq!(
        per_ip.selected_ips, want.selected_ips,
        "{what}: per-ip selected"
    );
    assert_eq!(
        per_ip.label_sets_live_end, want.label_sets,
        "{what}: per-ip label sets"
    );
    assert_eq!(
        per_ip.identities_live_end, want.identities_per_ip,
        "{what}: per-ip identities"
    );
    // One identity per selected IP, and none pre-allocated (Cilium ≤ 1.15 had no selector
    // identities).
    assert_eq!(per_ip.fqdn_identities_live_end, want.selected_ips, "{what}");
    want.selected_ips
}

#[test]
fn identities_and_label_sets_match_the_oracle_on_every_fixture_without_expiry() {
    let mut selected = 0;
    for path in all_fixtures() {
        selected += check_against_oracle(&path, 100_000_000);
    }
    // The fixtures really exercise it.
    assert!(selected > 40, "{selected}");
}

#[test]
fn identities_and_label_sets_match_the_oracle_with_expiry() {
    for path in all_fixtures() {
        check_against_oracle(&path, 0);
    }
    // The 23-hour pypacker capture: its first answer has expired by the end.
    let path = fixture("pypi-pypacker/dns.pcap");
    let (seen, end) = oracle_trace(&path, &[53]);
    assert!(
        expected(&seen, end, 0, &PATTERNS).cache_ips
            < expected(&seen, end, 100_000_000, &PATTERNS).cache_ips
    );
}

#[test]
fn s3_like_rotation_with_ttl_expiry_matches_the_oracle() {
    let dir = std::env::temp_dir().join(format!("fqdnd-replay-s3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s3.pcap");
    let shape = SynthShape {
        responses: 20_000,
        rate: 200,
        buckets: 40,
        hosts: 300,
        ..SynthShape::default()
    };
    s3_like_trace(std::fs::File::create(&path).unwrap(), &shape).unwrap();
    // 100 s of capture, TTL 5 for S3: many GC passes release and relearn.
    let report = check_against_oracle(&path, 0);
    assert!(report > 0);
    let r = run(&path, Some(0));
    assert!(r.run.gc_evictions > 1000, "{}", r.run.gc_evictions);
    assert!(r.run.gc_runs >= 2);
    // Rotation costs identities only in per-IP mode.
    assert!(
        r.compare.as_ref().unwrap().identities_allocated_total
            > 10 * r.run.identities_allocated_total
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tcp_and_fragmented_answers_reach_the_engine() {
    let r = run(&fixture("debsrc-dnscap/dnso1tcp.pcap"), None);
    assert_eq!(r.input.responses, 41);
    assert_eq!(r.input.responses_tcp, 41);
    // tshark: 24 of the 41 carry an A record (the others answer PTR queries).
    assert_eq!(r.input.responses_with_addresses, 24);
    assert_eq!(r.run.responses_learned, 24);
    let r = run(&fixture("debsrc-dnscap/frags.pcap"), None);
    assert_eq!(r.input.responses, 41);
    assert!(r.extract.ip_datagrams_reassembled > 0);
    assert!(r.run.selected_ips > 0);
}

#[test]
fn every_fixture_replays_without_error() {
    for path in all_fixtures() {
        let opts = options(vec![path.clone()], vec![IdentityMode::Selector], None);
        let (report, _) =
            replay(&opts, &mut |_| {}).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(report.run.engine_errors, 0, "{}", path.display());
        assert!(report.input.packets > 0, "{}", path.display());
    }
    // Several captures as one.
    let opts = options(all_fixtures(), vec![IdentityMode::Selector], None);
    let (report, _) = replay(&opts, &mut |_| {}).unwrap();
    assert!(report.input.responses > 400);
    // truncated_dns_2.pcap's last record is cut off: reported, not fatal.
    assert_eq!(
        report.input.capture_errors.len(),
        1,
        "{:?}",
        report.input.capture_errors
    );
}

#[test]
fn clients_outside_every_endpoint_are_counted_not_learned() {
    let dir = std::env::temp_dir().join(format!("fqdnd-replay-ep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let endpoints = dir.join("endpoints.yaml");
    // dns.pcap's client is 172.17.0.10; declare only another one.
    std::fs::write(
        &endpoints,
        "apiVersion: fqdnd.io/v1\nkind: ClientGroup\nmetadata:\n  name: other\nspec:\n  id: 7\n  addresses: [192.0.2.0/24]\n  labels:\n    app: client\n",
    )
    .unwrap();
    let mut opts = options(
        vec![fixture("debsrc-dnscap/dns.pcap")],
        vec![IdentityMode::Selector],
        None,
    );
    opts.endpoints = vec![endpoints.clone()];
    let (r, _) = replay(&opts, &mut |_| {}).unwrap();
    assert_eq!(r.run.responses_learned, 0);
    assert_eq!(
        r.run.responses_without_endpoint,
        r.input.responses_with_addresses
    );
    assert_eq!(r.run.selected_ips, 0);
    // The same client declared: learned, and the rule selects it by label.
    std::fs::write(
        &endpoints,
        "apiVersion: fqdnd.io/v1\nkind: ClientGroup\nmetadata:\n  name: lab\nspec:\n  id: 7\n  addresses: [172.17.0.0/16]\n  labels:\n    app: client\n",
    )
    .unwrap();
    let (r, _) = replay(&opts, &mut |_| {}).unwrap();
    assert_eq!(r.run.responses_learned, r.input.responses_with_addresses);
    assert!(r.run.selected_ips > 0);
    assert!(r.run.policy_upserts > 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The keys `docs/replay.md` documents for `--json`.
fn documented_keys(section: &str) -> Vec<String> {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/replay.md")).unwrap();
    let start = doc
        .find(section)
        .unwrap_or_else(|| panic!("docs/replay.md has no {section:?}"));
    let rest = &doc[start..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    rest[..end]
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn json_has_every_documented_key_and_nothing_undocumented() {
    let r = run(&fixture("debsrc-dnscap/dns.pcap"), None);
    let json: serde_json::Value =
        serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    let obj = json.as_object().unwrap();
    let documented = documented_keys("## JSON output");
    assert!(documented.len() > 40, "{documented:?}");
    for key in &documented {
        let found = match key.split_once('.') {
            Some((outer, inner)) => obj.get(outer).and_then(|o| o.get(inner)).is_some(),
            None => obj.contains_key(key),
        };
        assert!(found, "documented key {key} missing from the JSON");
    }
    for key in obj.keys() {
        assert!(documented.contains(key), "JSON key {key} is not documented");
    }
    for key in obj["compare"].as_object().unwrap().keys() {
        assert!(
            documented.contains(key),
            "compare key {key} is not documented"
        );
    }
    for key in obj["extract"].as_object().unwrap().keys() {
        assert!(
            documented.contains(&format!("extract.{key}")),
            "extract.{key} is not documented"
        );
    }
    for key in [
        "responses",
        "responses_skipped",
        "names",
        "ips",
        "selected_ips",
        "identities_allocated_total",
        "identities_peak",
        "identities_live_end",
        "label_sets_live_end",
        "ipcache_upserts",
        "ipcache_deletes",
        "selector_updates",
        "breaker_trips",
        "gc_evictions",
        "processing_ns_p50",
        "processing_ns_p99",
    ] {
        assert!(obj.contains_key(key), "{key}");
    }
}

#[test]
fn compare_shows_both_modes_and_the_time_series_and_plot_are_written() {
    let dir = std::env::temp_dir().join(format!("fqdnd-replay-ts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("ts.csv");
    let mut opts = options(
        vec![fixture("debsrc-dnscap/dns.pcap")],
        vec![IdentityMode::Selector, IdentityMode::PerIp],
        None,
    );
    opts.csv_timeseries = Some(csv.clone());
    let (report, series) = replay(&opts, &mut |_| {}).unwrap();
    let text = fqdnd_replay::report::summary(&report);
    assert!(text.starts_with("Statistics:"));
    let header = text.lines().find(|l| l.contains("Identity mode:")).unwrap();
    assert!(
        header.contains("selector") && header.contains("per-ip"),
        "{header}"
    );
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = csv_text.lines();
    assert_eq!(lines.next().unwrap(), fqdnd_replay::timeseries::CSV_HEADER);
    let rows: Vec<&str> = lines.collect();
    assert!(
        rows.iter().any(|r| r.contains(",selector,"))
            && rows.iter().any(|r| r.contains(",per-ip,"))
    );
    // The last row of each mode holds the final identity count.
    let last_sel = rows
        .iter()
        .rev()
        .find(|r| r.contains(",selector,"))
        .unwrap();
    let ids: usize = last_sel.split(',').nth(3).unwrap().parse().unwrap();
    assert_eq!(ids, report.run.identities_live_end);
    assert_eq!(series.len(), 2);
    let svg = fqdnd_replay::plot::svg("dns.pcap", &series);
    assert_eq!(svg.matches("<path ").count(), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn breaker_limits_from_the_command_line_apply() {
    let mut opts = options(
        vec![fixture("debian-pathspider/dns_valid_response.pcap")],
        vec![IdentityMode::PerIp],
        // Its answer's TTL is 0 (one record has TTL 0): keep it alive to the end.
        Some(3600),
    );
    opts.settings.max_fqdn_identities = Some(1);
    let (r, _) = replay(&opts, &mut |_| {}).unwrap();
    assert!(r.run.breaker_trips_fqdn_identities > 0);
    assert!(r.run.breaker_trips > 0);
    assert_eq!(
        r.run.selected_ips, 1,
        "fail closed: only the first IP got an identity"
    );
    opts.traces = vec![fixture("debsrc-dnscap/dns.pcap")];
    opts.settings.gc_interval = Some(Duration::from_secs(5));
    let (r, _) = replay(&opts, &mut |_| {}).unwrap();
    // Passes due while no message arrives are folded into one (see `EngineRun::advance`).
    assert!(r.run.gc_runs >= 5, "{}", r.run.gc_runs);
}
