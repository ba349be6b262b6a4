//! [`EtcdStore`]: the [`Store`] trait over etcd's v3 API (the `etcd-client` crate).
//!
//! Every call is bounded (`timeout`); a range is read in pages at one revision, so a large
//! keyspace never needs one huge response; a watch reports compaction as
//! [`StoreError::Compacted`] and anything that ends its stream as unreachable.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare as EtcdCompare, CompareOp, ConnectOptions, EventType, GetOptions,
    Identity as TlsIdentity, PutOptions, TlsOptions, Txn as EtcdTxn, TxnOp, WatchOptions,
    WatchResponseStream,
};

use crate::error::StoreError;
use crate::keys::prefix_end;
use crate::store::{
    CmpOp, Event, Kv, LeaseId, Op, Revision, Snapshot, Store, Target, Txn, TxnOutcome, Watch,
    WatchBatch,
};

/// Keys read per page of a range.
const PAGE: i64 = 2000;

/// The largest response accepted (a watch batch of one big transaction, a page of a range).
const MAX_MESSAGE: usize = 64 << 20;

/// TLS material for the client, as PEM files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA that signed the members' certificates (default: the system's roots are not
    /// used; without it the members' certificates are not trusted).
    pub ca: Option<PathBuf>,
    /// The client certificate, for members that require one.
    pub cert: Option<PathBuf>,
    /// Its key.
    pub key: Option<PathBuf>,
}

/// An etcd user and its password (etcd's authentication: the user's roles decide which keys
/// it may read and write).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user.
    pub user: String,
    /// Its password.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// How to reach etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    /// Member URLs (`http://127.0.0.1:2379`, `https://…` with TLS).
    pub endpoints: Vec<String>,
    /// TLS, if the members use it.
    pub tls: Option<TlsFiles>,
    /// A user to authenticate as, if the members have authentication on.
    pub credentials: Option<Credentials>,
    /// Bound on each call (and on connecting).
    pub timeout: Duration,
}

/// The [`Store`] over etcd.
#[derive(Clone)]
pub struct EtcdStore {
    /// Made on first use: with credentials, connecting authenticates, which needs a member.
    client: std::sync::Arc<tokio::sync::OnceCell<Client>>,
    endpoints: Vec<String>,
    options: ConnectOptions,
    timeout: Duration,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore").finish_non_exhaustive()
    }
}

fn setup(reason: impl std::fmt::Display) -> StoreError {
    StoreError::Setup {
        reason: reason.to_string(),
    }
}

fn read_pem(path: &PathBuf) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path).map_err(|e| setup(format_args!("reading {}: {e}", path.display())))
}

/// What an etcd-client error means for the caller.
fn map(e: etcd_client::Error) -> StoreError {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            let message = status.message();
            if message.contains("requested lease not found") {
                StoreError::LeaseNotFound { lease: 0 }
            } else if message.contains("compacted") {
                StoreError::Compacted {
                    requested: 0,
                    compacted: 0,
                }
            } else if matches!(
                status.code(),
                tonic::Code::PermissionDenied | tonic::Code::Unauthenticated
            ) || message.contains("authentication failed")
                || message.contains("user name is empty")
            {
                StoreError::Denied {
                    reason: message.to_owned(),
                }
            } else {
                match status.code() {
                    tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => {
                        StoreError::Refused {
                            reason: message.to_owned(),
                        }
                    }
                    _ => StoreError::Unavailable {
                        reason: format!("{:?}: {message}", status.code()),
                    },
                }
            }
        }
        etcd_client::Error::InvalidArgs(reason) => StoreError::Refused { reason },
        other => StoreError::Unavailable {
            reason: other.to_string(),
        },
    }
}

