//! Which upstream pool a question goes to: the pool of the longest zone that holds its name
//! (per-zone upstreams, conditional forwarding), else the default pool.
//!
//! Zones are kept in wire form, lowercase; a question's name is matched in its wire form, label
//! boundary by label boundary, case-insensitively, without allocating.

use std::ops::Range;

use crate::Error;

/// A zone and the upstreams its names go to ([`crate::Config::zones`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneUpstreams {
    /// The zone, e.g. `corp.example` (a trailing dot and the case do not matter).
    pub zone: String,
    /// Its upstreams, used round robin among the live ones as the default pool's are.
    pub upstreams: Vec<crate::UpstreamAddr>,
}

/// The pools, as ranges of the proxy's upstream list.
#[derive(Debug, Default)]
pub(crate) struct Pools {
    /// The default pool.
    pub(crate) default: Range<usize>,
    /// Each zone in wire form (lowercase) and its pool, longest first.
    zones: Vec<(Vec<u8>, Range<usize>)>,
}

impl Pools {
    /// The pools for `default` upstreams followed by each zone's, in that order in the
    /// proxy's upstream list.
    pub(crate) fn new(default: usize, zones: &[ZoneUpstreams]) -> Result<Self, Error> {
        let mut next = default;
        let mut out = Vec::with_capacity(zones.len());
        for z in zones {
            let wire = wire(&z.zone).ok_or_else(|| Error::InvalidConfig {
                reason: format!("zone {:?} is not a DNS name", z.zone),
            })?;
            if z.upstreams.is_empty() {
                return Err(Error::InvalidConfig {
                    reason: format!("zone {:?} has no upstream", z.zone),
                });
            }
            if out.iter().any(|(w, _)| *w == wire) {
                return Err(Error::InvalidConfig {
                    reason: format!("zone {:?} is listed twice", z.zone),
                });
            }
            out.push((wire, next..next + z.upstreams.len()));
            next += z.upstreams.len();
        }
        out.sort_by_key(|(w, _)| std::cmp::Reverse(w.len()));
        Ok(Self {
            default: 0..default,
            zones: out,
        })
    }

    /// The pool for a question name in wire form (`name` ends with its root label).
    pub(crate) fn for_name(&self, name: &[u8]) -> Range<usize> {
        if !self.zones.is_empty() {
            let mut at = 0;
            // Each suffix that starts at a label boundary, longest first.
            while at < name.len() {
                let suffix = &name[at..];
                if let Some((_, pool)) = self.zones.iter().find(|(zone, _)| {
                    zone.len() == suffix.len() && zone.eq_ignore_ascii_case(suffix)
                }) {
                    return pool.clone();
                }
                let len = usize::from(name[at]);
                if len == 0 {
                    break;
                }
                at += 1 + len;
            }
        }
        self.default.clone()
    }
}

/// `zone` in wire form, lowercase; `None` if it is not a name (an empty label, a label over 63
/// bytes, over 255 bytes in all). The root (`.`) is allowed: it is every name's zone.
fn wire(zone: &str) -> Option<Vec<u8>> {
    let text = zone.strip_suffix('.').unwrap_or(zone);
    let mut out = Vec::with_capacity(text.len() + 2);
    if !text.is_empty() {
        for label in text.split('.') {
            let len = u8::try_from(label.len())
                .ok()
                .filter(|l| (1..=63).contains(l))?;
            out.push(len);
            out.extend(label.bytes().map(|b| b.to_ascii_lowercase()));
        }
    }
    out.push(0);
    (out.len() <= 255).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(zone: &str, n: usize) -> ZoneUpstreams {
        ZoneUpstreams {
            zone: zone.into(),
            upstreams: (0..n)
                .map(|i| std::net::SocketAddr::from(([192, 0, 2, i as u8 + 1], 53)).into())
                .collect(),
        }
    }

    fn name(text: &str) -> Vec<u8> {
        wire(text).unwrap()
    }

    #[test]
    fn the_longest_zone_holding_the_name_wins_else_the_default_pool() {
        let pools =
            Pools::new(2, &[zone("corp.example", 1), zone("Lab.Corp.Example.", 2)]).unwrap();
        assert_eq!(pools.for_name(&name("www.corp.example")), 2..3);
        assert_eq!(pools.for_name(&name("corp.example")), 2..3);
        assert_eq!(pools.for_name(&name("a.b.lab.corp.example")), 3..5);
        assert_eq!(pools.for_name(&name("LAB.corp.EXAMPLE")), 3..5);
        assert_eq!(
            pools.for_name(&name("xcorp.example")),
            0..2,
            "a label boundary, not a suffix"
        );
        assert_eq!(pools.for_name(&name("example")), 0..2);
        assert_eq!(pools.for_name(&[0]), 0..2);
    }

    #[test]
    fn the_root_zone_takes_every_name_a_longer_one_does_not() {
        let pools = Pools::new(0, &[zone(".", 1), zone("test", 1)]).unwrap();
        assert_eq!(pools.for_name(&name("a.test")), 1..2);
        assert_eq!(pools.for_name(&name("a.example")), 0..1);
    }

    #[test]
    fn bad_zones_are_refused() {
        for bad in [
            zone("a..b", 1),
            zone(&"x".repeat(64), 1),
            zone("ok.example", 0),
        ] {
            assert!(Pools::new(1, &[bad]).is_err());
        }
        assert!(Pools::new(1, &[zone("a.example", 1), zone("A.example.", 1)]).is_err());
    }
}
