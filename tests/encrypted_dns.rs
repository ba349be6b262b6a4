//! `fqdnd gateway` as an encrypted resolver, checked with real clients: Knot's `kdig +tls` and
//! `kdig +https` (POST and GET), and `dnsperf -m dot` / `-m doh`. A query over DoT or DoH meets
//! what a UDP query meets (the client group's DNS rules, with `toPorts` seeing 853 and 443),
//! its answer is learned, the query log and the metrics say which transport it came by, and a
//! reload reads the certificate again: an expired one is refused and the one in use stays, a
//! renewed one is presented from the next connection.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed step should panic"
)]

mod common;

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;

use common::tls::{Issued, TestCa};
use common::{
    Gateway, LAN_GROUP, PATIENCE, documents, fqdns_on_443, free_port, gateway_doc, lan_policy,
    poll_until, run, runnable, text,
};

const ZONE: &str = "$TTL 300
@ IN SOA ns.corp.test. admin.corp.test. 1 3600 600 86400 60
@ IN NS ns.corp.test.
www IN A 192.0.2.10
app IN A 192.0.2.11
";

/// Whether the real clients are installed (scripts/install-deps.sh installs them).
fn clients(test: &str) -> bool {
    let found = |tool: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    runnable(test, found("kdig") && found("dnsperf"), "kdig and dnsperf")
}

struct Running {
    gw: Gateway,
    ca: TestCa,
    dot: u16,
    doh: u16,
}

