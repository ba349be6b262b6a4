//! Matching one name against 10k FQDN selectors compiled into one Matcher.
//! `cargo bench -p fqdnd-benchmarks --bench matcher`

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "benchmark fixtures are fixed; a failure should stop the run"
)]
#![allow(clippy::disallowed_types, reason = "a benchmark measures wall time")]

use criterion::{Criterion, criterion_group, criterion_main};
use fqdnd_benchmarks::{mixed_selectors, probe_names};
use fqdnd_namemgr::{FqdnSelector, Matcher, NameLabels, SelectorId};
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    for n in [1_000usize, 10_000] {
        let mut matcher = Matcher::new();
        for (i, pattern) in mixed_selectors(n).iter().enumerate() {
            let selector =
                FqdnSelector::match_pattern(pattern).expect("fixture patterns are valid");
            matcher.insert(&selector, SelectorId(i as u32));
        }
        let mut group = c.benchmark_group(format!("match/{n}-selectors"));
        for (kind, name) in probe_names(n) {
            let mut hits = 0;
            matcher.for_each_match(&name, |_| hits += 1);
            assert_eq!(
                hits > 0,
                kind != "miss",
                "{kind} probe {name} must {}match",
                if kind == "miss" { "not " } else { "" }
            );
            group.bench_function(kind, |b| {
                b.iter(|| {
                    let mut count = 0u32;
                    matcher.for_each_match(black_box(&name), |_| count += 1);
                    count
                })
            });
        }
        group.finish();
    }
    // The restore benchmark's shape (benchmarks/restore-time.sh): one `*.zone` selector, a
    // name under it; what a restore's labelling thread does for each of a million names.
    let mut matcher = Matcher::new();
    let selector = FqdnSelector::match_pattern("*.bench.test").expect("a valid pattern");
    matcher.insert(&selector, SelectorId(0));
    let name = "n123456.bench.test.";
    c.bench_function("match/1-wildcard-selector", |b| {
        b.iter(|| {
            let mut count = 0u32;
            matcher.for_each_match(black_box(name), |_| count += 1);
            count
        })
    });
}

/// The DNS rules of `benchmarks/vs-peers.sh`'s client group (a `matchName` and a `**.` pattern
/// for each of 1,000 zones, and `**.example.test`): is a query's name allowed?
fn dns_rules(c: &mut Criterion) {
    let mut matcher = Matcher::new();
    let mut id = 0;
    let mut add = |pattern: &str| {
        let selector = FqdnSelector::match_pattern(pattern).expect("a valid pattern");
        matcher.insert(&selector, SelectorId(id));
        id += 1;
    };
    add("example.test");
    add("**.example.test");
    for i in 0..1_000 {
        add(&format!("allow{i:04}.corp.test"));
        add(&format!("**.allow{i:04}.corp.test"));
    }
    let mut group = c.benchmark_group("is-match/2002-dns-rules");
    for (kind, name) in [
        ("hit", "h03596.example.test."),
        ("miss", "h03596.example.org."),
    ] {
        assert_eq!(matcher.is_match(name), kind == "hit");
        group.bench_function(kind, |b| b.iter(|| matcher.is_match(black_box(name))));
        group.bench_function(format!("{kind}/split"), |b| {
            b.iter(|| NameLabels::new(black_box(name)).is_some())
        });
        // What a second matcher costs once the name is split (the deny list, then the rules).
        let labels = NameLabels::new(name).expect("a canonical name");
        group.bench_function(format!("{kind}/split-once"), |b| {
            b.iter(|| matcher.is_match_labels(black_box(&labels)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench, dns_rules);
criterion_main!(benches);
