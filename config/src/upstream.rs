//! One entry of a gateway's `upstreams` (or of `zoneUpstreams[].upstreams`): a plain DNS
//! server, or one reached over DNS over TLS or DNS over HTTPS.
//!
//! ```text
//! 192.0.2.53:53                                plain: UDP, TCP when an answer is truncated
//! tls://192.0.2.53#dns.example                 DNS over TLS (RFC 7858), port 853
//! tls://[2001:db8::53]:8853                    the certificate must name the IP address
//! https://192.0.2.53/dns-query#dns.example     DNS over HTTPS (RFC 8484), port 443
//! https://192.0.2.53:8443/resolve#dns.example  another port and path
//! ```
//!
//! The address is an IP address: fqdnd resolves nothing to find its own resolver. The part
//! after `#` is the name the server's certificate must carry; without it the certificate must
//! carry the IP address itself (an IP SAN).

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// How the gateway talks to an upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamProtocol {
    /// UDP (TCP to retry a truncated answer).
    Plain,
    /// DNS over TLS.
    Tls {
        /// The name the certificate is checked against; `None`: the IP address.
        server_name: Option<String>,
    },
    /// DNS over HTTPS (POST, HTTP/2).
    Https {
        /// The name the certificate is checked against (and the `:authority`); `None`: the IP
        /// address.
        server_name: Option<String>,
        /// The URL path, e.g. `/dns-query`.
        path: String,
    },
}

/// One upstream server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// Its address and port.
    pub addr: SocketAddr,
    /// How it is spoken to.
    pub protocol: UpstreamProtocol,
}

impl From<SocketAddr> for Upstream {
    fn from(addr: SocketAddr) -> Self {
        Self {
            addr,
            protocol: UpstreamProtocol::Plain,
        }
    }
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |n: &Option<String>| n.as_ref().map(|n| format!("#{n}")).unwrap_or_default();
        match &self.protocol {
            UpstreamProtocol::Plain => write!(f, "{}", self.addr),
            UpstreamProtocol::Tls { server_name } => {
                write!(f, "tls://{}{}", self.addr, name(server_name))
            }
            UpstreamProtocol::Https { server_name, path } => {
                write!(f, "https://{}{path}{}", self.addr, name(server_name))
            }
        }
    }
}

impl std::str::FromStr for Upstream {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        parse(text)
    }
}

/// The DoT port (RFC 7858).
pub const DOT_PORT: u16 = 853;
/// The HTTPS port.
pub const DOH_PORT: u16 = 443;
/// The DoH path when the entry names none (RFC 8484's example, what servers default to).
pub const DOH_PATH: &str = "/dns-query";

const FORMS: &str = "write `192.0.2.1:53`, `tls://192.0.2.1:853#dns.example` or \
                     `https://192.0.2.1:443/dns-query#dns.example` (IPv6 in brackets)";

/// Parses one entry; the error says what is wrong and how to write it.
pub(crate) fn parse(text: &str) -> Result<Upstream, String> {
    let text = text.trim();
    let (scheme, rest) = match text.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, text),
    };
    match scheme {
        None => match rest.parse::<SocketAddr>() {
            Ok(addr) => Ok(addr.into()),
            Err(_) if rest.parse::<IpAddr>().is_ok() => {
                Err(format!("{text:?} has no port: {FORMS}"))
            }
            Err(_) => Err(format!("{text:?} is not an address with a port: {FORMS}")),
        },
        Some("tls") => {
            let (rest, server_name) = server_name(text, rest)?;
            if rest.contains('/') {
                return Err(format!(
                    "{text:?}: a `tls://` upstream has no path (only `https://` has one)"
                ));
            }
            let addr = address(text, rest, DOT_PORT)?;
            Ok(Upstream {
                addr,
                protocol: UpstreamProtocol::Tls { server_name },
            })
        }
        Some("https") => {
            let (rest, server_name) = server_name(text, rest)?;
            let (authority, path) = match rest.find('/') {
                Some(i) => rest.split_at(i),
                None => (rest, DOH_PATH),
            };
            if path.contains(['?', ' ']) || path.chars().any(char::is_control) {
                return Err(format!(
                    "{text:?}: the path {path:?} may not hold a query string or spaces"
                ));
            }
            let addr = address(text, authority, DOH_PORT)?;
            Ok(Upstream {
                addr,
                protocol: UpstreamProtocol::Https {
                    server_name,
                    path: path.to_owned(),
                },
            })
        }
        Some(other) => Err(format!(
            "{text:?}: unknown scheme `{other}://` (`tls://` or `https://`, none for plain DNS): {FORMS}"
        )),
    }
}

