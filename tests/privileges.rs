//! Privileges of a running `fqdnd gateway`: after start-up no thread holds any capability (as
//! root; the test needs root and is skipped without it unless `FQDND_REQUIRE_PRIVILEGED=1`),
//! the admin socket is the owner's only, and configuration files anyone could change are
//! warned about at start and on every reload.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed step should panic"
)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{
    DNS_ANYWHERE, Gateway, LAN_GROUP, PATIENCE, Setup, assert_private, documents, gateway_doc,
    lan_policy, poll_until, privileged, rcode, settings_doc, text, usual_umask,
};
use hickory_proto::op::ResponseCode;

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A gateway with a state directory and a query log (both created by it), its admin socket
/// named in the Gateway document; `spec` and `docs` add lines to the Gateway spec and
/// documents after it.
fn setup(test: &str, spec: &str, docs: &str) -> Setup {
    let mut g = Gateway::setup(&format!("privs-{test}"));
    chmod(g.dir(), 0o755);
    let spec = format!(
        "  staticZones: [{{origin: corp.test, records: \"$TTL 300\\n@ IN SOA ns.corp.test. a.corp.test. 1 3600 600 86400 60\\nwww IN A 192.0.2.10\\n\"}}]
  adminSocket: admin.sock
  queryLog: queries.jsonl
  stateDir: state
  lists: {{deny: [deny.txt]}}
{spec}"
    );
    g.config(
        "gateway.yaml",
        &(documents(&[&gateway_doc("127.0.0.1:0", &spec), LAN_GROUP]) + docs),
    );
    g.config(
        "policy.yaml",
        &lan_policy(&format!(
            "{DNS_ANYWHERE}  - toFQDNs: [{{matchPattern: \"*.corp.test\"}}]\n"
        )),
    );
    g.file("deny.txt", "ads.corp.test\n");
    g.socket_from_config();
    g.env("FQDND_LOG", "info");
    g
}

/// A gateway whose files get the given modes: (gateway.yaml, policy.yaml, deny list).
fn start(test: &str, modes: (u32, u32, u32)) -> Gateway {
    let g = setup(test, "", "");
    chmod(&g.dir().join("gateway.yaml"), modes.0);
    chmod(&g.dir().join("policy.yaml"), modes.1);
    chmod(&g.dir().join("deny.txt"), modes.2);
    g.start()
}

fn warnings_about(log: &str, file: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("WARN") && l.contains(file))
        .count()
}

fn reload(gw: &Gateway) {
    let out = gw.cli(&["policy", "reload"]);
    assert!(out.status.success(), "{}", text(&out.stdout));
}

#[test]
fn the_admin_socket_is_the_owners_only_and_loose_files_are_warned_about() {
    let gw = start("perms", (0o666, 0o644, 0o664));
    let socket = gw.join("admin.sock");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "admin socket mode {mode:o}");
    // The query log and the state directory, created by the gateway: the owner's only.
    for private in ["queries.jsonl", "state"] {
        let mode = std::fs::metadata(gw.join(private))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{private}: mode {mode:o}");
    }
    assert_eq!(rcode(gw.dns, "www.corp.test."), Some(ResponseCode::NoError));
    let log = gw.log();
    let gateway_file = gw.join("gateway.yaml").display().to_string();
    let deny_file = gw.join("deny.txt").display().to_string();
    let policy_file = gw.join("policy.yaml").display().to_string();
    assert_eq!(warnings_about(&log, &gateway_file), 1, "{log}");
    assert!(log.contains("writable by everyone"), "{log}");
    assert_eq!(warnings_about(&log, &deny_file), 1, "{log}");
    assert!(log.contains("writable by its group"), "{log}");
    assert_eq!(warnings_about(&log, &policy_file), 0, "{log}");

    // A reload warns again; a state directory others can read is warned about too.
    chmod(&gw.join("state"), 0o755);
    reload(&gw);
    let log = gw.log();
    assert_eq!(warnings_about(&log, &gateway_file), 2, "{log}");
    assert_eq!(warnings_about(&log, &deny_file), 2, "{log}");
    assert_eq!(warnings_about(&log, &policy_file), 0, "{log}");
    assert!(
        log.contains("(the state directory) is readable by everyone"),
        "{log}"
    );
}

fn caps_of(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap()
}

#[test]
fn a_running_gateway_holds_no_capability_in_any_thread() {
    if !privileged("privileges", "to start with capabilities") {
        return;
    }
    let gw = start("caps", (0o644, 0o644, 0o644));
    assert_eq!(rcode(gw.dns, "www.corp.test."), Some(ResponseCode::NoError));
    // The drop is the last start-up step, just after the admin socket opens.
    poll_until(PATIENCE, "`capabilities dropped` in the log", || {
        gw.log().contains("capabilities dropped").then_some(())
    });
    let tasks = format!("/proc/{}/task", gw.pid());
    let mut threads = 0;
    for task in std::fs::read_dir(&tasks).unwrap() {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        for key in ["CapEff:", "CapPrm:", "CapInh:", "CapAmb:", "CapBnd:"] {
            assert_eq!(caps_of(&status, key), 0, "{key} of a thread:\n{status}");
        }
        threads += 1;
    }
    assert!(threads >= 2, "{threads} threads");
    let log = gw.log();
    assert!(log.contains("kept=none"), "{log}");
    // Everything it does at run time still works without: answers, new names, a reload
    // (files re-read, journal written, query log appended).
    assert_eq!(rcode(gw.dns, "ads.corp.test."), Some(ResponseCode::Refused));
    reload(&gw);
    assert_eq!(rcode(gw.dns, "www.corp.test."), Some(ResponseCode::NoError));
    assert!(
        !gw.log().contains("ERROR"),
        "errors after the drop: {}",
        gw.log()
    );
}

/// Guards the privacy of the gateway's state directory: created 0700 with every file in it
/// (lock, journal, snapshot) 0600 — before, the journal, snapshot and lock files were created
/// with the umask's mode (0644 here) — and fqdnd warns neither at a restart nor on a reload
/// about its own state directory (it warned "(the state directory) is readable by everyone"
/// about a directory it had created itself). The umask is 022, so a file created without an
/// explicit mode would show. The test above shows the warning does exist for a directory
/// that others can read.
#[test]
fn the_state_directory_and_its_files_are_private_and_not_warned_about() {
    usual_umask();
    // A snapshot after the first record, at the next GC tick (every second).
    let g = setup(
        "state",
        "  stateCompactAfter: 1\n",
        &format!("---\n{}", settings_doc("  gcInterval: 1s\n")),
    );
    let state = g.dir().join("state");
    let mut gw = g.start();
    assert_eq!(rcode(gw.dns, "www.corp.test."), Some(ResponseCode::NoError));
    poll_until(PATIENCE, "a snapshot in the state directory", || {
        state.join("snapshot").exists().then_some(())
    });
    assert_private(&state, &["lock", "journal.*", "snapshot"]);

    // A second start finds the directory it created: no warning about it, then or on reload.
    gw.restart();
    reload(&gw);
    assert_eq!(rcode(gw.dns, "www.corp.test."), Some(ResponseCode::NoError));
    let log = gw.log();
    assert!(log.contains("state restored"), "{log}");
    assert!(!log.contains("(the state directory)"), "{log}");
    assert_private(&state, &["lock", "journal.*", "snapshot"]);
}
