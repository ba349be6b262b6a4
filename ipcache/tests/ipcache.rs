//! Behaviour of the IpCache through its public API, on the scenarios of the FQDN-identities
//! design (shared/design/000).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use fqdnd_ipcache::policy::{
    EgressRule, LabelSelector, Operator, PeerSelector, PortProtocol, PortRule, Protocol,
    Requirement, Rule,
};
use fqdnd_ipcache::{
    Config, Datapath, DatapathChange, Endpoint, EndpointId, EndpointLabel, Error, Identity,
    IpCache, LabelSet, MemoryDatapath, OwnerId, ResourceOwner, host_prefix,
};
use ipnet::IpNet;

const NOW: Duration = Duration::from_secs(1);

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn cache() -> IpCache<MemoryDatapath> {
    IpCache::new(Config::default(), MemoryDatapath::default())
}

/// What the NameManager does for `name` → `addr` with the given selector keys.
fn learn(
    c: &mut IpCache<MemoryDatapath>,
    name: &str,
    addr: &str,
    selectors: &[&str],
) -> Result<(), Error> {
    let labels: LabelSet = selectors.iter().map(|s| c.fqdn_label(s)).collect();
    let owner = name_owner(c, name);
    c.upsert_metadata(host_prefix(ip(addr)), owner, Arc::new(labels), NOW)
}

/// The NameManager's owner for `name`, registered on first use (as the NameManager does once
/// per name).
fn name_owner<D: Datapath>(c: &mut IpCache<D>, name: &str) -> OwnerId {
    let owner = ResourceOwner::name_manager(Arc::from(name));
    match c.find_owners(&owner).first() {
        Some(id) => *id,
        None => c.add_owner(owner).unwrap(),
    }
}

fn forget(c: &mut IpCache<MemoryDatapath>, name: &str, addr: &str) {
    let owner = name_owner(c, name);
    c.remove_metadata(host_prefix(ip(addr)), owner).unwrap();
}

fn id(c: &IpCache<MemoryDatapath>, addr: &str) -> Identity {
    c.identity_of(&host_prefix(ip(addr))).unwrap()
}

fn endpoint(id: u16, app: &str, addr: &str) -> Endpoint {
    Endpoint {
        id: EndpointId(id),
        name: app.into(),
        addresses: vec![host_prefix(ip(addr))],
        labels: vec![EndpointLabel {
            source: "k8s".into(),
            key: "app".into(),
            value: app.into(),
        }],
    }
}

fn app(value: &str) -> LabelSelector {
    LabelSelector {
        requirements: vec![Requirement {
            key: "app".into(),
            operator: Operator::In(vec![value.into()]),
        }],
    }
}

fn tcp(port: u16) -> Vec<PortRule> {
    vec![PortRule {
        ports: vec![PortProtocol {
            port,
            end_port: port,
            protocol: Protocol::Tcp,
        }],
        dns: None,
    }]
}

fn rule(selector: LabelSelector, peers: Vec<PeerSelector>, ports: Vec<PortRule>) -> Rule {
    Rule {
        origin: "test".into(),
        endpoint_selector: selector,
        egress: vec![EgressRule { peers, ports }],
        default_deny_egress: true,
        ..Default::default()
    }
}

fn fqdn(key: &str) -> PeerSelector {
    PeerSelector::Fqdn(key.into())
}

