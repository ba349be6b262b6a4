//! The writes the datapath applies, and [`MemoryMaps`]: the same maps in memory, with the
//! datapath's backend selection and the invariants every intermediate state must keep.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use crate::types::{BackendId, Protocol, RevNatIndex, ServiceKey};

/// The value of one service slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SlotValue {
    /// Slot 0: the backend count and the service's rev-NAT index.
    Service {
        /// Backends in slots `1..=count`.
        count: u16,
        /// The rev-NAT index.
        rev_nat: RevNatIndex,
    },
    /// Slot ≥ 1: one backend.
    Backend {
        /// The backend.
        id: BackendId,
        /// The service's rev-NAT index.
        rev_nat: RevNatIndex,
    },
}

/// One map write, in the order [`crate::LoadBalancer`] emits them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LbWrite {
    /// Insert or replace a backend.
    SetBackend {
        /// Its id.
        id: BackendId,
        /// Its address.
        addr: SocketAddr,
        /// Its protocol.
        proto: Protocol,
    },
    /// Delete a backend (no slot names it any more).
    RemoveBackend(BackendId),
    /// Insert or replace a rev-NAT entry.
    SetRevNat {
        /// The index.
        index: RevNatIndex,
        /// The VIP and service port replies get back as their source.
        vip: SocketAddr,
    },
    /// Delete a rev-NAT entry.
    RemoveRevNat(RevNatIndex),
    /// Insert or replace a service slot.
    SetSlot {
        /// The service.
        service: ServiceKey,
        /// The slot.
        slot: u16,
        /// Its value.
        value: SlotValue,
    },
    /// Delete a service slot.
    RemoveSlot {
        /// The service.
        service: ServiceKey,
        /// The slot.
        slot: u16,
    },
}

/// The three LB maps in memory. [`Self::check`] states what the datapath relies on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryMaps {
    /// `fqdnd_lb_svc`.
    pub slots: BTreeMap<(ServiceKey, u16), SlotValue>,
    /// `fqdnd_lb_backends`.
    pub backends: BTreeMap<BackendId, (SocketAddr, Protocol)>,
    /// `fqdnd_lb_revnat`.
    pub rev_nats: BTreeMap<RevNatIndex, SocketAddr>,
}

impl MemoryMaps {
    /// Applies one write.
    pub fn apply(&mut self, w: &LbWrite) {
        match *w {
            LbWrite::SetBackend { id, addr, proto } => {
                self.backends.insert(id, (addr, proto));
            }
            LbWrite::RemoveBackend(id) => {
                self.backends.remove(&id);
            }
            LbWrite::SetRevNat { index, vip } => {
                self.rev_nats.insert(index, vip);
            }
            LbWrite::RemoveRevNat(index) => {
                self.rev_nats.remove(&index);
            }
            LbWrite::SetSlot {
                service,
                slot,
                value,
            } => {
                self.slots.insert((service, slot), value);
            }
            LbWrite::RemoveSlot { service, slot } => {
                self.slots.remove(&(service, slot));
            }
        }
    }

    /// The backend the datapath picks for a new flow with `hash`: slot
    /// `hash % count + 1`. `None` for no service or no backend (the datapath drops).
    #[must_use]
    pub fn pick(&self, service: &ServiceKey, hash: u32) -> Option<(BackendId, SocketAddr)> {
        let SlotValue::Service { count, .. } = *self.slots.get(&(*service, 0))? else {
            return None;
        };
        if count == 0 {
            return None;
        }
        let slot = u16::try_from(hash % u32::from(count)).ok()? + 1;
        let SlotValue::Backend { id, .. } = *self.slots.get(&(*service, slot))? else {
            return None;
        };
        let (addr, _) = self.backends.get(&id)?;
        Some((id, *addr))
    }

    /// What the datapath relies on at every moment: every service's slots `1..=count` exist,
    /// hold backends that exist with the service's protocol and family, and carry the
    /// service's rev-NAT index, which exists and names the service's VIP. Two passing states
    /// [`Self::check_settled`] forbids: a slot past `count` (a removal deletes the last slot
    /// after the count went down) and a backend in two slots (a removal copies the last
    /// slot's backend into the hole before the count goes down — a moment of unfairness
    /// rather than a moment where the removed backend could still get a new flow).
    pub fn check(&self) -> Result<(), String> {
        self.check_slots(false)
    }

    fn check_slots(&self, distinct: bool) -> Result<(), String> {
        for ((service, slot), value) in &self.slots {
            let SlotValue::Service { count, rev_nat } = *value else {
                continue;
            };
            if *slot != 0 {
                return Err(format!("{service}: slot {slot} holds a service entry"));
            }
            match self.rev_nats.get(&rev_nat) {
                Some(vip) if *vip == service.addr() => {}
                other => {
                    return Err(format!("{service}: rev-NAT {rev_nat} is {other:?}"));
                }
            }
            let mut seen = BTreeSet::new();
            for s in 1..=count {
                let Some(SlotValue::Backend { id, rev_nat: r }) = self.slots.get(&(*service, s))
                else {
                    return Err(format!("{service}: slot {s} of {count} is missing"));
                };
                if *r != rev_nat {
                    return Err(format!("{service}: slot {s} has rev-NAT {r}"));
                }
                if !seen.insert(*id) && distinct {
                    return Err(format!("{service}: backend {id} is in two slots"));
                }
                match self.backends.get(id) {
                    Some((addr, proto))
                        if *proto == service.proto && addr.is_ipv4() == service.vip.is_ipv4() => {}
                    other => return Err(format!("{service}: slot {s} names {id}: {other:?}")),
                }
            }
        }
        Ok(())
    }

    /// [`Self::check`], and no leftovers: no backend in two slots of a service, no slot past
    /// a count, no slot without its service, no backend without a slot, no rev-NAT without a
    /// service.
    pub fn check_settled(&self) -> Result<(), String> {
        self.check_slots(true)?;
        let mut used_backends = BTreeSet::new();
        let mut used_rev_nats = BTreeSet::new();
        for ((service, slot), value) in &self.slots {
            match (*slot, value) {
                (0, SlotValue::Service { rev_nat, .. }) => {
                    used_rev_nats.insert(*rev_nat);
                }
                (s, SlotValue::Backend { id, .. }) => {
                    match self.slots.get(&(*service, 0)) {
                        Some(SlotValue::Service { count, .. }) if s <= *count => {}
                        _ => return Err(format!("{service}: slot {s} is a leftover")),
                    }
                    used_backends.insert(*id);
                }
                (s, _) => return Err(format!("{service}: slot {s} holds a service entry")),
            }
        }
        if let Some(id) = self.backends.keys().find(|id| !used_backends.contains(id)) {
            return Err(format!("backend {id} is in no slot"));
        }
        if let Some(i) = self.rev_nats.keys().find(|i| !used_rev_nats.contains(i)) {
            return Err(format!("rev-NAT {i} belongs to no service"));
        }
        Ok(())
    }
}
