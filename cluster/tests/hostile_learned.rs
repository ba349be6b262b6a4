//! A hostile store under the HA group's learned-record keys (issue 35): garbage, binary,
//! oversized values, out-of-range numbers, keys and values that disagree, fields that
//! disagree, forged records, keys outside the layout. The importer never crashes, never holds
//! more than the valid records give (a gateway reading only them holds the same), still
//! applies revocations, logs one line per bad key however often it is written, and counts
//! every refusal (`fqdnd_cluster_records_rejected_total{kind="learned"}`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed step should panic"
)]

#[path = "support/learned.rs"]
#[allow(dead_code, unreachable_pub, reason = "shared by the HA group's tests")]
mod support;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::{Mutex, Once};
use std::thread::ThreadId;
use std::time::Duration;

use fqdnd_cluster::learned::{Group, Publish};
use fqdnd_cluster::{Event, Kv, MemoryStore, ShareStatus, Snapshot, Wall, WatchBatch};
use tokio::sync::{mpsc, watch};
use tracing_subscriber::layer::SubscriberExt;

use support::{TestSink, TestWall, config, delete, ip, put, record, settle, spawn_importer, until};

/// Lines logged by thread: (warnings and errors, lines at info and above).
static LOUD: Mutex<Vec<(ThreadId, usize, usize)>> = Mutex::new(Vec::new());

/// Counts lines logged, by thread (a paused runtime's tasks run on its test's).
struct Loud;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Loud {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let level = *event.metadata().level();
        let warn = level == tracing::Level::WARN || level == tracing::Level::ERROR;
        if warn || level == tracing::Level::INFO {
            let me = std::thread::current().id();
            let mut loud = LOUD.lock().unwrap();
            let at = match loud.iter().position(|(id, _, _)| *id == me) {
                Some(at) => at,
                None => {
                    loud.push((me, 0, 0));
                    loud.len() - 1
                }
            };
            loud[at].1 += usize::from(warn);
            loud[at].2 += 1;
        }
    }
}

/// This thread's (warnings and errors, lines at info and above) logged so far. Every test of
/// this binary installs the counter first (a global one: a callsite first hit without any
/// subscriber would be cached as never logging).
fn logged() -> (usize, usize) {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Loud)).unwrap();
    });
    let me = std::thread::current().id();
    LOUD.lock()
        .unwrap()
        .iter()
        .find(|(id, _, _)| *id == me)
        .map_or((0, 0), |(_, w, i)| (*w, *i))
}

/// This thread's warnings and errors logged so far.
fn warnings() -> usize {
    logged().0
}

fn kv(key: &str, value: &[u8], revision: i64) -> Kv {
    Kv {
        key: key.to_owned(),
        value: value.to_vec(),
        create_revision: revision,
        mod_revision: revision,
        version: 1,
        lease: 0,
    }
}

/// The bad values (key, value, why) a hostile store writes under `gw-9`'s part of the group
/// at `now_ms`.
fn hostile(now_ms: u64) -> Vec<(String, Vec<u8>, &'static str)> {
    let c = config("gw-9");
    let key = |client: &str, name: &str| c.key_of("gw-9", client, name);
    let good = |client: &str, name: &str, ttl: u32, learned: u64| {
        record("gw-9", client, name, &[ip(66)], ttl, learned)
    };
    let json = |v: serde_json::Value| v.to_string().into_bytes();
    let base = serde_json::json!({
        "name": "n.example.test", "client": "lan", "addrs": ["10.0.0.66"],
        "ttl": 300, "learned_ms": now_ms, "expires_ms": now_ms + 300_000, "gateway": "gw-9",
    });
    let with = |field: &str, value: serde_json::Value| {
        let mut v = base.clone();
        v[field] = value;
        json(v)
    };
    let prefix = c.group_prefix();
    vec![
        (
            key("lan", "g1.example.test"),
            b"garbage {".to_vec(),
            "garbage",
        ),
        (
            key("lan", "g2.example.test"),
            vec![0xff, 0x00, 0xc3, 0x28, 0x9f],
            "binary",
        ),
        (
            key("lan", "g3.example.test"),
            vec![b' '; 300 << 10],
            "oversized",
        ),
        (
            key("lan", "n.example.test"),
            with("ttl", serde_json::json!(-1)),
            "negative ttl",
        ),
        (
            key("lan", "n.example.test"),
            with("ttl", serde_json::json!(1u64 << 40)),
            "ttl past u32",
        ),
        (
            key("lan", "n.example.test"),
            with("learned_ms", serde_json::json!(1e30)),
            "huge float",
        ),
        (
            key("lan", "n.example.test"),
            with("addrs", serde_json::json!(["10.0.0.300"])),
            "bad address",
        ),
        (
            key("lan", "n.example.test"),
            with("addrs", serde_json::json!([])),
            "no address",
        ),
        (
            key("lan", "n.example.test"),
            with("expires_ms", serde_json::json!(4_102_444_800_000u64)),
            "expiry 2100, ttl 300",
        ),
        (
            key("lan", "n.example.test"),
            with("expires_ms", serde_json::json!(u64::MAX)),
            "expiry past learned + ttl",
        ),
        (
            key("lan", "n.example.test"),
            good("lan", "n.example.test", 300, now_ms + 3_600_000).into_bytes(),
            "learned an hour ahead",
        ),
        (
            key("alpha", "n.example.test"),
            with("client", serde_json::json!("beta")),
            "client beta under alpha",
        ),
        (
            key("lan", "n.example.test"),
            with("gateway", serde_json::json!("gw-1")),
            "another gateway's",
        ),
        (
            key("lan", "other.example.test"),
            json(base.clone()),
            "another name's",
        ),
        (format!("{prefix}gw-9/lan"), json(base.clone()), "two parts"),
        (
            format!("{prefix}gw-9/lan/n.example.test/x"),
            json(base.clone()),
            "four parts",
        ),
        (
            format!("{prefix}gw-9//n.example.test"),
            json(base.clone()),
            "an empty part",
        ),
        (
            format!("{prefix}gw%2d9/lan/n.example.test"),
            json(base.clone()),
            "encoded where plain",
        ),
        (
            format!("{prefix}gw-9/lan/n.example.test%zz"),
            json(base.clone()),
            "a bad escape",
        ),
    ]
}

