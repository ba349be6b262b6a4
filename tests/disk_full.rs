//! A gateway whose state disk fails it: full (a 64 KiB tmpfs), answers that would teach new
//! state fail closed (SERVFAIL with `onHoldTimeout: servfail`), an error log and
//! `fqdnd_checkpoint_errors_total` say so, and names already known keep being answered; with
//! room again, an identity whose record the full disk lost is journaled again; frozen
//! (`fsfreeze`), an answer is released only once what it teaches is on disk, also to the next
//! client that asks the same name.
//! Needs root (mount); skipped without it unless `FQDND_REQUIRE_PRIVILEGED=1`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed step should panic"
)]

mod common;

use common::{
    DNS_ANYWHERE, Frozen, Gateway, LAN_GROUP, PATIENCE, documents, fqdns_on_443, gateway_doc,
    lan_policy, numbered_zone, poll_until, privileged, question, udp,
};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

fn ask(gw: &Gateway, name: &str) -> Option<ResponseCode> {
    udp(gw.dns, &question(0x1234, name, RecordType::A)).map(|(m, _)| m.metadata.response_code)
}

/// Writes the gateway's configuration: static zone `corp.test` from `corp.zone`, state in
/// `state_dir`, `onHoldTimeout: servfail`, `extra` spec lines, and the LAN group allowed DNS
/// and the FQDN `patterns` on 443.
fn configure(g: &mut common::Setup, state_dir: &str, extra: &str, patterns: &[&str]) {
    let spec = format!(
        "  staticZones: [{{origin: corp.test, file: corp.zone}}]\n  stateDir: {state_dir}\n  onHoldTimeout: servfail\n{extra}"
    );
    let fqdns = fqdns_on_443(patterns);
    g.config(
        "gateway.yaml",
        &documents(&[
            &gateway_doc("127.0.0.1:0", &spec),
            LAN_GROUP,
            &lan_policy(&(DNS_ANYWHERE.to_owned() + &fqdns)),
        ]),
    );
}

#[test]
fn a_full_state_disk_fails_new_learning_closed_and_keeps_known_names() {
    if !privileged("disk_full", "to mount a small tmpfs") {
        return;
    }
    let mut g = Gateway::setup("diskfull");
    g.mount_tmpfs("state", "64k");
    g.file("corp.zone", numbered_zone(5000));
    let metrics = g.metrics_port();
    let extra = format!("  metrics: 127.0.0.1:{metrics}\n");
    configure(&mut g, "state", &extra, &["matchPattern: \"*.corp.test\""]);
    let gw = g.start();

    // Learn names until the journal no longer takes records.
    let known = "h0000.corp.test.";
    assert_eq!(ask(&gw, known), Some(ResponseCode::NoError));
    let mut refused_at = None;
    for i in 1..5000u32 {
        match ask(&gw, &format!("h{i:04}.corp.test.")) {
            Some(ResponseCode::NoError) => {}
            Some(ResponseCode::ServFail) => {
                refused_at = Some(i);
                break;
            }
            other => panic!("h{i:04}: {other:?}"),
        }
    }
    let first_refused = refused_at.expect("64 KiB never filled up");
    assert!(first_refused > 100, "failed too early: {first_refused}");
    // Still full: new names keep failing closed; known names are answered.
    assert_eq!(ask(&gw, "h4999.corp.test."), Some(ResponseCode::ServFail));
    assert_eq!(ask(&gw, known), Some(ResponseCode::NoError));
    // A name whose learning was not journaled is in the engine's memory, not on disk: asking
    // it again is no mere refresh, it fails closed as long as its record cannot be written.
    let refused = format!("h{first_refused:04}.corp.test.");
    assert_eq!(ask(&gw, &refused), Some(ResponseCode::ServFail));
    assert_eq!(ask(&gw, "h4999.corp.test."), Some(ResponseCode::ServFail));
    // (Sampled once a second.)
    gw.wait_metric("fqdnd_checkpoint_errors_total", ">= 1", |v| v >= 1.0);
    // The names whose records failed stay in doubt (until a snapshot holds them).
    gw.wait_metric("fqdnd_checkpoint_names_in_doubt", ">= 2", |v| v >= 2.0);
    let text = gw.log();
    assert!(text.contains("journal write failed"), "{text}");
}

