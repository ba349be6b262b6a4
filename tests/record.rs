//! `fqdnd record` on a running gateway: every query and reply taken while recording is on is
//! in the pcapng files (none dropped, none while off), the files rotate within their bounds,
//! and `fqdnd replay` reads them back.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed step should panic"
)]

mod common;

use common::{
    DNS_ANYWHERE, Gateway, LAN_GROUP, documents, fqdnd, gateway_doc, json_of, lan_policy, question,
    rcode, tcp, udp,
};
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;

const ZONE: &str = "$TTL 300
@ IN SOA ns.corp.test. admin.corp.test. 1 3600 600 86400 60
@ IN NS ns.corp.test.
www IN A 192.0.2.10
other IN A 192.0.2.20
";

fn start() -> Gateway {
    start_with(&lan_policy(DNS_ANYWHERE))
}

/// A gateway of the lan group (id 7) under `policy`, with the zone as its upstream.
fn start_with(policy: &str) -> Gateway {
    let mut g = Gateway::setup("record");
    g.file("corp.zone", ZONE);
    let spec = "  staticZones: [{origin: corp.test, file: corp.zone}]\n";
    g.config(
        "gateway.yaml",
        &documents(&[&gateway_doc("127.0.0.1:0", spec), LAN_GROUP]),
    );
    g.config("policy.yaml", policy);
    g.start()
}

/// An egress rule: DNS for `name` only, on port 53 over `protocol`.
fn dns_for(name: &str, protocol: &str) -> String {
    format!(
        "  - toPorts:\n    - ports: [{{port: \"53\", protocol: {protocol}}}]\n      rules:\n        dns: [{{matchName: {name}}}]\n"
    )
}

fn ask(gw: &Gateway, n: usize) {
    for i in 0..n {
        let name = if i % 5 == 4 {
            "nope.corp.test."
        } else {
            "www.corp.test."
        };
        let expected = if i % 5 == 4 {
            ResponseCode::NXDomain
        } else {
            ResponseCode::NoError
        };
        assert_eq!(rcode(gw.dns, name), Some(expected), "query {i}");
    }
}

#[test]
fn what_is_taken_while_on_is_written_and_read_back() {
    let gw = start();
    let dir = gw.join("rec");
    let dir = dir.to_str().unwrap();
    let mut asked = 0;
    for round in 0..3 {
        let on = gw.admin(&["record", "start", "--dir", dir]);
        assert_eq!(on["recording"], true, "{on}");
        ask(&gw, 20);
        asked += 20;
        let off = gw.admin(&["record", "stop"]);
        // Each query and its reply, every one written: nothing dropped, nothing lost at stop.
        assert_eq!(off["taken"], 40, "round {round}: {off}");
        assert_eq!(off["packets"], 40, "round {round}: {off}");
        assert_eq!(off["dropped"], 0);
        // Off: nothing is taken.
        ask(&gw, 5);
        assert_eq!(gw.admin(&["record", "status"])["recording"], false);
    }
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path().to_string_lossy().into_owned())
        .filter(|p| p.ends_with(".pcapng"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 3, "one file per recording: {files:?}");
    for f in &files {
        tshark_reads(f, gw.dns.port(), 40);
    }
    let mut args = vec!["replay"];
    args.extend(files.iter().map(String::as_str));
    let policy = gw.join("policy.yaml");
    // The test gateway listens on a free port, not 53: replay is told which.
    let port = gw.dns.port().to_string();
    args.extend(["--policy", policy.to_str().unwrap(), "--port", &port]);
    args.extend(["--json", "--progress", "0"]);
    let report = json_of(&fqdnd(&args));
    assert_eq!(report["queries"], asked, "{report}");
    assert_eq!(report["responses"], asked);
    assert_eq!(report["dns_malformed"], 0);
}

/// tshark (Wireshark's reader, installed by scripts/install-deps.sh) reads `file` as pcapng:
/// `packets` DNS messages, half queries and half replies, each with fqdnd's comment.
fn tshark_reads(file: &str, port: u16, packets: usize) {
    let fields = ["dns.flags.response", "dns.qry.name", "frame.comment"];
    let Some(rows) = tshark(file, port, &fields) else {
        return;
    };
    assert_eq!(rows.len(), packets, "{rows:?}");
    let replies = rows
        .iter()
        .filter(|r| r[0] == "1" || r[0] == "True")
        .count();
    assert_eq!(replies, packets / 2, "{rows:?}");
    for r in &rows {
        assert!(r[1].ends_with("corp.test"), "{rows:?}");
        assert!(r[2].starts_with("fqdnd "), "{rows:?}");
    }
}

