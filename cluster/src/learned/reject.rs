//! Why a value under the group's keys is refused. Refusals are counted and logged as every
//! refused record of the cluster is ([`Rejections`](crate::Rejections), kind `learned`): once
//! per key, counted once per version — a store rewriting bad keys in a loop costs a counter,
//! not the log.

/// Why a value under the group's keys is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The key is not `<gateway>/<client>/<name>` under the group, each part percent-encoded
    /// as a gateway writes it.
    #[error("the key is not <gateway>/<client>/<name> under the group")]
    Layout,
    /// The value is larger than [`ShareConfig::max_value`](super::ShareConfig::max_value).
    #[error("the value is {bytes} bytes (at most {limit})")]
    Oversized {
        /// Its size.
        bytes: usize,
        /// The bound.
        limit: usize,
    },
    /// The value is not a record (not JSON, a field missing, a number out of range).
    #[error("the value is not a learned record: {0}")]
    Malformed(String),
    /// A field of the value differs from the key's part.
    #[error("the value's {field} ({value:?}) is not the key's")]
    Mismatch {
        /// `gateway`, `client` or `name`.
        field: &'static str,
        /// What the value says (cut to 64 bytes).
        value: String,
    },
    /// A record without addresses.
    #[error("the record has no address")]
    NoAddresses,
    /// `expires_ms` is not `learned_ms + ttl`.
    #[error("expires_ms {expires_ms} is not learned_ms + ttl ({learned_ms} + {ttl} s)")]
    Expiry {
        /// The record's `learned_ms`.
        learned_ms: u64,
        /// Its `ttl`.
        ttl: u32,
        /// Its `expires_ms`.
        expires_ms: u64,
    },
    /// The answer was learned later than this gateway's clock allows.
    #[error("learned {ahead_ms} ms in the future (clock offset allowed: {allowed_ms} ms)")]
    Future {
        /// How far ahead of now.
        ahead_ms: u64,
        /// [`ShareConfig::max_skew`](super::ShareConfig::max_skew).
        allowed_ms: u64,
    },
}

/// `s` cut to 64 bytes, for an error.
pub(super) fn cut(s: &str) -> String {
    let mut end = s.len().min(64);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or_default().to_owned()
}
