//! The live tail's records: a query log record with the client group (gateway) or endpoint
//! (node) its client address belongs to, by the longest prefix holding it — as the proxy
//! finds a query's client. The table of prefixes is a snapshot, taken again every few seconds,
//! so that the tail does not lock the engine once per query.

use std::net::IpAddr;
use std::time::Duration;

use fqdnd_dnsproxy::QueryLogEntry;
use ipnet::IpNet;
use serde::Serialize;

use crate::skeleton::Shared;

/// How old the snapshot may be.
const REFRESH: Duration = Duration::from_secs(5);

/// One query as the tail shows it.
#[derive(Debug, Serialize)]
pub(super) struct TailEntry<'a> {
    /// The query log's record.
    #[serde(flatten)]
    pub(super) entry: &'a QueryLogEntry,
    /// The client group or endpoint of its client address; `None` when none holds it.
    pub(super) group: Option<&'a str>,
}

/// The endpoints' prefixes, as of `at` (the daemon's clock).
#[derive(Debug, Default)]
pub(super) struct Groups {
    at: Option<Duration>,
    prefixes: Vec<(IpNet, String)>,
}

impl Groups {
    /// Builds the table from `(prefix, name)` pairs taken at `at`.
    pub(super) fn new(at: Duration, prefixes: Vec<(IpNet, String)>) -> Self {
        Self {
            at: Some(at),
            prefixes,
        }
    }

    /// Takes the table again from the engine if it is older than [`REFRESH`] at `now`.
    pub(super) fn refresh(&mut self, shared: &Shared, now: Duration) {
        if self.at.is_some_and(|at| now.saturating_sub(at) < REFRESH) {
            return;
        }
        let prefixes = shared
            .engine
            .lock()
            .map(|e| {
                e.ipcache
                    .endpoints()
                    .values()
                    .flat_map(|ep| ep.addresses.iter().map(|a| (*a, ep.name.clone())))
                    .collect()
            })
            .unwrap_or_default();
        *self = Self::new(now, prefixes);
    }

    /// The name of the longest prefix holding `addr`.
    pub(super) fn of(&self, addr: IpAddr) -> Option<&str> {
        self.prefixes
            .iter()
            .filter(|(net, _)| net.contains(&addr))
            .max_by_key(|(net, _)| net.prefix_len())
            .map(|(_, name)| name.as_str())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "test code")]
mod tests {
    use super::*;

    #[test]
    fn the_longest_prefix_names_the_client() {
        let g = Groups::new(
            Duration::ZERO,
            vec![
                ("10.0.0.0/8".parse().unwrap(), "lan".to_owned()),
                ("10.1.0.0/16".parse().unwrap(), "office".to_owned()),
                ("fd00::1/128".parse().unwrap(), "pod".to_owned()),
            ],
        );
        assert_eq!(g.of("10.1.2.3".parse().unwrap()), Some("office"));
        assert_eq!(g.of("10.2.2.3".parse().unwrap()), Some("lan"));
        assert_eq!(g.of("fd00::1".parse().unwrap()), Some("pod"));
        assert_eq!(g.of("192.0.2.1".parse().unwrap()), None);
    }
}