/// The valid records: two gateways', a forged one for a client group the gateway lacks, and
/// one learned long ago for a century (held at most a day after its answer: expired).
fn valid(now_ms: u64) -> Vec<(String, String)> {
    let k = |gw: &str, client: &str, name: &str| config("gw-x").key_of(gw, client, name);
    vec![
        (
            k("gw-1", "lan", "a.example.test"),
            record(
                "gw-1",
                "lan",
                "a.example.test",
                &[ip(1), ip(2)],
                300,
                now_ms,
            ),
        ),
        (
            k("gw-2", "lan", "a.example.test"),
            record("gw-2", "lan", "a.example.test", &[ip(2)], 600, now_ms),
        ),
        (
            k("gw-2", "lan", "b.example.test"),
            record("gw-2", "lan", "b.example.test", &[ip(3)], 300, now_ms),
        ),
        (
            k("forger", "refused", "x.example.test"),
            record("forger", "refused", "x.example.test", &[ip(4)], 300, now_ms),
        ),
        (
            k("gw-1", "lan", "old.example.test"),
            record(
                "gw-1",
                "lan",
                "old.example.test",
                &[ip(5)],
                u32::MAX,
                now_ms - 2 * 86_400_000,
            ),
        ),
    ]
}

/// What `sink` holds, live at `now_ms`.
fn held(sink: &TestSink, now_ms: u64) -> BTreeMap<(String, String), Vec<IpAddr>> {
    sink.cache
        .lock()
        .unwrap()
        .iter()
        .map(|(k, addrs)| {
            let live: Vec<IpAddr> = addrs
                .iter()
                .filter(|(_, e)| **e > now_ms)
                .map(|(a, _)| *a)
                .collect();
            (k.clone(), live)
        })
        .filter(|(_, a)| !a.is_empty())
        .collect()
}