#[test]
fn overlapping_selectors_give_one_identity_per_label_set() {
    // CFP: *.cilium.io and www.cilium.io; www → IP1, IP2; dev → IP2, IP3.
    let mut c = cache();
    learn(
        &mut c,
        "www.cilium.io.",
        "192.0.2.1",
        &["*.cilium.io.", "www.cilium.io."],
    )
    .unwrap();
    learn(
        &mut c,
        "www.cilium.io.",
        "192.0.2.2",
        &["*.cilium.io.", "www.cilium.io."],
    )
    .unwrap();
    learn(&mut c, "dev.cilium.io.", "192.0.2.2", &["*.cilium.io."]).unwrap();
    learn(&mut c, "dev.cilium.io.", "192.0.2.3", &["*.cilium.io."]).unwrap();
    c.commit().unwrap();
    assert_eq!(id(&c, "192.0.2.1"), id(&c, "192.0.2.2"));
    assert_ne!(id(&c, "192.0.2.1"), id(&c, "192.0.2.3"));
    assert_eq!(c.allocator().len(), 2);
    assert_eq!(
        c.labels_of(id(&c, "192.0.2.1")).unwrap(),
        "reserved:world-ipv4,fqdn:*.cilium.io.,fqdn:www.cilium.io."
    );
    // Owners are independent: dropping www's claim on IP2 leaves dev's label.
    forget(&mut c, "www.cilium.io.", "192.0.2.2");
    assert_eq!(id(&c, "192.0.2.2"), id(&c, "192.0.2.3"));
    forget(&mut c, "dev.cilium.io.", "192.0.2.2");
    assert_eq!(c.identity_of(&host_prefix(ip("192.0.2.2"))), None);
    c.commit().unwrap();
    assert_eq!(
        c.datapath().identity_of(ip("192.0.2.2")),
        Identity::WORLD_IPV4
    );
}

#[test]
fn many_ips_of_one_name_share_one_identity() {
    let mut c = cache();
    for i in 0..500u32 {
        let addr = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)).to_string();
        learn(
            &mut c,
            "bucket.s3.amazonaws.com.",
            &addr,
            &["*.s3.amazonaws.com."],
        )
        .unwrap();
    }
    c.commit().unwrap();
    assert_eq!(c.allocator().len(), 1);
    assert_eq!(c.datapath().ipcache().len(), 500);
}

#[test]
fn per_prefix_mode_gives_each_selected_ip_its_own_identity_still_selected_by_fqdn_label() {
    let mut c = IpCache::new(
        Config {
            identity_per_prefix: true,
            ..Config::default()
        },
        MemoryDatapath::default(),
    );
    c.set_endpoints(vec![endpoint(1, "web", "10.0.0.1")])
        .unwrap();
    c.set_policy(vec![rule(
        app("web"),
        vec![fqdn("*.s3.amazonaws.com.")],
        tcp(443),
    )])
    .unwrap();
    c.commit().unwrap();
    let before = c.allocator().len();
    for i in 0..20u32 {
        let addr = IpAddr::from(std::net::Ipv4Addr::from(0x0a01_0000 + i)).to_string();
        learn(
            &mut c,
            "bucket.s3.amazonaws.com.",
            &addr,
            &["*.s3.amazonaws.com."],
        )
        .unwrap();
    }
    c.commit().unwrap();
    assert_eq!(
        c.allocator().len(),
        before + 20,
        "one identity per selected IP"
    );
    let first = id(&c, "10.1.0.0");
    assert_ne!(first, id(&c, "10.1.0.1"));
    assert_eq!(
        c.labels_of(first).unwrap(),
        "reserved:world-ipv4,fqdn:*.s3.amazonaws.com.,cidr:10.1.0.0/32"
    );
    // The selector selects every one of them, and policy allows each.
    let selected = c.selected(&fqdn("*.s3.amazonaws.com."));
    for i in 0..20u32 {
        let addr = IpAddr::from(std::net::Ipv4Addr::from(0x0a01_0000 + i));
        assert!(selected.contains(&id(&c, &addr.to_string())));
        assert!(c.datapath().allows(EndpointId(1), addr, Protocol::Tcp, 443));
    }
    // Forgetting an IP frees its identity.
    forget(&mut c, "bucket.s3.amazonaws.com.", "10.1.0.0");
    c.commit().unwrap();
    assert_eq!(c.allocator().len(), before + 19);
}

