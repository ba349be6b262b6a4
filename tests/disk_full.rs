//! A gateway whose state directory fills up (a 64 KiB tmpfs): answers that would teach new
//! state fail closed (SERVFAIL with `onHoldTimeout: servfail`), an error log and
//! `fqdnd_checkpoint_errors_total` say so, and names already known keep being answered.
//! Needs root (mount); skipped without it unless `FQDND_REQUIRE_PRIVILEGED=1`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed step should panic"
)]

mod common;

use common::{
    DNS_ANYWHERE, Gateway, LAN_GROUP, documents, fqdns_on_443, gateway_doc, lan_policy,
    numbered_zone, privileged, question, udp,
};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

fn ask(gw: &Gateway, name: &str) -> Option<ResponseCode> {
    udp(gw.dns, &question(0x1234, name, RecordType::A)).map(|(m, _)| m.metadata.response_code)
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
    let spec = format!(
        "  staticZones: [{{origin: corp.test, file: corp.zone}}]\n  stateDir: state\n  onHoldTimeout: servfail\n  metrics: 127.0.0.1:{metrics}\n"
    );
    let fqdns = fqdns_on_443(&["matchPattern: \"*.corp.test\""]);
    g.config(
        "gateway.yaml",
        &documents(&[
            &gateway_doc("127.0.0.1:0", &spec),
            LAN_GROUP,
            &lan_policy(&(DNS_ANYWHERE.to_owned() + &fqdns)),
        ]),
    );
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
    // (Sampled once a second.)
    gw.wait_metric("fqdnd_checkpoint_errors_total", ">= 1", |v| v >= 1.0);
    let text = gw.log();
    assert!(text.contains("journal write failed"), "{text}");
}
