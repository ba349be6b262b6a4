//! Policy preview against an oracle: the names and addresses the report names are exactly the
//! ones the captures' answers (decoded with hickory-proto) say a policy change affects.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use fqdnd_replay::{Limits, PreviewOptions, SettingsOverrides, preview};
use hickory_proto::op::Message;

fn traces() -> Vec<PathBuf> {
    vec![
        common::fixture("debsrc-dnscap/dnso1tcp.pcap"),
        common::fixture("debian-pathspider/dns_valid_response.pcap"),
    ]
}

/// A policy for every client: DNS to anything on port 53 for the names `dns` allows, HTTPS to
/// the names `fqdns` selects.
fn policy(dir: &Path, file: &str, dns: &str, fqdns: &[&str]) -> PathBuf {
    let mut text = format!(
        "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {{name: {file}}}\nspec:\n  \
         endpointSelector: {{}}\n  egress:\n  - toPorts: [{{ports: [{{port: \"53\", protocol: ANY}}], \
         rules: {{dns: [{dns}]}}}}]\n"
    );
    if !fqdns.is_empty() {
        let selectors: Vec<String> = fqdns.iter().map(|s| format!("{{{s}}}")).collect();
        text.push_str(&format!(
            "  - toFQDNs: [{}]\n    toPorts: [{{ports: [{{port: \"443\", protocol: TCP}}]}}]\n",
            selectors.join(", ")
        ));
    }
    let path = dir.join(format!("{file}.yaml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn options(policy: PathBuf, baseline: PathBuf) -> PreviewOptions {
    PreviewOptions {
        traces: traces(),
        policy: vec![policy],
        baseline: vec![baseline],
        endpoints: Vec::new(),
        ports: vec![53],
        settings: SettingsOverrides::default(),
        limits: Limits::default(),
    }
}

/// The question of every response in the captures, and the addresses answered for names
/// matching `suffix`.
fn oracle(suffix: &str) -> (BTreeSet<String>, BTreeSet<IpAddr>) {
    let mut names = BTreeSet::new();
    let mut addrs = BTreeSet::new();
    for trace in traces() {
        let bytes = std::fs::read(trace).unwrap();
        let _ = fqdnd_replay::extract_bytes(&bytes, &[53], &mut |p| {
            let Ok(msg) = Message::from_vec(p.bytes) else {
                return;
            };
            if msg.metadata.message_type != hickory_proto::op::MessageType::Response {
                return;
            }
            let name = msg.queries[0].name.to_ascii().to_ascii_lowercase();
            if let Some((n, a, _)) = common::oracle_answer(p.bytes)
                && n.ends_with(suffix)
            {
                addrs.extend(a);
            }
            names.insert(name);
        });
    }
    (names, addrs)
}

#[test]
fn removing_a_to_fqdns_rule_takes_exactly_its_names_addresses_away() {
    let dir = tempfile::tempdir().unwrap();
    let any = "{matchPattern: \"*\"}";
    let before = policy(
        dir.path(),
        "before",
        any,
        &[
            "matchName: google.com",
            "matchPattern: \"*.soundcloud.com\"",
        ],
    );
    let after = policy(dir.path(), "after", any, &["matchName: google.com"]);
    let report = preview(&options(after, before)).unwrap();
    let (_, soundcloud) = oracle(".soundcloud.com.");
    assert_eq!(
        soundcloud.len(),
        8,
        "the fixtures' eight soundcloud addresses"
    );
    let [changes] = report.endpoints.as_slice() else {
        panic!("one endpoint changes: {:?}", report.endpoints);
    };
    let lost: BTreeSet<IpAddr> = changes.ips_losing_access.iter().map(|a| a.ip).collect();
    assert_eq!(lost, soundcloud);
    // Only HTTPS is lost: DNS (the L4-only port 53 rule) reaches them on both sides.
    assert!(
        changes
            .ips_losing_access
            .iter()
            .all(|a| a.ports == ["TCP/443"])
    );
    assert!(changes.ips_gaining_access.is_empty());
    // The DNS rules are the same: no name changes verdict.
    assert!(changes.names_now_refused.is_empty() && changes.names_now_allowed.is_empty());
    assert_eq!(report.baseline.queries_refused, 0);
    assert_eq!(report.policy.queries_refused, 0);
    assert_eq!(report.responses, report.policy.queries_allowed);
    assert!(
        report
            .summary()
            .contains("addresses losing access: 8, gaining access: 0")
    );
}

#[test]
fn narrowing_the_dns_rules_refuses_exactly_the_other_names_and_their_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let everything = ["matchPattern: \"*\""];
    let before = policy(dir.path(), "open", "{matchPattern: \"*\"}", &everything);
    let after = policy(dir.path(), "narrow", "{matchName: google.com}", &everything);
    let report = preview(&options(after.clone(), before.clone())).unwrap();
    let (names, _) = oracle(".");
    let (_, google) = oracle("google.com.");
    let (_, all) = oracle(".");
    let refused: BTreeSet<String> = names
        .iter()
        .filter(|n| *n != "google.com.")
        .cloned()
        .collect();
    assert!(names.contains("google.com.") && refused.len() >= 2);
    let [changes] = report.endpoints.as_slice() else {
        panic!("one endpoint changes: {:?}", report.endpoints);
    };
    assert_eq!(
        changes
            .names_now_refused
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>(),
        refused
    );
    assert!(changes.names_now_allowed.is_empty() && changes.names_mixed.is_empty());
    let lost: BTreeSet<IpAddr> = changes.ips_losing_access.iter().map(|a| a.ip).collect();
    assert_eq!(lost, all.difference(&google).copied().collect());
    // DNS itself (the L4-only rule) reaches them on both sides: only HTTPS is lost.
    assert!(
        changes
            .ips_losing_access
            .iter()
            .all(|a| a.ports == ["TCP/443"])
    );
    // The other way round, everything comes back.
    let back = preview(&options(before, after)).unwrap();
    assert_eq!(
        back.endpoints[0]
            .names_now_allowed
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>(),
        refused
    );
    assert_eq!(back.endpoints[0].ips_gaining_access.len(), lost.len());
}

#[test]
fn the_same_policy_on_both_sides_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let p = policy(
        dir.path(),
        "same",
        "{matchPattern: \"*\"}",
        &["matchPattern: \"*.com\""],
    );
    let report = preview(&options(p.clone(), p)).unwrap();
    assert!(report.endpoints.is_empty());
    assert_eq!(report.baseline, report.policy);
}

