//! [`LoadBalancer`]: services, their backends in slot order, and id allocation.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::maps::{LbWrite, MemoryMaps, SlotValue};
use crate::types::{BackendId, Protocol, RevNatIndex, ServiceKey};

/// Most backends one service can have (slots are `u16`, slot 0 is the service entry).
pub const MAX_BACKENDS_PER_SERVICE: usize = u16::MAX as usize;

/// One service in an [`LbState`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceState {
    /// The service.
    pub key: ServiceKey,
    /// Its rev-NAT index.
    pub rev_nat: RevNatIndex,
    /// Its backends, in slot order (slot 1 first).
    pub backends: Vec<BackendId>,
}

/// One backend in an [`LbState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendState {
    /// Its id.
    pub id: BackendId,
    /// Its address.
    pub addr: SocketAddr,
    /// Its protocol.
    pub proto: Protocol,
}

/// Everything a restart needs to give every service, backend and rev-NAT entry the numbers
/// it had: what the checkpoint persists.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LbState {
    /// Services, sorted by key.
    pub services: Vec<ServiceState>,
    /// Backends, sorted by id.
    pub backends: Vec<BackendState>,
    /// Where the next backend id allocation starts.
    pub next_backend: u16,
    /// Where the next rev-NAT allocation starts.
    pub next_rev_nat: u16,
}

#[derive(Debug, Clone)]
struct Service {
    rev_nat: RevNatIndex,
    /// Backend of slot `i + 1`.
    slots: Vec<BackendId>,
}

#[derive(Debug, Clone)]
struct Backend {
    addr: SocketAddr,
    proto: Protocol,
    /// Slots naming it, over all services.
    refs: usize,
}

/// The services and what the LB maps must hold for them. Every change returns the ordered
/// writes that move the maps there; applied one at a time, every intermediate state passes
/// [`MemoryMaps::check`] — so a new flow never meets a hole, a duplicate or a missing backend,
/// and a removed backend gets no new flow from the write that overwrites or deletes its slot.
#[derive(Debug, Clone, Default)]
pub struct LoadBalancer {
    services: BTreeMap<ServiceKey, Service>,
    backends: BTreeMap<BackendId, Backend>,
    by_addr: HashMap<(SocketAddr, Protocol), BackendId>,
    next_backend: u16,
    next_rev_nat: u16,
}

/// The first number from `start` (1 after 65535; never 0) that `in_use` says is free.
fn allocate(start: u16, in_use: impl Fn(u16) -> bool) -> Option<u16> {
    let mut n = start.max(1);
    for _ in 0..u16::MAX {
        if !in_use(n) {
            return Some(n);
        }
        n = n.checked_add(1).unwrap_or(1);
    }
    None
}

