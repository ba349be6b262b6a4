//! The store, the allocator and the node side against a real 3-member etcd cluster (the
//! system's `etcd`, on loopback ports): etcd's semantics as the in-memory store assumes them,
//! one identity per label set when many nodes register the same new labels at once (repeated),
//! and no identity change, no duplicate across the death of the etcd leader and of the
//! allocator leader.
//!
//! Skipped without etcd, unless `FQDND_REQUIRE_PRIVILEGED=1` (CI), where they fail.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "test code: real clocks and sleeps, a failed step should panic"
)]

#[path = "support/etcd.rs"]
#[allow(dead_code, unreachable_pub, reason = "shared with other test crates")]
mod etcd;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use etcd::EtcdCluster;
use fqdnd_cluster::operator::{self, OperatorConfig, OperatorStatus};
use fqdnd_cluster::{
    Compare, Connect, EndpointRecord, EtcdStore, Event, Label, Labels, Layout, Op, Store,
    StoreError, Txn, Watch, check_identities,
};
use tokio::sync::watch;

/// One etcd cluster at a time in this binary: each is three processes on two cores.
static SERIAL: Mutex<()> = Mutex::new(());

fn labels(app: &str) -> Labels {
    Labels::from(vec![Label {
        source: "k8s".into(),
        key: "app".into(),
        value: app.into(),
    }])
}

