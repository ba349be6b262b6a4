//! The gateway forwarding over DNS over TLS and DNS over HTTPS to real servers: Unbound
//! serving DoT (and plain DNS, its local data) and dnsdist 1.7's DoH frontend in front of that
//! Unbound, both on loopback with certificates of a test CA (`tests/common/tls.rs`). Clients
//! ask the gateway over plain UDP; what it answers must be what the servers hold, what policy
//! refuses stays refused, what it answered is learned, and a server whose certificate does not
//! carry the configured name is never used: SERVFAIL, the upstream marked dead with the reason
//! logged once, until a server with the right certificate answers again.
//!
//! Needs `unbound` and `dnsdist` (scripts/install-deps.sh); without them the tests are
//! skipped, unless FQDND_REQUIRE_PRIVILEGED=1, where they fail.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed step should panic"
)]

mod common;

use std::net::{IpAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::tls::{Issued, TestCa};
use common::{
    Gateway, LAN_GROUP, PATIENCE, TestDir, documents, fqdns_on_443, free_port, gateway_doc,
    lan_policy, metric, poll, question,
};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

/// What Unbound holds (every other name: NXDOMAIN, `. NS` included, answered at once).
const LOCAL_DATA: &[&str] = &[
    "www.corp.test. 300 IN A 192.0.2.10",
    "www.corp.test. 300 IN A 192.0.2.11",
    "app.doh.test. 300 IN A 198.51.100.7",
    "other.example. 300 IN A 203.0.113.9",
];

fn installed(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success())
}

fn runnable(test: &str) -> bool {
    common::runnable(
        test,
        installed("unbound") && installed("dnsdist"),
        "unbound and dnsdist (scripts/install-deps.sh)",
    )
}

/// A server process, killed when dropped (also when the test panics: its log's last lines are
/// printed then).
struct Server {
    name: &'static str,
    child: Option<Child>,
    log: PathBuf,
}

impl Server {
    fn spawn(name: &'static str, command: &mut Command, log: PathBuf) -> Self {
        let file = std::fs::File::create(&log).unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        Self {
            name,
            child: Some(child),
            log,
        }
    }

