//! Policy entries (`fqdnd_policy`): a policy key of the engine becomes one kernel entry per
//! protocol and port prefix ([`port_prefixes`]); overlapping keys share an entry through
//! reference counts (`Refs`), a deny winning over allows.

use aya::maps::MapError;
use aya::maps::lpm_trie::Key;
use fqdnd_ipcache::policy::{Direction, Protocol};
use fqdnd_ipcache::{DatapathError, EndpointId};

use super::batch::Undo;
use super::{KernelDatapath, ignore_absent, map_err};
use crate::sys::{self, PolicyData, PolicyKey, PolicyValue};

/// How many policy keys stand for one kernel entry, allowing and denying. The entry denies
/// while any deny does (a deny wins), else allows; it is absent while both are zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Refs {
    allow: u32,
    deny: u32,
}

impl Refs {
    /// The value the kernel entry has, `None` = no entry.
    pub(super) fn flags(self) -> Option<u32> {
        if self.deny > 0 {
            Some(sys::POLICY_DENY)
        } else if self.allow > 0 {
            Some(sys::POLICY_ALLOW)
        } else {
            None
        }
    }
}

/// The prefixes that cover the ports `first..=last` exactly: `(first port, prefix bits)`,
/// bits 0..=16 (16 = one port, 0 = every port). At most 30 prefixes (1–65534: two per bit
/// but the last).
pub fn port_prefixes(first: u16, last: u16) -> Vec<(u16, u8)> {
    let (mut lo, hi) = (u32::from(first), u32::from(last));
    let mut out = Vec::new();
    while lo <= hi {
        // the largest aligned block starting at `lo` that stays within `hi`
        let mut size: u32 = if lo == 0 {
            1 << 16
        } else {
            lo & lo.wrapping_neg()
        };
        while lo + size - 1 > hi {
            size >>= 1;
        }
        let bits = 16 - size.trailing_zeros();
        out.push((lo as u16, bits as u8));
        lo += size;
    }
    out
}

/// The kernel entries one policy key stands for: one entry for every protocol and port (a
/// rule without ports: every protocol, ICMP included), or per protocol (TCP and UDP for
/// "any") one entry for every port or one per port prefix of its range. Every range is
/// representable.
fn expand(endpoint: EndpointId, key: &fqdnd_ipcache::PolicyKey) -> Vec<PolicyKey> {
    let direction = match key.direction {
        Direction::Egress => 0,
        Direction::Ingress => sys::POLICY_ID_INGRESS,
    };
    let base = PolicyData {
        identity: key.identity.0 | direction,
        endpoint: endpoint.0,
        ..PolicyData::default()
    };
    if key.port == 0 && key.protocol == Protocol::Any {
        return vec![PolicyKey::new(sys::POLICY_PREFIX_ANY_PROTO, base)];
    }
    let protos: &[u8] = match key.protocol {
        Protocol::Tcp => &[sys::PROTO_TCP],
        Protocol::Udp => &[sys::PROTO_UDP],
        Protocol::Any => &[sys::PROTO_TCP, sys::PROTO_UDP],
        // The ICMP type, exactly, as the destination port.
        Protocol::Icmp | Protocol::Icmpv6 => {
            let proto = if key.protocol == Protocol::Icmp {
                sys::PROTO_ICMP
            } else {
                sys::PROTO_ICMPV6
            };
            return vec![PolicyKey::new(
                sys::POLICY_PREFIX_FULL,
                PolicyData {
                    proto,
                    dport: key.port.to_be(),
                    ..base
                },
            )];
        }
    };
    let mut out = Vec::new();
    for &proto in protos {
        let data = PolicyData { proto, ..base };
        if key.port == 0 {
            out.push(PolicyKey::new(sys::POLICY_PREFIX_PROTO, data));
            continue;
        }
        for (port, bits) in port_prefixes(key.port, key.end_port.max(key.port)) {
            out.push(PolicyKey::new(
                sys::POLICY_PREFIX_PROTO + u32::from(bits),
                PolicyData {
                    dport: port.to_be(),
                    ..data
                },
            ));
        }
    }
    out
}

