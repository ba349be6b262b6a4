//! Cluster mode of the IpCache: endpoint label sets take the numbers the cluster assigns, a
//! local endpoint waits on a temporary identity, other nodes' endpoints join the ipcache with
//! their global identity, and every switch of numbers keeps allowed flows allowed at every
//! step of the ordered batch. Single-node behaviour is the other test files'.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use fqdnd_ipcache::policy::{
    EgressRule, LabelSelector, Operator, PeerSelector, PortProtocol, PortRule, Protocol,
    Requirement, Rule,
};
use fqdnd_ipcache::{
    Config, Datapath, DatapathChange, DatapathError, Endpoint, EndpointId, EndpointLabel, Error,
    Identity, IpCache, MemoryDatapath, Scope, host_prefix,
};
use ipnet::IpNet;
use proptest::prelude::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn labels(app: &str) -> Vec<EndpointLabel> {
    vec![EndpointLabel {
        source: "k8s".into(),
        key: "app".into(),
        value: app.into(),
    }]
}

fn endpoint(id: u16, app: &str, addr: &str) -> Endpoint {
    Endpoint {
        id: EndpointId(id),
        name: format!("{app}{id}"),
        addresses: vec![host_prefix(ip(addr))],
        labels: labels(app),
    }
}

fn to_app(value: &str) -> PeerSelector {
    PeerSelector::Endpoints(LabelSelector {
        requirements: vec![Requirement {
            key: "app".into(),
            operator: Operator::In(vec![value.into()]),
        }],
    })
}

/// `client` may reach `web` and `db` on TCP 80.
fn rules() -> Vec<Rule> {
    vec![Rule {
        origin: "test".into(),
        endpoint_selector: LabelSelector {
            requirements: vec![Requirement {
                key: "app".into(),
                operator: Operator::In(vec!["client".into()]),
            }],
        },
        egress: vec![EgressRule {
            peers: vec![to_app("web"), to_app("db")],
            ports: vec![PortRule {
                ports: vec![PortProtocol {
                    port: 80,
                    end_port: 80,
                    protocol: Protocol::Tcp,
                }],
                dns: None,
            }],
        }],
        default_deny_egress: true,
        ..Default::default()
    }]
}

/// A datapath that applies a batch one change at a time and records, after each, whether
/// each probed flow (endpoint → address, TCP 80) is allowed.
#[derive(Default)]
struct Stepping {
    inner: MemoryDatapath,
    probes: Vec<(EndpointId, IpAddr)>,
    /// Per batch, per change: the probes' verdicts.
    trace: Vec<Vec<Vec<bool>>>,
    changes: Vec<Vec<DatapathChange>>,
}

impl Stepping {
    fn verdicts(&self) -> Vec<bool> {
        self.probes
            .iter()
            .map(|(ep, addr)| self.inner.allows(*ep, *addr, Protocol::Tcp, 80))
            .collect()
    }
}

impl Datapath for Stepping {
    fn apply(&mut self, changes: &[DatapathChange]) -> Result<(), DatapathError> {
        let mut steps = Vec::new();
        for change in changes {
            self.inner.apply(std::slice::from_ref(change))?;
            steps.push(self.verdicts());
        }
        self.trace.push(steps);
        self.changes.push(changes.to_vec());
        Ok(())
    }
}

fn cluster_cache() -> IpCache<Stepping> {
    let mut c = IpCache::new(Config::default(), Stepping::default());
    c.enable_cluster();
    c
}

