//! Learning a new (name, IP) for a name matched by one selector whose identity is already
//! pre-allocated: NameManager + IpCache + datapath batch, per answer.
//! `cargo bench -p fqdnd-benchmarks --bench learn`

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "benchmark fixtures are fixed; a failure should stop the run"
)]
#![allow(clippy::disallowed_types, reason = "a benchmark measures wall time")]

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use fqdnd_benchmarks::addr;
use fqdnd_ipcache::policy::{EgressRule, LabelSelector, PeerSelector, Rule};
use fqdnd_ipcache::{CountingDatapath, Datapath, Endpoint, EndpointId, IpCache, MemoryDatapath};
use fqdnd_namemgr::{Config, FqdnSelector, NameManager};

const EP: EndpointId = EndpointId(1);
const SELECTOR: &str = "*.s3.amazonaws.com";

fn engine<D: Datapath>(datapath: D) -> (NameManager, IpCache<D>) {
    let mut ipcache = IpCache::new(fqdnd_ipcache::Config::default(), datapath);
    ipcache
        .set_endpoints(vec![Endpoint {
            id: EP,
            name: "ep".into(),
            addresses: vec!["10.0.0.1/32".parse().unwrap()],
            labels: vec![],
        }])
        .unwrap();
    ipcache
        .set_policy(vec![Rule {
            origin: "bench".into(),
            endpoint_selector: LabelSelector::default(),
            egress: vec![EgressRule {
                peers: vec![PeerSelector::Fqdn(format!("{SELECTOR}."))],
                ports: vec![],
            }],
            default_deny_egress: true,
            ..Default::default()
        }])
        .unwrap();
    let config = Config {
        max_names_per_endpoint: usize::MAX,
        max_cache_entries: usize::MAX,
        ..Config::default()
    };
    let mut names = NameManager::new(config);
    names
        .set_selectors(
            &[FqdnSelector::match_pattern(SELECTOR).unwrap()],
            Duration::ZERO,
            &mut ipcache,
        )
        .unwrap();
    ipcache.commit().unwrap();
    (names, ipcache)
}

fn learn<D: Datapath>(c: &mut Criterion, label: &str, make: fn() -> D) {
    let names: Vec<String> = (0..10_000)
        .map(|i| format!("bucket{i}.s3.amazonaws.com"))
        .collect();
    c.bench_function(label, |b| {
        b.iter_custom(|iters| {
            let (mut nm, mut ipc) = engine(make());
            let identities = ipc.allocator().len();
            let start = Instant::now();
            for i in 0..iters {
                let i = i as u32;
                let name = &names[i as usize % names.len()];
                nm.observe(EP, name, &[addr(i)], 300, Duration::from_secs(1), &mut ipc)
                    .unwrap();
                ipc.commit().unwrap();
            }
            let elapsed = start.elapsed();
            assert_eq!(
                ipc.allocator().len(),
                identities,
                "learning must not allocate identities"
            );
            elapsed
        })
    });
}

fn bench(c: &mut Criterion) {
    learn(c, "learn-new-ip/memory-datapath", MemoryDatapath::default);
    learn(
        c,
        "learn-new-ip/counting-datapath",
        CountingDatapath::default,
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