#[test]
fn cidr_labels_flow_down_and_only_the_longest_is_kept() {
    let mut c = cache();
    c.set_endpoints(vec![endpoint(1, "web", "10.1.0.1")])
        .unwrap();
    learn(&mut c, "www.cilium.io.", "52.58.254.253", &["*.cilium.io."]).unwrap();
    c.set_policy(vec![rule(
        LabelSelector::default(),
        vec![
            PeerSelector::Cidr {
                cidr: net("52.58.0.0/16"),
                except: vec![],
            },
            PeerSelector::Cidr {
                cidr: net("52.58.254.0/24"),
                except: vec![],
            },
        ],
        vec![],
    )])
    .unwrap();
    c.commit().unwrap();
    assert_eq!(
        c.labels_of(id(&c, "52.58.254.253")).unwrap(),
        "reserved:world-ipv4,fqdn:*.cilium.io.,cidr:52.58.254.0/24"
    );
    // Both CIDR selectors select the FQDN IP's identity; the /16 also selects the /24's.
    let ip_id = id(&c, "52.58.254.253");
    let wide = c.selected(&PeerSelector::Cidr {
        cidr: net("52.58.0.0/16"),
        except: vec![],
    });
    let narrow = c.selected(&PeerSelector::Cidr {
        cidr: net("52.58.254.0/24"),
        except: vec![],
    });
    assert!(wide.contains(&ip_id) && narrow.contains(&ip_id));
    assert!(wide.contains(&c.identity_of(&net("52.58.254.0/24")).unwrap()));
    assert!(!narrow.contains(&c.identity_of(&net("52.58.0.0/16")).unwrap()));
    // Removing the /24 selector re-labels only what lies under it.
    c.set_policy(vec![rule(
        LabelSelector::default(),
        vec![PeerSelector::Cidr {
            cidr: net("52.58.0.0/16"),
            except: vec![],
        }],
        vec![],
    )])
    .unwrap();
    assert_eq!(
        c.labels_of(id(&c, "52.58.254.253")).unwrap(),
        "reserved:world-ipv4,fqdn:*.cilium.io.,cidr:52.58.0.0/16"
    );
    assert_eq!(c.identity_of(&net("52.58.254.0/24")), None);
}

#[test]
fn except_blocks_are_carved_out() {
    let mut c = cache();
    c.set_endpoints(vec![endpoint(1, "web", "10.1.0.1")])
        .unwrap();
    c.set_policy(vec![rule(
        app("web"),
        vec![PeerSelector::Cidr {
            cidr: net("192.0.2.0/24"),
            except: vec![net("192.0.2.128/25")],
        }],
        tcp(443),
    )])
    .unwrap();
    c.commit().unwrap();
    let dp = c.datapath();
    assert!(dp.allows(EndpointId(1), ip("192.0.2.1"), Protocol::Tcp, 443));
    assert!(!dp.allows(EndpointId(1), ip("192.0.2.200"), Protocol::Tcp, 443));
    assert!(!dp.allows(EndpointId(1), ip("192.0.2.1"), Protocol::Tcp, 80));
}

#[test]
fn fqdn_policy_allows_learned_ips_only_on_allowed_ports() {
    let mut c = cache();
    c.set_endpoints(vec![
        endpoint(1, "web", "10.1.0.1"),
        endpoint(2, "batch", "10.1.0.2"),
    ])
    .unwrap();
    c.set_policy(vec![rule(
        app("web"),
        vec![fqdn("api.github.com.")],
        tcp(443),
    )])
    .unwrap();
    c.commit().unwrap();
    let web = EndpointId(1);
    assert!(
        !c.datapath()
            .allows(web, ip("140.82.112.5"), Protocol::Tcp, 443)
    );
    // Pre-allocation: the selector's identity exists before any answer.
    let identities_before = c.allocator().len();
    learn(
        &mut c,
        "api.github.com.",
        "140.82.112.5",
        &["api.github.com."],
    )
    .unwrap();
    c.commit().unwrap();
    assert_eq!(
        c.allocator().len(),
        identities_before,
        "a new IP for one selector allocates nothing"
    );
    assert!(
        c.datapath()
            .allows(web, ip("140.82.112.5"), Protocol::Tcp, 443)
    );
    assert!(
        !c.datapath()
            .allows(web, ip("140.82.112.5"), Protocol::Tcp, 80)
    );
    assert!(
        !c.datapath()
            .allows(web, ip("140.82.112.6"), Protocol::Tcp, 443)
    );
    // batch is under no policy: allow all.
    assert_eq!(c.endpoint_enforcing(EndpointId(2)), Some(false));
    assert!(
        c.datapath()
            .allows(EndpointId(2), ip("1.1.1.1"), Protocol::Udp, 53)
    );
    // Dropping the rule removes access.
    c.set_policy(vec![]).unwrap();
    c.commit().unwrap();
    assert_eq!(c.endpoint_enforcing(web), Some(false));
}

