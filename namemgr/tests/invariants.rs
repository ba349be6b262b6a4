//! Property tests of the label/identity algebra across namemgr and ipcache, against a naive
//! oracle: for any sequence of answers, clock advances, GC runs and selector changes,
//! - selector S selects IP X iff some cached (name, X) has a name S matches, or X lies in a
//!   CIDR S names (checked through the datapath's own lookup);
//! - every IP carries exactly the labels the oracle derives, so live FQDN identities are the
//!   distinct label sets over live prefixes plus the pre-allocated ones;
//! - an identity number never changes label set while prefixes hold it;
//! - the same answers in another order give the same state.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::time::Duration;

use fqdnd_ipcache::policy::{
    EgressRule, LabelSelector, PeerSelector, PortProtocol, PortRule, Protocol, Rule,
};
use fqdnd_ipcache::{Endpoint, EndpointId, Identity, IpCache, MemoryDatapath, host_prefix};
use fqdnd_namemgr::{Config, FqdnSelector, NameManager};
use ipnet::IpNet;
use proptest::prelude::*;

const NAMES: &[&str] = &[
    "a.example.com",
    "b.example.com",
    "deep.a.example.com",
    "example.com",
    "cilium.io",
    "www.cilium.io",
    "bucket.s3.amazonaws.com",
];
const SELECTORS: &[&str] = &[
    "*.example.com",
    "**.example.com",
    "cilium.io",
    "*.cilium.io",
    "*",
    "*.s3.amazonaws.com",
    "www.cilium.io",
    "*cilium.io",
];
const CIDR: &str = "10.0.0.0/24";
const EP: EndpointId = EndpointId(1);

fn pool() -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = (1..=5)
        .map(|i| format!("10.0.0.{i}").parse().unwrap())
        .collect();
    ips.extend((1..=5).map(|i| format!("10.0.1.{i}").parse::<IpAddr>().unwrap()));
    ips.extend((1..=3).map(|i| format!("fd00::{i}").parse::<IpAddr>().unwrap()));
    ips
}

#[derive(Debug, Clone)]
enum Op {
    Answer {
        name: usize,
        ips: Vec<usize>,
        ttl: u32,
    },
    Advance(u64),
    Gc {
        in_use: Vec<usize>,
    },
    AddSelector(usize),
    RemoveSelector(usize),
    /// `cache forget`: a name's addresses (all when empty), live and zombie, at once.
    Forget {
        name: usize,
        ips: Vec<usize>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..NAMES.len(), prop::collection::vec(0..13usize, 1..4), 0u32..30)
            .prop_map(|(name, ips, ttl)| Op::Answer { name, ips, ttl }),
        2 => (1u64..40).prop_map(Op::Advance),
        2 => prop::collection::vec(0..13usize, 0..6).prop_map(|in_use| Op::Gc { in_use }),
        1 => (0..SELECTORS.len()).prop_map(Op::AddSelector),
        1 => (0..SELECTORS.len()).prop_map(Op::RemoveSelector),
        1 => (0..NAMES.len(), prop::collection::vec(0..13usize, 0..3))
            .prop_map(|(name, ips)| Op::Forget { name, ips }),
    ]
}

/// The engine under test: NameManager + IpCache + in-memory datapath, wired as the binary does.
struct Engine {
    names: NameManager,
    ipcache: IpCache<MemoryDatapath>,
    selectors: BTreeSet<usize>,
    now: Duration,
}

impl Engine {
    fn new(initial: &BTreeSet<usize>) -> Self {
        let config = Config {
            max_ips_per_hostname: 1000,
            max_ips_per_name: 1000,
            ..Config::default()
        };
        let mut ipcache = IpCache::new(fqdnd_ipcache::Config::default(), MemoryDatapath::default());
        ipcache
            .set_endpoints(vec![Endpoint {
                id: EP,
                name: "ep".into(),
                addresses: vec!["172.16.0.1/32".parse().unwrap()],
                labels: vec![],
            }])
            .unwrap();
        let mut engine = Self {
            names: NameManager::new(config),
            ipcache,
            selectors: BTreeSet::new(),
            now: Duration::from_secs(1000),
        };
        engine.set_selectors(initial.clone());
        engine
    }

