//! A policy or endpoint change the datapath refuses leaves nothing behind: the engine goes back
//! to what it had, the datapath holds exactly the previous policy, and the next change works
//! (issue: "a rejected reload poisons the next one").

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a fixture that does not load is a bug in the test"
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use fqdnd_engine::{Engine, Error};
use fqdnd_ipcache::policy::Direction;
use fqdnd_ipcache::{
    Datapath, DatapathChange, DatapathError, EndpointId, MemoryDatapath, PolicyKey,
};
use proptest::prelude::*;

/// A datapath that, like the kernel, reference-counts its policy entries and refuses port
/// ranges wider than `max_range`, whole batch or nothing.
#[derive(Debug, Default)]
struct Strict {
    inner: MemoryDatapath,
    refs: BTreeMap<(EndpointId, PolicyKey), u32>,
    max_range: u16,
}

impl Datapath for Strict {
    fn apply(&mut self, changes: &[DatapathChange]) -> Result<(), DatapathError> {
        for change in changes {
            if let DatapathChange::PolicyUpsert { key, .. } = change
                && key.port != 0
                && key.end_port - key.port >= self.max_range
            {
                return Err(DatapathError::Io {
                    operation: "test: port range too wide",
                    error: std::io::Error::other("too wide"),
                });
            }
        }
        for change in changes {
            match change {
                DatapathChange::PolicyUpsert { endpoint, key } => {
                    *self.refs.entry((*endpoint, *key)).or_default() += 1;
                }
                DatapathChange::PolicyDelete { endpoint, key } => {
                    if let Some(n) = self.refs.get_mut(&(*endpoint, *key)) {
                        *n -= 1;
                        if *n == 0 {
                            self.refs.remove(&(*endpoint, *key));
                        }
                    }
                }
                _ => {}
            }
        }
        self.inner.apply(changes)
    }
}

impl Strict {
    /// Every entry once, exactly what the engine's policy says.
    fn matches(&self, engine: &Engine<Strict>) -> Result<(), String> {
        if let Some(((ep, key), n)) = self.refs.iter().find(|(_, n)| **n != 1) {
            return Err(format!("{ep} {key:?} counted {n} times"));
        }
        for ep in engine.ipcache.endpoints().keys() {
            let want: Vec<PolicyKey> = engine.ipcache.endpoint_policy(*ep).unwrap_or_default();
            let have: Vec<PolicyKey> = self
                .refs
                .keys()
                .filter(|(e, k)| e == ep && k.direction == Direction::Egress)
                .map(|(_, k)| *k)
                .collect();
            if want != have {
                return Err(format!("endpoint {ep}: engine {want:?}, datapath {have:?}"));
            }
        }
        Ok(())
    }
}

const ENDPOINTS: &str = r#"
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {name: web}
spec: {id: 100, addresses: ["10.0.0.1/32"], labels: {app: web}}
---
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {name: db}
spec: {id: 101, addresses: ["10.0.0.2/32"], labels: {app: db}}
"#;

/// A policy letting `app` reach 192.0.2.0/24 on `ports` (`"80"` or `"1000-3000"`).
fn policy(rules: &[(&str, Vec<&str>)]) -> fqdnd_config::Config {
    let mut text = ENDPOINTS.to_owned();
    for (i, (app, ports)) in rules.iter().enumerate() {
        let ports: Vec<String> = ports
            .iter()
            .map(|p| match p.split_once('-') {
                Some((a, b)) => format!("{{port: \"{a}\", endPort: {b}, protocol: TCP}}"),
                None => format!("{{port: \"{p}\", protocol: TCP}}"),
            })
            .collect();
        text.push_str(&format!(
            "---\napiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {{name: r{i}}}\n\
             spec:\n  endpointSelector: {{matchLabels: {{app: {app}}}}}\n  egress:\n  \
             - toCIDR: [\"192.0.2.0/24\"]\n    toPorts: [{{ports: [{}]}}]\n",
            ports.join(", ")
        ));
    }
    fqdnd_config::load_str(&text, Path::new("policy.yaml")).unwrap()
}

fn engine(config: &fqdnd_config::Config) -> Engine<Strict> {
    let datapath = Strict {
        max_range: 1000,
        ..Strict::default()
    };
    Engine::from_config(config, datapath, Duration::ZERO).unwrap()
}

#[test]
fn a_refused_policy_is_rolled_back_and_the_next_reload_works() {
    let first = policy(&[("web", vec!["80"])]);
    let mut engine = engine(&first);
    engine.ipcache.datapath().matches(&engine).unwrap();
    let before = engine.ipcache.endpoint_policy(EndpointId(100));

    let wide = policy(&[("web", vec!["443", "1000-3000"]), ("db", vec!["5432"])]);
    let err = engine
        .apply(wide.endpoints.clone(), wide.rules.clone(), Duration::ZERO)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Datapath {
                rolled_back: true,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(engine.ipcache.endpoint_policy(EndpointId(100)), before);
    assert_eq!(engine.ipcache.rules(), first.rules.as_slice());
    engine.ipcache.datapath().matches(&engine).unwrap();

    // The offending range removed: the very next reload succeeds and is exact.
    let fixed = policy(&[("web", vec!["443"]), ("db", vec!["5432"])]);
    engine
        .apply(fixed.endpoints.clone(), fixed.rules.clone(), Duration::ZERO)
        .unwrap();
    engine.ipcache.datapath().matches(&engine).unwrap();
    assert_eq!(engine.ipcache.rules(), fixed.rules.as_slice());
}

proptest! {
    /// Any sequence of reloads, some refused: after each, the datapath holds every entry of
    /// the engine's policy exactly once, and a refused one left the previous policy.
    #[test]
    fn refused_reloads_never_leave_the_datapath_and_engine_apart(
        reloads in proptest::collection::vec(
            proptest::collection::vec(
                (prop_oneof![Just("web"), Just("db")],
                 proptest::collection::vec(prop_oneof![Just("80"), Just("443"), Just("1000-3000"), Just("8000-8100")], 1..3)),
                0..3),
            1..8)
    ) {
        let mut engine = engine(&policy(&[]));
        for rules in &reloads {
            let config = policy(rules);
            let before = engine.ipcache.rules().to_vec();
            let result = engine.apply(config.endpoints.clone(), config.rules.clone(), Duration::ZERO);
            let refused = rules.iter().any(|(_, ports)| ports.contains(&"1000-3000"));
            prop_assert_eq!(result.is_err(), refused);
            if refused {
                prop_assert_eq!(engine.ipcache.rules(), before.as_slice());
            }
            if let Err(e) = engine.ipcache.datapath().matches(&engine) {
                return Err(TestCaseError::fail(e));
            }
        }
    }
}