#[test]
fn a_local_endpoint_runs_on_a_temporary_identity_and_switches_without_a_gap() {
    let mut c = cluster_cache();
    c.set_policy(rules()).unwrap();
    c.set_endpoints(vec![
        endpoint(1, "client", "10.0.0.1"),
        endpoint(2, "web", "10.0.0.2"),
    ])
    .unwrap();
    c.commit().unwrap();
    let web = host_prefix(ip("10.0.0.2"));
    let temp = c.identity_of(&web).unwrap();
    assert_eq!(temp.scope(), Some(Scope::Temporary));
    assert!(
        c.datapath()
            .inner
            .allows(EndpointId(1), ip("10.0.0.2"), Protocol::Tcp, 80)
    );
    assert_eq!(c.temporary_identities().len(), 2);
    c.datapath_mut().probes = vec![(EndpointId(1), ip("10.0.0.2"))];
    c.assign_cluster_identities([(labels("web"), Some(Identity(300)))])
        .unwrap();
    c.commit().unwrap();
    assert_eq!(c.identity_of(&web), Some(Identity(300)));
    assert_eq!(
        c.allocator().labels(temp),
        None,
        "the temporary number is freed"
    );
    let dp = c.datapath();
    let batch = dp.changes.last().unwrap();
    let kinds: Vec<&str> = batch
        .iter()
        .map(|ch| match ch {
            DatapathChange::PolicyUpsert { .. } => "policy+",
            DatapathChange::IpcacheUpsert { .. } => "ipcache",
            DatapathChange::IpcacheDelete { .. } => "ipcache-",
            DatapathChange::PolicyDelete { .. } => "policy-",
        })
        .collect();
    assert_eq!(kinds, ["policy+", "ipcache", "policy-"]);
    assert!(
        dp.trace.last().unwrap().iter().all(|v| v[0]),
        "allowed at every step: {:?}",
        dp.trace.last()
    );
    assert_eq!(c.cluster_identity_of(&labels("web")), Some(Identity(300)));
    // The number goes away (collected while this node was cut off): back to a temporary one.
    c.assign_cluster_identities([(labels("web"), None)])
        .unwrap();
    c.commit().unwrap();
    assert_eq!(c.identity_of(&web).unwrap().scope(), Some(Scope::Temporary));
    assert!(c.datapath().trace.last().unwrap().iter().all(|v| v[0]));
}

#[test]
fn remote_endpoints_need_a_global_identity_and_go_with_their_node() {
    let mut c = cluster_cache();
    c.set_policy(rules()).unwrap();
    c.set_endpoints(vec![endpoint(1, "client", "10.0.0.1")])
        .unwrap();
    let remote = [host_prefix(ip("10.1.0.5"))];
    c.upsert_remote_endpoint("n2/5", &remote, &labels("db"))
        .unwrap();
    c.commit().unwrap();
    assert_eq!(
        c.identity_of(&remote[0]),
        None,
        "no global number yet: not in the ipcache"
    );
    assert!(
        !c.datapath()
            .inner
            .allows(EndpointId(1), ip("10.1.0.5"), Protocol::Tcp, 80)
    );
    c.assign_cluster_identities([(labels("db"), Some(Identity(257)))])
        .unwrap();
    c.commit().unwrap();
    assert_eq!(c.identity_of(&remote[0]), Some(Identity(257)));
    assert!(
        c.datapath()
            .inner
            .allows(EndpointId(1), ip("10.1.0.5"), Protocol::Tcp, 80)
    );
    // Labels that the policy does not allow: denied.
    c.upsert_remote_endpoint("n2/6", &[host_prefix(ip("10.1.0.6"))], &labels("other"))
        .unwrap();
    c.assign_cluster_identities([(labels("other"), Some(Identity(258)))])
        .unwrap();
    c.commit().unwrap();
    assert_eq!(
        c.identity_of(&host_prefix(ip("10.1.0.6"))),
        Some(Identity(258))
    );
    assert!(
        !c.datapath()
            .inner
            .allows(EndpointId(1), ip("10.1.0.6"), Protocol::Tcp, 80)
    );
    assert_eq!(c.remote_endpoint_count(), 2);
    c.remove_remote_endpoint("n2/5").unwrap();
    c.commit().unwrap();
    assert_eq!(c.identity_of(&remote[0]), None);
    assert!(!c.datapath().inner.ipcache().contains_key(&remote[0]));
    assert_eq!(c.allocator().labels(Identity(257)), None);
}