#[test]
fn batches_put_policy_before_the_ipcache_flip() {
    let mut c = cache();
    c.set_endpoints(vec![endpoint(1, "web", "10.1.0.1")])
        .unwrap();
    c.set_policy(vec![rule(
        app("web"),
        vec![fqdn("a.example."), fqdn("b.example.")],
        tcp(443),
    )])
    .unwrap();
    c.commit().unwrap();
    // An IP selected by both selectors needs a new identity {a, b}: its policy entry must
    // reach the datapath before the IP flips to it.
    struct Recorder(Vec<DatapathChange>);
    impl Datapath for Recorder {
        fn apply(
            &mut self,
            changes: &[DatapathChange],
        ) -> Result<(), fqdnd_ipcache::DatapathError> {
            self.0.extend_from_slice(changes);
            Ok(())
        }
    }
    let mut r = IpCache::new(Config::default(), Recorder(Vec::new()));
    r.set_endpoints(vec![endpoint(1, "web", "10.1.0.1")])
        .unwrap();
    r.set_policy(vec![rule(
        app("web"),
        vec![fqdn("a.example."), fqdn("b.example.")],
        tcp(443),
    )])
    .unwrap();
    r.commit().unwrap();
    r.datapath_mut().0.clear();
    let labels: LabelSet = ["a.example.", "b.example."]
        .iter()
        .map(|k| r.fqdn_label(k))
        .collect();
    let owner = name_owner(&mut r, "x.example.");
    r.upsert_metadata(host_prefix(ip("192.0.2.9")), owner, Arc::new(labels), NOW)
        .unwrap();
    r.commit().unwrap();
    let changes = &r.datapath().0;
    let flip = changes
        .iter()
        .position(|c| matches!(c, DatapathChange::IpcacheUpsert { .. }))
        .unwrap();
    let new_id = match changes[flip] {
        DatapathChange::IpcacheUpsert { identity, .. } => identity,
        _ => unreachable!(),
    };
    let policy = changes
        .iter()
        .position(
            |c| matches!(c, DatapathChange::PolicyUpsert { key, .. } if key.identity == new_id),
        )
        .unwrap();
    assert!(policy < flip, "{changes:?}");
}

#[test]
fn identity_breaker_fails_closed_and_keeps_state() {
    let mut c = IpCache::new(
        Config {
            max_fqdn_identities: 2,
            preallocate_fqdn_identities: false,
            identity_per_prefix: false,
            datapath_prefixes: None,
        },
        MemoryDatapath::default(),
    );
    learn(&mut c, "a.", "192.0.2.1", &["s1."]).unwrap();
    learn(&mut c, "b.", "192.0.2.2", &["s2."]).unwrap();
    // A third distinct label set would be a third DNS identity.
    let err = learn(&mut c, "c.", "192.0.2.3", &["s3."]).unwrap_err();
    assert!(matches!(err, Error::BreakerTripped { limit: 2, .. }));
    assert_eq!(c.stats().breaker_trips, 1);
    assert_eq!(c.identity_of(&host_prefix(ip("192.0.2.3"))), None);
    // Relabelling an existing IP into a new set is rejected too, leaving its old identity.
    let before = id(&c, "192.0.2.1");
    assert!(learn(&mut c, "c.", "192.0.2.1", &["s3."]).is_err());
    assert_eq!(id(&c, "192.0.2.1"), before);
    // Existing label sets still work.
    learn(&mut c, "a.", "192.0.2.4", &["s1."]).unwrap();
    assert_eq!(id(&c, "192.0.2.4"), before);
}