impl LoadBalancer {
    /// An empty load balancer.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key`'s backends to `backends` (in that order for new slots; duplicates count
    /// once) — creating the service, or changing it in place: backends that stay keep their
    /// ids and slots, a removed one's slot gets the last slot's backend, new ones are
    /// appended. A backend address shared by several services has one id. Returns the
    /// writes, in order; an error changes and writes nothing.
    pub fn set_service(
        &mut self,
        key: ServiceKey,
        backends: &[SocketAddr],
    ) -> Result<Vec<LbWrite>, Error> {
        if key.vip.is_unspecified() || key.port == 0 {
            return Err(Error::InvalidService {
                service: key,
                what: "the VIP must be a unicast address and the port not 0",
            });
        }
        let mut wanted: Vec<SocketAddr> = Vec::with_capacity(backends.len());
        for b in backends {
            if b.is_ipv4() != key.vip.is_ipv4() {
                return Err(Error::FamilyMismatch {
                    service: key,
                    backend: *b,
                });
            }
            if b.ip().is_unspecified() || b.port() == 0 {
                return Err(Error::InvalidService {
                    service: key,
                    what: "a backend address must be unicast with a port",
                });
            }
            if !wanted.contains(b) {
                wanted.push(*b);
            }
        }
        if wanted.len() > MAX_BACKENDS_PER_SERVICE {
            return Err(Error::TooManyBackends {
                service: key,
                count: wanted.len(),
                max: MAX_BACKENDS_PER_SERVICE,
            });
        }
        let new_ids = wanted
            .iter()
            .filter(|a| !self.by_addr.contains_key(&(**a, key.proto)))
            .count();
        if self.backends.len() + new_ids > usize::from(u16::MAX) {
            return Err(Error::Exhausted {
                what: "backend id",
                in_use: self.backends.len(),
            });
        }
        let mut writes = Vec::new();
        let mut service = match self.services.remove(&key) {
            Some(s) => s,
            None => {
                let Some(n) = allocate(self.next_rev_nat, |n| {
                    self.services.values().any(|s| s.rev_nat.0 == n)
                }) else {
                    return Err(Error::Exhausted {
                        what: "rev-NAT index",
                        in_use: self.services.len(),
                    });
                };
                self.next_rev_nat = n.checked_add(1).unwrap_or(1);
                writes.push(LbWrite::SetRevNat {
                    index: RevNatIndex(n),
                    vip: key.addr(),
                });
                Service {
                    rev_nat: RevNatIndex(n),
                    slots: Vec::new(),
                }
            }
        };
        let rev_nat = service.rev_nat;
        let count_write = |slots: &[BackendId]| LbWrite::SetSlot {
            service: key,
            slot: 0,
            value: SlotValue::Service {
                count: u16::try_from(slots.len()).unwrap_or(u16::MAX),
                rev_nat,
            },
        };
        let slot_of = |i: usize| u16::try_from(i + 1).unwrap_or(u16::MAX);

        // New backend ids first: a slot never names a backend the map does not hold.
        let mut wanted_ids = Vec::with_capacity(wanted.len());
        for addr in &wanted {
            let id = match self.by_addr.get(&(*addr, key.proto)) {
                Some(id) => *id,
                None => {
                    let backends = &self.backends;
                    // Checked above: there is a free id.
                    let n = allocate(self.next_backend, |n| backends.contains_key(&BackendId(n)))
                        .unwrap_or(1);
                    self.next_backend = n.checked_add(1).unwrap_or(1);
                    let id = BackendId(n);
                    self.backends.insert(
                        id,
                        Backend {
                            addr: *addr,
                            proto: key.proto,
                            refs: 0,
                        },
                    );
                    self.by_addr.insert((*addr, key.proto), id);
                    writes.push(LbWrite::SetBackend {
                        id,
                        addr: *addr,
                        proto: key.proto,
                    });
                    id
                }
            };
            wanted_ids.push(id);
        }

        // Removals: the last slot's backend moves into the hole (it is in two slots for a
        // moment, the removed one in none), the count goes down, the last slot goes.
        let mut released = Vec::new();
        let removed: Vec<BackendId> = service
            .slots
            .iter()
            .copied()
            .filter(|id| !wanted_ids.contains(id))
            .collect();
        for id in removed {
            let Some(i) = service.slots.iter().position(|s| *s == id) else {
                continue;
            };
            let last = service.slots.len() - 1;
            if i != last {
                service.slots[i] = service.slots[last];
                writes.push(LbWrite::SetSlot {
                    service: key,
                    slot: slot_of(i),
                    value: SlotValue::Backend {
                        id: service.slots[i],
                        rev_nat,
                    },
                });
            }
            service.slots.pop();
            writes.push(count_write(&service.slots));
            writes.push(LbWrite::RemoveSlot {
                service: key,
                slot: slot_of(last),
            });
            released.push(id);
        }

        // Additions: the slots first, then the count that makes them visible.
        let before = service.slots.len();
        for id in &wanted_ids {
            if !service.slots.contains(id) {
                service.slots.push(*id);
                writes.push(LbWrite::SetSlot {
                    service: key,
                    slot: slot_of(service.slots.len() - 1),
                    value: SlotValue::Backend { id: *id, rev_nat },
                });
                if let Some(b) = self.backends.get_mut(id) {
                    b.refs += 1;
                }
            }
        }
        let is_new = writes
            .iter()
            .any(|w| matches!(w, LbWrite::SetRevNat { .. }));
        if service.slots.len() != before || is_new {
            writes.push(count_write(&service.slots));
        }
        self.services.insert(key, service);
        for id in released {
            self.release(id, &mut writes);
        }
        Ok(writes)
    }

    /// Removes a service: new flows to it are dropped first (count 0), then its slots, its
    /// rev-NAT entry and the backends no other service uses go. Unknown: no writes.
    pub fn remove_service(&mut self, key: &ServiceKey) -> Vec<LbWrite> {
        let Some(service) = self.services.remove(key) else {
            return Vec::new();
        };
        let mut writes = vec![LbWrite::SetSlot {
            service: *key,
            slot: 0,
            value: SlotValue::Service {
                count: 0,
                rev_nat: service.rev_nat,
            },
        }];
        for i in (0..service.slots.len()).rev() {
            writes.push(LbWrite::RemoveSlot {
                service: *key,
                slot: u16::try_from(i + 1).unwrap_or(u16::MAX),
            });
        }
        writes.push(LbWrite::RemoveSlot {
            service: *key,
            slot: 0,
        });
        writes.push(LbWrite::RemoveRevNat(service.rev_nat));
        for id in service.slots {
            self.release(id, &mut writes);
        }
        writes
    }