    fn policy(&self) -> Vec<PeerSelector> {
        let mut peers: Vec<PeerSelector> = self
            .selectors
            .iter()
            .map(|i| PeerSelector::Fqdn(key(*i)))
            .collect();
        peers.push(PeerSelector::Cidr {
            cidr: CIDR.parse().unwrap(),
            except: vec![],
        });
        peers
    }

    fn set_selectors(&mut self, selectors: BTreeSet<usize>) {
        self.selectors = selectors;
        let rule = Rule {
            origin: "test".into(),
            endpoint_selector: LabelSelector::default(),
            egress: vec![EgressRule {
                peers: self.policy(),
                ports: vec![PortRule {
                    ports: vec![PortProtocol {
                        port: 443,
                        end_port: 443,
                        protocol: Protocol::Tcp,
                    }],
                    dns: None,
                }],
            }],
            default_deny_egress: true,
            ..Default::default()
        };
        self.ipcache.set_policy(vec![rule]).unwrap();
        let fqdn: Vec<FqdnSelector> = self
            .selectors
            .iter()
            .map(|i| FqdnSelector::match_pattern(SELECTORS[*i]).unwrap())
            .collect();
        self.names
            .set_selectors(&fqdn, self.now, &mut self.ipcache)
            .unwrap();
        self.ipcache.commit().unwrap();
    }

    fn answer(&mut self, name: usize, ips: &[usize], ttl: u32) {
        let pool = pool();
        let addrs: Vec<IpAddr> = ips.iter().map(|i| pool[*i]).collect();
        self.names
            .observe(EP, NAMES[name], &addrs, ttl, self.now, &mut self.ipcache)
            .unwrap();
        self.ipcache.commit().unwrap();
    }

    fn gc(&mut self, in_use: &HashSet<IpAddr>) {
        self.names
            .gc(
                self.now,
                &|a: IpAddr| in_use.contains(&a),
                &mut self.ipcache,
            )
            .unwrap();
        self.ipcache.commit().unwrap();
    }

    /// Each IP's labels, as strings.
    fn labels(&self) -> BTreeMap<IpAddr, BTreeSet<String>> {
        pool()
            .into_iter()
            .filter_map(|ip| {
                let id = self.ipcache.identity_of(&host_prefix(ip))?;
                let labels = self.ipcache.labels_of(id)?;
                Some((ip, labels.split(',').map(str::to_owned).collect()))
            })
            .collect()
    }
}

fn key(selector: usize) -> String {
    FqdnSelector::match_pattern(SELECTORS[selector])
        .unwrap()
        .key()
        .to_owned()
}

/// The naive model: (name, IP) → expiry for live mappings, and the zombie set.
#[derive(Default)]
struct Model {
    live: HashMap<(usize, IpAddr), u64>,
    zombies: HashSet<(usize, IpAddr)>,
}

impl Model {
    fn answer(&mut self, name: usize, ips: &[IpAddr], expires: u64) {
        for ip in ips {
            if let Some(e) = self.live.get_mut(&(name, *ip)) {
                *e = (*e).max(expires);
            } else {
                self.zombies.remove(&(name, *ip));
                self.live.insert((name, *ip), expires);
            }
        }
    }

    fn forget(&mut self, name: usize, ips: Option<&[IpAddr]>) {
        let gone = |(n, ip): &(usize, IpAddr)| *n == name && ips.is_none_or(|ips| ips.contains(ip));
        self.live.retain(|k, _| !gone(k));
        self.zombies.retain(|k| !gone(k));
    }

    fn gc(&mut self, now: u64, in_use: &HashSet<IpAddr>) {
        let expired: Vec<_> = self
            .live
            .iter()
            .filter(|(_, e)| **e <= now)
            .map(|(k, _)| *k)
            .collect();
        for k in expired {
            self.live.remove(&k);
            self.zombies.insert(k);
        }
        self.zombies.retain(|(_, ip)| in_use.contains(ip));
    }