#[test]
fn to_endpoints_selects_endpoint_identities() {
    let mut c = cache();
    c.set_endpoints(vec![
        endpoint(1, "web", "10.1.0.1"),
        endpoint(2, "db", "10.1.0.2"),
    ])
    .unwrap();
    c.set_policy(vec![rule(
        app("web"),
        vec![PeerSelector::Endpoints(app("db"))],
        tcp(5432),
    )])
    .unwrap();
    c.commit().unwrap();
    let dp = c.datapath();
    assert!(dp.allows(EndpointId(1), ip("10.1.0.2"), Protocol::Tcp, 5432));
    assert!(!dp.allows(EndpointId(1), ip("10.1.0.1"), Protocol::Tcp, 5432));
    assert!(Identity::scope(id(&c, "10.1.0.2")) == Some(fqdnd_ipcache::Scope::Cluster));
    // Re-declaring the same endpoints keeps their identities.
    let before = id(&c, "10.1.0.2");
    c.set_endpoints(vec![
        endpoint(1, "web", "10.1.0.1"),
        endpoint(2, "db", "10.1.0.2"),
    ])
    .unwrap();
    assert_eq!(id(&c, "10.1.0.2"), before);
}

#[test]
fn zero_prefix_cidr_selects_the_world() {
    let mut c = cache();
    c.set_endpoints(vec![endpoint(1, "web", "10.1.0.1")])
        .unwrap();
    c.set_policy(vec![rule(
        app("web"),
        vec![PeerSelector::Cidr {
            cidr: net("0.0.0.0/0"),
            except: vec![],
        }],
        vec![],
    )])
    .unwrap();
    c.commit().unwrap();
    assert!(
        c.datapath()
            .allows(EndpointId(1), ip("8.8.8.8"), Protocol::Udp, 53)
    );
    assert!(
        !c.datapath()
            .allows(EndpointId(1), ip("2001:db8::1"), Protocol::Udp, 53)
    );
}

#[test]
fn a_rule_without_egress_entries_still_denies_by_default() {
    let mut c = cache();
    c.set_endpoints(vec![endpoint(1, "web", "10.1.0.1")])
        .unwrap();
    c.set_policy(vec![Rule {
        origin: "egress: [{}]".into(),
        endpoint_selector: app("web"),
        egress: vec![],
        default_deny_egress: true,
        ..Default::default()
    }])
    .unwrap();
    c.commit().unwrap();
    assert_eq!(c.endpoint_enforcing(EndpointId(1)), Some(true));
    assert!(
        !c.datapath()
            .allows(EndpointId(1), ip("192.0.2.1"), Protocol::Tcp, 443)
    );
    // enableDefaultDeny.egress: false adds nothing and denies nothing.
    c.set_policy(vec![Rule {
        origin: "no default deny".into(),
        endpoint_selector: app("web"),
        egress: vec![],
        default_deny_egress: false,
        ..Default::default()
    }])
    .unwrap();
    c.commit().unwrap();
    assert!(
        c.datapath()
            .allows(EndpointId(1), ip("192.0.2.1"), Protocol::Tcp, 443)
    );
}

