//! A gateway whose state directory fills up (a 64 KiB tmpfs): answers that would teach new
//! state fail closed (SERVFAIL with `onHoldTimeout: servfail`), an error log and
//! `fqdnd_checkpoint_errors_total` say so, and names already known keep being answered.
//! Needs root (mount); skipped without it unless `FQDND_REQUIRE_PRIVILEGED=1`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "test code: real processes and clocks; a failed step should panic"
)]

mod common;

use common::{Gateway, question, udp};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

fn ask(gw: &Gateway, name: &str) -> Option<ResponseCode> {
    udp(gw.dns, &question(0x1234, name, RecordType::A)).map(|(m, _)| m.metadata.response_code)
}

#[test]
fn a_full_state_disk_fails_new_learning_closed_and_keeps_known_names() {
    if !nix::unistd::geteuid().is_root() {
        assert!(
            std::env::var("FQDND_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
            "needs root to mount a small tmpfs, and FQDND_REQUIRE_PRIVILEGED=1"
        );
        eprintln!("disk_full: needs root (skipped)");
        return;
    }
    let mut g = Gateway::setup("diskfull");
    g.mount_tmpfs("state", "64k");
    let mut zone = String::from(
        "$TTL 3600\n@ IN SOA ns.corp.test. admin.corp.test. 1 3600 600 86400 60\n@ IN NS ns.corp.test.\n",
    );
    for i in 0..5000u32 {
        zone += &format!("h{i:04} IN A 100.64.{}.{}\n", i / 250, i % 250 + 1);
    }
    g.file("corp.zone", zone);
    let metrics = g.metrics_port();
    g.config(
        "gateway.yaml",
        &format!(
            "apiVersion: fqdnd.io/v1
kind: Gateway
spec:
  listen: [\"127.0.0.1:0\"]
  staticZones: [{{origin: corp.test, file: corp.zone}}]
  stateDir: state
  onHoldTimeout: servfail
  metrics: 127.0.0.1:{metrics}
---
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {{name: lan}}
spec: {{id: 7, addresses: [\"127.0.0.0/8\"], labels: {{site: lan}}}}
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {{name: lan}}
spec:
  endpointSelector: {{matchLabels: {{site: lan}}}}
  egress:
  - toPorts: [{{ports: [{{port: \"53\", protocol: ANY}}]}}]
  - toFQDNs: [{{matchPattern: \"*.corp.test\"}}]
    toPorts: [{{ports: [{{port: \"443\", protocol: TCP}}]}}]
"
        ),
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