#[test]
fn a_number_moving_to_another_label_set_needs_its_release_first() {
    let mut c = cluster_cache();
    c.set_endpoints(vec![endpoint(2, "web", "10.0.0.2")])
        .unwrap();
    // db's prefix sorts first: it is resolved before web lets go of 300.
    c.upsert_remote_endpoint("n2/1", &[host_prefix(ip("10.0.0.1"))], &labels("db"))
        .unwrap();
    c.assign_cluster_identities([(labels("web"), Some(Identity(300)))])
        .unwrap();
    c.commit().unwrap();
    // 300 now means db (web's was collected and reused): in one step it is refused …
    let err = c
        .assign_cluster_identities([(labels("web"), None), (labels("db"), Some(Identity(300)))])
        .unwrap_err();
    assert!(matches!(
        err,
        Error::IdentityTaken {
            identity: Identity(300)
        }
    ));
    // … in two steps it is what the engine does.
    let mut c = cluster_cache();
    c.set_endpoints(vec![endpoint(2, "web", "10.0.0.2")])
        .unwrap();
    c.upsert_remote_endpoint("n2/1", &[host_prefix(ip("10.1.0.1"))], &labels("db"))
        .unwrap();
    c.assign_cluster_identities([(labels("web"), Some(Identity(300)))])
        .unwrap();
    c.commit().unwrap();
    c.assign_cluster_identities([(labels("web"), None)])
        .unwrap();
    c.commit().unwrap();
    c.assign_cluster_identities([(labels("db"), Some(Identity(300)))])
        .unwrap();
    c.commit().unwrap();
    assert_eq!(
        c.identity_of(&host_prefix(ip("10.1.0.1"))),
        Some(Identity(300))
    );
    assert_eq!(
        c.identity_of(&host_prefix(ip("10.0.0.2"))).unwrap().scope(),
        Some(Scope::Temporary)
    );
    assert!(matches!(
        c.assign_cluster_identities([(labels("db"), Some(Identity(70_000)))]),
        Err(Error::NotClusterIdentity { .. })
    ));
    // A number out of range is refused alone: the other changes of the batch are made.
    c.assign_cluster_identities([(labels("web"), Some(Identity(301)))])
        .unwrap();
    c.commit().unwrap();
    assert!(matches!(
        c.assign_cluster_identities([
            (labels("db"), Some(Identity(70_000))),
            (labels("web"), None),
            (labels("web"), Some(Identity(302))),
        ]),
        Err(Error::NotClusterIdentity { .. })
    ));
    c.commit().unwrap();
    assert_eq!(
        c.identity_of(&host_prefix(ip("10.0.0.2"))),
        Some(Identity(302))
    );
    assert_eq!(
        c.identity_of(&host_prefix(ip("10.1.0.1"))),
        Some(Identity(300))
    );
}

#[test]
fn a_single_node_never_sees_cluster_numbers() {
    let mut c = IpCache::new(Config::default(), MemoryDatapath::default());
    c.set_endpoints(vec![endpoint(2, "web", "10.0.0.2")])
        .unwrap();
    c.assign_cluster_identities([(labels("web"), Some(Identity(999)))])
        .unwrap();
    c.upsert_remote_endpoint("n2/1", &[host_prefix(ip("10.1.0.1"))], &labels("db"))
        .unwrap();
    c.commit().unwrap();
    assert_eq!(
        c.identity_of(&host_prefix(ip("10.0.0.2"))),
        Some(Identity(256))
    );
    assert_eq!(c.identity_of(&host_prefix(ip("10.1.0.1"))), None);
    assert!(!c.is_cluster());
}

const APPS: [&str; 4] = ["web", "db", "client", "other"];

#[derive(Debug, Clone)]
enum Op {
    /// Local endpoint slot `slot` (0..4, address 10.0.0.1+slot) gets app `app` (or goes).
    Local { slot: u8, app: Option<u8> },
    /// Remote endpoint slot (address 10.1.0.1+slot).
    Remote { slot: u8, app: Option<u8> },
    /// The cluster (un)assigns a number to app `app`: `Some(k)` → 300 + k.
    Assign { app: u8, number: Option<u8> },
}

fn op() -> impl Strategy<Value = Op> {
    let app = proptest::option::weighted(0.8, 0u8..4);
    prop_oneof![
        (0u8..4, app.clone()).prop_map(|(slot, app)| Op::Local { slot, app }),
        (0u8..4, app).prop_map(|(slot, app)| Op::Remote { slot, app }),
        (0u8..4, proptest::option::weighted(0.8, 0u8..6))
            .prop_map(|(app, number)| Op::Assign { app, number }),
    ]
}

