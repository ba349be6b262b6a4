//! The DNS cache: name → IPs with expiry, the zombies among them, and IP → names.
//!
//! One entry per (name, IP). An entry is *live* until its expiry; then, or when the name's
//! IP cap evicts it, it becomes a *zombie* and stays only while the datapath reports the IP
//! in use. Times are whole seconds on the caller's clock.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use fqdnd_ipcache::LabelSet;
use smallvec::SmallVec;

/// Seconds on the caller's clock.
pub(crate) type Secs = u32;

/// One (name, IP) mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpEntry {
    /// The address.
    pub addr: IpAddr,
    /// When the answer that taught it expires (live), or expired/was evicted (zombie).
    pub expires: Secs,
}

/// What the cache holds for one name.
#[derive(Debug, Default)]
pub(crate) struct NameEntry {
    /// Live mappings.
    pub(crate) live: SmallVec<[IpEntry; 1]>,
    /// Zombies: expired or evicted, kept while in use.
    pub(crate) zombies: Vec<IpEntry>,
    /// The `fqdn:` labels of the selectors matching this name.
    pub(crate) labels: LabelSet,
    /// When this name was last answered.
    pub(crate) last_lookup: Secs,
}

impl NameEntry {
    pub(crate) fn holds(&self) -> usize {
        self.live.len() + self.zombies.len()
    }
}

/// Name → entries, and IP → names.
#[derive(Debug, Default)]
pub(crate) struct DnsCache {
    pub(crate) names: HashMap<Arc<str>, NameEntry>,
    pub(crate) reverse: HashMap<IpAddr, SmallVec<[Arc<str>; 1]>>,
}

impl DnsCache {
    pub(crate) fn link(&mut self, addr: IpAddr, name: &Arc<str>) {
        let names = self.reverse.entry(addr).or_default();
        if !names.iter().any(|n| n == name) {
            names.push(name.clone());
        }
    }

    pub(crate) fn unlink(&mut self, addr: IpAddr, name: &str) {
        if let Some(names) = self.reverse.get_mut(&addr) {
            names.retain(|n| &**n != name);
            if names.is_empty() {
                self.reverse.remove(&addr);
            }
        }
    }
}