#[test]
fn a_restore_gives_every_label_set_its_old_number() {
    // Before: three label sets learned in one order, with a freed number in between.
    let mut before = cache();
    learn(&mut before, "a.test.", "192.0.2.1", &["a.test."]).unwrap();
    learn(&mut before, "gone.test.", "192.0.2.9", &["gone.test."]).unwrap();
    learn(&mut before, "b.test.", "192.0.2.2", &["b.test."]).unwrap();
    learn(
        &mut before,
        "ab.test.",
        "192.0.2.3",
        &["a.test.", "b.test."],
    )
    .unwrap();
    forget(&mut before, "gone.test.", "192.0.2.9");
    before.commit().unwrap();
    let table = before.identities_canonical();
    let old: Vec<Identity> = ["192.0.2.1", "192.0.2.2", "192.0.2.3"]
        .iter()
        .map(|a| id(&before, a))
        .collect();

    // After: labels interned in another order, and a newcomer allocated during the restore.
    let mut after = cache();
    after.restore_identities(table);
    learn(&mut after, "new.test.", "198.51.100.1", &["new.test."]).unwrap();
    learn(&mut after, "ab.test.", "192.0.2.3", &["b.test.", "a.test."]).unwrap();
    learn(&mut after, "b.test.", "192.0.2.2", &["b.test."]).unwrap();
    learn(&mut after, "a.test.", "192.0.2.1", &["a.test."]).unwrap();
    // A second prefix with a label set already restored takes the same number.
    learn(&mut after, "a2.test.", "192.0.2.4", &["a.test."]).unwrap();
    after.commit().unwrap();
    assert_eq!(id(&after, "192.0.2.4"), id(&after, "192.0.2.1"));
    let new: Vec<Identity> = ["192.0.2.1", "192.0.2.2", "192.0.2.3"]
        .iter()
        .map(|a| id(&after, a))
        .collect();
    assert_eq!(old, new);
    // The newcomer took none of the restored numbers.
    assert!(!old.contains(&id(&after, "198.51.100.1")));
    // Every restored number came back (the freed set was not in the table).
    assert_eq!(after.finish_restore(), 0);
}

#[test]
fn a_full_datapath_ipcache_rejects_new_prefixes_before_anything_changes() {
    let mut c = IpCache::new(
        Config {
            datapath_prefixes: Some(3),
            ..Config::default()
        },
        MemoryDatapath::default(),
    );
    for i in 1..=3 {
        learn(&mut c, "a.test.", &format!("192.0.2.{i}"), &["*.test."]).unwrap();
    }
    c.commit().unwrap();
    assert_eq!(c.datapath_prefixes(), [3, 0]);
    let full = learn(&mut c, "b.test.", "192.0.2.9", &["*.test."]);
    assert!(
        matches!(full, Err(Error::DatapathFull { limit: 3, .. })),
        "{full:?}"
    );
    // Nothing changed: no metadata, no identity, nothing for the datapath.
    assert!(c.identity_of(&host_prefix(ip("192.0.2.9"))).is_none());
    assert_eq!(c.prefix_count(), 3);
    c.commit().unwrap();
    assert_eq!(c.datapath().ipcache().len(), 3);
    assert_eq!(c.stats().datapath_full, 1);
    // A known prefix may still change its labels; the other family has its own room.
    learn(&mut c, "b.test.", "192.0.2.1", &["*.test.", "b.test."]).unwrap();
    learn(&mut c, "v6.test.", "2001:db8::1", &["*.test."]).unwrap();
    // Room comes back when a prefix goes.
    forget(&mut c, "a.test.", "192.0.2.3");
    assert_eq!(c.datapath_prefixes(), [2, 1]);
    learn(&mut c, "b.test.", "192.0.2.9", &["*.test."]).unwrap();
    assert_eq!(c.datapath_prefixes(), [3, 1]);
}

