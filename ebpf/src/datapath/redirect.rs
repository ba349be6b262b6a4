//! The DNS redirect's maps: where the proxy listens (`fqdnd_dns_proxy`, read by the tc and
//! the socket programs) and, for host processes, where each redirected socket's DNS was going
//! (`fqdnd_dns_origins`, read by the proxy through [`DnsOrigins`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::path::Path;

use aya::maps::{HashMap, MapData};
use fqdnd_ipcache::{DatapathError, EndpointId};

use super::{KernelDatapath, map_err, open_map};
use crate::error::Error;
use crate::sys::{self, DnsProxy, OriginKey, SockOrigin};

impl KernelDatapath {
    /// Where the DNS proxy listens, per family (`None`: no proxy, redirected DNS of that
    /// family is dropped). The address is what the sockets are bound to: `0.0.0.0` / `::` for
    /// wildcard listeners, else their address (e.g. `127.0.0.1`). UDP and TCP share the port.
    pub fn set_dns_proxy(
        &mut self,
        v4: Option<SocketAddrV4>,
        v6: Option<SocketAddrV6>,
    ) -> Result<(), DatapathError> {
        let mut v = DnsProxy::default();
        if let Some(a) = v4 {
            v.addr4 = a.ip().octets();
            v.port4 = a.port().to_be();
        }
        if let Some(a) = v6 {
            v.addr6 = a.ip().octets();
            v.port6 = a.port().to_be();
        }
        self.dns_proxy
            .set(0, v, 0)
            .map_err(|e| map_err("fqdnd_dns_proxy", "dns proxy update", e))
    }

    /// The DNS proxy addresses the programs use.
    pub fn dns_proxy(&self) -> Result<(Option<SocketAddrV4>, Option<SocketAddrV6>), Error> {
        let v = self.dns_proxy.get(&0, 0)?;
        let v4 = (v.port4 != 0)
            .then(|| SocketAddrV4::new(Ipv4Addr::from(v.addr4), u16::from_be(v.port4)));
        let v6 = (v.port6 != 0)
            .then(|| SocketAddrV6::new(Ipv6Addr::from(v.addr6), u16::from_be(v.port6), 0, 0));
        Ok((v4, v6))
    }
}

/// Where a host process's redirected DNS message was going, as the cgroup socket programs
/// recorded it ([`DnsOrigins::lookup`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DnsOrigin {
    /// The destination the process asked for (an IPv6 socket's v4-mapped address as IPv4).
    pub server: SocketAddr,
    /// The endpoint of the process's cgroup.
    pub endpoint: EndpointId,
}

/// The proxy's handle on `fqdnd_dns_origins`: which socket a query from a local address came
/// from, where it was going, for which endpoint. Read on the DNS path: one map lookup, no
/// lock.
pub struct DnsOrigins {
    map: HashMap<MapData, OriginKey, SockOrigin>,
}

impl std::fmt::Debug for DnsOrigins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsOrigins").finish_non_exhaustive()
    }
}

impl DnsOrigins {
    /// Opens `fqdnd_dns_origins` pinned in `pin_dir`.
    pub fn open(pin_dir: &Path) -> Result<Self, Error> {
        Ok(DnsOrigins {
            map: open_map(pin_dir, "fqdnd_dns_origins")?.try_into()?,
        })
    }

    /// The record of the socket that sent the proxy a packet from `client` (its source
    /// address and port) over TCP or UDP, if a redirect wrote one.
    pub fn lookup(&self, client: SocketAddr, tcp: bool) -> Option<DnsOrigin> {
        let mut k = OriginKey {
            port: client.port().to_be(),
            proto: if tcp { sys::PROTO_TCP } else { sys::PROTO_UDP },
            ..OriginKey::default()
        };
        match client.ip() {
            IpAddr::V4(a) => {
                k.family = 4;
                k.addr[..4].copy_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                k.family = 6;
                k.addr = a.octets();
            }
        }
        let o = self.map.get(&k, 0).ok()?;
        let ip = match o.family {
            4 => IpAddr::V4(Ipv4Addr::new(o.addr[0], o.addr[1], o.addr[2], o.addr[3])),
            6 => {
                let v6 = Ipv6Addr::from(o.addr);
                v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
            }
            _ => return None,
        };
        Some(DnsOrigin {
            server: SocketAddr::new(ip, u16::from_be(o.port)),
            endpoint: EndpointId(o.endpoint),
        })
    }
}
