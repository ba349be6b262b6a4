//! Conntrack (`fqdnd_ct`): the entries read back ([`CtEntry`]), the live destinations the
//! name manager's GC keeps addresses for, the GC of dead entries, and the lifetimes by state
//! (`fqdnd_settings`).

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use aya::maps::MapError;
use fqdnd_ipcache::DatapathError;

use super::{KernelDatapath, map_err, not_found};
use crate::error::Error;
use crate::sys::{self, CtKey, CtValue, Settings};

/// How long a conntrack entry lives after a packet, by state (`fqdnd_settings`). Defaults:
/// Cilium's (TCP SYN 60 s, established 6 h, closing 10 s, other 60 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CtLifetimes {
    /// A TCP flow that has seen only SYNs.
    pub tcp_syn: Duration,
    /// An established TCP flow (a packet without SYN seen).
    pub tcp_established: Duration,
    /// A closing TCP flow: FIN in both directions, or RST.
    pub tcp_closing: Duration,
    /// Every other protocol (UDP, ICMP echo).
    pub other: Duration,
}

impl Default for CtLifetimes {
    fn default() -> Self {
        CtLifetimes {
            tcp_syn: Duration::from_nanos(sys::CT_TCP_SYN_DEFAULT_NS),
            tcp_established: Duration::from_nanos(sys::CT_TCP_ESTABLISHED_DEFAULT_NS),
            tcp_closing: Duration::from_nanos(sys::CT_TCP_CLOSING_DEFAULT_NS),
            other: Duration::from_nanos(sys::CT_OTHER_DEFAULT_NS),
        }
    }
}

/// The state of a conntrack entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CtState {
    /// TCP, only SYNs seen.
    TcpSyn,
    /// TCP, a packet without SYN seen.
    TcpEstablished,
    /// TCP, FIN both ways or RST.
    TcpClosing,
    /// Not TCP.
    Other,
}

impl CtState {
    /// The name `fqdnd bpf ct list` shows.
    pub fn name(self) -> &'static str {
        match self {
            CtState::TcpSyn => "syn",
            CtState::TcpEstablished => "established",
            CtState::TcpClosing => "closing",
            CtState::Other => "-",
        }
    }
}

/// One conntrack entry, read back. Addresses and ports as on the wire, in the direction of the
/// flow's first packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CtEntry {
    /// Source address.
    pub src: IpAddr,
    /// Source port.
    pub sport: u16,
    /// Destination address.
    pub dst: IpAddr,
    /// Destination port.
    pub dport: u16,
    /// IP protocol (6 TCP, 17 UDP, 1 ICMP, 58 ICMPv6; ICMP echo: the identifier is `sport`
    /// of the request's tuple).
    pub proto: u8,
    /// `sys::CT_*` flags: [`sys::CT_EGRESS`] (opened by the endpoint) or [`sys::CT_INGRESS`],
    /// and the TCP state bits.
    pub flags: u32,
    /// Creation, `CLOCK_MONOTONIC` nanoseconds (`bpf_ktime_get_ns`).
    pub created_ns: u64,
    /// Last packet, `CLOCK_MONOTONIC` nanoseconds.
    pub last_seen_ns: u64,
    /// When the entry dies without another packet, `CLOCK_MONOTONIC` nanoseconds.
    pub expires_ns: u64,
    /// Rev-NAT index of the service of a load-balanced flow, 0 = none.
    pub rev_nat: u16,
    /// The backend a client → VIP flow is translated to, 0 = none.
    pub backend: u16,
    /// [`sys::CT_ZONE_INTERFACE`] (seen by the interface programs) or [`sys::CT_ZONE_SOCKET`]
    /// (a host process's flow, seen by the cgroup socket programs).
    pub zone: u8,
}

impl CtEntry {
    fn new(k: &CtKey, v: &CtValue) -> Option<Self> {
        let (src, dst) = match k.family {
            4 => {
                let a = |b: &[u8; 16]| IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]));
                (a(&k.saddr), a(&k.daddr))
            }
            6 => (
                IpAddr::V6(Ipv6Addr::from(k.saddr)),
                IpAddr::V6(Ipv6Addr::from(k.daddr)),
            ),
            _ => return None,
        };
        Some(CtEntry {
            src,
            sport: u16::from_be(k.sport),
            dst,
            dport: u16::from_be(k.dport),
            proto: k.proto,
            flags: v.flags,
            created_ns: v.created_ns,
            last_seen_ns: v.last_seen_ns,
            expires_ns: v.expires_ns,
            rev_nat: v.rev_nat,
            backend: v.backend,
            zone: k.zone,
        })
    }

    /// The entry's state.
    pub fn state(&self) -> CtState {
        if self.proto != sys::PROTO_TCP {
            CtState::Other
        } else if self.flags & sys::CT_TCP_RST != 0
            || self.flags & (sys::CT_TCP_FIN_FWD | sys::CT_TCP_FIN_REV)
                == sys::CT_TCP_FIN_FWD | sys::CT_TCP_FIN_REV
        {
            CtState::TcpClosing
        } else if self.flags & sys::CT_TCP_SEEN_NON_SYN != 0 {
            CtState::TcpEstablished
        } else {
            CtState::TcpSyn
        }
    }

    /// Whether the entry is alive at `now_ns` (`CLOCK_MONOTONIC`): the programs treat a dead
    /// one as absent.
    pub fn alive(&self, now_ns: u64) -> bool {
        self.expires_ns > now_ns
    }

    /// How long it lives without another packet, from `now_ns` (zero when dead).
    pub fn remaining(&self, now_ns: u64) -> Duration {
        Duration::from_nanos(self.expires_ns.saturating_sub(now_ns))
    }
}