fn policy_key_error(k: &PolicyKey, operation: &'static str, e: MapError) -> DatapathError {
    match map_err("fqdnd_policy", operation, e) {
        DatapathError::Io { operation, error } => DatapathError::Io {
            operation,
            error: std::io::Error::new(
                error.kind(),
                format!(
                    "endpoint {} identity {} proto {:?} ports {:?}: {error}",
                    k.endpoint,
                    k.identity,
                    k.protocol(),
                    k.ports()
                ),
            ),
        },
        other => other,
    }
}

impl KernelDatapath {
    /// Every policy entry in the kernel, sorted.
    pub fn policy_entries(&self) -> Result<Vec<PolicyKey>, DatapathError> {
        let mut out = Vec::new();
        for r in self.policy.iter() {
            let (k, _) = r.map_err(|e| map_err("fqdnd_policy", "policy dump", e))?;
            out.push(PolicyKey::new(k.prefix_len(), k.data()));
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    fn policy_write(&mut self, k: &PolicyKey, flags: u32) -> Result<(), DatapathError> {
        self.policy
            .insert(&Key::new(k.prefixlen, k.data()), PolicyValue { flags }, 0)
            .map_err(|e| policy_key_error(k, "policy upsert", e))
    }

    fn policy_remove(&mut self, k: &PolicyKey) -> Result<(), DatapathError> {
        ignore_absent(self.policy.remove(&Key::new(k.prefixlen, k.data())))
            .map_err(|e| policy_key_error(k, "policy delete", e))
    }

    /// Brings the kernel entry of `k` from the value of `before` to that of `after`.
    pub(super) fn policy_set(
        &mut self,
        k: &PolicyKey,
        before: Option<u32>,
        after: Option<u32>,
    ) -> Result<(), DatapathError> {
        match (before, after) {
            (b, a) if b == a => Ok(()),
            (_, Some(flags)) => self.policy_write(k, flags),
            (_, None) => self.policy_remove(k),
        }
    }

    pub(super) fn policy_upsert(
        &mut self,
        endpoint: EndpointId,
        key: &fqdnd_ipcache::PolicyKey,
        undo: &mut Vec<Undo>,
    ) -> Result<(), DatapathError> {
        for k in expand(endpoint, key) {
            let before = self.refs.get(&k).copied();
            let mut after = before.unwrap_or_default();
            if key.deny {
                after.deny += 1;
            } else {
                after.allow += 1;
            }
            if before.is_none()
                && let Some(rs) = &mut self.resync
                && rs.policy.remove(&k)
            {
                // present before the restart: confirmed, its value written as wanted
                let old = self
                    .policy
                    .get(&Key::new(k.prefixlen, k.data()), 0)
                    .map_or(sys::POLICY_ALLOW, |v| v.flags);
                rs.stats.kept += 1;
                undo.push(Undo::ResyncPolicy(k, old));
                self.refs.insert(k, after);
                if let Some(flags) = after.flags().filter(|f| *f != old) {
                    self.policy_write(&k, flags)?;
                }
                continue;
            }
            self.policy_set(&k, before.and_then(Refs::flags), after.flags())?;
            if before.is_none()
                && let Some(rs) = &mut self.resync
            {
                rs.stats.added += 1;
            }
            self.refs.insert(k, after);
            undo.push(Undo::Policy { key: k, before });
        }
        Ok(())
    }

    pub(super) fn policy_delete(
        &mut self,
        endpoint: EndpointId,
        key: &fqdnd_ipcache::PolicyKey,
        undo: &mut Vec<Undo>,
    ) -> Result<(), DatapathError> {
        for k in expand(endpoint, key) {
            let Some(before) = self.refs.get(&k).copied() else {
                continue;
            };
            let mut after = before;
            if key.deny {
                after.deny = after.deny.saturating_sub(1);
            } else {
                after.allow = after.allow.saturating_sub(1);
            }
            self.policy_set(&k, before.flags(), after.flags())?;
            if after.flags().is_none() {
                self.refs.remove(&k);
            } else {
                self.refs.insert(k, after);
            }
            undo.push(Undo::Policy {
                key: k,
                before: Some(before),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fqdnd_ipcache::Identity;
    use proptest::prelude::*;

    /// Whether prefix (base, bits) holds `port`.
    fn holds((base, bits): (u16, u8), port: u16) -> bool {
        bits == 0 || (port ^ base) >> (16 - bits) == 0
    }

    /// The prefixes tile `lo..=hi` exactly: each aligned, in order, each starting where the
    /// previous one ended, the first at `lo`, the last ending at `hi`.
    fn assert_tiles(lo: u16, hi: u16) -> Vec<(u16, u8)> {
        let p = port_prefixes(lo, hi);
        let mut next = u32::from(lo);
        for &(base, bits) in &p {
            let size = 1u32 << (16 - u32::from(bits));
            assert_eq!(u32::from(base), next, "{lo}-{hi}: {p:?}");
            assert_eq!(
                u32::from(base) % size,
                0,
                "{lo}-{hi}: unaligned {base}/{bits}"
            );
            next += size;
        }
        assert_eq!(next, u32::from(hi) + 1, "{lo}-{hi}: {p:?}");
        assert!(p.len() <= 30, "{lo}-{hi}: {} prefixes", p.len());
        p
    }

    #[test]
    fn well_known_ranges() {
        assert_eq!(port_prefixes(0, 65535), vec![(0, 0)]);
        assert_eq!(port_prefixes(443, 443), vec![(443, 16)]);
        assert_eq!(
            port_prefixes(1024, 65535),
            vec![
                (1024, 6),
                (2048, 5),
                (4096, 4),
                (8192, 3),
                (16384, 2),
                (32768, 1)
            ]
        );
        assert_eq!(assert_tiles(1, 65535).len(), 16);
        assert_eq!(assert_tiles(1, 65534).len(), 30);
        assert_eq!(port_prefixes(80, 82), vec![(80, 15), (82, 16)]);
    }

    #[test]
    fn every_small_range_tiles_exactly() {
        for lo in 0..=200u16 {
            for hi in lo..=200 {
                let p = assert_tiles(lo, hi);
                for port in lo.saturating_sub(2)..=hi + 2 {
                    let n = p.iter().filter(|&&q| holds(q, port)).count();
                    assert_eq!(
                        n,
                        usize::from((lo..=hi).contains(&port)),
                        "{lo}-{hi} port {port}"
                    );
                }
            }
        }
    }

    proptest! {
        /// Every port of a range is held by exactly one prefix, no port outside by any.
        #[test]
        fn prefixes_hold_exactly_the_range(a in any::<u16>(), b in any::<u16>(), probe in any::<u16>()) {
            let (lo, hi) = (a.min(b), a.max(b));
            let p = assert_tiles(lo, hi);
            for port in [lo, hi, lo.wrapping_sub(1), hi.wrapping_add(1), probe] {
                let n = p.iter().filter(|&&q| holds(q, port)).count();
                prop_assert_eq!(n, usize::from((lo..=hi).contains(&port)), "{}-{} port {}", lo, hi, port);
            }
        }

        /// The kernel keys of a policy key: its protocols, each with the range's prefixes.
        #[test]
        fn expansion_follows_the_prefixes(a in 1u16.., b in 1u16.., proto in 0u8..3) {
            let (lo, hi) = (a.min(b), a.max(b));
            let protocol = [Protocol::Tcp, Protocol::Udp, Protocol::Any][usize::from(proto)];
            let key = fqdnd_ipcache::PolicyKey { identity: Identity(9), protocol, port: lo, end_port: hi, ..Default::default() };
            let keys = expand(EndpointId(3), &key);
            let n = port_prefixes(lo, hi).len();
            prop_assert_eq!(keys.len(), if protocol == Protocol::Any { 2 * n } else { n });
            for k in &keys {
                prop_assert_eq!((k.identity, k.endpoint), (9, 3));
                let (first, last) = k.ports();
                prop_assert!(lo <= first && last <= hi);
                prop_assert!(matches!(k.protocol(), Some(sys::PROTO_TCP | sys::PROTO_UDP)));
            }
        }
    }

    #[test]
    fn rules_without_ports_match_every_protocol() {
        let any = expand(EndpointId(1), &fqdnd_ipcache::PolicyKey::ALLOW_ALL);
        assert_eq!(any.len(), 1);
        assert_eq!((any[0].protocol(), any[0].ports()), (None, (0, 65535)));
        let tcp = expand(
            EndpointId(1),
            &fqdnd_ipcache::PolicyKey {
                identity: Identity(5),
                protocol: Protocol::Tcp,
                port: 0,
                end_port: 0,
                ..Default::default()
            },
        );
        assert_eq!(
            (tcp.len(), tcp[0].protocol(), tcp[0].ports()),
            (1, Some(sys::PROTO_TCP), (0, 65535))
        );
    }
}