    /// One slot fewer names `id`; with none left the backend is deleted.
    fn release(&mut self, id: BackendId, writes: &mut Vec<LbWrite>) {
        let Some(b) = self.backends.get_mut(&id) else {
            return;
        };
        b.refs = b.refs.saturating_sub(1);
        if b.refs == 0 {
            let key = (b.addr, b.proto);
            self.backends.remove(&id);
            self.by_addr.remove(&key);
            writes.push(LbWrite::RemoveBackend(id));
        }
    }

    /// The services, sorted, each with its rev-NAT index and its backends in slot order.
    pub fn services(
        &self,
    ) -> impl Iterator<Item = (ServiceKey, RevNatIndex, Vec<(BackendId, SocketAddr)>)> + '_ {
        self.services.iter().map(|(k, s)| {
            let backends = s
                .slots
                .iter()
                .filter_map(|id| Some((*id, self.backends.get(id)?.addr)))
                .collect();
            (*k, s.rev_nat, backends)
        })
    }

    /// Whether `key` is a service.
    #[must_use]
    pub fn contains(&self, key: &ServiceKey) -> bool {
        self.services.contains_key(key)
    }

    /// The backend a flow with `hash` goes to, the way the datapath picks it (slot
    /// `hash % count + 1`): the DNS proxy uses it for queries to a service VIP.
    #[must_use]
    pub fn pick(&self, key: &ServiceKey, hash: u32) -> Option<SocketAddr> {
        let s = self.services.get(key)?;
        let n = u32::try_from(s.slots.len()).ok().filter(|n| *n > 0)?;
        let id = s.slots.get(usize::try_from(hash % n).ok()?)?;
        Some(self.backends.get(id)?.addr)
    }

    /// The backend of the service at `vip` over `proto` for the client flow `client`, if `vip`
    /// is a service: the flow's hash (address, port, protocol; a fixed-key hasher, so the
    /// same in every process) picks the slot, so every query of one flow goes to the same
    /// backend. The DNS proxy uses it for queries to a service VIP.
    #[must_use]
    pub fn backend_for_flow(
        &self,
        vip: SocketAddr,
        proto: Protocol,
        client: SocketAddr,
    ) -> Option<SocketAddr> {
        use std::hash::{BuildHasher, Hash, Hasher};
        let key = ServiceKey {
            vip: vip.ip(),
            port: vip.port(),
            proto,
        };
        if !self.contains(&key) {
            return None;
        }
        let mut h =
            std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
                .build_hasher();
        client.hash(&mut h);
        h.write_u8(proto.number());
        self.pick(&key, (h.finish() >> 32) as u32)
    }

    /// Every entry the maps must hold, as writes into empty maps (backends and rev-NAT entries
    /// first, slot 0 of each service last).
    #[must_use]
    pub fn full_writes(&self) -> Vec<LbWrite> {
        let mut writes: Vec<LbWrite> = self
            .backends
            .iter()
            .map(|(id, b)| LbWrite::SetBackend {
                id: *id,
                addr: b.addr,
                proto: b.proto,
            })
            .collect();
        for (key, s) in &self.services {
            writes.push(LbWrite::SetRevNat {
                index: s.rev_nat,
                vip: key.addr(),
            });
        }
        for (key, s) in &self.services {
            for (i, id) in s.slots.iter().enumerate() {
                writes.push(LbWrite::SetSlot {
                    service: *key,
                    slot: u16::try_from(i + 1).unwrap_or(u16::MAX),
                    value: SlotValue::Backend {
                        id: *id,
                        rev_nat: s.rev_nat,
                    },
                });
            }
            writes.push(LbWrite::SetSlot {
                service: *key,
                slot: 0,
                value: SlotValue::Service {
                    count: u16::try_from(s.slots.len()).unwrap_or(u16::MAX),
                    rev_nat: s.rev_nat,
                },
            });
        }
        writes
    }

    /// The maps as [`Self::full_writes`] fills them.
    #[must_use]
    pub fn maps(&self) -> MemoryMaps {
        let mut m = MemoryMaps::default();
        for w in self.full_writes() {
            m.apply(&w);
        }
        m
    }

    /// What the checkpoint persists.
    #[must_use]
    pub fn state(&self) -> LbState {
        LbState {
            services: self
                .services
                .iter()
                .map(|(k, s)| ServiceState {
                    key: *k,
                    rev_nat: s.rev_nat,
                    backends: s.slots.clone(),
                })
                .collect(),
            backends: self
                .backends
                .iter()
                .map(|(id, b)| BackendState {
                    id: *id,
                    addr: b.addr,
                    proto: b.proto,
                })
                .collect(),
            next_backend: self.next_backend,
            next_rev_nat: self.next_rev_nat,
        }
    }

    /// The load balancer a [`LbState`] describes, with every id it had. Backends no service
    /// uses are dropped (their ids are free again once the counters wrap).
    pub fn from_state(state: &LbState) -> Result<Self, Error> {
        let bad = |what: String| Err(Error::Inconsistent(what));
        let mut lb = LoadBalancer {
            next_backend: state.next_backend,
            next_rev_nat: state.next_rev_nat,
            ..Self::default()
        };
        for b in &state.backends {
            if b.id.0 == 0 {
                return bad("backend id 0".to_owned());
            }
            if lb.by_addr.insert((b.addr, b.proto), b.id).is_some()
                || lb
                    .backends
                    .insert(
                        b.id,
                        Backend {
                            addr: b.addr,
                            proto: b.proto,
                            refs: 0,
                        },
                    )
                    .is_some()
            {
                return bad(format!(
                    "backend {} ({} {}) given twice",
                    b.id, b.addr, b.proto
                ));
            }
        }
        for s in &state.services {
            if s.rev_nat.0 == 0 || lb.services.values().any(|o| o.rev_nat == s.rev_nat) {
                return bad(format!(
                    "{}: rev-NAT index {} is 0 or taken",
                    s.key, s.rev_nat
                ));
            }
            if s.backends.len() > MAX_BACKENDS_PER_SERVICE {
                return bad(format!("{}: {} backends", s.key, s.backends.len()));
            }
            for (i, id) in s.backends.iter().enumerate() {
                if s.backends[..i].contains(id) {
                    return bad(format!("{}: backend {id} in two slots", s.key));
                }
                match lb.backends.get_mut(id) {
                    Some(b)
                        if b.proto == s.key.proto && b.addr.is_ipv4() == s.key.vip.is_ipv4() =>
                    {
                        b.refs += 1;
                    }
                    _ => return bad(format!("{}: backend {id} unknown or unsuitable", s.key)),
                }
            }
            if lb
                .services
                .insert(
                    s.key,
                    Service {
                        rev_nat: s.rev_nat,
                        slots: s.backends.clone(),
                    },
                )
                .is_some()
            {
                return bad(format!("{} given twice", s.key));
            }
        }
        let unused: Vec<BackendId> = lb
            .backends
            .iter()
            .filter(|(_, b)| b.refs == 0)
            .map(|(id, _)| *id)
            .collect();
        for id in unused {
            if let Some(b) = lb.backends.remove(&id) {
                lb.by_addr.remove(&(b.addr, b.proto));
            }
        }
        Ok(lb)
    }

    /// The load balancer the maps describe (a restart without a checkpoint adopts what the
    /// pinned maps hold, so established flows keep their backend ids). Slots past a count
    /// and entries no service uses are ignored; the counters start after the largest ids.
    pub fn from_maps(maps: &MemoryMaps) -> Result<Self, Error> {
        let mut state = LbState::default();
        for ((key, slot), value) in &maps.slots {
            let (0, SlotValue::Service { count, rev_nat }) = (*slot, *value) else {
                continue;
            };
            let mut backends = Vec::with_capacity(usize::from(count));
            for s in 1..=count {
                match maps.slots.get(&(*key, s)) {
                    Some(SlotValue::Backend { id, .. }) => backends.push(*id),
                    _ => {
                        return Err(Error::Inconsistent(format!(
                            "{key}: slot {s} of {count} is missing"
                        )));
                    }
                }
            }
            state.services.push(ServiceState {
                key: *key,
                rev_nat,
                backends,
            });
        }
        state.backends = maps
            .backends
            .iter()
            .map(|(id, (addr, proto))| BackendState {
                id: *id,
                addr: *addr,
                proto: *proto,
            })
            .collect();
        let after = |n: Option<u16>| n.map_or(1, |n| n.checked_add(1).unwrap_or(1));
        state.next_backend = after(maps.backends.keys().map(|b| b.0).max());
        state.next_rev_nat = after(state.services.iter().map(|s| s.rev_nat.0).max());
        Self::from_state(&state)
    }
}
