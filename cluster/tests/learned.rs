//! The HA gateway group's sharing of learned answers (docs/ha-gateway.md), on the in-memory
//! store and tokio's paused clock: batching (one transaction per batch, never one per answer,
//! at most 128 operations each), keys that expire on their own under expiry-bucket leases and
//! outlive their writer, import of the peers' records (and one's own at start), an outage that
//! keeps what waits and writes it once the store is back, the bound on what waits; answers
//! the group lacks published again (at start, after a reconnection); revocations (a deleted
//! key, a rewrite without an address, `cache forget`) and what is not one (a lease running
//! out, a newer answer); the import lag of new records only.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed step should panic"
)]

#[path = "support/learned.rs"]
#[allow(dead_code, unreachable_pub, reason = "shared by the HA group's tests")]
mod support;

use std::sync::Arc;
use std::time::Duration;

use fqdnd_cluster::learned::{self, Forget, Importer, Publish, Publisher, Revoked};
use fqdnd_cluster::{LearnedRecord, MemoryStore, ShareStatus, StoreError, Wall};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use support::{
    TestSink, TestWall, answer, config, delete, ip, learned_keys, settle, spawn_importer,
    spawn_publisher, until,
};

/// Offers `answers` to `publisher` and writes them at once.
async fn publish_now(
    publisher: &mut Publisher,
    store: &MemoryStore,
    wall: &TestWall,
    answers: Vec<learned::Answer>,
) {
    for answer in answers {
        publisher.offer(answer, Instant::now());
    }
    publisher
        .flush(store, wall.unix_ms(), Instant::now())
        .await
        .unwrap();
}

fn value(store: &MemoryStore, key: &str) -> Option<LearnedRecord> {
    store
        .dump()
        .get(key)
        .map(|v| serde_json::from_slice(v).unwrap())
}

