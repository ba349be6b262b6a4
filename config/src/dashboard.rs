//! The `dashboard` block of a `Gateway` or `Node` document: the read-only web view's address
//! and the file holding its bearer token.
//!
//! ```yaml
//! dashboard:
//!   enabled: true              # default true once `dashboard` is given
//!   address: 127.0.0.1:9968    # the default; another than loopback needs `tokenFile`
//!   tokenFile: dashboard-token # optional: the token's first line; requests must send
//!                              # `Authorization: Bearer <token>` (relative to the file)
//! ```

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::yaml::{Diag, Text, at, sanitize, shape};

/// Where the dashboard listens when `dashboard` names no `address`.
pub const DEFAULT_DASHBOARD_ADDRESS: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9968);

/// The dashboard's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dashboard {
    /// The TCP address it serves HTTP on.
    pub address: SocketAddr,
    /// The file whose first line is the bearer token every request must carry; `None`: no
    /// token (only allowed on a loopback address).
    pub token_file: Option<PathBuf>,
}

/// `dashboard:` as written.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
pub(crate) struct DashboardSpec {
    enabled: Option<bool>,
    address: Option<Text>,
    token_file: Option<Text>,
}

shape!(DashboardSpec,);

/// The `dashboard` block: `None` when off (`enabled: false`) or wrong (reported at its place).
pub(crate) fn dashboard(
    spec: &Spanned<DashboardSpec>,
    base: &Path,
    diag: &mut Diag<'_>,
) -> Option<Dashboard> {
    let d = &spec.value;
    if d.enabled == Some(false) {
        return None;
    }
    let before = diag.count();
    let address = match &d.address {
        None => DEFAULT_DASHBOARD_ADDRESS,
        Some(text) => match text.value.trim().parse::<SocketAddr>() {
            Ok(addr) => addr,
            Err(_) => {
                diag.invalid(
                    at(text),
                    format!(
                        "`dashboard.address` {:?} is not an address with a port: write \
                         `127.0.0.1:9968` or `[::1]:9968`",
                        sanitize(&text.value)
                    ),
                );
                return None;
            }
        },
    };
    let token_file = match &d.token_file {
        Some(text) if text.value.trim().is_empty() => {
            diag.invalid(at(text), "`dashboard.tokenFile` is empty: name a file");
            None
        }
        Some(text) => Some(base.join(text.value.trim())),
        None => None,
    };
    if token_file.is_none() && d.token_file.is_none() && !address.ip().is_loopback() {
        diag.invalid(
            d.address.as_ref().map_or_else(|| at(spec), at),
            format!(
                "`dashboard.address` {address} is not a loopback address: anyone who reaches it \
                 would see every client's queries; set `dashboard.tokenFile` (a file holding a \
                 bearer token) or listen on 127.0.0.1 / [::1]"
            ),
        );
    }
    (diag.count() == before).then_some(Dashboard {
        address,
        token_file,
    })
}