/// The kill -9 loop's finding (tests/restart.rs): a name whose first answer still waits for
/// its sync is known to the engine, not to the disk. A second client asking it then must wait
/// for the disk too — released at once as a mere refresh, a crash would lose what it was told.
#[test]
fn a_name_still_syncing_is_no_refresh_for_the_next_client() {
    if !privileged("frozen_disk", "to mount and freeze a file system") {
        return;
    }
    let mut g = Gateway::setup("frozen");
    let state = g.mount_ext4("state", 16);
    g.file("corp.zone", numbered_zone(10));
    let metrics = g.metrics_port();
    let extra = format!("  metrics: 127.0.0.1:{metrics}\n");
    configure(&mut g, "state", &extra, &["matchPattern: \"*.corp.test\""]);
    let gw = g.start();
    let (known, syncing) = ("h0000.corp.test.", "h0001.corp.test.");
    assert_eq!(ask(&gw, known), Some(ResponseCode::NoError));

    // Declared after the gateway: thawed before it is killed, even when an assert fails.
    let frozen = Frozen::freeze(&state);
    // The journal's writer waits in its write: the hold ends at `proxyResponseMaxDelay`.
    assert_eq!(ask(&gw, syncing), Some(ResponseCode::ServFail));
    assert_eq!(
        ask(&gw, syncing),
        Some(ResponseCode::ServFail),
        "the second answer was released before the first one's record was on disk"
    );
    // A name known on disk is refreshed lazily: answered while the disk is frozen.
    assert_eq!(ask(&gw, known), Some(ResponseCode::NoError));
    drop(frozen);
    // Thawed: the queued records are written, and the name is answered again.
    poll_until(
        PATIENCE,
        "the name answered once its record is on disk",
        || (ask(&gw, syncing) == Some(ResponseCode::NoError)).then_some(()),
    );
    // The batch waited through two held answers: an operator sees it among the slow ones.
    gw.wait_metric(
        "fqdnd_checkpoint_slow_batches_total{over=\"100ms\"}",
        ">= 1",
        |v| v >= 1.0,
    );
}

/// A batch that failed on a full disk held the record of an identity created with it. Once
/// there is room again, later answers using that identity are journaled fine; the identity
/// must be too, or a restart would not know its label set's number.
#[test]
fn an_identity_whose_record_failed_is_journaled_again_once_there_is_room() {
    if !privileged("disk_full_identity", "to mount a small tmpfs") {
        return;
    }
    let mut g = Gateway::setup("diskfull-id");
    // For the restore's "state restored … identities=N" line.
    g.env("FQDND_LOG", "info");
    let disk = g.mount_tmpfs("disk", "64k");
    // What is freed later: the state directory takes only its own files.
    let filler = disk.join("filler");
    std::fs::write(&filler, vec![1u8; 24 << 10]).unwrap();
    g.file("corp.zone", numbered_zone(5000));
    // h49xx names carry a label set of their own, created with the first of them.
    configure(
        &mut g,
        "disk/state",
        "",
        &[
            "matchPattern: \"*.corp.test\"",
            "matchPattern: \"h49*.corp.test\"",
        ],
    );
    let mut gw = g.start();
    let filled = (0..4900u32)
        .map(|i| ask(&gw, &format!("h{i:04}.corp.test.")))
        .any(|code| code == Some(ResponseCode::ServFail));
    assert!(filled, "the disk never filled up");
    let before = gw.admin(&["identity", "list"]).as_array().unwrap().len();
    // The new label set's identity is created, its record lost with the batch.
    assert_eq!(ask(&gw, "h4900.corp.test."), Some(ResponseCode::ServFail));
    let identities = gw.admin(&["identity", "list"]).as_array().unwrap().len();
    assert_eq!(identities, before + 1, "h4900 made a new identity");

    std::fs::remove_file(&filler).unwrap();
    poll_until(
        PATIENCE,
        "answers journaled again once there is room",
        || (ask(&gw, "h4901.corp.test.") == Some(ResponseCode::NoError)).then_some(()),
    );
    gw.restart();
    let log = gw.log();
    let restored = log
        .lines()
        .rev()
        .find_map(|line| {
            let line = line.split_once("state restored")?.1;
            line.split_once(" identities=")?
                .1
                .split(' ')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .expect("a 'state restored' line with identities=");
    assert_eq!(
        restored, identities,
        "every identity known before the restart was on disk"
    );
}
