//! `fqdnd gateway` with its answer cache on: a repeated question is answered from the cache
//! (the static-zone upstream is asked once), the engine still learns every answer served,
//! a deny-listed name is refused whatever the cache holds, and `fqdnd status` shows the cache.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed step should panic"
)]

mod common;

use common::{Gateway, LAN_GROUP, documents, fqdns_on_443, gateway_doc, lan_policy, question};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

const ZONE: &str = "$TTL 300
@ IN SOA ns.corp.test. admin.corp.test. 1 3600 600 86400 60
@ IN NS ns.corp.test.
www IN A 192.0.2.10
";

fn start() -> Gateway {
    let mut g = Gateway::setup("gw-cache");
    g.file("corp.zone", ZONE);
    let metrics = g.metrics_port();
    let spec = format!(
        "  staticZones: [{{origin: corp.test, file: corp.zone}}]
  metrics: 127.0.0.1:{metrics}
  adminSocket: admin.sock
  cache: {{size: 100, maxNegativeTTL: 30s}}
  lists: {{denyNames: [\"secret.corp.test\"]}}
"
    );
    g.config(
        "gateway.yaml",
        &documents(&[&gateway_doc("127.0.0.1:0", &spec), LAN_GROUP]),
    );
    g.config(
        "policy.yaml",
        &lan_policy(&format!(
            "  - toPorts:
    - ports: [{{port: \"53\", protocol: ANY}}]
      rules:
        dns: [{{matchPattern: \"*.corp.test\"}}]
{}",
            fqdns_on_443(&["matchPattern: \"*.corp.test\""])
        )),
    );
    g.socket_from_config();
    g.start()
}

fn ask(gw: &Gateway, name: &str) -> hickory_proto::op::Message {
    common::udp(gw.dns, &question(0x1234, name, RecordType::A))
        .expect("a UDP reply")
        .0
}

#[test]
fn repeated_questions_come_from_the_cache_and_are_still_learned() {
    let gw = start();
    for _ in 0..3 {
        let www = ask(&gw, "www.corp.test.");
        assert_eq!(www.metadata.response_code, ResponseCode::NoError);
        assert_eq!(common::addrs(&www).len(), 1);
        assert!(www.answers[0].ttl <= 300);
    }
    for _ in 0..2 {
        let nx = ask(&gw, "nope.corp.test.");
        assert_eq!(nx.metadata.response_code, ResponseCode::NXDomain);
    }
    assert_eq!(
        ask(&gw, "secret.corp.test.").metadata.response_code,
        ResponseCode::Refused
    );
    let status = gw.status();
    let cache = &status["answer_cache"];
    assert_eq!(cache["hits"], 3, "{status}");
    assert_eq!(cache["misses"], 2, "{status}");
    assert_eq!(cache["entries"], 2, "{status}");
    assert_eq!(cache["capacity"], 100, "{status}");
    // Every answer served was shown to the engine: the name is in its DNS cache.
    assert!(status["cache_names"].as_u64().unwrap() >= 1, "{status}");
    let text = common::stdout_of(&gw.cli(&["status"]));
    assert!(
        text.contains("answer cache:     2/100 entries, 3 hits, 2 misses"),
        "{text}"
    );
    let metrics = gw.metrics_text();
    assert!(
        metrics.contains("fqdnd_answer_cache_hits_total 3"),
        "{metrics}"
    );
}
