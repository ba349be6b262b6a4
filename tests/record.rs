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
    DNS_ANYWHERE, Gateway, LAN_GROUP, documents, fqdnd, gateway_doc, json_of, lan_policy, rcode,
};
use hickory_proto::op::ResponseCode;

const ZONE: &str = "$TTL 300
@ IN SOA ns.corp.test. admin.corp.test. 1 3600 600 86400 60
@ IN NS ns.corp.test.
www IN A 192.0.2.10
";

fn start() -> Gateway {
    let mut g = Gateway::setup("record");
    g.file("corp.zone", ZONE);
    let spec = "  staticZones: [{origin: corp.test, file: corp.zone}]\n";
    g.config(
        "gateway.yaml",
        &documents(&[&gateway_doc("127.0.0.1:0", spec), LAN_GROUP]),
    );
    g.config("policy.yaml", &lan_policy(DNS_ANYWHERE));
    g.start()
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
        tshark_reads(f, 40);
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
fn tshark_reads(file: &str, packets: usize) {
    let out = match std::process::Command::new("tshark")
        .args(["-r", file, "-T", "fields", "-E", "separator=|"])
        .args([
            "-e",
            "dns.flags.response",
            "-e",
            "dns.qry.name",
            "-e",
            "frame.comment",
        ])
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            let msg = format!("tshark cannot run ({e}): scripts/install-deps.sh installs it");
            assert!(
                std::env::var("FQDND_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
                "{msg}"
            );
            eprintln!("{msg} (skipped)");
            return;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tshark -r {file}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Vec<&str>> = stdout.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(rows.len(), packets, "{stdout}");
    let replies = rows
        .iter()
        .filter(|r| r[0] == "1" || r[0] == "True")
        .count();
    assert_eq!(replies, packets / 2, "{stdout}");
    for r in &rows {
        assert!(r[1].ends_with("corp.test"), "{stdout}");
        assert!(r[2].starts_with("fqdnd "), "{stdout}");
    }
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
