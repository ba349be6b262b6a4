//! [`LbMaps`]: the load balancer's three pinned maps (`fqdnd_lb_svc`, `fqdnd_lb_backends`,
//! `fqdnd_lb_revnat`), written from [`fqdnd_lb::LbWrite`]s in the order given and read back
//! as [`fqdnd_lb::MemoryMaps`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

use aya::maps::{HashMap, Map, MapData, MapError};
use fqdnd_lb::{
    BackendId, LbWrite, LoadBalancer, MemoryMaps, Protocol, RevNatIndex, ServiceKey, SlotValue,
};

use crate::error::Error;
use crate::sys::{LbBackend, LbRevNat, LbSvcKey, LbSvcValue};

/// The three LB maps, opened from their pins.
pub struct LbMaps {
    svc: HashMap<MapData, LbSvcKey, LbSvcValue>,
    backends: HashMap<MapData, u16, LbBackend>,
    rev_nat: HashMap<MapData, u16, LbRevNat>,
}

impl std::fmt::Debug for LbMaps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LbMaps").finish_non_exhaustive()
    }
}

/// What [`LbMaps::sync`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LbSyncStats {
    /// Entries already right.
    pub kept: usize,
    /// Entries written.
    pub written: usize,
    /// Entries deleted (in the maps, not in the state).
    pub removed: usize,
}

fn addr16(ip: IpAddr) -> ([u8; 16], u8) {
    let mut a = [0; 16];
    match ip {
        IpAddr::V4(v4) => {
            a[..4].copy_from_slice(&v4.octets());
            (a, 4)
        }
        IpAddr::V6(v6) => (v6.octets(), 6),
    }
}

fn ip_of(addr: &[u8; 16], family: u8) -> Option<IpAddr> {
    match family {
        4 => Some(IpAddr::V4(Ipv4Addr::new(
            addr[0], addr[1], addr[2], addr[3],
        ))),
        6 => Some(IpAddr::V6(Ipv6Addr::from(*addr))),
        _ => None,
    }
}

fn svc_key(service: &ServiceKey, slot: u16) -> LbSvcKey {
    let (addr, family) = addr16(service.vip);
    LbSvcKey {
        addr,
        dport: service.port.to_be(),
        slot,
        proto: service.proto.number(),
        family,
        pad: [0; 2],
    }
}

fn svc_value(v: &SlotValue) -> LbSvcValue {
    match *v {
        SlotValue::Service { count, rev_nat } => LbSvcValue {
            count,
            backend: 0,
            rev_nat: rev_nat.0,
            pad: 0,
        },
        SlotValue::Backend { id, rev_nat } => LbSvcValue {
            count: 0,
            backend: id.0,
            rev_nat: rev_nat.0,
            pad: 0,
        },
    }
}

fn backend_value(addr: SocketAddr, proto: Protocol) -> LbBackend {
    let (a, family) = addr16(addr.ip());
    LbBackend {
        addr: a,
        port: addr.port().to_be(),
        proto: proto.number(),
        family,
    }
}

fn rev_nat_value(vip: SocketAddr) -> LbRevNat {
    let (addr, family) = addr16(vip.ip());
    LbRevNat {
        addr,
        port: vip.port().to_be(),
        family,
        pad: 0,
    }
}