impl EtcdStore {
    /// A client of the members in `connect`. Connecting is lazy: this succeeds while every
    /// member is down, and each call then reports the store unreachable until one is back.
    ///
    /// # Errors
    /// A URL that does not parse, unreadable TLS files.
    pub async fn connect(connect: &Connect) -> Result<Self, StoreError> {
        let mut options = ConnectOptions::new()
            .with_timeout(connect.timeout)
            .with_connect_timeout(connect.timeout)
            // HTTP/2 pings find a member that went silent (a killed one resets at once);
            // generous, so a loaded machine does not cut a healthy watch.
            .with_keep_alive(
                Duration::from_secs(5),
                connect.timeout.max(Duration::from_secs(10)),
            )
            .with_keep_alive_while_idle(true);
        if let Some(tls) = &connect.tls {
            let mut config = TlsOptions::new();
            if let Some(ca) = &tls.ca {
                config = config.ca_certificate(Certificate::from_pem(read_pem(ca)?));
            }
            match (&tls.cert, &tls.key) {
                (Some(cert), Some(key)) => {
                    config =
                        config.identity(TlsIdentity::from_pem(read_pem(cert)?, read_pem(key)?));
                }
                (None, None) => {}
                _ => return Err(setup("a client certificate needs both `cert` and `key`")),
            }
            options = options.with_tls(config);
        }
        if connect.endpoints.is_empty() {
            return Err(setup("no etcd endpoint"));
        }
        if let Some(c) = &connect.credentials {
            options = options
                .with_user(c.user.clone(), c.password.clone())
                .with_auto_token_refresh(true);
        }
        let store = Self {
            client: std::sync::Arc::new(tokio::sync::OnceCell::new()),
            endpoints: connect.endpoints.clone(),
            options,
            timeout: connect.timeout,
        };
        // Without credentials connecting reaches no member: a bad URL shows now. With them
        // the first call connects (and authenticates).
        if connect.credentials.is_none() {
            store.client().await?;
        }
        Ok(store)
    }

    /// The client, connected (and authenticated) on first use.
    async fn client(&self) -> Result<&Client, StoreError> {
        self.client
            .get_or_try_init(|| async {
                match tokio::time::timeout(
                    self.timeout,
                    Client::connect(&self.endpoints, Some(self.options.clone())),
                )
                .await
                {
                    Ok(Ok(client)) => Ok(client),
                    Ok(Err(etcd_client::Error::InvalidUri(e))) => Err(setup(e)),
                    Ok(Err(e)) => Err(map(e)),
                    Err(_) => Err(StoreError::Unavailable {
                        reason: format!("no member answered within {:?}", self.timeout),
                    }),
                }
            })
            .await
    }

    async fn bounded<T>(
        &self,
        f: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(result) => result.map_err(map),
            Err(_) => Err(StoreError::Unavailable {
                reason: format!("no answer within {:?}", self.timeout),
            }),
        }
    }
}

/// A key-value pair as the store's caller sees it. A key that is not UTF-8 (no key of the
/// layout is) is read with replacement characters: it reaches the caller, which refuses it as
/// outside the layout, instead of failing the whole read or watch.
fn kv(kv: &etcd_client::KeyValue) -> Kv {
    Kv {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
        lease: kv.lease(),
    }
}

fn compare(c: &crate::store::Compare) -> EtcdCompare {
    let op = match c.op {
        CmpOp::Equal => CompareOp::Equal,
        CmpOp::NotEqual => CompareOp::NotEqual,
        CmpOp::Less => CompareOp::Less,
        CmpOp::Greater => CompareOp::Greater,
    };
    let key = c.key.clone();
    let out = match &c.target {
        Target::CreateRevision(r) => EtcdCompare::create_revision(key, op, *r),
        Target::ModRevision(r) => EtcdCompare::mod_revision(key, op, *r),
        Target::Version(v) => EtcdCompare::version(key, op, *v),
        Target::Value(v) => EtcdCompare::value(key, op, v.clone()),
    };
    match c.range_end() {
        Some(end) => out.with_range(end),
        None => out,
    }
}

impl Store for EtcdStore {
    type Watch = EtcdWatch;

