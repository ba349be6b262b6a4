//! `kind: Service`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use common::{errs, ok};
use fqdnd_config::{Duplicated, Error};
use fqdnd_lb::{Protocol, ServiceKey};

fn doc(name: &str, spec: &str) -> String {
    format!("apiVersion: fqdnd.io/v1\nkind: Service\nmetadata:\n  name: {name}\nspec:\n{spec}")
}

#[test]
fn services_load_with_their_protocol() {
    let text = [
        doc(
            "dns-udp",
            "  frontend: 10.96.0.10:53\n  protocol: UDP\n  backends: [\"10.0.1.5:53\", \"10.0.2.5:53\"]\n",
        ),
        doc(
            "dns-tcp",
            "  frontend: 10.96.0.10:53\n  backends: [\"10.0.1.6:53\"]\n",
        ),
        doc(
            "web6",
            "  frontend: \"[fd00::10]:80\"\n  protocol: tcp\n  backends: [\"[fd00:1::5]:8080\"]\n",
        ),
    ]
    .join("---\n");
    let config = ok(&text);
    assert_eq!(config.services.len(), 3);
    let udp = &config.services[0];
    assert_eq!(
        udp.key,
        ServiceKey {
            vip: "10.96.0.10".parse().unwrap(),
            port: 53,
            proto: Protocol::Udp
        }
    );
    assert_eq!(udp.backends.len(), 2);
    assert_eq!(
        config.services[1].key.proto,
        Protocol::Tcp,
        "TCP is the default"
    );
    assert_eq!(config.services[2].key.port, 80);
}

#[test]
fn bad_services_name_the_problem() {
    let text = doc(
        "bad",
        "  frontend: 10.96.0.10\n  protocol: SCTP\n  backends: [\"10.0.0.1:0\"]\n",
    );
    let all: Vec<String> = errs(&text).iter().map(ToString::to_string).collect();
    let all = all.join("\n");
    assert!(all.contains("is not ADDRESS:PORT"), "{all}");
    assert!(all.contains("expected TCP or UDP"), "{all}");
    assert!(all.contains("port other than 0"), "{all}");
    let mixed = doc(
        "mixed",
        "  frontend: 10.96.0.10:53\n  backends: [\"[fd00::1]:53\"]\n",
    );
    let all: Vec<String> = errs(&mixed).iter().map(ToString::to_string).collect();
    assert!(all.join("\n").contains("address family"), "{all:?}");
}

#[test]
fn duplicate_names_and_frontends_are_errors() {
    let a = doc("a", "  frontend: 10.96.0.10:53\n  backends: []\n");
    let b = doc("a", "  frontend: 10.96.0.11:53\n  backends: []\n");
    let c = doc("c", "  frontend: 10.96.0.10:53\n  backends: []\n");
    let errors = errs(&[a.clone(), b].join("---\n"));
    assert!(
        errors.iter().any(
            |e| matches!(e, Error::Duplicate { item: Duplicated::ServiceName(n), .. } if n == "a")
        ),
        "{errors:?}"
    );
    let errors = errs(&[a, c].join("---\n"));
    assert!(
        errors.iter().any(|e| matches!(
            e,
            Error::Duplicate {
                item: Duplicated::ServiceFrontend(_),
                ..
            }
        )),
        "{errors:?}"
    );
}
