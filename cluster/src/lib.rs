//! Cluster mode: global identities every node agrees on, endpoints visible across nodes, and
//! policy written once — on etcd, as Cilium's kvstore mode, with one central allocator
//! (CFP-27752).
//!
//! It owns
//! - the **key layout** under one prefix ([`keys`]): identities by number and by label set,
//!   endpoints per label set and node under the node's lease, each node's registration with
//!   its own addresses under the same lease, shared policy documents, the
//!   allocator's leader key and cursor;
//! - the **store** behind a trait ([`Store`]): etcd's data model (revisions, transactions with
//!   compares, leases, ordered watches), with [`EtcdStore`] over etcd's v3 API and
//!   [`MemoryStore`] — the same semantics in memory on a virtual clock — for tests;
//! - the **allocator** ([`Allocator`], the algorithm; [`operator::run`], the service with
//!   leader election): one identity per label set in 256–65535, created by a transaction
//!   that fails rather than make a duplicate, collected only when no endpoint has used it for
//!   a grace period;
//! - the **node side** ([`node::run`], [`View`]): watching the cluster, handing what changed to
//!   a [`Sink`], publishing the node's endpoints and registration (its own addresses) under
//!   its lease, persisting the view for a restart while etcd is down;
//! - a **highly available gateway group** ([`learned`]): what each gateway's DNS answers
//!   taught, published batched under expiry-bucket leases and imported by its peers through a
//!   [`LearnedSink`] the binary implements.
//!
//! It never
//! - creates a global identity from a node (only the allocator leader does);
//! - publishes a temporary identity (they never leave their node);
//! - knows the engine, the IpCache or the kernel: labels are its own [`Labels`], and a node's
//!   changes go to the [`Sink`] the binary implements;
//! - reads the wall clock: the algorithms take `now`; the services time leases and retries on
//!   tokio's clock (tests run them on a paused clock).

#![forbid(unsafe_code)]

mod allocator;
mod any;
mod error;
mod etcd;
pub mod keys;
mod labels;
pub mod learned;
mod memory;
pub mod node;
pub mod operator;
mod reject;
mod store;
mod view;

pub use allocator::{Allocator, Plan, check_identities};
pub use any::{AnyStore, AnyWatch};
pub use error::{Error, StoreError};
pub use etcd::{Connect, Credentials, EtcdStore, EtcdWatch, TlsFiles};
pub use keys::{CLUSTER_MAX, CLUSTER_MIN, EndpointRecord, IdentityRecord, Key, Layout, NodeRecord};
pub use labels::{Label, Labels};
pub use learned::{
    Held, Import, LearnedRecord, LearnedSink, Revocation, ShareConfig, ShareStatus, Wall,
};
pub use memory::{MemoryStore, MemoryWatch};
pub use node::{Local, LocalEndpoint, NodeConfig, NodeStatus, Sink};
pub use operator::{OperatorConfig, OperatorStatus};
pub use reject::{RecordKind, Rejections};
pub use store::{
    CmpOp, Compare, Event, Kv, LeaseId, Op, Revision, Snapshot, Store, Target, Txn, TxnOutcome,
    Watch, WatchBatch,
};
pub use view::{Changes, MAX_RECORD_ADDRESSES, Own, View};
