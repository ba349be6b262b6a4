//! Per-zone upstreams: a name in a zone (the longest that holds it, in any case) goes to that
//! zone's pool; every other name to the default pool; no default pool: REFUSED.

use fqdnd_dnsproxy::ZoneUpstreams;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use crate::harness::{Harness, Mode, ask_udp, test_config};
use crate::upstream::TestUpstream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_goes_to_its_pool_the_longest_wins_and_the_rest_to_the_default() {
    let default = TestUpstream::start().await;
    let corp = TestUpstream::start().await;
    let lab = TestUpstream::start().await;
    let mut config = test_config(vec![default.addr]);
    config.zones = vec![
        ZoneUpstreams {
            zone: "corp.test".into(),
            upstreams: vec![corp.addr.into()],
        },
        ZoneUpstreams {
            zone: "Lab.Corp.Test.".into(),
            upstreams: vec![lab.addr.into()],
        },
    ];
    let h = Harness::with(default, config, Mode::Done).await;
    for name in [
        "a.corp.test.",
        "CORP.test.",
        "x.lab.corp.test.",
        "xcorp.test.",
        "www.example.",
    ] {
        // The test upstream answers a name it has no rule for with NXDOMAIN: forwarded.
        let reply = ask_udp(h.udp, name, RecordType::A).await;
        assert_eq!(
            reply.metadata.response_code,
            ResponseCode::NXDomain,
            "{name}"
        );
    }
    let names = |u: &TestUpstream| -> Vec<String> {
        u.queries()
            .into_iter()
            .map(|s| s.name.to_ascii_lowercase())
            .collect()
    };
    assert_eq!(names(&corp), ["a.corp.test.", "corp.test."]);
    assert_eq!(names(&lab), ["x.lab.corp.test."]);
    assert_eq!(names(&h.upstream), ["xcorp.test.", "www.example."]);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_default_pool_a_name_outside_every_zone_is_refused() {
    let corp = TestUpstream::start().await;
    let unused = TestUpstream::start().await;
    let mut config = test_config(Vec::new());
    config.zones = vec![ZoneUpstreams {
        zone: "corp.test".into(),
        upstreams: vec![corp.addr.into()],
    }];
    let h = Harness::with(unused, config, Mode::Done).await;
    let inside = ask_udp(h.udp, "a.corp.test.", RecordType::A).await;
    assert_eq!(
        inside.metadata.response_code,
        ResponseCode::NXDomain,
        "forwarded"
    );
    let outside = ask_udp(h.udp, "www.example.", RecordType::A).await;
    assert_eq!(outside.metadata.response_code, ResponseCode::Refused);
    assert_eq!(corp.queries().len(), 1);
    h.stop().await;
}