    /// Waits until `port` of 127.0.0.1 accepts TCP connections; panics if the process exits.
    fn wait_listening(&mut self, port: u16) {
        let name = self.name;
        let child = self.child.as_mut().unwrap();
        let log = self.log.clone();
        poll(PATIENCE, &format!("{name} listening on {port}"), || {
            if let Some(code) = child.try_wait().unwrap() {
                panic!(
                    "{name} exited ({code}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            TcpStream::connect(("127.0.0.1", port)).map(drop)
        });
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            eprintln!("--- {} log (last lines) ---", self.name);
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

/// Unbound answering its local data over plain DNS on `plain` and over TLS on `dot`, with
/// the certificate `cert`; `extra` holds more `server:` lines.
fn unbound(dir: &Path, plain: u16, dot: u16, cert: &Issued, extra: &str) -> Server {
    let local: String = LOCAL_DATA
        .iter()
        .map(|rr| format!("    local-data: \"{rr}\"\n"))
        .collect();
    let conf = dir.join("unbound.conf");
    std::fs::write(
        &conf,
        format!(
            "server:
    interface: 127.0.0.1@{plain}
    interface: 127.0.0.1@{dot}
    tls-port: {dot}
    tls-service-key: \"{key}\"
    tls-service-pem: \"{pem}\"
    do-ip6: no
    username: \"\"
    chroot: \"\"
    directory: \"{dir}\"
    pidfile: \"\"
    use-syslog: no
    verbosity: 1
    access-control: 127.0.0.0/8 allow
    local-zone: \".\" static
{extra}{local}remote-control:
    control-enable: no
",
            key = cert.key.display(),
            pem = cert.cert.display(),
            dir = dir.display(),
        ),
    )
    .unwrap();
    let mut server = Server::spawn(
        "unbound",
        Command::new("unbound").arg("-d").arg("-c").arg(&conf),
        dir.join("unbound.log"),
    );
    server.wait_listening(plain);
    server.wait_listening(dot);
    server
}

/// dnsdist with a DoH frontend on `doh` (path `/dns-query`, certificate `cert`) forwarding to
/// the plain server on `backend`; `local` is its plain listener (unused, but it must not take
/// 127.0.0.1:53, its default); `options` is the Lua table of `addDOHLocal`'s options.
fn dnsdist(dir: &Path, doh: u16, local: u16, backend: u16, cert: &Issued, options: &str) -> Server {
    let conf = dir.join("dnsdist.conf");
    std::fs::write(
        &conf,
        format!(
            "setSecurityPollSuffix(\"\")
setLocal(\"127.0.0.1:{local}\")
addDOHLocal(\"127.0.0.1:{doh}\", \"{pem}\", \"{key}\", \"/dns-query\", {options})
newServer({{address=\"127.0.0.1:{backend}\"}})
",
            pem = cert.cert.display(),
            key = cert.key.display(),
        ),
    )
    .unwrap();
    let mut server = Server::spawn(
        "dnsdist",
        Command::new("dnsdist")
            .args(["--supervised", "--disable-syslog", "-C"])
            .arg(&conf),
        dir.join("dnsdist.log"),
    );
    server.wait_listening(doh);
    server
}

/// The policy: DNS for `*.corp.test` and `*.doh.test` only, their addresses on 443.
fn policy() -> String {
    lan_policy(&format!(
        "  - toPorts:
    - ports: [{{port: \"53\", protocol: ANY}}]
      rules:
        dns: [{{matchPattern: \"*.corp.test\"}}, {{matchPattern: \"*.doh.test\"}}]
{}",
        fqdns_on_443(&[
            "matchPattern: \"*.corp.test\"",
            "matchPattern: \"*.doh.test\""
        ])
    ))
}

/// A gateway whose default pool is `upstream` and whose `doh.test` zone goes to
/// `doh_upstream`, trusting the test CA.
fn gateway(test: &str, ca: &Path, upstream: &str, doh_upstream: &str) -> Gateway {
    let mut g = Gateway::setup(test);
    // The recoveries are logged at info, connections closing at debug.
    g.env(
        "FQDND_LOG",
        "info,fqdnd_dnsproxy::upstream_encrypted=debug,fqdnd_dnsproxy::upstream_https=debug",
    );
    let metrics = g.metrics_port();
    let spec = format!(
        "  upstreams: [\"{upstream}\"]
  zoneUpstreams:
  - zone: doh.test
    upstreams: [\"{doh_upstream}\"]
  upstreamCA: {ca}
  upstreamTimeout: 1s
  metrics: 127.0.0.1:{metrics}
",
        ca = ca.display()
    );
    g.config(
        "gateway.yaml",
        &documents(&[&gateway_doc("127.0.0.1:0", &spec), LAN_GROUP]),
    );
    g.config("policy.yaml", &policy());
    g.start()
}

/// The reply to an A question for `name` over UDP: its code and sorted addresses.
fn ask(gw: &Gateway, name: &str) -> (ResponseCode, Vec<IpAddr>) {
    let (reply, from) =
        common::udp(gw.dns, &question(0x2a2a, name, RecordType::A)).expect("a UDP reply");
    assert_eq!(from, gw.dns);
    assert_eq!(reply.metadata.id, 0x2a2a, "the client's ID comes back");
    let mut addrs = common::addrs(&reply);
    addrs.sort();
    (reply.metadata.response_code, addrs)
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|a| a.parse().unwrap()).collect()
}

/// `fqdnd_dns_upstream_connections_total` of one upstream and result.
fn connections(gw: &Gateway, upstream: &str, result: &str) -> f64 {
    let series = format!(
        "fqdnd_dns_upstream_connections_total{{upstream=\"{upstream}\",result=\"{result}\"}}"
    );
    let page = gw.metrics_text();
    metric(&page, &series).unwrap_or_else(|| {
        // The exporter may order the labels either way.
        let swapped = format!(
            "fqdnd_dns_upstream_connections_total{{result=\"{result}\",upstream=\"{upstream}\"}}"
        );
        metric(&page, &swapped).unwrap_or(0.0)
    })
}

/// The upstream row of `fqdnd status` whose `addr` is `label`.
fn upstream_alive(gw: &Gateway, label: &str) -> bool {
    let status = gw.status();
    status["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["addr"] == label)
        .unwrap_or_else(|| panic!("no upstream {label} in {status}"))["alive"]
        .as_bool()
        .unwrap()
}

#[test]
fn dot_and_doh_upstreams_answer_refuse_and_teach_over_reused_connections() {
    if !runnable("dot_and_doh_upstreams_answer_refuse_and_teach_over_reused_connections") {
        return;
    }
    let dir = TestDir::new("enc-up");
    let ca = TestCa::new(dir.path());
    let cert = ca.issue(dir.path(), "server", &["dns.test", "doh.test"], &[]);
    let (plain, dot, doh, local) = (free_port(), free_port(), free_port(), free_port());
    let _unbound = unbound(dir.path(), plain, dot, &cert, "");
    let _dnsdist = dnsdist(dir.path(), doh, local, plain, &cert, "{}");
    let dot_upstream = format!("tls://127.0.0.1:{dot}#dns.test");
    let doh_upstream = format!("https://127.0.0.1:{doh}/dns-query#doh.test");
    let gw = gateway("enc-up-gw", &ca.cert, &dot_upstream, &doh_upstream);

    // Over DoT (the default pool) and DoH (the doh.test zone's pool): the servers' data.
    assert_eq!(
        ask(&gw, "www.corp.test."),
        (ResponseCode::NoError, ips(&["192.0.2.10", "192.0.2.11"]))
    );
    // dnsdist may still be checking its backend: poll the first DoH answer.
    poll(PATIENCE, "an answer over DoH", || {
        match ask(&gw, "app.doh.test.") {
            (ResponseCode::NoError, a) if a == ips(&["198.51.100.7"]) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    assert_eq!(
        ask(&gw, "nope.corp.test.").0,
        ResponseCode::NXDomain,
        "NXDOMAIN passes through"
    );
    // Not allowed by the DNS rules: refused by the gateway, never forwarded.
    assert_eq!(ask(&gw, "other.example.").0, ResponseCode::Refused);

    // Many queries at once, on both: pipelined on the one TLS connection, concurrent streams
    // on the one HTTP/2 connection.
    std::thread::scope(|s| {
        for i in 0..16 {
            let gw = &gw;
            s.spawn(move || {
                let (name, want) = if i % 2 == 0 {
                    ("www.corp.test.", ips(&["192.0.2.10", "192.0.2.11"]))
                } else {
                    ("app.doh.test.", ips(&["198.51.100.7"]))
                };
                for _ in 0..5 {
                    assert_eq!(ask(gw, name), (ResponseCode::NoError, want.clone()));
                }
            });
        }
    });
    assert_eq!(
        connections(&gw, &dot_upstream, "ok"),
        1.0,
        "one DoT connection, reused"
    );
    assert_eq!(
        connections(&gw, &doh_upstream, "ok"),
        1.0,
        "one DoH connection, reused"
    );
    assert_eq!(connections(&gw, &dot_upstream, "failed"), 0.0);

    // What it answered is learned (for the endpoint of the client group, from a lookup);
    // what it refused is not.
    let cache = gw.admin(&["cache", "list"]);
    for fqdn in ["www.corp.test.", "app.doh.test."] {
        let row = cache
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["fqdn"] == fqdn)
            .unwrap_or_else(|| panic!("{fqdn} not learned: {cache}"));
        assert_eq!(row["endpoint"], "7", "{row}");
    }
    let ipcache = gw.admin(&["ipcache", "list"]).to_string();
    for prefix in ["192.0.2.10/32", "192.0.2.11/32", "198.51.100.7/32"] {
        assert!(ipcache.contains(prefix), "{prefix} in {ipcache}");
    }
    assert!(
        !ipcache.contains("203.0.113.9/32"),
        "a refused name teaches nothing"
    );

    // Both upstreams are alive and named as configured.
    assert!(upstream_alive(&gw, &dot_upstream));
    assert!(upstream_alive(&gw, &doh_upstream));
    assert!(!gw.log().contains("cannot connect"), "{}", gw.log());
}

#[test]
fn a_server_name_the_certificate_lacks_kills_the_upstream_until_a_right_one_answers() {
    if !runnable("a_server_name_the_certificate_lacks_kills_the_upstream_until_a_right_one_answers")
    {
        return;
    }
    let dir = TestDir::new("enc-up-name");
    let ca = TestCa::new(dir.path());
    // Certificates for other names than the gateway expects.
    let wrong = ca.issue(dir.path(), "wrong", &["dns.test"], &[]);
    let (plain, dot, doh, local) = (free_port(), free_port(), free_port(), free_port());
    let mut unbound_server = unbound(dir.path(), plain, dot, &wrong, "");
    let _dnsdist = dnsdist(dir.path(), doh, local, plain, &wrong, "{}");
    let dot_upstream = format!("tls://127.0.0.1:{dot}#resolver.test");
    let doh_upstream = format!("https://127.0.0.1:{doh}/dns-query#doh.test");
    let gw = gateway("enc-up-name-gw", &ca.cert, &dot_upstream, &doh_upstream);

    // Never answered over a connection that does not verify: SERVFAIL (after the upstream
    // timeout), until the upstream is marked dead (then SERVFAIL at once).
    poll(PATIENCE, "the DoT upstream marked dead", || {
        assert_eq!(ask(&gw, "www.corp.test.").0, ResponseCode::ServFail);
        if upstream_alive(&gw, &dot_upstream) {
            Err("alive")
        } else {
            Ok(())
        }
    });
    poll(PATIENCE, "the DoH upstream marked dead", || {
        assert_eq!(ask(&gw, "app.doh.test.").0, ResponseCode::ServFail);
        if upstream_alive(&gw, &doh_upstream) {
            Err("alive")
        } else {
            Ok(())
        }
    });
    let log = gw.log();
    // The reason, once per upstream, however many attempts failed.
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains("WARN") && l.contains("cannot connect to the encrypted DNS upstream")
        })
        .collect();
    assert_eq!(warnings.len(), 2, "{log}");
    for (upstream, name) in [
        (&dot_upstream, "resolver.test"),
        (&doh_upstream, "doh.test"),
    ] {
        let line = warnings
            .iter()
            .find(|l| l.contains(upstream.as_str()))
            .unwrap_or_else(|| panic!("no warning for {upstream}: {log}"));
        assert!(
            line.contains("certificate") && line.contains(name),
            "the reason names the certificate and the name: {line}"
        );
    }
    assert!(connections(&gw, &dot_upstream, "failed") >= 2.0);
    assert_eq!(connections(&gw, &dot_upstream, "ok"), 0.0);
    assert!(log.contains("DNS upstream marked dead"), "{log}");

    // The DoT server comes back with a certificate for the name: the health probe finds it,
    // and queries are answered again.
    unbound_server.stop();
    let right = ca.issue(dir.path(), "right", &["resolver.test"], &[]);
    let _unbound = unbound(dir.path(), plain, dot, &right, "");
    poll(PATIENCE, "the DoT upstream answering again", || {
        match ask(&gw, "www.corp.test.") {
            (ResponseCode::NoError, a) if a == ips(&["192.0.2.10", "192.0.2.11"]) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    assert!(upstream_alive(&gw, &dot_upstream));
    let log = gw.log();
    assert!(
        log.contains("connected to the encrypted DNS upstream again"),
        "{log}"
    );
    assert!(log.contains("DNS upstream is back"), "{log}");
    assert_eq!(connections(&gw, &dot_upstream, "ok"), 1.0);
}

#[test]
fn connections_the_servers_close_when_idle_are_opened_again() {
    if !runnable("connections_the_servers_close_when_idle_are_opened_again") {
        return;
    }
    let dir = TestDir::new("enc-up-idle");
    let ca = TestCa::new(dir.path());
    let cert = ca.issue(dir.path(), "server", &["dns.test", "doh.test"], &[]);
    let (plain, dot, doh, local) = (free_port(), free_port(), free_port(), free_port());
    // Unbound closes a connection idle for 300 ms, dnsdist one idle for a second.
    let _unbound = unbound(
        dir.path(),
        plain,
        dot,
        &cert,
        "    tcp-idle-timeout: 300\n    edns-tcp-keepalive: no\n",
    );
    let _dnsdist = dnsdist(dir.path(), doh, local, plain, &cert, "{idleTimeout=1}");
    let dot_upstream = format!("tls://127.0.0.1:{dot}#dns.test");
    let doh_upstream = format!("https://127.0.0.1:{doh}/dns-query#doh.test");
    let gw = gateway("enc-up-idle-gw", &ca.cert, &dot_upstream, &doh_upstream);
    let www = (ResponseCode::NoError, ips(&["192.0.2.10", "192.0.2.11"]));
    let app = (ResponseCode::NoError, ips(&["198.51.100.7"]));
    assert_eq!(ask(&gw, "www.corp.test."), www);
    poll(PATIENCE, "an answer over DoH", || {
        match ask(&gw, "app.doh.test.") {
            got if got == app => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    // Each server closes its idle connection (the gateway logs it); the next query opens a
    // new one and is answered.
    let closed = |upstream: &str| {
        gw.log()
            .lines()
            .filter(|l| {
                l.contains("encrypted DNS upstream connection closed") && l.contains(upstream)
            })
            .count()
    };
    for round in 1..=2 {
        poll(
            PATIENCE,
            "both idle connections closed by the servers",
            || {
                let seen = (closed(&dot_upstream), closed(&doh_upstream));
                if seen.0 >= round && seen.1 >= round {
                    Ok(())
                } else {
                    Err(format!("{seen:?}"))
                }
            },
        );
        assert_eq!(ask(&gw, "www.corp.test."), www);
        assert_eq!(ask(&gw, "app.doh.test."), app);
        let opened = f64::from(u32::try_from(round).unwrap() + 1);
        assert_eq!(connections(&gw, &dot_upstream, "ok"), opened);
        assert_eq!(connections(&gw, &doh_upstream, "ok"), opened);
    }
    assert!(upstream_alive(&gw, &dot_upstream));
    assert!(upstream_alive(&gw, &doh_upstream));
    assert_eq!(connections(&gw, &dot_upstream, "failed"), 0.0);
    let page = gw.metrics_text();
    assert_eq!(
        metric(
            &page,
            "fqdnd_dns_queries_total{result=\"upstream_timeout\"}"
        )
        .unwrap_or(0.0),
        0.0,
        "no query was lost to a closed connection: {page}"
    );
}

#[test]
fn a_missing_trust_store_is_a_clear_start_error() {
    let mut g = Gateway::setup("enc-up-ca");
    let spec = "  upstreams: [\"tls://127.0.0.1:853#dns.test\"]\n  upstreamCA: missing-ca.pem\n";
    g.config(
        "gateway.yaml",
        &documents(&[&gateway_doc("127.0.0.1:0", spec), LAN_GROUP]),
    );
    let configs: Vec<PathBuf> = g.configs().to_vec();
    let mut command = common::fqdnd_command();
    command.arg("gateway");
    for c in &configs {
        command.arg("--config").arg(c);
    }
    let socket = g.socket();
    let out = common::run(command.arg("--admin-socket").arg(&socket));
    assert!(!out.status.success());
    let stderr = common::text(&out.stderr);
    assert!(
        stderr.contains("missing-ca.pem") && stderr.contains("upstreamCA"),
        "{stderr}"
    );
}