#[test]
fn many_removals_at_once_end_where_one_by_one_does() {
    // Names share IPs (an S3-like pool), with two label sets; some IPs also carry a policy
    // CIDR. Removing most claims in one pass and one by one must leave the same state.
    let build = || {
        let mut c = cache();
        c.set_policy(vec![rule(
            app("web"),
            vec![
                fqdn("*.a.example."),
                fqdn("*.b.example."),
                PeerSelector::Cidr {
                    cidr: net("192.0.2.0/28"),
                    except: vec![],
                },
            ],
            tcp(443),
        )])
        .unwrap();
        c.set_endpoints(vec![endpoint(1, "web", "10.1.0.1")])
            .unwrap();
        for n in 0..40u32 {
            let selectors: &[&str] = if n % 3 == 0 {
                &["*.a.example."]
            } else {
                &["*.a.example.", "*.b.example."]
            };
            for k in 0..6u32 {
                let addr = format!("192.0.2.{}", (n * 7 + k * 13) % 60);
                learn(&mut c, &format!("n{n}.a.example."), &addr, selectors).unwrap();
            }
        }
        c.commit().unwrap();
        c
    };
    let mut claims: Vec<(IpNet, OwnerId)> = Vec::new();
    let mut one = build();
    for n in 0..40u32 {
        for k in 0..6u32 {
            if (n + k) % 5 != 0 {
                let addr = format!("192.0.2.{}", (n * 7 + k * 13) % 60);
                let owner = name_owner(&mut one, &format!("n{n}.a.example."));
                claims.push((host_prefix(ip(&addr)), owner));
            }
        }
    }
    claims.sort();
    claims.dedup();
    let mut many = build();
    for (prefix, owner) in &claims {
        one.remove_metadata(*prefix, *owner).unwrap();
    }
    many.remove_metadata_many(claims.iter().copied(), claims.len())
        .unwrap();
    one.commit().unwrap();
    many.commit().unwrap();
    let state = |c: &IpCache<MemoryDatapath>| {
        let prefixes: Vec<_> = c.prefixes().collect();
        let mut identities = c.identities_canonical();
        identities.sort();
        let policy = c.datapath().policy(EndpointId(1)).cloned();
        (prefixes, identities, c.datapath().ipcache(), policy)
    };
    assert_eq!(state(&one), state(&many));
    assert!(one.prefix_count() > 0 && one.prefix_count() < 60);
}

/// The node's own addresses get the host identity (reserved 1, `reserved:host`) in the
/// datapath; an endpoint's address stays the endpoint's, and a learned name's address that is
/// the node's is the host. With the datapath's room used up, an address that needs a new
/// entry is left out until room comes back; one that has an entry already becomes the host.
#[test]
fn the_node_addresses_are_the_host_identity_within_the_datapaths_room() {
    let mut c = IpCache::new(
        Config {
            datapath_prefixes: Some(3),
            ..Config::default()
        },
        MemoryDatapath::default(),
    );
    c.set_endpoints(vec![endpoint(1, "a", "10.0.0.1")]).unwrap();
    learn(&mut c, "a.test.", "192.0.2.1", &["*.test."]).unwrap();
    assert!(
        c.set_host_addresses([ip("10.0.0.1"), ip("10.0.0.254"), ip("192.0.2.1")])
            .unwrap()
    );
    c.commit().unwrap();
    let of = |c: &IpCache<MemoryDatapath>, a: &str| c.identity_of(&host_prefix(ip(a)));
    assert_eq!(of(&c, "10.0.0.254"), Some(Identity::HOST));
    assert_eq!(
        of(&c, "192.0.2.1"),
        Some(Identity::HOST),
        "the node's, learned or not"
    );
    assert!(
        of(&c, "10.0.0.1").is_some_and(|id| id != Identity::HOST),
        "the endpoint's"
    );
    assert_eq!(
        c.labels_of(Identity::HOST).as_deref(),
        Some("reserved:host")
    );
    assert_eq!(c.datapath_prefixes(), [3, 0]);
    // Full: a new node address waits; the other family has its room.
    assert!(
        c.set_host_addresses([
            ip("10.0.0.254"),
            ip("192.0.2.1"),
            ip("10.0.0.253"),
            ip("fd00::1")
        ])
        .unwrap()
    );
    c.commit().unwrap();
    assert_eq!(of(&c, "10.0.0.253"), None);
    assert_eq!(of(&c, "fd00::1"), Some(Identity::HOST));
    assert_eq!(c.datapath().ipcache().len(), 4);
    // An address gone gives its room to the waiting one.
    c.set_host_addresses([ip("192.0.2.1"), ip("10.0.0.253"), ip("fd00::1")])
        .unwrap();
    c.commit().unwrap();
    assert_eq!(of(&c, "10.0.0.254"), None);
    assert_eq!(of(&c, "10.0.0.253"), Some(Identity::HOST));
    // The learned name's address stays known (its own identity) once the node lets it go.
    c.set_host_addresses([ip("10.0.0.253")]).unwrap();
    c.commit().unwrap();
    assert!(of(&c, "192.0.2.1").is_some_and(|id| id != Identity::HOST && c.has_fqdn_label(id)));
    assert_eq!(c.host_addresses().collect::<Vec<_>>(), [ip("10.0.0.253")]);
}

