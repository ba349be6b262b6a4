//! Endpoints in `fqdnd_endpoints` (interfaces: one endpoint, by source, or a bridge), the
//! client prefixes of by-source interfaces (`fqdnd_clients4/6`) and the interface addresses
//! source validation accepts (`fqdnd_ep_addrs`).

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aya::maps::MapError;
use fqdnd_ipcache::{DatapathError, EndpointId};
use ipnet::IpNet;

use super::{KernelDatapath, ignore_absent, lpm_key4, lpm_key6, map_err};
use crate::error::Error;
use crate::sys::{self, EndpointValue, EpAddrKey, EpAddrValue};

/// What an endpoint (an interface, or a client prefix of a by-source interface) gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct EndpointFlags {
    /// Default deny for its egress: only what the policy map allows passes.
    pub enforce_egress: bool,
    /// UDP and TCP to port 53 go to the DNS proxy (and are dropped when there is none).
    pub redirect_dns: bool,
    /// Packets whose source is not one of the interface's addresses
    /// ([`KernelDatapath::set_endpoint_addresses`]) are dropped, before the DNS redirect.
    /// Interface endpoints only (a by-source interface finds its endpoints by source).
    pub check_source: bool,
    /// Its ingress goes through its ingress policy entries (default deny there, or denies).
    pub enforce_ingress: bool,
}

impl EndpointFlags {
    pub(super) fn bits(self) -> u8 {
        let mut b = 0;
        if self.enforce_egress {
            b |= sys::EP_ENFORCE_EGRESS;
        }
        if self.redirect_dns {
            b |= sys::EP_REDIRECT_DNS;
        }
        if self.check_source {
            b |= sys::EP_CHECK_SOURCE;
        }
        if self.enforce_ingress {
            b |= sys::EP_ENFORCE_INGRESS;
        }
        b
    }

    pub(super) fn from_bits(b: u8) -> Self {
        EndpointFlags {
            enforce_egress: b & sys::EP_ENFORCE_EGRESS != 0,
            redirect_dns: b & sys::EP_REDIRECT_DNS != 0,
            check_source: b & sys::EP_CHECK_SOURCE != 0,
            enforce_ingress: b & sys::EP_ENFORCE_INGRESS != 0,
        }
    }
}

/// One `fqdnd_endpoints` entry, read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EndpointEntry {
    /// An interface that is one endpoint.
    Endpoint {
        /// Host-side interface index.
        ifindex: u32,
        /// The endpoint.
        id: EndpointId,
        /// Its flags.
        flags: EndpointFlags,
    },
    /// An interface whose endpoints are found by source prefix ([`KernelDatapath::client_entries`]).
    BySource {
        /// Interface index.
        ifindex: u32,
        /// Sources no prefix holds are dropped (else they pass untouched).
        enforce_unknown: bool,
    },
    /// A bridge whose ports are endpoints ([`KernelDatapath::set_bridge`]).
    Bridge {
        /// The bridge's interface index.
        ifindex: u32,
    },
}

fn ep_addr_key(ifindex: u32, addr: IpAddr) -> EpAddrKey {
    let mut k = EpAddrKey {
        ifindex,
        ..EpAddrKey::default()
    };
    match addr {
        IpAddr::V4(a) => {
            k.family = 4;
            k.addr[..4].copy_from_slice(&a.octets());
        }
        IpAddr::V6(a) => {
            k.family = 6;
            k.addr = a.octets();
        }
    }
    k
}

fn ep_addr_of(k: &EpAddrKey) -> Option<IpAddr> {
    match k.family {
        4 => Some(IpAddr::V4(Ipv4Addr::new(
            k.addr[0], k.addr[1], k.addr[2], k.addr[3],
        ))),
        6 => Some(IpAddr::V6(Ipv6Addr::from(k.addr))),
        _ => None,
    }
}