/// The DNS messages tshark finds in `file`, DNS on `port` (the test gateway's, not 53), one
/// row of `fields` each; `None` (the test skipped) if tshark cannot run, unless privileged
/// tests are required.
fn tshark(file: &str, port: u16, fields: &[&str]) -> Option<Vec<Vec<String>>> {
    tshark_filtered(file, port, "dns", fields)
}

/// The packets of `file` that tshark's display `filter` keeps, one row of `fields` each.
fn tshark_filtered(
    file: &str,
    port: u16,
    filter: &str,
    fields: &[&str],
) -> Option<Vec<Vec<String>>> {
    let mut command = std::process::Command::new("tshark");
    command.args([
        "-r",
        file,
        "-Y",
        filter,
        "-T",
        "fields",
        "-E",
        "separator=|",
    ]);
    for transport in ["udp", "tcp"] {
        command.args(["-d", &format!("{transport}.port=={port},dns")]);
    }
    for f in fields {
        command.args(["-e", f]);
    }
    let out = match command.output() {
        Ok(out) => out,
        Err(e) => {
            let msg = format!("tshark cannot run ({e}): scripts/install-deps.sh installs it");
            assert!(
                std::env::var("FQDND_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
                "{msg}"
            );
            eprintln!("{msg} (skipped)");
            return None;
        }
    };
    assert!(
        out.status.success(),
        "tshark -r {file}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    Some(
        stdout
            .lines()
            .map(|l| l.split('|').map(str::to_owned).collect())
            .collect(),
    )
}

/// The one file a recording into `dir` wrote.
fn only_file(dir: &str) -> String {
    let files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

/// A refused query and its reply name the client group whose rules refused it, as an allowed
/// one does (issue 36, item 8).
#[test]
fn refused_queries_name_their_client_group() {
    let gw = start_with(&lan_policy(&dns_for("www.corp.test", "ANY")));
    let dir = gw.join("rec");
    let dir = dir.to_str().unwrap();
    gw.admin(&["record", "start", "--dir", dir]);
    assert_eq!(rcode(gw.dns, "www.corp.test."), Some(ResponseCode::NoError));
    assert_eq!(
        rcode(gw.dns, "other.corp.test."),
        Some(ResponseCode::Refused)
    );
    gw.admin(&["record", "stop"]);
    let fields = ["dns.qry.name", "frame.comment"];
    let Some(rows) = tshark(&only_file(dir), gw.dns.port(), &fields) else {
        return;
    };
    assert_eq!(rows.len(), 4, "{rows:?}");
    for r in &rows {
        let verdict = if r[0] == "www.corp.test" {
            ["verdict=allow", "verdict=answered"]
        } else {
            ["verdict=deny", "verdict=denied"]
        };
        assert!(r[1].contains(" endpoint=7 "), "{rows:?}");
        assert!(verdict.iter().any(|v| r[1].ends_with(v)), "{rows:?}");
    }
}

/// A query over TCP is recorded as TCP — segments of a connection that starts with a
/// handshake, which tshark and replay read as TCP — and the preview judges it by that
/// transport: under a UDP-only DNS rule it is refused, as the gateway refused it (issue 36,
/// item 9).
#[test]
fn tcp_queries_are_recorded_as_tcp_and_judged_by_it() {
    let gw = start_with(&lan_policy(&dns_for("www.corp.test", "UDP")));
    let baseline = gw.join("baseline.yaml");
    std::fs::write(&baseline, lan_policy(DNS_ANYWHERE)).unwrap();
    let dir = gw.join("rec");
    let dir = dir.to_str().unwrap();
    gw.admin(&["record", "start", "--dir", dir]);
    let q = question(0x0909, "www.corp.test.", RecordType::A);
    let code = |reply: Option<(Message, _)>| reply.map(|(m, _)| m.metadata.response_code);
    assert_eq!(code(udp(gw.dns, &q)), Some(ResponseCode::NoError));
    assert_eq!(code(tcp(gw.dns, &q)), Some(ResponseCode::Refused));
    gw.admin(&["record", "stop"]);
    let file = only_file(dir);

    // tshark: two messages over UDP, two over TCP (their notes say so), after a handshake.
    let port = gw.dns.port();
    if let Some(rows) = tshark(&file, port, &["ip.proto", "frame.comment"]) {
        let mut protos: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
        protos.sort_unstable();
        assert_eq!(protos, ["17", "17", "6", "6"], "{rows:?}");
        for r in &rows {
            let transport = if r[0] == "6" { "tcp" } else { "udp" };
            assert!(
                r[1].contains(&format!(" transport={transport} ")),
                "{rows:?}"
            );
        }
        let syns = tshark_filtered(&file, port, "tcp.flags.syn == 1", &["tcp.flags.ack"]).unwrap();
        assert_eq!(syns.len(), 2, "SYN and SYN-ACK: {syns:?}");
    }

    // The preview of the UDP-only rule against one that allows DNS over both: the query over
    // TCP is refused, as the gateway refused it; www's verdict now depends on the transport.
    let port = port.to_string();
    let report = json_of(&fqdnd(&[
        "replay",
        &file,
        "--policy",
        gw.join("policy.yaml").to_str().unwrap(),
        "--baseline",
        baseline.to_str().unwrap(),
        "--endpoints",
        gw.join("gateway.yaml").to_str().unwrap(),
        "--port",
        &port,
        "--json",
    ]));
    assert_eq!(report["baseline"]["queries_allowed"], 2, "{report}");
    assert_eq!(report["policy"]["queries_allowed"], 1, "{report}");
    assert_eq!(report["policy"]["queries_refused"], 1, "{report}");
    assert_eq!(report["endpoints"][0]["name"], "lan", "{report}");
    assert_eq!(
        report["endpoints"][0]["names_mixed"],
        serde_json::json!(["www.corp.test."]),
        "{report}"
    );
}

/// A name the policy in force refused has no answer in the recording: the preview of a policy
/// that allows it lists it as allowed now and says that what it would reach is unknown
/// (issue 36, item 12).
#[test]
fn a_name_refused_when_recorded_is_flagged_as_without_addresses() {
    let gw = start_with(&lan_policy(&dns_for("www.corp.test", "ANY")));
    let new = gw.join("new.yaml");
    std::fs::write(&new, lan_policy(DNS_ANYWHERE)).unwrap();
    let dir = gw.join("rec");
    let dir = dir.to_str().unwrap();
    gw.admin(&["record", "start", "--dir", dir]);
    assert_eq!(rcode(gw.dns, "www.corp.test."), Some(ResponseCode::NoError));
    assert_eq!(
        rcode(gw.dns, "other.corp.test."),
        Some(ResponseCode::Refused)
    );
    gw.admin(&["record", "stop"]);
    let file = only_file(dir);
    let port = gw.dns.port().to_string();
    let preview = |json: bool| {
        let mut args = vec![
            "replay".to_owned(),
            file.clone(),
            "--policy".to_owned(),
            new.to_str().unwrap().to_owned(),
            "--baseline".to_owned(),
            gw.join("policy.yaml").to_str().unwrap().to_owned(),
            "--port".to_owned(),
            port.clone(),
        ];
        if json {
            args.push("--json".to_owned());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fqdnd(&args)
    };
    let report = json_of(&preview(true));
    let changes = &report["endpoints"][0];
    let other = serde_json::json!(["other.corp.test."]);
    assert_eq!(changes["names_now_allowed"], other, "{report}");
    assert_eq!(changes["names_without_addresses"], other, "{report}");
    assert_eq!(
        changes["ips_gaining_access"],
        serde_json::json!([]),
        "{report}"
    );
    let summary = common::stdout_of(&preview(false));
    assert!(
        summary.contains("addresses incomplete: the capture holds no address for 1 name(s)"),
        "{summary}"
    );
    assert!(
        summary.contains("no addresses:   other.corp.test."),
        "{summary}"
    );
}

#[test]
fn files_rotate_within_their_bounds() {
    let gw = start();
    let dir = gw.join("rec");
    let dir = dir.to_str().unwrap();
    gw.admin(&[
        "record",
        "start",
        "--dir",
        dir,
        "--max-file-size",
        "4K",
        "--max-files",
        "2",
    ]);
    ask(&gw, 100);
    let off = gw.admin(&["record", "stop"]);
    assert_eq!(off["packets"], 200, "{off}");
    assert!(off["rotated_out"].as_u64().unwrap() > 0, "{off}");
    let files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 2, "{files:?}");
    for f in &files {
        let len = std::fs::metadata(f).unwrap().len();
        assert!(len <= 4096, "{} is {len} bytes", f.display());
    }
    // A second start while recording is refused; stop when not recording too.
    gw.admin(&["record", "start", "--dir", dir]);
    let again = gw.cli(&["record", "start", "--dir", dir]);
    assert!(!again.status.success());
    gw.admin(&["record", "stop"]);
    assert!(!gw.cli(&["record", "stop"]).status.success());
}
