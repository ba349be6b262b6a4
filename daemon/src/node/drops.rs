//! Policy drops reported by the datapath's ring buffer: counted in metrics, logged at debug
//! level, and kept in a bounded log that `fqdnd monitor` polls through the admin API.

use std::collections::{BTreeMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Drops kept for `fqdnd monitor`; older ones are forgotten (the reader is told how many).
const KEPT: usize = 4096;

/// One drop, as the admin API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Drop {
    /// Sequence number (1, 2, …) since the daemon started.
    pub seq: u64,
    /// Kernel monotonic time of the drop, nanoseconds.
    pub ts_ns: u64,
    /// The endpoint whose packet was dropped.
    pub endpoint: u16,
    /// Its name (when the endpoint still exists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_name: Option<String>,
    /// Where it was dropped: `interface` (the programs on an endpoint's interface) or
    /// `socket` (the cgroup socket programs: a host process's socket).
    #[serde(default = "interface")]
    pub seen: String,
    /// The interface it arrived on (0 for `socket`).
    pub ifindex: u32,
    /// Source address and port.
    pub src: String,
    /// Destination address and port.
    pub dst: String,
    /// `tcp`, `udp`, or the IP protocol number.
    pub proto: String,
    /// The peer's identity: the destination's for the endpoint's egress, the source's for
    /// its ingress.
    pub identity: u32,
    /// Why: `policy-denied`, `unhandled`, `no-dns-proxy`, `no-service-backend`,
    /// `source-spoofed`, `fragment-unknown`, `icmp-denied`, `ipv6-ext-headers`,
    /// `dns-not-redirected`, or the number.
    pub reason: String,
    /// ICMP/ICMPv6: the message's type and code (`src`/`dst` then carry no port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp: Option<(u8, u8)>,
}

/// `GET /v1/drops?since=N`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct DropPage {
    /// Drops with `seq > since`, oldest first.
    pub drops: Vec<Drop>,
    /// The sequence number to ask from next.
    pub next: u64,
    /// Drops after `since` no longer kept.
    pub missed: u64,
}

fn interface() -> String {
    "interface".to_owned()
}

/// The bounded drop log.
#[derive(Debug, Default)]
pub struct DropLog {
    inner: Mutex<Log>,
    /// Endpoint names by id, as of the last sync.
    names: Mutex<BTreeMap<u16, String>>,
}

#[derive(Debug, Default)]
struct Log {
    kept: VecDeque<Drop>,
    last_seq: u64,
}

/// The reason's name.
pub(super) fn reason_name(reason: u8) -> String {
    match reason {
        fqdnd_ebpf::sys::DROP_POLICY => "policy-denied".to_owned(),
        fqdnd_ebpf::sys::DROP_UNHANDLED => "unhandled".to_owned(),
        fqdnd_ebpf::sys::DROP_NO_PROXY => "no-dns-proxy".to_owned(),
        fqdnd_ebpf::sys::DROP_NO_BACKEND => "no-service-backend".to_owned(),
        fqdnd_ebpf::sys::DROP_SPOOFED => "source-spoofed".to_owned(),
        fqdnd_ebpf::sys::DROP_FRAGMENT => "fragment-unknown".to_owned(),
        fqdnd_ebpf::sys::DROP_ICMP => "icmp-denied".to_owned(),
        fqdnd_ebpf::sys::DROP_EXT_HEADERS => "ipv6-ext-headers".to_owned(),
        fqdnd_ebpf::sys::DROP_DNS_BYPASS => "dns-not-redirected".to_owned(),
        other => other.to_string(),
    }
}

fn proto_name(proto: u8) -> String {
    match proto {
        6 => "tcp".to_owned(),
        17 => "udp".to_owned(),
        1 => "icmp".to_owned(),
        58 => "icmpv6".to_owned(),
        other => other.to_string(),
    }
}

/// An event address: IPv4 in the first four bytes.
fn addr(family: u8, bytes: [u8; 16]) -> IpAddr {
    if family == 4 {
        IpAddr::from([bytes[0], bytes[1], bytes[2], bytes[3]])
    } else {
        IpAddr::from(bytes)
    }
}

fn endpoint_addr(addr: IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(addr, port).to_string()
}

impl DropLog {
    /// The endpoints' names, for the drops recorded from now on.
    pub fn set_names(&self, names: BTreeMap<u16, String>) {
        if let Ok(mut n) = self.names.lock() {
            *n = names;
        }
    }

    /// Records the events of one ring-buffer drain.
    pub fn record(&self, events: &[fqdnd_ebpf::sys::DropEvent]) {
        if events.is_empty() {
            return;
        }
        let names = self.names.lock().map(|n| n.clone()).unwrap_or_default();
        let Ok(mut log) = self.inner.lock() else {
            return;
        };
        for e in events {
            let reason = reason_name(e.reason);
            metrics::counter!(crate::metrics::catalogue::POLICY_DROPS, "reason" => reason.clone())
                .increment(1);
            log.last_seq += 1;
            let (src, dst) = (addr(e.family, e.saddr), addr(e.family, e.daddr));
            // ICMP events carry the type and code where ports would be
            let icmp = matches!((e.family, e.proto), (4, 1) | (6, 58)).then(|| {
                (
                    u8::try_from(e.sport).unwrap_or(u8::MAX),
                    u8::try_from(e.dport).unwrap_or(u8::MAX),
                )
            });
            let (src, dst) = if icmp.is_some() {
                (src.to_string(), dst.to_string())
            } else {
                (endpoint_addr(src, e.sport), endpoint_addr(dst, e.dport))
            };
            let seen = if e.source == fqdnd_ebpf::sys::SOURCE_SOCKET {
                "socket"
            } else {
                "interface"
            };
            let drop = Drop {
                seq: log.last_seq,
                ts_ns: e.ts_ns,
                endpoint: e.endpoint,
                endpoint_name: names.get(&e.endpoint).cloned(),
                seen: seen.to_owned(),
                ifindex: e.ifindex,
                src,
                dst,
                proto: proto_name(e.proto),
                identity: e.identity,
                reason,
                icmp,
            };
            tracing::debug!(endpoint = drop.endpoint, name = ?drop.endpoint_name, seen = %drop.seen, src = %drop.src, dst = %drop.dst, proto = %drop.proto, identity = drop.identity, reason = %drop.reason, "packet dropped");
            if log.kept.len() == KEPT {
                log.kept.pop_front();
            }
            log.kept.push_back(drop);
        }
    }

    /// Drops after `since`, at most `limit`.
    pub fn page(&self, since: u64, limit: usize) -> DropPage {
        let Ok(log) = self.inner.lock() else {
            return DropPage::default();
        };
        let first_kept = log.kept.front().map_or(log.last_seq + 1, |d| d.seq);
        let missed = first_kept.saturating_sub(since + 1);
        let drops: Vec<Drop> = log
            .kept
            .iter()
            .filter(|d| d.seq > since)
            .take(limit)
            .cloned()
            .collect();
        let next = drops.last().map_or(since.max(first_kept - 1), |d| d.seq);
        DropPage {
            drops,
            next,
            missed,
        }
    }
}