/// A gateway reading a store with the valid records and a hostile store's writes holds
/// exactly what a gateway reading the valid records alone holds; every refusal is counted,
/// each bad key logged once however often it is written; a deletion of a valid key amid the
/// garbage is still a revocation.
#[tokio::test(start_paused = true)]
async fn a_hostile_store_opens_nothing_the_valid_records_do_not() {
    let warned = warnings();
    let wall = TestWall::new();
    let now = wall.unix_ms();
    let (clean, dirty) = (MemoryStore::new(), MemoryStore::new());
    for (key, value) in valid(now) {
        put(&clean, &key, value.clone()).await;
        put(&dirty, &key, value).await;
    }
    let bad = hostile(now);
    for (key, value, _) in &bad {
        put(&dirty, key, value.clone()).await;
    }
    let (_stop_tx, stop) = watch::channel(false);
    let (ptx, _prx) = mpsc::channel(1024);
    let (clean_sink, dirty_sink) = (Arc::new(TestSink::default()), Arc::new(TestSink::default()));
    let clean_rx = spawn_importer(
        &clean,
        config("gw-x"),
        &clean_sink,
        &wall,
        ptx.clone(),
        stop.clone(),
    );
    let dirty_rx = spawn_importer(
        &dirty,
        config("gw-x"),
        &dirty_sink,
        &wall,
        ptx.clone(),
        stop.clone(),
    );
    let ready = |rx: &watch::Receiver<ShareStatus>| rx.borrow().importing;
    until(Duration::from_secs(1), "both read", || {
        ready(&clean_rx) && ready(&dirty_rx)
    })
    .await;
    // Keys the store holds after the writes (some bad values overwrote others).
    let bad_keys: std::collections::BTreeSet<&String> = bad.iter().map(|(k, _, _)| k).collect();
    assert_eq!(
        dirty_rx.borrow().rejected,
        bad_keys.len() as u64,
        "one refusal per key as read: {:?}",
        dirty_rx.borrow()
    );
    assert_eq!(clean_rx.borrow().rejected, 0);
    let expected = held(&clean_sink, now);
    assert_eq!(held(&dirty_sink, now), expected);
    assert_eq!(
        expected
            .keys()
            .map(|(c, n)| format!("{c}/{n}"))
            .collect::<Vec<_>>(),
        ["lan/a.example.test", "lan/b.example.test"]
    );
    // The forged record for a group it lacks went to the engine, which refused it.
    assert_eq!(clean_rx.borrow().import_refused, 1);
    assert_eq!(dirty_rx.borrow().import_refused, 1);
    assert_eq!(warnings() - warned, bad_keys.len(), "one line per bad key");
    // A flood: the bad values written again and again (each write a new revision).
    let before = dirty_rx.borrow().rejected;
    for _ in 0..50 {
        for (key, value, _) in bad.iter().take(3) {
            put(&dirty, key, value.clone()).await;
        }
    }
    until(Duration::from_secs(2), "the flood counted", || {
        dirty_rx.borrow().rejected == before + 150
    })
    .await;
    assert_eq!(warnings() - warned, bad_keys.len(), "no more lines");
    // A bad value over a valid key: the key holds nothing valid, what only it carried goes.
    let b = config("gw-x").key_of("gw-2", "lan", "b.example.test");
    put(&dirty, &b, b"{}".to_vec()).await;
    delete(&clean, &b).await;
    // A valid key deleted amid the garbage: revoked, as without it.
    let a = config("gw-x").key_of("gw-1", "lan", "a.example.test");
    delete(&dirty, &a).await;
    delete(&clean, &a).await;
    until(Duration::from_secs(1), "revoked on both", || {
        clean_rx.borrow().revoked == 2 && dirty_rx.borrow().revoked == 2
    })
    .await;
    let now = wall.unix_ms();
    assert_eq!(held(&dirty_sink, now), held(&clean_sink, now));
    assert_eq!(
        dirty_sink.addrs("lan", "a.example.test", now),
        [ip(2)],
        "10.0.0.2: gw-2's key still has it"
    );
    assert!(dirty_sink.addrs("lan", "b.example.test", now).is_empty());
    // A flood of valid writes and deletes: each a revocation, counted; a summary line, not a
    // line each.
    let lines = logged().1;
    let flood = config("gw-x").key_of("gw-9", "lan", "flood.example.test");
    let value = record("gw-9", "lan", "flood.example.test", &[ip(9)], 300, now);
    for _ in 0..100 {
        put(&dirty, &flood, value.clone()).await;
        settle(Duration::from_millis(1)).await;
        delete(&dirty, &flood).await;
        settle(Duration::from_millis(1)).await;
    }
    until(Duration::from_secs(2), "the flood revoked", || {
        dirty_rx.borrow().revoked == 102
    })
    .await;
    assert!(logged().1 - lines <= 1, "{} lines", logged().1 - lines);
    settle(Duration::from_millis(10)).await;
    assert!(dirty_rx.borrow().importing, "still watching");
}

