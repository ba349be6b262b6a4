//! The NameManager: what DNS answered, for how long, and which FQDN selectors that makes
//! each IP carry.
//!
//! It owns
//! - DNS names and FQDN patterns with Cilium's exact `matchName` / `matchPattern` semantics
//!   ([`name`], [`pattern`]), and one [`Matcher`] compiled from every selector in force;
//! - the DNS cache: name → IPs with expiry (TTL raised to the minimum), how many names hold
//!   each IP, the endpoints that asked each name, a per-name
//!   IP cap, and zombies — expired or evicted IPs kept while the datapath reports them in use;
//! - the `fqdn:<selector>` labels on IPs: for each (name, IP) it upserts or removes labels in
//!   the IpCache under the owner `fqdn-name-manager/<name>`, and relabels cached IPs when a
//!   selector is added or removed;
//! - the per-name and per-endpoint circuit breakers.
//!
//! It never reads the clock (every call takes `now`), never sleeps, never talks to the
//! kernel (conntrack arrives through [`Connections`]) and never commits IpCache batches: the
//! caller decides when a batch goes to the datapath.

#![forbid(unsafe_code)]

pub mod answer;
mod cache;
mod config;
mod error;
mod manager;
pub mod matcher;
pub mod name;
pub mod pattern;

pub use answer::{Answer, AnswerError, Record, RecordData};
pub use cache::{IpEntry, RestoreRoom};
pub use config::Config;
pub use error::{Breaker, Error};
pub use manager::{
    BreakerTrips, CacheEntry, CachedName, Connections, Forget, Forgotten, GcStats, Learned,
    NameManager, OneByOne, Restore, RestoreAnswers, RestoreStats, Sizes, Stats,
};
pub use matcher::{Matcher, NameLabels, SelectorId};
pub use name::{DnsName, NameError, canonicalize};
pub use pattern::{FqdnSelector, PatternError, SelectorKind};