/// A channel standing for the publisher: what the importer hands it is kept.
fn publisher_channel() -> (mpsc::Sender<Publish>, mpsc::Receiver<Publish>) {
    mpsc::channel(4096)
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_answers_is_one_transaction_per_batch() {
    let store = MemoryStore::new();
    let wall = TestWall::new();
    let (_stop_tx, stop) = watch::channel(false);
    let before = store.revision();
    let (tx, status_rx) = spawn_publisher(&store, "gw-1", &wall, 4096, stop);
    // 300 answers at once (one name asked twice: merged).
    for i in 0..300u32 {
        let last = u8::try_from(i % 250).unwrap();
        let a = answer(&wall, &format!("n{i}.example.test"), last, 300);
        tx.send(Publish::Answer(a)).await.unwrap();
    }
    let again = answer(&wall, "n0.example.test", 251, 300);
    tx.send(Publish::Answer(again)).await.unwrap();
    until(Duration::from_secs(1), "300 records written", || {
        status_rx.borrow().published == 300
    })
    .await;
    let s = status_rx.borrow().clone();
    // 300 keys in transactions of at most 128 operations: 3, not 301; one lease grant.
    assert_eq!(s.transactions, 3, "{s:?}");
    assert_eq!(store.revision() - before, 3);
    assert_eq!(learned_keys(&store).len(), 300);
    let record = value(&store, &config("gw-1").key("lan", "n0.example.test")).unwrap();
    assert_eq!(record.addrs, vec![ip(0), ip(251)]);
    assert_eq!(record.gateway, "gw-1");
    assert_eq!(record.expires_ms, record.learned_ms + 300_000);
    // The lag is the batch delay (5 ms on the paused clock), not more.
    assert!(s.publish_lag_ms <= 6, "{s:?}");
    // The same answers again: already written, nothing to write.
    let revision = store.revision();
    for i in 0..10u32 {
        let last = u8::try_from(i).unwrap();
        let a = answer(&wall, &format!("n{i}.example.test"), last, 300);
        tx.send(Publish::Answer(a)).await.unwrap();
    }
    settle(Duration::from_millis(50)).await;
    assert_eq!(store.revision(), revision);
}

#[tokio::test(start_paused = true)]
async fn records_expire_on_their_own_after_their_writer_is_gone() {
    let store = MemoryStore::new();
    let wall = TestWall::new();
    let mut publisher = Publisher::new(config("gw-1"));
    publisher.offer(answer(&wall, "short.example.test", 1, 10), Instant::now());
    publisher.offer(answer(&wall, "long.example.test", 2, 3600), Instant::now());
    let (written, transactions, _) = publisher
        .flush(&store, wall.unix_ms(), Instant::now())
        .await
        .unwrap();
    assert_eq!((written, transactions), (2, 1));
    // Two buckets, two leases; the writer never renews them (it may be dead).
    assert_eq!(store.leases().len(), 2);
    drop(publisher);
    // The short record's lease ends within two 30 s buckets of its expiry; the long one stays.
    store.advance(Duration::from_secs(75));
    let keys = learned_keys(&store);
    assert_eq!(keys, vec![config("gw-1").key("lan", "long.example.test")]);
    store.advance(Duration::from_secs(3600 + 60));
    assert!(learned_keys(&store).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_peer_imports_what_others_learn_and_its_own_only_at_start() {
    let store = MemoryStore::new();
    let wall = TestWall::new();
    // What gw-2 wrote before a restart, and gw-1's earlier answer.
    let mut old = Publisher::new(config("gw-2"));
    let before = answer(&wall, "before.example.test", 1, 300);
    publish_now(&mut old, &store, &wall, vec![before]).await;
    let mut gw1 = Publisher::new(config("gw-1"));
    let mut refused = answer(&wall, "refused.example.test", 3, 300);
    refused.client = "refused".into();
    let early = answer(&wall, "early.example.test", 2, 300);
    publish_now(&mut gw1, &store, &wall, vec![early, refused]).await;
    // gw-2 starts: everything is imported before it serves.
    let sink = Arc::new(TestSink::default());
    let (status, status_rx) = watch::channel(ShareStatus::default());
    let mut importer = Importer::new(config("gw-2"), Arc::clone(&sink), Arc::clone(&wall), status);
    let revision = learned::import_all(&store, &mut importer).await.unwrap();
    assert_eq!(
        sink.names(),
        vec![
            "before.example.test@gw-2",
            "early.example.test@gw-1",
            "refused.example.test@gw-1"
        ]
    );
    assert_eq!(status_rx.borrow().imported, 2);
    assert_eq!(status_rx.borrow().import_refused, 1);
    assert!(status_rx.borrow().initial_import_done);
    // Then it watches: gw-1's new answers come in; gw-2's own do not come back.
    let (_stop_tx, stop) = watch::channel(false);
    let (ptx, _prx) = publisher_channel();
    tokio::spawn(learned::import(
        store.clone(),
        importer,
        Some(revision),
        ptx,
        stop,
    ));
    settle(Duration::from_millis(20)).await;
    let late = answer(&wall, "late.example.test", 4, 300);
    publish_now(&mut gw1, &store, &wall, vec![late]).await;
    let mut own = Publisher::new(config("gw-2"));
    let mine = answer(&wall, "own.example.test", 5, 300);
    publish_now(&mut own, &store, &wall, vec![mine]).await;
    until(Duration::from_secs(1), "the late answer imported", || {
        sink.names().contains(&"late.example.test@gw-1".to_owned())
    })
    .await;
    settle(Duration::from_millis(50)).await;
    assert!(!sink.names().contains(&"own.example.test@gw-2".to_owned()));
    assert!(status_rx.borrow().importing);
}

#[tokio::test(start_paused = true)]
async fn an_outage_keeps_what_waits_and_the_importer_catches_up() {
    let store = MemoryStore::new();
    let wall = TestWall::new();
    let (_stop_tx, stop) = watch::channel(false);
    let sink = Arc::new(TestSink::default());
    let (tx, status_rx) = spawn_publisher(&store, "gw-1", &wall, 64, stop.clone());
    let (ptx, _prx) = publisher_channel();
    let import_rx = spawn_importer(&store, config("gw-2"), &sink, &wall, ptx, stop);
    until(Duration::from_secs(1), "importing", || {
        import_rx.borrow().importing
    })
    .await;
    assert!(
        status_rx.borrow().publishing,
        "nothing written yet is not failing"
    );
    store.set_down(true);
    let during = answer(&wall, "during.example.test", 1, 300);
    tx.send(Publish::Answer(during)).await.unwrap();
    until(Duration::from_secs(1), "the write failed", || {
        !status_rx.borrow().publishing && status_rx.borrow().last_error.is_some()
    })
    .await;
    assert_eq!(status_rx.borrow().pending, 1);
    assert!(sink.names().is_empty());
    settle(Duration::from_secs(5)).await;
    assert_eq!(status_rx.borrow().pending, 1, "what waits is kept");
    assert!(!import_rx.borrow().importing);
    store.set_down(false);
    until(Duration::from_secs(5), "written after the outage", || {
        status_rx.borrow().published == 1
    })
    .await;
    until(Duration::from_secs(5), "imported after the outage", || {
        sink.names() == vec!["during.example.test@gw-1".to_owned()]
    })
    .await;
    assert_eq!(status_rx.borrow().pending, 0);
    assert!(status_rx.borrow().publishing);
}

#[tokio::test(start_paused = true)]
async fn what_waits_is_bounded() {
    let wall = TestWall::new();
    let mut c = config("gw-1");
    c.max_pending = 3;
    let mut publisher = Publisher::new(c);
    for i in 0..5 {
        publisher.offer(
            answer(&wall, &format!("n{i}.example.test"), i, 300),
            Instant::now(),
        );
    }
    // A pending key still merges; new keys past the bound are dropped and counted.
    publisher.offer(answer(&wall, "n0.example.test", 9, 300), Instant::now());
    assert_eq!((publisher.pending(), publisher.dropped()), (3, 2));
    // Percent-encoding keeps a key's parts apart, and reads back only as written.
    let c = config("gw/1");
    let key = c.key("a b", "x/y.");
    assert_eq!(key, "/t-learned/edge/gw%2F1/a%20b/x%2Fy.");
    assert_eq!(
        c.parse_key(&key),
        Some(("gw/1".into(), "a b".into(), "x/y.".into()))
    );
    for bad in [
        "/t-learned/edge/gw%2f1/a/x.",
        "/t-learned/edge/gw/a/x./more",
        "/t-learned/edge/gw/a",
        "/t-learned/edge/gw//x.",
        "/t-learned/edge/g%zz/a/x.",
        "/t-learned/edge/g%FF/a/x.",
        "/t-learned/other/gw/a/x.",
    ] {
        assert_eq!(c.parse_key(bad), None, "{bad}");
    }
    // An answer expired before it could be written is not written.
    let store = MemoryStore::new();
    let mut p = Publisher::new(config("gw-1"));
    p.offer(answer(&wall, "gone.example.test", 1, 1), Instant::now());
    let (written, _, _) = p
        .flush(&store, wall.unix_ms() + 5_000, Instant::now())
        .await
        .unwrap();
    assert_eq!(written, 0);
    assert!(learned_keys(&store).is_empty());
}

/// Item 11: a key deleted before its record expired takes away, on every gateway (its own
/// writer included), what no other live key carries: an address another key carries stays,
/// and so does the client group's record while another key has the name for it.
#[tokio::test(start_paused = true)]
async fn a_deleted_key_revokes_what_only_it_carried_on_every_gateway() {
    let store = MemoryStore::new();
    let wall = TestWall::new();
    let (mut gw1, mut gw2) = (
        Publisher::new(config("gw-1")),
        Publisher::new(config("gw-2")),
    );
    let mut a = answer(&wall, "a.example.test", 1, 300);
    a.addrs.push(ip(2));
    publish_now(&mut gw1, &store, &wall, vec![a]).await;
    let a2 = answer(&wall, "a.example.test", 2, 300);
    let b = answer(&wall, "b.example.test", 3, 300);
    publish_now(&mut gw2, &store, &wall, vec![a2, b]).await;
    let (_stop_tx, stop) = watch::channel(false);
    // gw-1's own importer (its engine holds its answer) and a third gateway's.
    let (own, third) = (Arc::new(TestSink::default()), Arc::new(TestSink::default()));
    let now = wall.unix_ms();
    own.hold("lan", "a.example.test", &[ip(1), ip(2)], now + 300_000);
    let (p1, mut p1_rx) = publisher_channel();
    let own_rx = spawn_importer(&store, config("gw-1"), &own, &wall, p1, stop.clone());
    let (p3, _p3_rx) = publisher_channel();
    let third_rx = spawn_importer(&store, config("gw-3"), &third, &wall, p3, stop);
    until(Duration::from_secs(1), "gw-3 imports all", || {
        third.addrs("lan", "a.example.test", wall.unix_ms()) == [ip(1), ip(2)]
            && third.addrs("lan", "b.example.test", wall.unix_ms()) == [ip(3)]
    })
    .await;
    until(Duration::from_secs(1), "gw-1 watches", || {
        own_rx.borrow().importing
    })
    .await;
    // gw-1's key deleted: 10.0.0.1 is gone everywhere; 10.0.0.2 stays (gw-2's key has it).
    delete(&store, &config("gw-1").key("lan", "a.example.test")).await;
    until(Duration::from_secs(1), "gw-3 forgets 10.0.0.1", || {
        third.addrs("lan", "a.example.test", wall.unix_ms()) == [ip(2)]
    })
    .await;
    until(Duration::from_secs(1), "gw-1 forgets 10.0.0.1", || {
        own.addrs("lan", "a.example.test", wall.unix_ms()) == [ip(2)]
    })
    .await;
    let revocation = third.revocations.lock().unwrap()[0].clone();
    assert_eq!((revocation.addrs, revocation.record), (vec![ip(1)], false));
    // gw-1's publisher is told: a later answer writes the key again.
    let unwritten = loop {
        if let Publish::Unwritten(keys) = p1_rx.recv().await.unwrap() {
            break keys;
        }
    };
    assert_eq!(unwritten, [config("gw-1").key("lan", "a.example.test")]);
    // gw-2's key of a.example.test deleted: nothing carries the name for `lan` any more.
    delete(&store, &config("gw-2").key("lan", "a.example.test")).await;
    until(Duration::from_secs(1), "gw-3 forgets the name", || {
        third
            .addrs("lan", "a.example.test", wall.unix_ms())
            .is_empty()
    })
    .await;
    let last = third.revocations.lock().unwrap().last().unwrap().clone();
    assert_eq!((last.addrs, last.record), (vec![ip(2)], true));
    assert_eq!(third_rx.borrow().revoked, 2);
    assert_eq!(
        third.addrs("lan", "b.example.test", wall.unix_ms()),
        [ip(3)]
    );
}

/// Item 11: a lease running out deletes keys whose records expired: no revocation; a key
/// written again under a later bucket's lease outlives the old lease.
#[tokio::test(start_paused = true)]
async fn a_lease_running_out_revokes_nothing_and_a_key_put_again_outlives_it() {
    let store = MemoryStore::new();
    let wall = TestWall::new();
    let mut gw1 = Publisher::new(config("gw-1"));
    let short_a = answer(&wall, "a.example.test", 1, 10);
    let short_b = answer(&wall, "b.example.test", 2, 10);
    publish_now(&mut gw1, &store, &wall, vec![short_a, short_b]).await;
    let (_stop_tx, stop) = watch::channel(false);
    let sink = Arc::new(TestSink::default());
    let (ptx, _prx) = publisher_channel();
    let status = spawn_importer(&store, config("gw-2"), &sink, &wall, ptx, stop);
    until(Duration::from_secs(1), "imported", || {
        status.borrow().imported == 2
    })
    .await;
    let key_a = config("gw-1").key("lan", "a.example.test");
    let lease = store.leases().into_iter().next().unwrap();
    // 20 s on: both expired; a.example.test answered again for 300 s (a later bucket).
    tokio::time::advance(Duration::from_secs(20)).await;
    store.advance(Duration::from_secs(20));
    let again = answer(&wall, "a.example.test", 1, 300);
    publish_now(&mut gw1, &store, &wall, vec![again]).await;
    assert_eq!(store.leases().len(), 2);
    // The first lease runs out: b.example.test's key goes, a.example.test's stays.
    for _ in 0..12 {
        tokio::time::advance(Duration::from_secs(10)).await;
        store.advance(Duration::from_secs(10));
        settle(Duration::from_millis(5)).await;
    }
    assert!(!store.leases().contains(&lease), "the old lease ran out");
    assert_eq!(learned_keys(&store), [key_a]);
    assert!(sink.revocations.lock().unwrap().is_empty());
    assert_eq!(status.borrow().revoked, 0);
    assert_eq!(sink.addrs("lan", "a.example.test", wall.unix_ms()), [ip(1)]);
}

/// Item 11: the same answer rewritten without an address (what `cache forget` does to a key
/// it does not empty) revokes that address; a newer answer with other addresses replaces
/// the key's without revoking anything.
#[tokio::test(start_paused = true)]
async fn a_rewrite_without_an_address_revokes_it_and_a_newer_answer_does_not() {
    let store = MemoryStore::new();
    let wall = TestWall::new();
    let mut gw1 = Publisher::new(config("gw-1"));
    let mut a = answer(&wall, "a.example.test", 1, 300);
    a.addrs.push(ip(2));
    publish_now(&mut gw1, &store, &wall, vec![a]).await;
    let (_stop_tx, stop) = watch::channel(false);
    let sink = Arc::new(TestSink::default());
    let (ptx, _prx) = publisher_channel();
    let status = spawn_importer(&store, config("gw-2"), &sink, &wall, ptx, stop);
    until(Duration::from_secs(1), "imported", || {
        status.borrow().imported == 1
    })
    .await;
    let forget = Forget {
        name: "a.example.test".into(),
        addrs: Some(vec![ip(1)]),
        client: None,
    };
    let done = learned::revoke(&store, &config("gw-2"), &forget)
        .await
        .unwrap();
    assert_eq!(
        done,
        Revoked {
            deleted: 0,
            rewritten: 1,
            denied: 0
        }
    );
    let key = config("gw-1").key("lan", "a.example.test");
    assert_eq!(value(&store, &key).unwrap().addrs, [ip(2)]);
    until(Duration::from_secs(1), "10.0.0.1 revoked", || {
        sink.addrs("lan", "a.example.test", wall.unix_ms()) == [ip(2)]
    })
    .await;
    // A newer answer: the key now says 10.0.0.3 only; 10.0.0.2 is not revoked.
    settle(Duration::from_secs(1)).await;
    let newer = answer(&wall, "a.example.test", 3, 300);
    publish_now(&mut gw1, &store, &wall, vec![newer]).await;
    until(Duration::from_secs(1), "the newer answer imported", || {
        status.borrow().imported == 3
    })
    .await;
    assert_eq!(
        sink.addrs("lan", "a.example.test", wall.unix_ms()),
        [ip(2), ip(3)]
    );
    assert_eq!(status.borrow().revoked, 1);
}

/// Item 11: `cache forget` through the publisher: its client group's keys of the name are
/// deleted (another group's stay), what waits to be written loses it, an outage makes it
/// wait, and a later answer is written again.
#[tokio::test(start_paused = true)]
async fn cache_forget_reaches_the_groups_keys_and_waits_out_an_outage() {
    let store = MemoryStore::new();
    let wall = TestWall::new();
    let (_stop_tx, stop) = watch::channel(false);
    let (tx, status) = spawn_publisher(&store, "gw-1", &wall, 64, stop);
    let a = answer(&wall, "a.example.test", 1, 300);
    tx.send(Publish::Answer(a)).await.unwrap();
    let mut gw2 = Publisher::new(config("gw-2"));
    let mut other = answer(&wall, "a.example.test", 5, 300);
    other.client = "other".into();
    let lan2 = answer(&wall, "a.example.test", 1, 300);
    publish_now(&mut gw2, &store, &wall, vec![other, lan2]).await;
    until(Duration::from_secs(1), "written", || {
        status.borrow().published == 1
    })
    .await;
    // Down: an answer waits; the forget takes it out of what waits and waits too.
    store.set_down(true);
    let c = answer(&wall, "c.example.test", 7, 300);
    tx.send(Publish::Answer(c)).await.unwrap();
    let (reply, done) = oneshot::channel();
    let forget = Forget {
        name: "a.example.test".into(),
        addrs: None,
        client: Some("lan".into()),
    };
    tx.send(Publish::Forget(forget, Some(reply))).await.unwrap();
    let forget_c = Forget {
        name: "c.example.test".into(),
        addrs: None,
        client: None,
    };
    tx.send(Publish::Forget(forget_c, None)).await.unwrap();
    until(Duration::from_secs(1), "waiting", || {
        status.borrow().forgets_pending == 2 && !status.borrow().publishing
    })
    .await;
    assert_eq!(status.borrow().pending, 0, "c.example.test left what waits");
    store.set_down(false);
    let done = done.await.unwrap();
    assert_eq!(
        done,
        Revoked {
            deleted: 2,
            rewritten: 0,
            denied: 0
        },
        "gw-1's and gw-2's keys of a.example.test for lan"
    );
    let keys = learned_keys(&store);
    assert_eq!(keys, [config("gw-2").key("other", "a.example.test")]);
    until(Duration::from_secs(1), "nothing waits", || {
        status.borrow().forgets_pending == 0
    })
    .await;
    // Asked again: written again (what was written under the key is forgotten).
    let again = answer(&wall, "a.example.test", 1, 300);
    tx.send(Publish::Answer(again)).await.unwrap();
    until(Duration::from_secs(1), "written again", || {
        learned_keys(&store).contains(&config("gw-1").key("lan", "a.example.test"))
    })
    .await;
}

/// Item 8: a gateway that learned answers while etcd was unreachable and restarted before it
/// came back holds them (its journal) but no key carries them: its first read of the group
/// publishes them, and so does every read after a reconnection — not what a peer's key
/// carries, not what expired.
#[tokio::test(start_paused = true)]
async fn what_the_group_lacks_is_published_again_at_start_and_after_a_reconnection() {
    let store = MemoryStore::new();
    let wall = TestWall::new();
    let mut gw2 = Publisher::new(config("gw-2"));
    let imported = answer(&wall, "imported.example.test", 5, 300);
    publish_now(&mut gw2, &store, &wall, vec![imported]).await;
    let now = wall.unix_ms();
    let engine = Arc::new(TestSink::default());
    engine.hold("lan", "outage.example.test", &[ip(1)], now + 200_000);
    engine.hold("lan", "imported.example.test", &[ip(5)], now + 300_000);
    engine.hold("lan", "old.example.test", &[ip(9)], now - 1);
    let (_stop_tx, stop) = watch::channel(false);
    let (tx, publisher) = spawn_publisher(&store, "gw-1", &wall, 64, stop.clone());
    let status = spawn_importer(&store, config("gw-1"), &engine, &wall, tx, stop);
    let key = config("gw-1").key("lan", "outage.example.test");
    until(Duration::from_secs(1), "published again", || {
        value(&store, &key).is_some()
    })
    .await;
    let record = value(&store, &key).unwrap();
    assert_eq!(record.addrs, [ip(1)]);
    assert!(
        record.expires_ms.abs_diff(now + 200_000) <= 1000,
        "{record:?}"
    );
    settle(Duration::from_millis(50)).await;
    assert_eq!(learned_keys(&store).len(), 2, "{:?}", learned_keys(&store));
    assert_eq!(status.borrow().republished, 1);
    // A reconnection: what was learned meanwhile is published once the group is read again.
    store.set_down(true);
    until(Duration::from_secs(1), "disconnected", || {
        !status.borrow().importing
    })
    .await;
    engine.hold(
        "lan",
        "meanwhile.example.test",
        &[ip(2)],
        wall.unix_ms() + 100_000,
    );
    store.set_down(false);
    let key = config("gw-1").key("lan", "meanwhile.example.test");
    until(
        Duration::from_secs(5),
        "published after the reconnection",
        || value(&store, &key).is_some(),
    )
    .await;
    assert_eq!(status.borrow().republished, 2);
    assert!(publisher.borrow().publishing);
}

/// Item 11 across a reconnection: a key deleted while the watch was down is found missing
/// by the next read of the group, and revoked.
#[tokio::test(start_paused = true)]
async fn a_key_deleted_while_the_watch_was_down_is_revoked_on_the_next_read() {
    let store = MemoryStore::new();
    let wall = TestWall::new();
    let mut gw1 = Publisher::new(config("gw-1"));
    let a = answer(&wall, "a.example.test", 1, 300);
    publish_now(&mut gw1, &store, &wall, vec![a]).await;
    let (_stop_tx, stop) = watch::channel(false);
    let sink = Arc::new(TestSink::default());
    let (ptx, _prx) = publisher_channel();
    let status = spawn_importer(&store, config("gw-2"), &sink, &wall, ptx, stop);
    until(Duration::from_secs(1), "imported", || {
        status.borrow().imported == 1 && status.borrow().importing
    })
    .await;
    store.set_down(true);
    until(Duration::from_secs(1), "disconnected", || {
        !status.borrow().importing
    })
    .await;
    store.set_down(false);
    // Before the importer's retry reads the group again.
    delete(&store, &config("gw-1").key("lan", "a.example.test")).await;
    until(Duration::from_secs(5), "revoked", || {
        sink.addrs("lan", "a.example.test", wall.unix_ms())
            .is_empty()
    })
    .await;
    assert_eq!(status.borrow().revoked, 1);
}

/// Item 12: the import lag is that of new records — not the age of the records a start (or a
/// reconnection) reads again; the start-up import is reported apart.
#[tokio::test(start_paused = true)]
async fn the_import_lag_is_that_of_new_records() {
    let store = MemoryStore::new();
    let wall = TestWall::new();
    let mut gw1 = Publisher::new(config("gw-1"));
    let old: Vec<_> = (0..3)
        .map(|i| answer(&wall, &format!("old{i}.example.test"), i, 300))
        .collect();
    publish_now(&mut gw1, &store, &wall, old).await;
    // 35 s later gw-2 (re)starts: the records are 35 s old.
    tokio::time::advance(Duration::from_secs(35)).await;
    let (_stop_tx, stop) = watch::channel(false);
    let sink = Arc::new(TestSink::default());
    let (ptx, _prx) = publisher_channel();
    let status = spawn_importer(&store, config("gw-2"), &sink, &wall, ptx, stop);
    until(Duration::from_secs(1), "the start-up import", || {
        status.borrow().initial_import_done && status.borrow().importing
    })
    .await;
    let s = status.borrow().clone();
    assert_eq!((s.imported, s.startup_records), (3, 3), "{s:?}");
    assert_eq!((s.import_lag_ms, s.import_lag_max_ms), (0, 0), "{s:?}");
    // A new record: its own lag.
    let new = answer(&wall, "new.example.test", 9, 300);
    settle(Duration::from_millis(3)).await;
    publish_now(&mut gw1, &store, &wall, vec![new]).await;
    until(Duration::from_secs(1), "the new record", || {
        status.borrow().imported == 4
    })
    .await;
    let lag = status.borrow().import_lag_ms;
    assert!((3..100).contains(&lag), "{lag}");
    // A reconnection reads the old records again: not new.
    store.set_down(true);
    until(Duration::from_secs(1), "disconnected", || {
        !status.borrow().importing
    })
    .await;
    store.set_down(false);
    until(Duration::from_secs(5), "read again", || {
        status.borrow().importing && status.borrow().imported == 8
    })
    .await;
    assert!(
        status.borrow().import_lag_max_ms < 100,
        "{:?}",
        status.borrow()
    );
}

/// The in-memory store with etcd's permission check of least-privilege roles: writes only
/// under `writable` (a gateway's own keys).
#[derive(Clone)]
struct Guarded {
    inner: MemoryStore,
    writable: String,
}

impl fqdnd_cluster::Store for Guarded {
    type Watch = fqdnd_cluster::MemoryWatch;

    async fn range(&self, prefix: &str) -> Result<fqdnd_cluster::Snapshot, StoreError> {
        self.inner.range(prefix).await
    }

    async fn txn(&self, txn: fqdnd_cluster::Txn) -> Result<fqdnd_cluster::TxnOutcome, StoreError> {
        let allowed = txn.ops.iter().all(|op| match op {
            fqdnd_cluster::Op::Put { key, .. } | fqdnd_cluster::Op::Delete { key } => {
                key.starts_with(&self.writable)
            }
        });
        if !allowed {
            return Err(StoreError::Denied {
                reason: "permission denied".into(),
            });
        }
        self.inner.txn(txn).await
    }

    async fn grant(&self, ttl: Duration) -> Result<i64, StoreError> {
        self.inner.grant(ttl).await
    }

    async fn keep_alive(&self, lease: i64) -> Result<bool, StoreError> {
        self.inner.keep_alive(lease).await
    }

    async fn revoke(&self, lease: i64) -> Result<(), StoreError> {
        fqdnd_cluster::Store::revoke(&self.inner, lease).await
    }

    async fn watch(
        &self,
        prefix: &str,
        from: i64,
    ) -> Result<fqdnd_cluster::MemoryWatch, StoreError> {
        self.inner.watch(prefix, from).await
    }
}

/// With roles that let a gateway write only its own keys (docs/manual/cluster-and-ha.md, "Who is
/// trusted"), `cache forget` changes this gateway's keys, reports the others' as refused, and
/// holds back none of the answers waiting behind it.
#[tokio::test(start_paused = true)]
async fn cache_forget_under_least_privilege_changes_its_own_keys_and_reports_the_others() {
    let store = MemoryStore::new();
    let wall = TestWall::new();
    let mut gw2 = Publisher::new(config("gw-2"));
    let theirs = answer(&wall, "a.example.test", 2, 300);
    publish_now(&mut gw2, &store, &wall, vec![theirs]).await;
    let guarded = Guarded {
        inner: store.clone(),
        writable: format!("{}gw-1/", config("gw-1").group_prefix()),
    };
    let mut gw1 = Publisher::new(config("gw-1"));
    let mine = answer(&wall, "a.example.test", 1, 300);
    publish_now(&mut gw1, &store, &wall, vec![mine]).await;
    let (reply, done) = oneshot::channel();
    let forget = Forget {
        name: "a.example.test".into(),
        addrs: None,
        client: None,
    };
    gw1.forget(forget, Some(reply));
    let later = answer(&wall, "later.example.test", 3, 300);
    gw1.offer(later, Instant::now());
    let (written, _, _) = gw1
        .flush(&guarded, wall.unix_ms(), Instant::now())
        .await
        .unwrap();
    assert_eq!(written, 1, "the answer behind the forget is written");
    assert_eq!(
        done.await.unwrap(),
        Revoked {
            deleted: 1,
            rewritten: 0,
            denied: 1
        }
    );
    assert_eq!(
        learned_keys(&store),
        [
            config("gw-1").key("lan", "later.example.test"),
            config("gw-2").key("lan", "a.example.test"),
        ]
    );
    assert_eq!(gw1.forgets_pending(), 0);
}
