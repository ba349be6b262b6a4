//! Destinations: CIDRs (`toCIDR`, `toCIDRSet`) and FQDN selectors (`toFQDNs`, `rules.dns`).

use std::net::IpAddr;

use fqdnd_ipcache::policy::PeerSelector;
use fqdnd_namemgr::pattern::FqdnSelector;
use ipnet::IpNet;
use serde_saphyr::Spanned;

use super::reject;
use crate::cnp::{CidrRuleSpec, FqdnSpec};
use crate::yaml::{Diag, Text, at, sanitize};

/// `toCIDRSet[]` / `fromCIDRSet[]` (`field`): a CIDR minus exceptions, each inside it.
pub(super) fn cidr_rule(
    spec: &Spanned<CidrRuleSpec>,
    field: &str,
    diag: &mut Diag<'_>,
) -> Option<PeerSelector> {
    let c = &spec.value;
    if reject(c.rejected(), diag) {
        return None;
    }
    let Some(cidr_text) = &c.cidr else {
        diag.missing(
            at(spec),
            &["cidr"],
            format!("a `{field}` entry needs a `cidr`"),
        );
        return None;
    };
    let cidr = parse_cidr(cidr_text, &format!("{field}.cidr"), diag);
    let mut except = Vec::new();
    let mut ok = true;
    for x in c.except.iter().flatten() {
        match (parse_cidr(x, &format!("{field}.except"), diag), cidr) {
            (Some(net), Some(outer)) if outer.contains(&net) => except.push(net),
            (Some(net), Some(outer)) => {
                ok = false;
                diag.invalid(
                    at(x),
                    format!("`except` {net} is not inside the `cidr` {outer}"),
                );
            }
            _ => ok = false,
        }
    }
    Some(PeerSelector::Cidr {
        cidr: cidr?,
        except,
    })
    .filter(|_| ok)
}

/// A CIDR or a bare IP (a host prefix). Host bits must be clear.
pub(crate) fn parse_cidr(text: &Text, field: &str, diag: &mut Diag<'_>) -> Option<IpNet> {
    let s = text.value.as_str();
    let parsed = if s.contains('/') {
        s.parse::<IpNet>()
            .map_err(|_| "is not a CIDR such as 10.0.0.0/8 or 2001:db8::/32")
    } else {
        s.parse::<IpAddr>()
            .map(IpNet::from)
            .map_err(|_| "is not an IP address or a CIDR")
    };
    match parsed {
        Ok(net) if net.trunc() != net => {
            diag.invalid(
                at(text),
                format!(
                    "`{field}` {s:?} has host bits set: write it as {}",
                    net.trunc()
                ),
            );
            None
        }
        Ok(net) => Some(net),
        Err(why) => {
            diag.invalid(at(text), format!("`{field}` {:?} {why}", sanitize(s)));
            None
        }
    }
}

/// A `toFQDNs[]` or `rules.dns[]` entry: exactly one of `matchName` and `matchPattern`,
/// validated as Cilium's CRD and `matchpattern` package do.
pub(super) fn fqdn(
    spec: &Spanned<FqdnSpec>,
    field: &str,
    diag: &mut Diag<'_>,
) -> Option<FqdnSelector> {
    let (text, is_pattern) = match (&spec.value.match_name, &spec.value.match_pattern) {
        (Some(name), None) => (name, false),
        (None, Some(pattern)) => (pattern, true),
        (Some(_), Some(_)) => {
            diag.invalid(
                at(spec),
                format!("a `{field}` entry takes `matchName` or `matchPattern`, not both"),
            );
            return None;
        }
        (None, None) => {
            diag.missing(
                at(spec),
                &["matchName", "matchPattern"],
                format!("a `{field}` entry needs `matchName` or `matchPattern`"),
            );
            return None;
        }
    };
    let what = if is_pattern {
        "matchPattern"
    } else {
        "matchName"
    };
    let s = text.value.as_str();
    let problem = if s.trim() != s {
        Some("has leading or trailing whitespace".to_owned())
    } else {
        let selector = if is_pattern {
            FqdnSelector::match_pattern(s)
        } else {
            FqdnSelector::match_name(s)
        };
        match selector {
            Err(e) => Some(e.to_string()),
            Ok(_) if s.starts_with('.') => Some("starts with a dot (an empty label)".to_owned()),
            Ok(_) if s.contains("..") => Some("has two dots in a row (an empty label)".to_owned()),
            Ok(selector) => return Some(selector),
        }
    };
    if let Some(problem) = problem {
        diag.invalid(at(text), format!("`{what}` {:?}: {problem}", sanitize(s)));
    }
    None
}