/// `CLOCK_MONOTONIC` now in nanoseconds: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> Result<u64, Error> {
    let t =
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_err(|e| Error::Io {
            what: "clock_gettime(CLOCK_MONOTONIC)".to_owned(),
            error: e.into(),
        })?;
    Ok(u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
        + u64::try_from(t.tv_nsec()).unwrap_or(0))
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The conntrack map.
type CtMap = aya::maps::HashMap<aya::maps::MapData, CtKey, CtValue>;

/// The conntrack map on a handle of its own: what the daemon's GC and occupancy sampling walk
/// (a walk of a large map takes a while), apart from the datapath's other maps and any lock
/// on them.
pub struct Conntrack {
    ct: CtMap,
}

impl Conntrack {
    /// Opens the pinned conntrack map under `pin_dir`.
    ///
    /// # Errors
    /// The map is not pinned there, or is not the conntrack map.
    pub fn open(pin_dir: &std::path::Path) -> Result<Self, Error> {
        Ok(Self {
            ct: super::open_map(pin_dir, "fqdnd_ct")?.try_into()?,
        })
    }

    /// Every conntrack entry (unordered).
    ///
    /// # Errors
    /// Reading the map failed.
    pub fn entries(&self) -> Result<Vec<CtEntry>, Error> {
        entries(&self.ct)
    }

    /// Destination addresses of the live flows endpoints opened (see
    /// [`KernelDatapath::live_destinations`]).
    ///
    /// # Errors
    /// Reading the map or the clock failed.
    pub fn live_destinations(&self) -> Result<HashSet<IpAddr>, Error> {
        live_destinations(&self.ct)
    }

    /// Deletes the dead entries; returns how many (see [`KernelDatapath::gc_conntrack`]).
    ///
    /// # Errors
    /// Reading or writing the map failed.
    pub fn gc(&mut self) -> Result<usize, Error> {
        gc(&mut self.ct)
    }
}

fn entries(ct: &CtMap) -> Result<Vec<CtEntry>, Error> {
    let mut out = Vec::new();
    for r in ct.iter() {
        match r {
            Ok((k, v)) => out.extend(CtEntry::new(&k, &v)),
            // an entry deleted (LRU eviction, GC) between the key walk and the lookup
            Err(MapError::KeyNotFound) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

fn live_destinations(ct: &CtMap) -> Result<HashSet<IpAddr>, Error> {
    let now = monotonic_ns()?;
    Ok(entries(ct)?
        .into_iter()
        .filter(|e| e.flags & sys::CT_EGRESS != 0 && e.alive(now))
        .map(|e| e.dst)
        .collect())
}

fn gc(ct: &mut CtMap) -> Result<usize, Error> {
    let now = monotonic_ns()?;
    let mut dead = Vec::new();
    for r in ct.iter() {
        match r {
            Ok((k, v)) if v.expires_ns <= now => dead.push(k),
            Ok(_) | Err(MapError::KeyNotFound) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut n = 0;
    for k in &dead {
        // a packet may have revived it since the walk: delete only what is still dead
        match ct.get(k, 0) {
            Ok(v) if v.expires_ns > now => continue,
            Ok(_) => {}
            Err(e) if not_found(&e) => continue,
            Err(e) => return Err(e.into()),
        }
        match ct.remove(k) {
            Ok(()) => n += 1,
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(n)
}

impl KernelDatapath {
    /// Every conntrack entry (unordered).
    pub fn ct_entries(&self) -> Result<Vec<CtEntry>, Error> {
        entries(&self.ct)
    }

    /// Destination addresses of the live flows endpoints opened (`CT_EGRESS`): entries not past
    /// their lifetime (which depends on their state: [`CtLifetimes`]). The "connections still
    /// use this IP" input of the name manager's GC: a zombie stays while such a flow lives.
    pub fn live_destinations(&self) -> Result<HashSet<IpAddr>, Error> {
        live_destinations(&self.ct)
    }

    /// Deletes the dead conntrack entries (past their lifetime; the programs already treat
    /// them as absent); returns how many. (The map is also LRU: when full, the kernel evicts
    /// the least recently used.)
    pub fn gc_conntrack(&mut self) -> Result<usize, Error> {
        gc(&mut self.ct)
    }

    /// Sets the conntrack lifetimes the programs use from their next packet on (entries keep
    /// the expiry their last packet gave them).
    pub fn set_ct_lifetimes(&mut self, l: &CtLifetimes) -> Result<(), DatapathError> {
        let v = Settings {
            ct_tcp_syn_ns: nanos(l.tcp_syn),
            ct_tcp_established_ns: nanos(l.tcp_established),
            ct_tcp_closing_ns: nanos(l.tcp_closing),
            ct_other_ns: nanos(l.other),
        };
        self.settings
            .set(0, v, 0)
            .map_err(|e| map_err("fqdnd_settings", "settings update", e))
    }

    /// The conntrack lifetimes the programs use (defaults for fields never set).
    pub fn ct_lifetimes(&self) -> Result<CtLifetimes, Error> {
        let v = self.settings.get(&0, 0)?;
        let d = CtLifetimes::default();
        let pick = |ns: u64, default: Duration| {
            if ns == 0 {
                default
            } else {
                Duration::from_nanos(ns)
            }
        };
        Ok(CtLifetimes {
            tcp_syn: pick(v.ct_tcp_syn_ns, d.tcp_syn),
            tcp_established: pick(v.ct_tcp_established_ns, d.tcp_established),
            tcp_closing: pick(v.ct_tcp_closing_ns, d.tcp_closing),
            other: pick(v.ct_other_ns, d.other),
        })
    }
}