impl KernelDatapath {
    /// Registers the host-side veth `ifindex` as endpoint `id` with `flags`
    /// (`enforce_egress`: default deny, else its packets only feed conntrack; `redirect_dns`:
    /// its DNS goes to the proxy set by [`Self::set_dns_proxy`]).
    pub fn set_endpoint(
        &mut self,
        ifindex: u32,
        id: EndpointId,
        flags: EndpointFlags,
    ) -> Result<(), DatapathError> {
        let v = EndpointValue {
            endpoint: id.0,
            flags: flags.bits(),
            pad: 0,
        };
        self.endpoints
            .insert(ifindex, v, 0)
            .map_err(|e| map_err("fqdnd_endpoints", "endpoint upsert", e))
    }

    /// Registers `ifindex` as a by-source interface (gateway mode): each packet's endpoint is
    /// the client prefix ([`Self::set_client_prefix`]) holding its source address. Sources no
    /// prefix holds are dropped (with a `DROP_POLICY` event, endpoint 0) when
    /// `enforce_unknown`, else pass untouched.
    pub fn set_interface_by_source(
        &mut self,
        ifindex: u32,
        enforce_unknown: bool,
    ) -> Result<(), DatapathError> {
        let mut flags = sys::EP_BY_SOURCE;
        if enforce_unknown {
            flags |= sys::EP_ENFORCE_EGRESS;
        }
        let v = EndpointValue {
            endpoint: 0,
            flags,
            pad: 0,
        };
        self.endpoints
            .insert(ifindex, v, 0)
            .map_err(|e| map_err("fqdnd_endpoints", "endpoint upsert", e))
    }

    /// Registers the bridge `ifindex` whose ports are endpoints (node mode). Their packets are
    /// judged at their port; a DNS query's socket assignment made there does not survive the
    /// bridge, so the bridge's ingress assigns it again: for sources whose client prefix
    /// ([`Self::set_client_prefix`]) has `redirect_dns`. Everything else passes.
    pub fn set_bridge(&mut self, ifindex: u32) -> Result<(), DatapathError> {
        let v = EndpointValue {
            endpoint: 0,
            flags: sys::EP_BY_SOURCE | sys::EP_DNS_ONLY,
            pad: 0,
        };
        self.endpoints
            .insert(ifindex, v, 0)
            .map_err(|e| map_err("fqdnd_endpoints", "endpoint upsert", e))
    }

    /// Source prefix → endpoint for by-source interfaces (longest prefix wins).
    pub fn set_client_prefix(
        &mut self,
        prefix: IpNet,
        id: EndpointId,
        flags: EndpointFlags,
    ) -> Result<(), DatapathError> {
        let v = EndpointValue {
            endpoint: id.0,
            flags: flags.bits(),
            pad: 0,
        };
        let r = match prefix.trunc() {
            IpNet::V4(n) => self.clients4.insert(&lpm_key4(&n), v, 0),
            IpNet::V6(n) => self.clients6.insert(&lpm_key6(&n), v, 0),
        };
        r.map_err(|e| map_err("fqdnd_clients", "client prefix upsert", e))
    }

    /// Forgets a client prefix (absent is fine).
    pub fn remove_client_prefix(&mut self, prefix: IpNet) -> Result<(), DatapathError> {
        let r = match prefix.trunc() {
            IpNet::V4(n) => self.clients4.remove(&lpm_key4(&n)),
            IpNet::V6(n) => self.clients6.remove(&lpm_key6(&n)),
        };
        ignore_absent(r).map_err(|e| map_err("fqdnd_clients", "client prefix delete", e))
    }

    /// Every `fqdnd_endpoints` entry, sorted by interface index.
    pub fn endpoint_entries(&self) -> Result<Vec<EndpointEntry>, Error> {
        let mut out = Vec::new();
        for r in self.endpoints.iter() {
            let (ifindex, v) = r?;
            out.push(if v.flags & sys::EP_DNS_ONLY != 0 {
                EndpointEntry::Bridge { ifindex }
            } else if v.flags & sys::EP_BY_SOURCE != 0 {
                EndpointEntry::BySource {
                    ifindex,
                    enforce_unknown: v.flags & sys::EP_ENFORCE_EGRESS != 0,
                }
            } else {
                EndpointEntry::Endpoint {
                    ifindex,
                    id: EndpointId(v.endpoint),
                    flags: EndpointFlags::from_bits(v.flags),
                }
            });
        }
        out.sort_by_key(|e| match e {
            EndpointEntry::Endpoint { ifindex, .. }
            | EndpointEntry::BySource { ifindex, .. }
            | EndpointEntry::Bridge { ifindex } => *ifindex,
        });
        Ok(out)
    }

