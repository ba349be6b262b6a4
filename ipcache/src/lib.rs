//! The IpCache: what fqdnd knows about destination prefixes, and what that means for policy.
//!
//! It owns
//! - **prefix metadata**: for each prefix, the labels each resource owner gives it (the
//!   NameManager owns one `fqdn-name-manager/<name>` per DNS name; policy owns the CIDRs its
//!   selectors name; endpoints own their addresses). A prefix's labels are the union over its
//!   owners, plus the `cidr:` label of the closest enclosing CIDR that has one (labels flow
//!   down), plus the world label;
//! - **identities**: one number per unique label set (not per IP), reference counted, in
//!   Cilium's ranges, with pre-allocation for FQDN selectors and a withhold API for restores;
//! - the **selector cache** (selector → identities) and **per-endpoint policy**
//!   (which identity, protocol and ports each endpoint may reach);
//! - the **circuit breaker** on identities created from DNS answers.
//!
//! Its output is ordered batches for a [`Datapath`]: policy entries first, ipcache flips
//! next, stale policy entries last.
//!
//! It never talks to the kernel, reads the clock, or knows what an FQDN pattern means: an
//! `fqdn:` label is an opaque key here; the NameManager decides which IPs carry it.

#![forbid(unsafe_code)]

mod cache;
mod config;
pub mod datapath;
mod endpoint;
mod endpoint_policy;
mod error;
pub mod identity;
pub mod labels;
mod metadata;
pub mod policy;
mod selector;

pub use cache::{Claims, IpCache, ManyUpserted, NotApplied, Refused, Stats};
pub use config::Config;
pub use datapath::{
    CountingDatapath, Datapath, DatapathChange, MemoryDatapath, PolicyKey, verdict,
};
pub use endpoint::{Endpoint, EndpointId, EndpointLabel};
pub use error::{Breaker, DatapathError, Error};
pub use identity::{Identity, Scope};
pub use labels::{Label, LabelId, LabelSet};
pub use metadata::{OwnerId, OwnerKind, ResourceOwner, host_prefix};
