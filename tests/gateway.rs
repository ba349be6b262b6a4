//! `fqdnd gateway` end to end: the binary as a user runs it, a static-zone upstream on
//! loopback, real UDP/TCP clients, the admin API, metrics and hot reload.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed step should panic"
)]

mod common;

use std::net::SocketAddr;
use std::process::Output;

use common::{
    Gateway, LAN_GROUP, PATIENCE, Setup, TestDir, documents, fqdnd, fqdnd_command, fqdns_on_443,
    gateway_doc, json_of, lan_policy, poll, poll_until, question, run, stdout_of, text,
};
use hickory_proto::op::{Edns, Message, ResponseCode};
use hickory_proto::rr::RecordType;

const ZONE: &str = "$TTL 300
@ IN SOA ns.corp.test. admin.corp.test. 1 3600 600 86400 60
@ IN NS ns.corp.test.
ns IN A 127.0.0.53
www IN A 192.0.2.10
www IN A 192.0.2.11
app IN CNAME edge.cdn.corp.test.
edge.cdn 30 IN A 198.51.100.5
secret IN A 203.0.113.9
";

fn policy(allowed: &str) -> String {
    lan_policy(&format!(
        "  - toPorts:
    - ports: [{{port: \"53\", protocol: ANY}}]
      rules:
        dns: [{allowed}]
{}",
        fqdns_on_443(&["matchPattern: \"*.corp.test\""])
    ))
}

/// The Gateway document (with the client group), its admin socket `socket` (relative to the
/// file).
fn gateway_yaml(metrics: u16, socket: &str) -> String {
    let spec = format!(
        "  staticZones: [{{origin: corp.test, file: corp.zone}}]
  metrics: 127.0.0.1:{metrics}
  queryLog: queries.jsonl
  adminSocket: {socket}
  lists: {{denyNames: [\"secret.corp.test\"]}}
"
    );
    documents(&[&gateway_doc("127.0.0.1:0", &spec), LAN_GROUP])
}

/// `gateway.yaml` (naming `admin.sock`, so the gateway is started without `--admin-socket`)
/// and `policy.yaml` allowing the DNS names `allowed`.
fn setup(allowed: &str) -> Setup {
    let mut g = Gateway::setup("gw");
    g.file("corp.zone", ZONE);
    let metrics = g.metrics_port();
    g.config("gateway.yaml", &gateway_yaml(metrics, "admin.sock"));
    g.config("policy.yaml", &policy(allowed));
    g.socket_from_config();
    g
}

fn start(allowed: &str) -> Gateway {
    setup(allowed).start()
}

fn query(name: &str, qtype: RecordType, edns: bool) -> Message {
    let mut q = question(0x1234, name, qtype);
    if edns {
        let mut e = Edns::new();
        e.set_max_payload(1232);
        e.set_dnssec_ok(true);
        q.edns = Some(e);
    }
    q
}

fn udp(server: SocketAddr, msg: &Message) -> Message {
    let (reply, from) = common::udp(server, msg).expect("a UDP reply");
    assert_eq!(from, server, "the reply comes from the address asked");
    reply
}

/// The response code of an A question over UDP.
fn ask(gw: &Gateway, name: &str) -> ResponseCode {
    udp(gw.dns, &query(name, RecordType::A, false))
        .metadata
        .response_code
}

fn tcp(server: SocketAddr, msg: &Message) -> Message {
    common::tcp(server, msg).expect("a TCP reply").0
}

fn addrs(msg: &Message) -> Vec<String> {
    common::addrs(msg).iter().map(ToString::to_string).collect()
}

#[test]
fn allowed_refused_nxdomain_cname_tcp_edns_and_listings() {
    let gw = start("{matchPattern: \"*.corp.test\"}, {matchPattern: \"**.cdn.corp.test\"}");
    let www = udp(gw.dns, &query("www.corp.test.", RecordType::A, false));
    assert_eq!(www.metadata.response_code, ResponseCode::NoError);
    assert_eq!(www.metadata.id, 0x1234);
    let mut got = addrs(&www);
    got.sort();
    assert_eq!(got, vec!["192.0.2.10", "192.0.2.11"]);

    // Not allowed by the DNS rules, and a deny-listed name: REFUSED.
    assert_eq!(ask(&gw, "corp.test."), ResponseCode::Refused);
    assert_eq!(ask(&gw, "secret.corp.test."), ResponseCode::Refused);
    // NXDOMAIN passes through.
    assert_eq!(ask(&gw, "nope.corp.test."), ResponseCode::NXDomain);
    // CNAME chain, over TCP.
    let app = tcp(gw.dns, &query("app.corp.test.", RecordType::A, false));
    assert_eq!(addrs(&app), vec!["198.51.100.5"]);
    // EDNS0 and the DO bit come back.
    let edns = udp(gw.dns, &query("www.corp.test.", RecordType::A, true));
    assert!(edns.edns.is_some(), "the OPT record passes through");

    // What the answers taught.
    let identities = gw.admin(&["identity", "list"]);
    let fqdn = identities
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            r["labels"]
                .as_array()
                .unwrap()
                .iter()
                .any(|l| l == "fqdn:*.corp.test.")
                && r["labels"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|l| l == "reserved:world-ipv4")
        })
        .expect("the *.corp.test identity");
    // 192.0.2.10, .11 and 198.51.100.5 share it, plus the pre-allocation reference.
    assert_eq!(fqdn["refs"], 4, "{identities}");
    let ipcache = gw.admin(&["ipcache", "list"]);
    let prefixes: Vec<&str> = ipcache
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["prefix"].as_str().unwrap())
        .collect();
    for p in ["192.0.2.10/32", "192.0.2.11/32", "198.51.100.5/32"] {
        assert!(prefixes.contains(&p), "{ipcache}");
    }
    assert!(
        !prefixes.contains(&"203.0.113.9/32"),
        "a refused name teaches nothing"
    );
    let cache = gw.admin(&["cache", "list"]);
    let www_row = cache
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["fqdn"] == "www.corp.test.")
        .expect("www in the cache");
    assert_eq!(www_row["endpoint"], "7");
    assert_eq!(www_row["source"], "lookup");

    // Metrics (a query is counted when its task ends, possibly after the client has the
    // reply).
    poll(
        PATIENCE,
        "fqdnd_dns_queries_total on the metrics page",
        || {
            let page = gw.metrics_text();
            if page.contains("fqdnd_dns_queries_total") {
                Ok(())
            } else {
                Err(page)
            }
        },
    );
    // The proxy's own latency summaries are on the same page, with the answers' samples
    // (recorded as each reply leaves: polled, as the counters are).
    poll(
        PATIENCE,
        "the latency summaries with 3 samples each",
        || {
            let page = gw.metrics_text();
            let samples = |name: &str| {
                page.lines()
                    .find_map(|l| l.strip_prefix(&format!("{name}_count ")))
                    .and_then(|n| n.parse::<u64>().ok())
            };
            let complete = [
                "fqdnd_dns_upstream_latency_seconds",
                "fqdnd_dns_hold_seconds",
                "fqdnd_dns_observer_seconds",
            ]
            .iter()
            .all(|name| {
                page.contains(&format!("# TYPE {name} summary"))
                    && page.contains(&format!("{name}{{quantile=\"0.99\"}} "))
                    && !page.contains(&format!("{name}{{quantile=\"0.99\"}} NaN"))
                    && samples(name).is_some_and(|n| n >= 3)
            });
            if complete { Ok(()) } else { Err(page) }
        },
    );

    // The query log has a line per query (written behind the replies).
    poll(PATIENCE, "a query-log line per query", || {
        let log = std::fs::read_to_string(gw.join("queries.jsonl")).unwrap_or_default();
        if log.lines().count() >= 6 {
            Ok(())
        } else {
            Err(log)
        }
    });
    let status = gw.status();
    assert!(status["cache_names"].as_u64().unwrap() >= 2, "{status}");
    // Guards `mode` in the status (it was not there): a gateway says it is one.
    assert_eq!(status["mode"], "gateway", "{status}");
}

#[test]
fn hot_reload_keeps_the_old_policy_when_the_new_one_is_broken() {
    let gw = start("{matchPattern: \"*.corp.test\"}");
    assert_eq!(ask(&gw, "www.corp.test."), ResponseCode::NoError);

    // A broken file: rejected with its errors, the old policy stays.
    std::fs::write(
        gw.join("policy.yaml"),
        policy("{matchPattern: \"*.cor!p.test\"}"),
    )
    .unwrap();
    let out = gw.cli(&["policy", "reload"]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("policy.yaml:") && stdout.contains("invalid character '!'"),
        "{stdout}"
    );
    assert_eq!(ask(&gw, "www.corp.test."), ResponseCode::NoError);

    // SIGHUP with a good file that allows only app.corp.test.
    std::fs::write(
        gw.join("policy.yaml"),
        policy("{matchName: \"app.corp.test\"}"),
    )
    .unwrap();
    gw.signal(nix::sys::signal::Signal::SIGHUP);
    poll_until(
        PATIENCE,
        "the SIGHUP reload to refuse www.corp.test",
        || {
            let rcode = ask(&gw, "www.corp.test.");
            (rcode == ResponseCode::Refused).then_some(())
        },
    );
    assert_eq!(ask(&gw, "app.corp.test."), ResponseCode::NoError);
    let status = gw.status();
    assert_eq!(status["reloads"]["failed"], 1, "{status}");
}

/// A configuration file without documents (`# disabled`) is skipped with a warning in the
/// log: the gateway starts, and reloads, with the other files (before, it refused to start,
/// and every reload failed: "no policy or configuration documents").
#[test]
fn a_disabled_file_is_skipped_with_a_warning() {
    let mut g = setup("{matchPattern: \"*.corp.test\"}");
    let disabled = g.config("disabled.yaml", "# disabled\n");
    let gw = g.start();
    assert_eq!(ask(&gw, "www.corp.test."), ResponseCode::NoError);
    let warning = format!(
        "{}:1:1: warning: no policy or configuration documents",
        disabled.display()
    );
    assert!(gw.log().contains(&warning), "{}", gw.log());

    // Emptied entirely, and the policy changed: the reload goes through.
    std::fs::write(&disabled, "").unwrap();
    std::fs::write(
        gw.join("policy.yaml"),
        policy("{matchName: \"app.corp.test\"}"),
    )
    .unwrap();
    let out = gw.cli(&["policy", "reload"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert_eq!(ask(&gw, "www.corp.test."), ResponseCode::Refused);
}

#[test]
fn a_gateway_needs_a_gateway_document() {
    let dir = TestDir::new("gw-none");
    let file = dir.write("p.yaml", policy("{matchPattern: \"*\"}"));
    let out = fqdnd(&["gateway", "--config", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no `kind: Gateway` document"));
}

/// The DNS path's threads (`fqdnd-dns-N`) are `dns.threads` of the Settings document, and the
/// port answers clients on many source ports (the kernel spreads them over one UDP listener
/// socket per thread; which socket took a query is not observed here).
#[test]
fn dns_threads_sets_the_threads_of_the_dns_path() {
    let mut g = setup("{matchPattern: \"*.corp.test\"}");
    g.config(
        "settings.yaml",
        &common::settings_doc("  dns:\n    threads: 3\n"),
    );
    let gw = g.start();
    let names = || -> Vec<String> {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", gw.pid())).unwrap();
        let mut names: Vec<String> = tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|n| n.trim().to_owned())
            .filter(|n| n.starts_with("fqdnd-dns-"))
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(), ["fqdnd-dns-0", "fqdnd-dns-1", "fqdnd-dns-2"]);
    // Clients on many source ports: the kernel spreads them over the three sockets.
    for i in 0..30 {
        assert_eq!(
            ask(&gw, "www.corp.test."),
            ResponseCode::NoError,
            "query {i}"
        );
    }
}

#[test]
fn the_demo_runs_with_no_network() {
    let text = stdout_of(&fqdnd(&["gateway", "--demo"]));
    assert!(
        text.contains("www.example.test.")
            && text.contains("NOERROR")
            && text.contains("192.0.2.10"),
        "{text}"
    );
    assert!(
        text.contains("other.example.net.") && text.contains("REFUSED"),
        "{text}"
    );
    assert!(text.contains("fqdn:*.example.test."), "{text}");
}

/// Guards how the CLI finds the admin socket without `--admin-socket` (before, it used
/// `--admin-socket` or one fixed default, and the listing commands took no `--config`): from
/// `FQDND_ADMIN_SOCKET`, and from `--config` with the gateway's own files (the Gateway
/// document's `adminSocket`, relative to the file, whatever the working directory); and
/// `--admin-socket` wins over both, in either direction.
#[test]
fn the_cli_finds_the_admin_socket_from_the_environment_and_the_config() {
    let gw = start("{matchPattern: \"*.corp.test\"}");
    let listen = gw.dns.to_string();
    let answers = |out: &Output| {
        let status = json_of(out);
        assert_eq!(status["listen"][0], listen.as_str(), "{status}");
    };
    let configs = || {
        gw.configs()
            .iter()
            .flat_map(|c| ["--config".as_ref(), c.as_os_str()])
            .collect::<Vec<&std::ffi::OsStr>>()
    };
    // Where no daemon listens, named by the environment and by a configuration file.
    let nobody = gw.join("nobody.sock");
    let decoy = gw.join("decoy.yaml");
    std::fs::write(&decoy, gateway_yaml(1, "nobody.sock")).unwrap();

    // FQDND_ADMIN_SOCKET.
    answers(&run(fqdnd_command()
        .args(["status", "--json"])
        .env("FQDND_ADMIN_SOCKET", &gw.socket)));
    // --config: the gateway's files, run from another directory.
    answers(&run(fqdnd_command()
        .args(["status", "--json"])
        .args(configs())
        .current_dir("/")));
    stdout_of(&run(fqdnd_command()
        .args(["policy", "reload"])
        .args(configs())
        .current_dir("/")));
    // --admin-socket wins over a wrong environment and a wrong configuration...
    answers(&run(fqdnd_command()
        .args(["status", "--json", "--admin-socket"])
        .arg(&gw.socket)
        .arg("--config")
        .arg(&decoy)
        .env("FQDND_ADMIN_SOCKET", &nobody)));
    // ...and a wrong one is not saved by right ones.
    let out = run(fqdnd_command()
        .args(["status", "--json", "--admin-socket"])
        .arg(&nobody)
        .args(configs())
        .env("FQDND_ADMIN_SOCKET", &gw.socket));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains(&*nobody.to_string_lossy()),
        "{}",
        text(&out.stderr)
    );
}