/// Issue 18: an `egressDeny` of one learned address takes exactly that address away, though
/// `toFQDNs` still selects it (a deny wins); the other addresses keep their access.
#[test]
fn a_deny_of_one_address_takes_exactly_it_away() {
    let dir = tempfile::tempdir().unwrap();
    let any = "{matchPattern: \"*\"}";
    let before = policy(dir.path(), "before", any, &["matchPattern: \"*\""]);
    let (_, all) = oracle(".");
    let denied = *all.iter().next().unwrap();
    let prefix = if denied.is_ipv4() { 32 } else { 128 };
    let text = std::fs::read_to_string(&before).unwrap()
        + &format!("  egressDeny:\n  - toCIDR: [\"{denied}/{prefix}\"]\n");
    let after = dir.path().join("after.yaml");
    std::fs::write(&after, text).unwrap();
    let report = preview(&options(after, before)).unwrap();
    let [changes] = report.endpoints.as_slice() else {
        panic!("one endpoint changes: {:?}", report.endpoints);
    };
    let lost: BTreeSet<IpAddr> = changes.ips_losing_access.iter().map(|a| a.ip).collect();
    assert_eq!(lost, BTreeSet::from([denied]), "{changes:?}");
    assert!(changes.ips_gaining_access.is_empty());
}