fn absent(e: &MapError) -> bool {
    match e {
        MapError::KeyNotFound => true,
        MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

fn ignore_absent(r: Result<(), MapError>) -> Result<(), Error> {
    match r {
        Err(e) if absent(&e) => Ok(()),
        r => Ok(r?),
    }
}

impl LbMaps {
    /// Opens the maps pinned in `pin_dir` (by [`crate::Loaded::load`]); nothing changes.
    pub fn open(pin_dir: &Path) -> Result<Self, Error> {
        let open = |name: &str| -> Result<Map, Error> {
            Ok(Map::from_map_data(MapData::from_pin(pin_dir.join(name))?)?)
        };
        Ok(LbMaps {
            svc: open("fqdnd_lb_svc")?.try_into()?,
            backends: open("fqdnd_lb_backends")?.try_into()?,
            rev_nat: open("fqdnd_lb_revnat")?.try_into()?,
        })
    }

    /// Applies `writes` one by one, in order (each is one syscall, so the programs see every
    /// intermediate state — which [`fqdnd_lb::LoadBalancer`] makes valid). Stops at the first
    /// failure (a full map: [`Error::Map`] with E2BIG).
    pub fn apply(&mut self, writes: &[LbWrite]) -> Result<(), Error> {
        for w in writes {
            match *w {
                LbWrite::SetBackend { id, addr, proto } => {
                    self.backends.insert(id.0, backend_value(addr, proto), 0)?;
                }
                LbWrite::RemoveBackend(id) => ignore_absent(self.backends.remove(&id.0))?,
                LbWrite::SetRevNat { index, vip } => {
                    self.rev_nat.insert(index.0, rev_nat_value(vip), 0)?;
                }
                LbWrite::RemoveRevNat(index) => ignore_absent(self.rev_nat.remove(&index.0))?,
                LbWrite::SetSlot {
                    service,
                    slot,
                    value,
                } => self
                    .svc
                    .insert(svc_key(&service, slot), svc_value(&value), 0)?,
                LbWrite::RemoveSlot { service, slot } => {
                    ignore_absent(self.svc.remove(&svc_key(&service, slot)))?;
                }
            }
        }
        Ok(())
    }

    /// The maps' contents. Entries that do not decode (unknown family or protocol) are left
    /// out.
    pub fn read(&self) -> Result<MemoryMaps, Error> {
        let mut m = MemoryMaps::default();
        for r in self.backends.iter() {
            let (id, b) = match r {
                Ok(e) => e,
                Err(MapError::KeyNotFound) => continue,
                Err(e) => return Err(e.into()),
            };
            if let (Some(ip), Some(proto)) =
                (ip_of(&b.addr, b.family), Protocol::from_number(b.proto))
            {
                m.backends.insert(
                    BackendId(id),
                    (SocketAddr::new(ip, u16::from_be(b.port)), proto),
                );
            }
        }
        for r in self.rev_nat.iter() {
            let (i, v) = match r {
                Ok(e) => e,
                Err(MapError::KeyNotFound) => continue,
                Err(e) => return Err(e.into()),
            };
            if let Some(ip) = ip_of(&v.addr, v.family) {
                m.rev_nats
                    .insert(RevNatIndex(i), SocketAddr::new(ip, u16::from_be(v.port)));
            }
        }
        for r in self.svc.iter() {
            let (k, v) = match r {
                Ok(e) => e,
                Err(MapError::KeyNotFound) => continue,
                Err(e) => return Err(e.into()),
            };
            let (Some(vip), Some(proto)) =
                (ip_of(&k.addr, k.family), Protocol::from_number(k.proto))
            else {
                continue;
            };
            let service = ServiceKey {
                vip,
                port: u16::from_be(k.dport),
                proto,
            };
            let value = if k.slot == 0 {
                SlotValue::Service {
                    count: v.count,
                    rev_nat: RevNatIndex(v.rev_nat),
                }
            } else {
                SlotValue::Backend {
                    id: BackendId(v.backend),
                    rev_nat: RevNatIndex(v.rev_nat),
                }
            };
            m.slots.insert((service, k.slot), value);
        }
        Ok(m)
    }

    /// Makes the maps hold exactly what `lb` wants, never flushing: entries already right
    /// are left alone (established flows and new ones see no gap), missing or different ones
    /// are written — backends and rev-NAT entries first, slot 0 of each service last — and
    /// then entries `lb` does not have are deleted (a service's count set to 0 first, slots
    /// before backends).
    pub fn sync(&mut self, lb: &LoadBalancer) -> Result<LbSyncStats, Error> {
        let have = self.read()?;
        let want = lb.maps();
        let mut stats = LbSyncStats::default();
        let mut writes = Vec::new();
        for w in lb.full_writes() {
            let same = match w {
                LbWrite::SetBackend { id, addr, proto } => {
                    have.backends.get(&id) == Some(&(addr, proto))
                }
                LbWrite::SetRevNat { index, vip } => have.rev_nats.get(&index) == Some(&vip),
                LbWrite::SetSlot {
                    service,
                    slot,
                    value,
                } => have.slots.get(&(service, slot)) == Some(&value),
                _ => false,
            };
            if same {
                stats.kept += 1;
            } else {
                writes.push(w);
            }
        }
        // Services `lb` does not have: new flows to them are dropped first (count 0), so
        // deleting their slots never leaves a count naming a missing slot.
        for ((service, slot), value) in &have.slots {
            if let (0, SlotValue::Service { rev_nat, .. }) = (*slot, value)
                && !want.slots.contains_key(&(*service, 0))
            {
                writes.push(LbWrite::SetSlot {
                    service: *service,
                    slot: 0,
                    value: SlotValue::Service {
                        count: 0,
                        rev_nat: *rev_nat,
                    },
                });
            }
        }
        stats.written = writes.len();
        for (service, slot) in have.slots.keys().rev() {
            if !want.slots.contains_key(&(*service, *slot)) {
                writes.push(LbWrite::RemoveSlot {
                    service: *service,
                    slot: *slot,
                });
            }
        }
        for index in have.rev_nats.keys() {
            if !want.rev_nats.contains_key(index) {
                writes.push(LbWrite::RemoveRevNat(*index));
            }
        }
        for id in have.backends.keys() {
            if !want.backends.contains_key(id) {
                writes.push(LbWrite::RemoveBackend(*id));
            }
        }
        stats.removed = writes.len() - stats.written;
        self.apply(&writes)?;
        Ok(stats)
    }
}