    fn cached(&self) -> impl Iterator<Item = (usize, IpAddr)> + '_ {
        self.live
            .keys()
            .copied()
            .chain(self.zombies.iter().copied())
    }

    /// The labels the design says each IP carries.
    fn labels(&self, selectors: &BTreeSet<usize>) -> BTreeMap<IpAddr, BTreeSet<String>> {
        let cidr: IpNet = CIDR.parse().unwrap();
        let mut out: BTreeMap<IpAddr, BTreeSet<String>> = BTreeMap::new();
        for (name, ip) in self.cached() {
            let canonical = format!("{}.", NAMES[name]);
            for s in selectors {
                let sel = FqdnSelector::match_pattern(SELECTORS[*s]).unwrap();
                if sel.matches(&canonical) {
                    out.entry(ip)
                        .or_default()
                        .insert(format!("fqdn:{}", sel.key()));
                }
            }
        }
        for (ip, labels) in &mut out {
            if cidr.contains(ip) {
                labels.insert(format!("cidr:{CIDR}"));
            }
            labels.insert(
                if ip.is_ipv4() {
                    "reserved:world-ipv4"
                } else {
                    "reserved:world-ipv6"
                }
                .to_owned(),
            );
        }
        out
    }

    fn selects(&self, selector: usize, ip: IpAddr) -> bool {
        let sel = FqdnSelector::match_pattern(SELECTORS[selector]).unwrap();
        self.cached()
            .any(|(name, x)| x == ip && sel.matches(&format!("{}.", NAMES[name])))
    }
}

fn check(engine: &Engine, model: &Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(engine.labels(), model.labels(&engine.selectors));
    let distinct: BTreeSet<IpAddr> = model.cached().map(|(_, ip)| ip).collect();
    prop_assert_eq!(engine.names.ip_count(), distinct.len());
    let dp = engine.ipcache.datapath();
    let cidr: IpNet = CIDR.parse().unwrap();
    for ip in pool() {
        let identity = dp.identity_of(ip);
        for s in &engine.selectors {
            let selected = engine
                .ipcache
                .selected(&PeerSelector::Fqdn(key(*s)))
                .contains(&identity);
            prop_assert_eq!(
                selected,
                model.selects(*s, ip),
                "selector {} ip {}",
                SELECTORS[*s],
                ip
            );
        }
        let by_cidr = engine
            .ipcache
            .selected(&PeerSelector::Cidr {
                cidr,
                except: vec![],
            })
            .contains(&identity);
        prop_assert_eq!(by_cidr, cidr.contains(&ip), "cidr selector ip {}", ip);
        let allowed = model.selects_any(&engine.selectors, ip) || cidr.contains(&ip);
        prop_assert_eq!(
            dp.allows(EP, ip, Protocol::Tcp, 443),
            allowed,
            "policy for {}",
            ip
        );
        prop_assert!(!dp.allows(EP, ip, Protocol::Tcp, 80));
    }
    // Live FQDN identities are exactly the label sets held by prefixes, plus pre-allocation.
    let mut expected: BTreeSet<Identity> = pool()
        .into_iter()
        .filter_map(|ip| engine.ipcache.identity_of(&host_prefix(ip)))
        .filter(|id| engine.ipcache.has_fqdn_label(*id))
        .collect();
    let live: BTreeSet<Identity> = engine
        .ipcache
        .allocator()
        .iter()
        .map(|(id, _, _)| id)
        .filter(|id| engine.ipcache.has_fqdn_label(*id))
        .collect();
    for (id, labels, _) in engine.ipcache.allocator().iter() {
        if labels.len() == 2 && engine.ipcache.has_fqdn_label(id) {
            // {fqdn:<sel>, world-ipvX}: pre-allocated for a selector in force.
            let text = engine.ipcache.labels_of(id).unwrap();
            if engine
                .selectors
                .iter()
                .any(|s| text.contains(&format!("fqdn:{}", key(*s))))
            {
                expected.insert(id);
            }
        }
    }
    prop_assert_eq!(live, expected);
    Ok(())
}