async fn connect(cluster: &EtcdCluster) -> EtcdStore {
    EtcdStore::connect(&Connect {
        endpoints: cluster.endpoints(),
        tls: None,
        credentials: None,
        timeout: Duration::from_secs(3),
    })
    .await
    .unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Retries `f` until it returns `Some` or `limit` passes (etcd may be electing a leader).
async fn eventually<T, F: Future<Output = Option<T>>>(
    what: &str,
    limit: Duration,
    mut f: impl FnMut() -> F,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "never happened within {limit:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn etcd_has_the_semantics_the_memory_store_assumes() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !etcd::available("etcd_semantics") {
        return;
    }
    let cluster = EtcdCluster::start("semantics", 3, None, "127.0.0.1");
    runtime().block_on(async {
        let s = connect(&cluster).await;
        // Compare-and-create: one of two writers wins.
        let create = |v: &str| Txn {
            compares: vec![Compare::missing("/s/k")],
            ops: vec![Op::Put {
                key: "/s/k".into(),
                value: v.into(),
                lease: None,
            }],
        };
        assert!(s.txn(create("a")).await.unwrap().succeeded);
        assert!(!s.txn(create("b")).await.unwrap().succeeded);
        // A prefix compare holds on an empty range and fails once a key appears after the
        // revision it names.
        let r0 = s.range("/s/").await.unwrap().revision;
        let guarded = |rev| Txn {
            compares: vec![Compare::unchanged_since("/s/p/", rev)],
            ops: vec![Op::Put {
                key: "/s/x".into(),
                value: b"1".to_vec(),
                lease: None,
            }],
        };
        assert!(s.txn(guarded(r0)).await.unwrap().succeeded);
        let r1 = s.range("/s/").await.unwrap().revision;
        s.txn(Txn {
            compares: vec![],
            ops: vec![Op::Put {
                key: "/s/p/a".into(),
                value: b"1".to_vec(),
                lease: None,
            }],
        })
        .await
        .unwrap();
        assert!(!s.txn(guarded(r1)).await.unwrap().succeeded);
        // A put on a revoked lease is LeaseNotFound; keep-alive says it is gone.
        let lease = s.grant(Duration::from_secs(5)).await.unwrap();
        assert!(s.keep_alive(lease).await.unwrap());
        s.revoke(lease).await.unwrap();
        assert!(!s.keep_alive(lease).await.unwrap());
        let err = s
            .txn(Txn {
                compares: vec![],
                ops: vec![Op::Put {
                    key: "/s/l".into(),
                    value: b"1".to_vec(),
                    lease: Some(lease),
                }],
            })
            .await
            .unwrap_err();
        assert_eq!(err, StoreError::LeaseNotFound { lease });
        // A range larger than one page is read whole, at one revision.
        let mut ops = Vec::new();
        for i in 0..2500 {
            ops.push(Op::Put {
                key: format!("/s/many/{i:05}"),
                value: b"v".to_vec(),
                lease: None,
            });
            if ops.len() == 100 {
                s.txn(Txn {
                    compares: vec![],
                    ops: std::mem::take(&mut ops),
                })
                .await
                .unwrap();
            }
        }
        let all = s.range("/s/many/").await.unwrap();
        assert_eq!(all.kvs.len(), 2500);
        assert!(all.kvs.windows(2).all(|w| w[0].key < w[1].key));
        // A watch from an old revision replays in order; a compacted one says so.
        let mut w = s.watch("/s/p/", r0).await.unwrap();
        let batch = w.next().await.unwrap();
        assert!(matches!(&batch.events[0], Event::Put(kv) if kv.key == "/s/p/a"));
        let now = s.range("/s/").await.unwrap().revision;
        let out = std::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args([
                "--endpoints",
                &cluster.endpoints()[0],
                "compact",
                &now.to_string(),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut old = s.watch("/s/p/", r0).await.unwrap();
        assert!(matches!(
            old.next().await,
            Err(StoreError::Compacted { .. })
        ));
        // A key that is not UTF-8 (anyone with access may write one) stops neither a range
        // nor a watch of its prefix: it comes through with its bytes replaced, a key no
        // reader of the layout takes for one of its own.
        let from = s.range("/s/").await.unwrap().revision + 1;
        let mut raw = etcd_client::Client::connect(cluster.endpoints(), None)
            .await
            .unwrap();
        raw.put(b"/s/bin/\xff\xfe".to_vec(), b"x".to_vec(), None)
            .await
            .unwrap();
        s.txn(Txn {
            compares: vec![],
            ops: vec![Op::Put {
                key: "/s/bin/ok".into(),
                value: b"1".to_vec(),
                lease: None,
            }],
        })
        .await
        .unwrap();
        let keys: Vec<String> = s
            .range("/s/bin/")
            .await
            .unwrap()
            .kvs
            .into_iter()
            .map(|kv| kv.key)
            .collect();
        assert_eq!(keys, ["/s/bin/ok", "/s/bin/\u{fffd}\u{fffd}"]);
        let mut w = s.watch("/s/bin/", from).await.unwrap();
        let mut seen = Vec::new();
        while seen.len() < 2 {
            seen.extend(w.next().await.unwrap().events);
        }
        assert!(matches!(&seen[1], Event::Put(kv) if kv.key == "/s/bin/ok"));
    });
}

fn start_operator(
    rt: &tokio::runtime::Runtime,
    store: EtcdStore,
    name: &str,
) -> (
    watch::Receiver<OperatorStatus>,
    watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
) {
    let mut config = OperatorConfig::new(name.to_owned(), Layout::new("/fqdnd-test"));
    config.lease_ttl = Duration::from_secs(3);
    let (status_tx, status) = watch::channel(OperatorStatus::default());
    let (stop, stop_rx) = watch::channel(false);
    let task = rt.spawn(async move {
        operator::run(store, config, status_tx, stop_rx)
            .await
            .unwrap();
    });
    (status, stop, task)
}

async fn table(store: &EtcdStore) -> Option<BTreeMap<u32, Labels>> {
    let layout = Layout::new("/fqdnd-test");
    let snapshot = store.range(&layout.root()).await.ok()?;
    Some(check_identities(&layout, &snapshot.kvs).unwrap())
}

/// Many nodes register the same new label sets at the same moment, with three allocators
/// running; then the etcd leader and the allocator leader are killed. Every label set ever
/// used has exactly one number, and no number changes.
#[test]
fn one_identity_per_label_set_through_etcd_and_allocator_leader_deaths() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !etcd::available("allocator_on_etcd") {
        return;
    }
    let mut cluster = EtcdCluster::start("allocator", 3, None, "127.0.0.1");
    let rt = runtime();
    let layout = Layout::new("/fqdnd-test");
    let mut operators = Vec::new();
    for name in ["op-a", "op-b", "op-c"] {
        let store = rt.block_on(connect(&cluster));
        operators.push(start_operator(&rt, store, name));
    }
    let client = rt.block_on(connect(&cluster));
    let mut numbers: BTreeMap<Labels, u32> = BTreeMap::new();
    let register_round = |round: u32, numbers: &mut BTreeMap<Labels, u32>| {
        rt.block_on(async {
            // 20 nodes × 3 new label sets, all at once.
            let mut tasks = Vec::new();
            for node in 0..20 {
                let client = client.clone();
                let layout = layout.clone();
                tasks.push(tokio::spawn(async move {
                    for set in 0..3 {
                        let key = layout.endpoint(
                            &labels(&format!("r{round}s{set}")),
                            &format!("n{node}"),
                            1,
                        );
                        let value = EndpointRecord::new(
                            &format!("n{node}"),
                            1,
                            labels(&format!("r{round}s{set}")),
                        )
                        .to_value();
                        eventually("an endpoint registered", Duration::from_secs(30), || {
                            let client = client.clone();
                            let key = key.clone();
                            let value = value.clone();
                            async move {
                                client
                                    .txn(Txn {
                                        compares: vec![],
                                        ops: vec![Op::Put {
                                            key,
                                            value,
                                            lease: None,
                                        }],
                                    })
                                    .await
                                    .ok()
                            }
                        })
                        .await;
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            let t = eventually(
                "identities for the round",
                Duration::from_secs(60),
                || async {
                    let t = table(&client).await?;
                    let done = (0..3)
                        .all(|set| t.values().any(|l| *l == labels(&format!("r{round}s{set}"))));
                    done.then_some(t)
                },
            )
            .await;
            for (id, l) in t {
                if let Some(old) = numbers.insert(l.clone(), id) {
                    assert_eq!(old, id, "{l} changed its number");
                }
            }
        });
    };
    for round in 0..3 {
        register_round(round, &mut numbers);
    }
    assert_eq!(numbers.len(), 9);
    // Kill the etcd leader: the allocators carry on through the election.
    let leader = cluster.leader().unwrap();
    cluster.kill(leader);
    cluster.wait_healthy(Duration::from_secs(30));
    register_round(3, &mut numbers);
    cluster.restart(leader);
    cluster.wait_healthy(Duration::from_secs(30));
    // Kill the allocator leader (its task dropped: no resignation): another takes over once
    // its lease (3 s) expires.
    let leading = operators.iter().position(|o| o.0.borrow().leading).unwrap();
    let (_, _, task) = operators.remove(leading);
    task.abort();
    let started = Instant::now();
    register_round(4, &mut numbers);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(30), "take-over took {took:?}");
    assert_eq!(numbers.len(), 15);
    let final_table = rt.block_on(table(&client)).unwrap();
    for (l, id) in &numbers {
        assert_eq!(final_table.get(id), Some(l), "{l} still has {id}");
    }
    assert_eq!(
        operators.iter().filter(|o| o.0.borrow().leading).count(),
        1,
        "one leader"
    );
    for (_, stop, task) in operators {
        let _ = stop.send(true);
        rt.block_on(task).unwrap();
    }
}

/// Runs `openssl ARGS` (`args` split at spaces) in `dir`; panics with its output on failure.
fn openssl(dir: &std::path::Path, args: &str) {
    let out = std::process::Command::new("openssl")
        .current_dir(dir)
        .args(args.split(' '))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, in `dir`.
fn certificates(dir: &std::path::Path) {
    let key = |name: &str| {
        openssl(
            dir,
            &format!("ecparam -name prime256v1 -genkey -noout -out {name}.key"),
        )
    };
    key("ca");
    openssl(
        dir,
        "req -x509 -new -key ca.key -subj /CN=fqdnd-test-ca -days 2 -out ca.pem",
    );
    for (name, ext) in [
        (
            "server",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        ),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ] {
        std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
        key(name);
        openssl(
            dir,
            &format!("req -new -key {name}.key -subj /CN={name} -out {name}.csr"),
        );
        openssl(
            dir,
            &format!(
                "x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
                 -extfile {name}.ext -out {name}.pem"
            ),
        );
    }
}

/// A member that requires TLS client certificates: the client connects with the CA and its
/// certificate, and is refused without the certificate.
#[test]
fn tls_with_a_client_certificate() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !etcd::available("etcd_tls") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let port = 9_000 + (std::process::id() % 900) as u16;
    let client_url = format!("https://127.0.0.1:{port}");
    let peer_url = format!("http://127.0.0.1:{}", port + 1000);
    let log = std::fs::File::create(dir.path().join("etcd.log")).unwrap();
    let pem = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let mut etcd = std::process::Command::new("etcd")
        .args(["--name", "tls0", "--data-dir"])
        .arg(dir.path().join("data"))
        .args([
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
        ])
        .args([
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
        .args(["--initial-cluster", &format!("tls0={peer_url}")])
        .args([
            "--cert-file",
            &pem("server.pem"),
            "--key-file",
            &pem("server.key"),
        ])
        .args(["--client-cert-auth", "--trusted-ca-file", &pem("ca.pem")])
        .args(["--logger", "zap", "--log-outputs", "stderr"])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime().block_on(async {
            let connect = |cert: bool| Connect {
                endpoints: vec![client_url.clone()],
                tls: Some(fqdnd_cluster::TlsFiles {
                    ca: Some(dir.path().join("ca.pem")),
                    cert: cert.then(|| dir.path().join("client.pem")),
                    key: cert.then(|| dir.path().join("client.key")),
                }),
                credentials: None,
                timeout: Duration::from_secs(3),
            };
            let store = EtcdStore::connect(&connect(true)).await.unwrap();
            eventually("a TLS transaction", Duration::from_secs(30), || {
                let store = store.clone();
                async move {
                    store
                        .txn(Txn {
                            compares: vec![],
                            ops: vec![Op::Put {
                                key: "/tls/k".into(),
                                value: b"v".to_vec(),
                                lease: None,
                            }],
                        })
                        .await
                        .ok()
                }
            })
            .await;
            assert_eq!(store.range("/tls/").await.unwrap().kvs.len(), 1);
            let anonymous = EtcdStore::connect(&connect(false)).await.unwrap();
            assert!(
                anonymous.range("/tls/").await.is_err(),
                "without a client certificate the member refuses"
            );
        });
    }));
    let _ = etcd.kill();
    let _ = etcd.wait();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