/// Items 9 and 10 record by record: what each bad value is refused for, and the clamp of a
/// valid one to its own fields and the gateway's bound.
#[test]
fn each_record_is_refused_for_what_it_is_and_clamped_to_the_gateways_bounds() {
    warnings();
    let now = 1_800_000_000_000;
    let mut group = Group::new(config("gw-x"));
    let bad = hostile(now);
    let kvs: Vec<Kv> = bad
        .iter()
        .zip(2..)
        .map(|((k, v, _), r)| kv(k, v, r))
        .collect();
    for (kv, (_, _, why)) in kvs.iter().zip(&bad) {
        let mut one = Group::new(config("gw-x"));
        let applied = one.reload(
            &Snapshot {
                kvs: vec![kv.clone()],
                revision: 100,
            },
            now,
            true,
        );
        assert_eq!((applied.rejected, applied.imports.len()), (1, 0), "{why}");
    }
    let _ = group.reload(&Snapshot::default(), now, true);
    // A century's TTL learned now: held a day (the bound), not a century.
    let key = config("gw-x").key_of("gw-1", "lan", "long.example.test");
    let long = record("gw-1", "lan", "long.example.test", &[ip(1)], u32::MAX, now);
    let batch = WatchBatch {
        events: vec![Event::Put(kv(&key, long.as_bytes(), 5))],
        revision: 5,
    };
    let applied = group.apply(&batch, now);
    assert_eq!(applied.imports[0].expires_ms, now + 86_400_000);
    // With a gateway bound of 10 minutes.
    let mut c = config("gw-x");
    c.max_ttl = 600;
    let mut short = Group::new(c);
    let applied = short.apply(&batch, now);
    assert_eq!(applied.imports[0].expires_ms, now + 600_000);
    // Its own fields first: 300 s after its answer, a minute ago.
    let key = config("gw-x").key_of("gw-1", "lan", "n.example.test");
    let value = record("gw-1", "lan", "n.example.test", &[ip(1)], 300, now - 60_000);
    let batch = WatchBatch {
        events: vec![Event::Put(kv(&key, value.as_bytes(), 6))],
        revision: 6,
    };
    assert_eq!(
        group.apply(&batch, now).imports[0].expires_ms,
        now + 240_000
    );
    // Within the clock offset allowed, an answer a little ahead is taken — and held no
    // longer than the bound from now.
    let value = record(
        "gw-1",
        "lan",
        "n.example.test",
        &[ip(1)],
        u32::MAX,
        now + 30_000,
    );
    let batch = WatchBatch {
        events: vec![Event::Put(kv(&key, value.as_bytes(), 7))],
        revision: 7,
    };
    assert_eq!(
        group.apply(&batch, now).imports[0].expires_ms,
        now + 86_400_000
    );
    // What the issue found: ttl 300, expires_ms in 2100 — refused, not a 73-year TTL.
    let value = serde_json::json!({
        "name": "n.example.test", "client": "lan", "addrs": ["10.0.0.1"], "ttl": 300,
        "learned_ms": now, "expires_ms": 4_102_444_800_000u64, "gateway": "gw-1",
    })
    .to_string();
    let batch = WatchBatch {
        events: vec![Event::Put(kv(&key, value.as_bytes(), 8))],
        revision: 8,
    };
    let applied = group.apply(&batch, now);
    assert_eq!((applied.rejected, applied.imports.len()), (1, 0));
    // … and the key held a valid record until then: that is revoked.
    assert_eq!(applied.revocations.len(), 1);
    assert_eq!(applied.revocations[0].addrs, [ip(1)]);
    // The same bad value read again (a reconnection) is not counted twice.
    let snapshot = Snapshot {
        kvs: vec![kv(&key, value.as_bytes(), 8)],
        revision: 9,
    };
    assert_eq!(group.reload(&snapshot, now, false).rejected, 0);
}

/// A forged record under this gateway's own name, while it runs, is not imported (its own
/// records come back only at start), but it counts as carried: it is not published again.
#[tokio::test(start_paused = true)]
async fn a_record_forged_under_the_gateways_own_name_is_not_imported_while_it_runs() {
    warnings();
    let wall = TestWall::new();
    let store = MemoryStore::new();
    let (_stop_tx, stop) = watch::channel(false);
    let (ptx, mut prx) = mpsc::channel(1024);
    let sink = Arc::new(TestSink::default());
    let status = spawn_importer(&store, config("gw-x"), &sink, &wall, ptx, stop);
    until(Duration::from_secs(1), "watching", || {
        status.borrow().importing
    })
    .await;
    let key = config("gw-x").key("lan", "forged.example.test");
    put(
        &store,
        &key,
        record(
            "gw-x",
            "lan",
            "forged.example.test",
            &[ip(7)],
            300,
            wall.unix_ms(),
        ),
    )
    .await;
    settle(Duration::from_millis(20)).await;
    assert!(sink.imports.lock().unwrap().is_empty());
    assert_eq!(status.borrow().rejected, 0);
    // Deleted: this gateway's own key changed by someone else; nothing imported to revoke,
    // but its publisher is told.
    delete(&store, &key).await;
    let message = tokio::time::timeout(Duration::from_secs(1), prx.recv())
        .await
        .unwrap();
    assert!(matches!(message, Some(Publish::Unwritten(keys)) if keys == [key]));
}