impl Model {
    fn selects_any(&self, selectors: &BTreeSet<usize>, ip: IpAddr) -> bool {
        selectors.iter().any(|s| self.selects(*s, ip))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn engine_matches_the_oracle(initial in prop::collection::btree_set(0..SELECTORS.len(), 0..4), ops in prop::collection::vec(op(), 1..60)) {
        let mut engine = Engine::new(&initial);
        let mut model = Model::default();
        let pool = pool();
        let mut held: BTreeMap<Identity, String> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Answer { name, ips, ttl } => {
                    let addrs: Vec<IpAddr> = ips.iter().map(|i| pool[*i]).collect();
                    model.answer(name, &addrs, engine.now.as_secs() + u64::from(ttl));
                    engine.answer(name, &ips, ttl);
                }
                Op::Advance(s) => engine.now += Duration::from_secs(s),
                Op::Gc { in_use } => {
                    let in_use: HashSet<IpAddr> = in_use.iter().map(|i| pool[*i]).collect();
                    model.gc(engine.now.as_secs(), &in_use);
                    engine.gc(&in_use);
                }
                Op::AddSelector(s) => {
                    let mut sel = engine.selectors.clone();
                    sel.insert(s);
                    engine.set_selectors(sel);
                }
                Op::RemoveSelector(s) => {
                    let mut sel = engine.selectors.clone();
                    sel.remove(&s);
                    engine.set_selectors(sel);
                }
                Op::Forget { name, ips } => {
                    let addrs: Vec<IpAddr> = ips.iter().map(|i| pool[*i]).collect();
                    let addrs = (!addrs.is_empty()).then_some(addrs.as_slice());
                    model.forget(name, addrs);
                    engine
                        .names
                        .forget(
                            &fqdnd_namemgr::Forget { name: NAMES[name], addrs, endpoint: None },
                            &mut engine.ipcache,
                        )
                        .unwrap();
                    engine.ipcache.commit().unwrap();
                }
            }
            check(&engine, &model)?;
            // An identity held by a prefix before and after a step keeps its label set.
            let now_held: BTreeMap<Identity, String> = engine
                .ipcache
                .prefixes()
                .filter_map(|(_, id, _)| id)
                .map(|id| (id, engine.ipcache.labels_of(id).unwrap()))
                .collect();
            for (id, labels) in &now_held {
                if let Some(before) = held.get(id) {
                    prop_assert_eq!(before, labels, "identity {} changed label set while held", id);
                }
            }
            held = now_held;
        }
    }

    #[test]
    fn answer_order_does_not_matter(
        selectors in prop::collection::btree_set(0..SELECTORS.len(), 0..5),
        answers in prop::collection::vec((0..NAMES.len(), prop::collection::vec(0..13usize, 1..4), 0u32..30), 1..20),
        seed in any::<u64>(),
    ) {
        let mut shuffled = answers.clone();
        // A deterministic permutation from the seed.
        let mut state = seed | 1;
        for i in (1..shuffled.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            shuffled.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let mut a = Engine::new(&selectors);
        let mut b = Engine::new(&selectors);
        for (name, ips, ttl) in &answers {
            a.answer(*name, ips, *ttl);
        }
        for (name, ips, ttl) in &shuffled {
            b.answer(*name, ips, *ttl);
        }
        prop_assert_eq!(a.labels(), b.labels());
        let entries = |e: &Engine| -> BTreeSet<(String, IpAddr, u32, bool)> {
            e.names.entries().map(|c| (c.name.to_string(), c.ip.addr, c.ip.expires, c.zombie)).collect()
        };
        prop_assert_eq!(entries(&a), entries(&b));
        prop_assert_eq!(a.ipcache.allocator().len(), b.ipcache.allocator().len());
    }
}