/// Splits `#server.name` off and checks it.
fn server_name<'a>(text: &str, rest: &'a str) -> Result<(&'a str, Option<String>), String> {
    let Some((rest, name)) = rest.split_once('#') else {
        return Ok((rest, None));
    };
    let name = name.trim_end_matches('.');
    if !is_host_name(name) {
        return Err(format!(
            "{text:?}: {name:?} after `#` is not a server name, e.g. `#dns.example`"
        ));
    }
    Ok((rest, Some(name.to_ascii_lowercase())))
}

/// `IP`, `IP:PORT`, `[IPv6]` or `[IPv6]:PORT`.
fn address(text: &str, authority: &str, default_port: u16) -> Result<SocketAddr, String> {
    if let Ok(addr) = authority.parse::<SocketAddr>() {
        if addr.port() == 0 {
            return Err(format!("{text:?}: port 0 is no port"));
        }
        return Ok(addr);
    }
    let bare = authority
        .strip_prefix('[')
        .and_then(|a| a.strip_suffix(']'))
        .unwrap_or(authority);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, default_port));
    }
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    if is_host_name(host) {
        return Err(format!(
            "{text:?}: {host:?} is a name; the address must be an IP address (fqdnd resolves \
             nothing to reach its upstreams): write the address and put the name after `#`, \
             e.g. `tls://192.0.2.1#{host}`"
        ));
    }
    Err(format!(
        "{text:?}: {authority:?} is not an IP address with an optional port: {FORMS}"
    ))
}

/// A DNS host name: labels of letters, digits, `-` and `_`, 1 to 63 bytes, at most 253 in all,
/// not all digits at the end (that would be an address).
fn is_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            (1..=63).contains(&l.len())
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
        && name
            .rsplit('.')
            .next()
            .is_some_and(|tld| !tld.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(addr: &str, name: Option<&str>) -> Upstream {
        Upstream {
            addr: addr.parse().unwrap(),
            protocol: UpstreamProtocol::Tls {
                server_name: name.map(str::to_owned),
            },
        }
    }

    fn https(addr: &str, path: &str, name: Option<&str>) -> Upstream {
        Upstream {
            addr: addr.parse().unwrap(),
            protocol: UpstreamProtocol::Https {
                server_name: name.map(str::to_owned),
                path: path.to_owned(),
            },
        }
    }

    #[test]
    fn every_form_parses_with_its_defaults() {
        assert_eq!(
            parse("192.0.2.1:53").unwrap(),
            Upstream::from("192.0.2.1:53".parse::<SocketAddr>().unwrap())
        );
        assert_eq!(
            parse("tls://192.0.2.1").unwrap(),
            tls("192.0.2.1:853", None)
        );
        assert_eq!(
            parse("tls://192.0.2.1:8853#DNS.Example.").unwrap(),
            tls("192.0.2.1:8853", Some("dns.example"))
        );
        assert_eq!(
            parse(" tls://[2001:db8::1]#dns.example ").unwrap(),
            tls("[2001:db8::1]:853", Some("dns.example"))
        );
        assert_eq!(
            parse("tls://[2001:db8::1]:5353").unwrap(),
            tls("[2001:db8::1]:5353", None)
        );
        assert_eq!(
            parse("https://192.0.2.1").unwrap(),
            https("192.0.2.1:443", "/dns-query", None)
        );
        assert_eq!(
            parse("https://192.0.2.1:8443/resolve#dns.example").unwrap(),
            https("192.0.2.1:8443", "/resolve", Some("dns.example"))
        );
        assert_eq!(
            parse("https://[::1]/#dns.example").unwrap(),
            https("[::1]:443", "/", Some("dns.example"))
        );
    }

    #[test]
    fn display_writes_what_parses_back() {
        for text in [
            "192.0.2.1:53",
            "tls://192.0.2.1:853",
            "tls://[2001:db8::1]:853#dns.example",
            "https://192.0.2.1:443/dns-query#dns.example",
        ] {
            let parsed = parse(text).unwrap();
            assert_eq!(parsed.to_string(), text);
            assert_eq!(parse(&parsed.to_string()).unwrap(), parsed);
        }
    }

    #[test]
    fn bad_entries_say_what_is_wrong() {
        for (text, says) in [
            ("192.0.2.1", "has no port"),
            ("dns.example:53", "is not an address with a port"),
            ("quic://192.0.2.1", "unknown scheme `quic://`"),
            ("tls://dns.example", "must be an IP address"),
            ("tls://dns.example:853", "tls://192.0.2.1#dns.example"),
            ("tls://192.0.2.1/dns-query", "has no path"),
            ("tls://192.0.2.1#", "is not a server name"),
            ("tls://192.0.2.1#bad name", "is not a server name"),
            ("tls://192.0.2.1#10.0.0.1", "is not a server name"),
            ("tls://192.0.2.1:0", "port 0"),
            (
                "tls://192.0.2.1:99999",
                "is not an IP address with an optional port",
            ),
            ("https://192.0.2.1/q?dns=1", "query string"),
            ("https://dns.example/dns-query", "must be an IP address"),
        ] {
            let error = parse(text).unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
        }
    }
}