/// Cluster mode: another node's own addresses are `reserved:remote-node` (6), below this
/// node's host claim and an endpoint's, whichever came first; a learned name's address that a
/// node registered is the node's (as the host's is). On a single node they change nothing.
#[test]
fn other_nodes_addresses_are_the_remote_node_below_the_host_and_endpoints() {
    let of = |c: &IpCache<MemoryDatapath>, a: &str| c.identity_of(&host_prefix(ip(a)));
    let mut single = cache();
    single.upsert_remote_node("n2", &[ip("10.1.0.1")]).unwrap();
    assert_eq!(
        of(&single, "10.1.0.1"),
        None,
        "no remote node on a single node"
    );

    let mut c = cache();
    c.enable_cluster();
    c.set_endpoints(vec![endpoint(1, "a", "10.0.0.1")]).unwrap();
    learn(&mut c, "a.test.", "192.0.2.1", &["*.test."]).unwrap();
    c.upsert_remote_node(
        "n2",
        &[
            ip("10.1.0.1"),
            ip("10.0.0.1"),
            ip("10.0.0.254"),
            ip("192.0.2.1"),
        ],
    )
    .unwrap();
    c.commit().unwrap();
    assert_eq!(of(&c, "10.1.0.1"), Some(Identity::REMOTE_NODE));
    assert_eq!(
        of(&c, "192.0.2.1"),
        Some(Identity::REMOTE_NODE),
        "the node's, learned or not"
    );
    assert!(
        of(&c, "10.0.0.1").is_some_and(|id| id != Identity::REMOTE_NODE),
        "the endpoint's"
    );
    assert_eq!(
        c.labels_of(Identity::REMOTE_NODE).as_deref(),
        Some("reserved:remote-node")
    );
    assert_eq!(
        c.datapath().identity_of(ip("10.1.0.1")),
        Identity::REMOTE_NODE
    );
    // This node claims an address after the remote node did: the host's; let go, the remote
    // node's again.
    c.set_host_addresses([ip("10.0.0.254")]).unwrap();
    c.commit().unwrap();
    assert_eq!(of(&c, "10.0.0.254"), Some(Identity::HOST));
    c.set_host_addresses([]).unwrap();
    c.commit().unwrap();
    assert_eq!(of(&c, "10.0.0.254"), Some(Identity::REMOTE_NODE));
    // The node goes: the learned address is its name's again, the others unknown.
    c.remove_remote_node("n2").unwrap();
    c.commit().unwrap();
    assert_eq!(of(&c, "10.1.0.1"), None);
    assert_eq!(of(&c, "10.0.0.254"), None);
    assert!(of(&c, "192.0.2.1").is_some_and(|id| c.has_fqdn_label(id)));
    assert_eq!(c.labels_of(Identity::REMOTE_NODE), None);
    assert_eq!(
        c.datapath().identity_of(ip("10.1.0.1")),
        Identity::world(true)
    );
}