    /// Every client prefix of by-source interfaces, sorted.
    pub fn client_entries(&self) -> Result<Vec<(IpNet, EndpointId, EndpointFlags)>, Error> {
        let mut out = Vec::new();
        for r in self.clients4.iter() {
            let (k, v) = r?;
            if let Ok(n) = IpNet::new(Ipv4Addr::from(k.data()).into(), k.prefix_len() as u8) {
                out.push((n, EndpointId(v.endpoint), EndpointFlags::from_bits(v.flags)));
            }
        }
        for r in self.clients6.iter() {
            let (k, v) = r?;
            if let Ok(n) = IpNet::new(Ipv6Addr::from(k.data()).into(), k.prefix_len() as u8) {
                out.push((n, EndpointId(v.endpoint), EndpointFlags::from_bits(v.flags)));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Makes `addrs` the addresses of interface `ifindex` (endpoint `id`), the sources its
    /// packets may have when it is flagged `check_source`: the new ones are written first,
    /// then the others removed, so a valid source never drops meanwhile.
    pub fn set_endpoint_addresses(
        &mut self,
        ifindex: u32,
        id: EndpointId,
        addrs: &[IpAddr],
    ) -> Result<(), DatapathError> {
        let wanted: HashSet<EpAddrKey> = addrs.iter().map(|a| ep_addr_key(ifindex, *a)).collect();
        let v = EpAddrValue {
            endpoint: id.0,
            pad: 0,
        };
        for k in &wanted {
            self.ep_addrs
                .insert(k, v, 0)
                .map_err(|e| map_err("fqdnd_ep_addrs", "endpoint address upsert", e))?;
        }
        for k in self.addresses_of(ifindex)? {
            if !wanted.contains(&k) {
                ignore_absent(self.ep_addrs.remove(&k))
                    .map_err(|e| map_err("fqdnd_ep_addrs", "endpoint address delete", e))?;
            }
        }
        Ok(())
    }

    /// The keys of `ifindex`'s addresses (a walk of the map).
    fn addresses_of(&self, ifindex: u32) -> Result<Vec<EpAddrKey>, DatapathError> {
        let mut out = Vec::new();
        for k in self.ep_addrs.keys() {
            let k = k.map_err(|e| map_err("fqdnd_ep_addrs", "endpoint address dump", e))?;
            if k.ifindex == ifindex {
                out.push(k);
            }
        }
        Ok(out)
    }

    /// Every endpoint address: (interface index, endpoint, address), sorted.
    pub fn endpoint_addresses(&self) -> Result<Vec<(u32, EndpointId, IpAddr)>, Error> {
        let mut out = Vec::new();
        for r in self.ep_addrs.iter() {
            match r {
                Ok((k, v)) => {
                    if let Some(a) = ep_addr_of(&k) {
                        out.push((k.ifindex, EndpointId(v.endpoint), a));
                    }
                }
                Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(e.into()),
            }
        }
        out.sort();
        Ok(out)
    }

    /// Forgets an interface: its packets pass untouched. Its addresses go after its entry.
    pub fn remove_endpoint(&mut self, ifindex: u32) -> Result<(), DatapathError> {
        ignore_absent(self.endpoints.remove(&ifindex))
            .map_err(|e| map_err("fqdnd_endpoints", "endpoint delete", e))?;
        for k in self.addresses_of(ifindex)? {
            ignore_absent(self.ep_addrs.remove(&k))
                .map_err(|e| map_err("fqdnd_ep_addrs", "endpoint address delete", e))?;
        }
        Ok(())
    }
}