    async fn range(&self, prefix: &str) -> Result<Snapshot, StoreError> {
        let end = prefix_end(prefix);
        let mut kv_client = self
            .client()
            .await?
            .kv_client()
            .max_decoding_message_size(MAX_MESSAGE);
        let mut out = Vec::new();
        let mut from = prefix.as_bytes().to_vec();
        let mut revision = 0;
        loop {
            let mut options = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
            if revision > 0 {
                options = options.with_revision(revision);
            }
            let resp = self
                .bounded(kv_client.get(from.clone(), Some(options)))
                .await?;
            if revision == 0 {
                revision = resp.header().map_or(0, |h| h.revision());
            }
            for item in resp.kvs() {
                out.push(kv(item));
            }
            match (resp.more(), resp.kvs().last()) {
                (true, Some(last)) => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => break,
            }
        }
        Ok(Snapshot { kvs: out, revision })
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome, StoreError> {
        let lease_of = txn.ops.iter().find_map(|op| match op {
            Op::Put { lease, .. } => *lease,
            Op::Delete { .. } => None,
        });
        let compares: Vec<EtcdCompare> = txn.compares.iter().map(compare).collect();
        let ops: Vec<TxnOp> = txn
            .ops
            .into_iter()
            .map(|op| match op {
                Op::Put { key, value, lease } => {
                    TxnOp::put(key, value, lease.map(|l| PutOptions::new().with_lease(l)))
                }
                Op::Delete { key } => TxnOp::delete(key, None),
            })
            .collect();
        let request = EtcdTxn::new().when(compares).and_then(ops);
        let mut kv_client = self.client().await?.kv_client();
        match self.bounded(kv_client.txn(request)).await {
            Ok(resp) => Ok(TxnOutcome {
                succeeded: resp.succeeded(),
                revision: resp.header().map_or(0, |h| h.revision()),
            }),
            Err(StoreError::LeaseNotFound { .. }) => Err(StoreError::LeaseNotFound {
                lease: lease_of.unwrap_or(0),
            }),
            Err(e) => Err(e),
        }
    }

    async fn grant(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        let secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let mut lease = self.client().await?.lease_client();
        Ok(self.bounded(lease.grant(secs, None)).await?.id())
    }

    async fn keep_alive(&self, id: LeaseId) -> Result<bool, StoreError> {
        let mut lease = self.client().await?.lease_client();
        match tokio::time::timeout(self.timeout, lease.keep_alive(id)).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => Ok(false),
            Ok(Err(e)) => Err(map(e)),
            Err(_) => Err(StoreError::Unavailable {
                reason: format!("no keep-alive answer within {:?}", self.timeout),
            }),
        }
    }

    async fn revoke(&self, id: LeaseId) -> Result<(), StoreError> {
        let mut lease = self.client().await?.lease_client();
        match self.bounded(lease.revoke(id)).await {
            Ok(_) | Err(StoreError::LeaseNotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<EtcdWatch, StoreError> {
        let options = WatchOptions::new()
            .with_range(prefix_end(prefix))
            .with_start_revision(from)
            .with_progress_notify();
        let mut client = self
            .client()
            .await?
            .watch_client()
            .max_decoding_message_size(MAX_MESSAGE);
        let stream = self.bounded(client.watch(prefix, Some(options))).await?;
        let (sender, stream) = stream.split();
        Ok(EtcdWatch {
            _sender: sender,
            stream,
            from,
        })
    }
}

/// A watch on etcd.
pub struct EtcdWatch {
    /// Dropping it would close the request side, which ends the watch.
    _sender: etcd_client::WatchRequestSender,
    stream: WatchResponseStream,
    from: Revision,
}

impl std::fmt::Debug for EtcdWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdWatch")
            .field("from", &self.from)
            .finish_non_exhaustive()
    }
}

impl Watch for EtcdWatch {
    async fn next(&mut self) -> Result<WatchBatch, StoreError> {
        loop {
            let resp = match self.stream.message().await {
                Ok(Some(resp)) => resp,
                Ok(None) => {
                    return Err(StoreError::Unavailable {
                        reason: "the watch stream ended".to_owned(),
                    });
                }
                Err(e) => return Err(map(e)),
            };
            if resp.canceled() {
                return Err(if resp.compact_revision() > 0 {
                    StoreError::Compacted {
                        requested: self.from,
                        compacted: resp.compact_revision(),
                    }
                } else {
                    StoreError::Unavailable {
                        reason: format!("the watch was cancelled: {}", resp.cancel_reason()),
                    }
                });
            }
            if resp.events().is_empty() {
                continue;
            }
            let mut events = Vec::with_capacity(resp.events().len());
            for e in resp.events() {
                let Some(item) = e.kv() else { continue };
                match e.event_type() {
                    EventType::Put => events.push(Event::Put(kv(item))),
                    EventType::Delete => events.push(Event::Delete {
                        key: kv(item).key,
                        revision: item.mod_revision(),
                    }),
                }
            }
            let revision = resp
                .header()
                .map_or(0, |h| h.revision())
                .max(events.last().map_or(0, Event::revision));
            self.from = revision + 1;
            return Ok(WatchBatch { events, revision });
        }
    }
}