proptest! {
    /// Against an oracle: every endpoint prefix has the assigned number of its label set, or —
    /// local only — a temporary one; remote ones without a number are not in the ipcache; the
    /// client's policy allows exactly web and db; and a flow allowed before and after a change
    /// of numbers is allowed at every step of the batches in between.
    #[test]
    fn numbers_follow_the_cluster_and_switches_never_drop_a_flow(ops in proptest::collection::vec(op(), 1..60)) {
        let mut c = cluster_cache();
        c.set_policy(rules()).unwrap();
        let mut local: BTreeMap<u8, u8> = BTreeMap::new();
        let mut remote: BTreeMap<u8, u8> = BTreeMap::new();
        // The cluster's table: app → number, numbers unique.
        let mut table: BTreeMap<u8, u32> = BTreeMap::new();
        let client = EndpointId(100);
        let endpoints = |local: &BTreeMap<u8, u8>| {
            let mut eps = vec![endpoint(100, "client", "10.9.9.9")];
            eps.extend(local.iter().map(|(slot, app)| {
                endpoint(u16::from(*slot) + 1, APPS[usize::from(*app)], &format!("10.0.0.{}", slot + 1))
            }));
            eps
        };
        c.set_endpoints(endpoints(&local)).unwrap();
        c.commit().unwrap();
        let probes: Vec<(EndpointId, IpAddr)> = (0..4u8)
            .flat_map(|s| [ip(&format!("10.0.0.{}", s + 1)), ip(&format!("10.1.0.{}", s + 1))])
            .map(|a| (client, a))
            .collect();
        c.datapath_mut().probes = probes.clone();
        for op in ops {
            let before = c.datapath().verdicts();
            let batches_before = c.datapath().trace.len();
            let renumbering = matches!(op, Op::Assign { .. });
            match op {
                Op::Local { slot, app } => {
                    match app { Some(a) => { local.insert(slot, a); } None => { local.remove(&slot); } }
                    c.set_endpoints(endpoints(&local)).unwrap();
                    c.commit().unwrap();
                }
                Op::Remote { slot, app } => {
                    let name = format!("n2/{slot}");
                    match app {
                        Some(a) => {
                            remote.insert(slot, a);
                            c.upsert_remote_endpoint(&name, &[host_prefix(ip(&format!("10.1.0.{}", slot + 1)))], &labels(APPS[usize::from(a)])).unwrap();
                        }
                        None => {
                            remote.remove(&slot);
                            c.remove_remote_endpoint(&name).unwrap();
                        }
                    }
                    c.commit().unwrap();
                }
                Op::Assign { app, number } => {
                    let number = number.map(|k| 300 + u32::from(k));
                    // A number another app holds is taken from it first (two commits).
                    if let Some(n) = number
                        && let Some((&holder, _)) = table.iter().find(|(a, m)| **m == n && **a != app)
                    {
                        table.remove(&holder);
                        c.assign_cluster_identities([(labels(APPS[usize::from(holder)]), None)]).unwrap();
                        c.commit().unwrap();
                    }
                    match number { Some(n) => { table.insert(app, n); } None => { table.remove(&app); } }
                    c.assign_cluster_identities([(labels(APPS[usize::from(app)]), number.map(Identity))]).unwrap();
                    c.commit().unwrap();
                }
            }
            // The oracle.
            for (slot, app) in &local {
                let id = c.identity_of(&host_prefix(ip(&format!("10.0.0.{}", slot + 1)))).unwrap();
                match table.get(app) {
                    Some(n) => prop_assert_eq!(id, Identity(*n)),
                    None => prop_assert_eq!(id.scope(), Some(Scope::Temporary)),
                }
            }
            for (slot, app) in &remote {
                let prefix: IpNet = host_prefix(ip(&format!("10.1.0.{}", slot + 1)));
                prop_assert_eq!(c.identity_of(&prefix), table.get(app).map(|n| Identity(*n)));
            }
            let after = c.datapath().verdicts();
            for (i, (ep, addr)) in probes.iter().enumerate() {
                let slot_app = |net: u8| -> Option<u8> {
                    let s = addr.to_string();
                    let last: u8 = s.rsplit('.').next().unwrap().parse().unwrap();
                    let map = if net == 0 { &local } else { &remote };
                    map.get(&(last - 1)).copied()
                };
                let is_remote = addr.to_string().starts_with("10.1.");
                let app = slot_app(u8::from(is_remote));
                let numbered = app.is_some_and(|a| !is_remote || table.contains_key(&a));
                let expected = numbered && app.is_some_and(|a| APPS[usize::from(a)] == "web" || APPS[usize::from(a)] == "db");
                prop_assert_eq!(after[i], expected, "{:?} → {}", ep, addr);
                if renumbering && before[i] && after[i] {
                    for batch in &c.datapath().trace[batches_before..] {
                        for step in batch {
                            prop_assert!(step[i], "{:?} → {} dropped during a switch", ep, addr);
                        }
                    }
                }
            }
            let temporaries: BTreeSet<Identity> = c.temporary_identities().into_iter().map(|(id, _)| id).collect();
            // The client (app 2) is local too.
            let wanted: BTreeSet<u8> = local.values().chain([&2]).filter(|a| !table.contains_key(*a)).copied().collect();
            prop_assert_eq!(temporaries.len(), wanted.len());
        }
    }
}