/// A gateway serving corp.test over UDP, DoT and DoH, whose policy allows `*.corp.test` on
/// the DNS ports in `ports`.
fn start(test: &str, ports: &[u16]) -> Running {
    let mut g = Gateway::setup(test);
    let ca = TestCa::new(g.dir());
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    ca.issue(g.dir(), "server", &["dns.test"], &[ip]);
    g.file("corp.zone", ZONE);
    let metrics = g.metrics_port();
    let (dot, doh) = (free_port(), free_port());
    let spec = format!(
        "  staticZones: [{{origin: corp.test, file: corp.zone}}]
  metrics: 127.0.0.1:{metrics}
  adminSocket: admin.sock
  queryLog: queries.jsonl
  tls:
    certificate: server.pem
    key: server.key
    dot: [\"127.0.0.1:{dot}\"]
    doh: [\"127.0.0.1:{doh}\"]
"
    );
    g.config(
        "gateway.yaml",
        &documents(&[&gateway_doc("127.0.0.1:0", &spec), LAN_GROUP]),
    );
    let ports: Vec<String> = ports
        .iter()
        .map(|p| format!("{{port: \"{p}\", protocol: TCP}}"))
        .collect();
    g.config(
        "policy.yaml",
        &lan_policy(&format!(
            "  - toPorts:
    - ports: [{{port: \"53\", protocol: ANY}}, {}]
      rules:
        dns: [{{matchPattern: \"*.corp.test\"}}]
{}",
            ports.join(", "),
            fqdns_on_443(&["matchPattern: \"*.corp.test\""])
        )),
    );
    g.socket_from_config();
    Running {
        gw: g.start(),
        ca,
        dot,
        doh,
    }
}

/// `kdig` over `how` (`+tls` or `+https…`) trusting `ca`; its output (panics if it fails).
fn kdig(ca: &Path, port: u16, how: &[&str], name: &str) -> String {
    let out = run(Command::new("kdig")
        .arg("@127.0.0.1")
        .args(["-p", &port.to_string()])
        .arg(format!("+tls-ca={}", ca.display()))
        .arg("+tls-hostname=dns.test")
        .args(how)
        .args(["+time=5", "+retry=0", name, "A"]));
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "kdig {how:?} {name}: {stdout}{}",
        text(&out.stderr)
    );
    stdout
}

#[test]
fn kdig_and_dnsperf_over_dot_and_doh_meet_the_policy_and_are_learned() {
    if !clients("encrypted-real-clients") {
        return;
    }
    let r = start("enc-clients", &[853, 443, 8853]);
    let dot = ["+tls"];
    let post = ["+https=/dns-query"];
    let get = ["+https=/dns-query", "+https-get"];
    for (port, how) in [(r.dot, &dot[..]), (r.doh, &post[..]), (r.doh, &get[..])] {
        let out = kdig(&r.ca.cert, port, how, "www.corp.test");
        assert!(out.contains("status: NOERROR"), "{how:?}: {out}");
        assert!(out.contains("192.0.2.10"), "{how:?}: {out}");
        let out = kdig(&r.ca.cert, port, how, "www.other.example");
        assert!(out.contains("status: REFUSED"), "{how:?}: {out}");
    }
    // A client that does not trust the CA does not get through.
    let out = run(Command::new("kdig")
        .args(["@127.0.0.1", "-p", &r.dot.to_string()])
        .args([
            "+tls-ca=/dev/null",
            "+tls-hostname=dns.test",
            "+time=3",
            "+retry=0",
        ])
        .arg("app.corp.test"));
    assert!(!text(&out.stdout).contains("192.0.2.11"));

    // Learned: the engine has what DoT and DoH answered.
    let cache = r.gw.admin(&["cache", "list"]);
    assert!(cache.to_string().contains("192.0.2.10"), "{cache}");

    // The query log and the metrics say which transport each query came by.
    let log = poll_until(PATIENCE, "the query log names dot and doh", || {
        let log = std::fs::read_to_string(r.gw.join("queries.jsonl")).ok()?;
        (log.contains("\"transport\":\"dot\"") && log.contains("\"transport\":\"doh\""))
            .then_some(log)
    });
    assert!(!log.contains("\"transport\":\"udp\""), "{log}");
    for transport in ["dot", "doh"] {
        r.gw.wait_metric(
            &format!("fqdnd_dns_queries_by_transport_total{{transport=\"{transport}\"}}"),
            "queries counted by transport",
            |v| v >= 2.0,
        );
    }

    // dnsperf's DoT and DoH modes, a bounded run each: every query answered NOERROR. DoH with
    // one query in flight: dnsperf 2.10's DoH client handles one response per TLS read and
    // stalls when two arrive together (it does so against dnsdist 1.7 as well).
    let input = r.gw.join("queries.txt");
    std::fs::write(&input, "www.corp.test A\napp.corp.test A\n").unwrap();
    // (dnsperf paces a single outstanding query coarsely: a few tens of DoH queries in 2 s.)
    for (mode, port, clients, least) in [("dot", r.dot, "8", 100), ("doh", r.doh, "1", 10)] {
        let out = run(Command::new("dnsperf")
            .args(["-m", mode, "-s", "127.0.0.1", "-p", &port.to_string()])
            .arg("-d")
            .arg(&input)
            .args([
                "-c", clients, "-q", clients, "-l", "2", "-Q", "500", "-t", "5",
            ]));
        let stdout = text(&out.stdout);
        let completed = figure(&stdout, "Queries completed:");
        assert!(completed >= least, "{mode}: {stdout}");
        assert_eq!(figure(&stdout, "Queries lost:"), 0, "{mode}: {stdout}");
        assert!(
            stdout.contains(&format!("NOERROR {completed} ")),
            "{mode}: every answer NOERROR: {stdout}"
        );
    }
    let status = r.gw.status();
    let encrypted = status["encrypted"].to_string();
    assert!(
        encrypted.contains(&format!("dot 127.0.0.1:{}", r.dot))
            && encrypted.contains(&format!("doh 127.0.0.1:{}", r.doh)),
        "{status}"
    );
}

/// The first number after `label` in dnsperf's report.
fn figure(report: &str, label: &str) -> u64 {
    report
        .lines()
        .find_map(|l| l.trim().strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {label:?} in {report}"))
}

#[test]
fn to_ports_sees_the_port_the_client_asked() {
    if !clients("encrypted-to-ports") {
        return;
    }
    // DNS rules on port 53 only: the same name is allowed over UDP, refused over DoT and DoH.
    let r = start("enc-ports", &[]);
    let udp = common::rcode(r.gw.dns, "www.corp.test.");
    assert_eq!(udp, Some(hickory_proto::op::ResponseCode::NoError));
    let out = kdig(&r.ca.cert, r.dot, &["+tls"], "www.corp.test");
    assert!(out.contains("status: REFUSED"), "{out}");
    let out = kdig(&r.ca.cert, r.doh, &["+https=/dns-query"], "www.corp.test");
    assert!(out.contains("status: REFUSED"), "{out}");
}

#[test]
fn a_reload_refuses_an_expired_certificate_and_presents_a_renewed_one() {
    if !clients("encrypted-reload") {
        return;
    }
    let r = start("enc-reload", &[853, 443, 8853]);
    let dir = r.gw.join("");
    // Expired: the reload is refused with the date; the pair in use goes on serving.
    let expired: Issued =
        r.ca.issue_expired(Path::new(&dir), "expired", &["dns.test"]);
    std::fs::copy(&expired.cert, r.gw.join("server.pem")).unwrap();
    std::fs::copy(&expired.key, r.gw.join("server.key")).unwrap();
    let out = r.gw.cli(&["policy", "reload"]);
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("expired on"), "{said}");
    let served = kdig(&r.ca.cert, r.dot, &["+tls"], "www.corp.test");
    assert!(served.contains("192.0.2.10"), "{served}");

    // Renewed by another CA: presented from the next connection.
    std::fs::create_dir_all(r.gw.join("other")).unwrap();
    let other = TestCa::new(&r.gw.join("other"));
    let renewed = other.issue(&r.gw.join("other"), "server", &["dns.test"], &[]);
    std::fs::copy(&renewed.cert, r.gw.join("server.pem")).unwrap();
    std::fs::copy(&renewed.key, r.gw.join("server.key")).unwrap();
    let out = r.gw.cli(&["policy", "reload"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let served = kdig(&other.cert, r.dot, &["+tls"], "www.corp.test");
    assert!(served.contains("192.0.2.10"), "{served}");
    let old = run(Command::new("kdig")
        .args(["@127.0.0.1", "-p", &r.dot.to_string()])
        .arg(format!("+tls-ca={}", r.ca.cert.display()))
        .args([
            "+tls-hostname=dns.test",
            "+time=3",
            "+retry=0",
            "www.corp.test",
        ]));
    assert!(
        !text(&old.stdout).contains("192.0.2.10"),
        "the old CA no longer verifies"
    );
}
