//! systemd's readiness protocol, as a `Type=notify` unit sees it, without systemd: the test
//! is the service manager (a datagram socket in `NOTIFY_SOCKET`). The gateway says READY=1
//! only once it answers DNS and its admin API; a SIGHUP sent the moment it is ready reloads
//! (RELOADING=1, then READY=1) instead of killing it; SIGTERM says STOPPING=1. The real
//! units are tested in a booted Debian by `scripts/package-e2e.sh` (tests/package.rs).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use std::net::SocketAddr;
use std::os::unix::net::UnixDatagram;

use common::*;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use nix::sys::signal::Signal;

/// The next message the daemon sends to the notify socket (waits up to PATIENCE).
fn next(socket: &UnixDatagram) -> String {
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buf = [0u8; 4096];
    let n = socket
        .recv(&mut buf)
        .unwrap_or_else(|e| panic!("no sd_notify message within {PATIENCE:?}: {e}"));
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn the_gateway_is_ready_only_once_it_answers_and_a_reload_right_after_keeps_it() {
    let mut setup = Gateway::setup("sd-notify");
    let port = free_port();
    let zone = "$TTL 300\n@ IN SOA ns.corp.test. admin.corp.test. 1 3600 600 86400 60\n@ IN NS ns.corp.test.\nwww IN A 192.0.2.10\n";
    setup.file("corp.zone", zone);
    setup.config(
        "gateway.yaml",
        &documents(&[
            &gateway_doc(
                &format!("127.0.0.1:{port}"),
                "  staticZones: [{origin: corp.test, file: corp.zone}]\n",
            ),
            LAN_GROUP,
            &lan_policy(&format!(
                "  - toPorts: [{{ports: [{{port: \"53\", protocol: ANY}}], rules: {{dns: [{{matchPattern: \"*.corp.test\"}}]}}}}]\n{}",
                fqdns_on_443(&["matchPattern: \"*.corp.test\""])
            )),
        ]),
    );
    let notify_path = setup.dir().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    setup.env("NOTIFY_SOCKET", notify_path.to_str().unwrap());
    let mut gw = setup.launch();

    let ready = next(&notify);
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready}");
    assert!(
        ready.contains(&format!(
            "STATUS=gateway: answering DNS on [127.0.0.1:{port}]"
        )),
        "{ready}"
    );
    // Ready means serving: the first question, asked at once, is answered, and the admin API
    // answers too — no polling.
    let dns = SocketAddr::from(([127, 0, 0, 1], port));
    let (answer, _) = udp(dns, &question(1, "www.corp.test.", RecordType::A))
        .expect("no answer right after READY=1");
    assert_eq!(answer.metadata.response_code, ResponseCode::NoError);
    assert_eq!(
        addrs(&answer),
        vec!["192.0.2.10".parse::<std::net::IpAddr>().unwrap()]
    );
    try_admin(&gw.socket, &["status"]).expect("the admin API does not answer right after READY=1");

    // `systemctl reload` sends SIGHUP as soon as the unit is active: it reloads.
    gw.signal(Signal::SIGHUP);
    assert_eq!(next(&notify).trim(), "RELOADING=1");
    let reloaded = next(&notify);
    assert!(reloaded.lines().any(|l| l == "READY=1"), "{reloaded}");
    assert!(reloaded.contains("STATUS=policy reloaded"), "{reloaded}");
    assert!(gw.alive(), "SIGHUP killed the gateway:\n{}", gw.log());

    gw.signal(Signal::SIGTERM);
    assert_eq!(next(&notify).trim(), "STOPPING=1");
}
