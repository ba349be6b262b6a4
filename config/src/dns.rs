//! What the DNS proxy does at its edges, as the configuration says it (`onUpstreamTimeout`,
//! `onHoldTimeout`, `onTruncated`, `rateLimit.action`, `rejectResponseCode`, `cache`).
//!
//! These are config's own types: the crate parses, the daemon maps them onto the proxy's
//! (`fqdnd_dnsproxy`), so the policy crates never compile the proxy.

/// `onUpstreamTimeout`: what the proxy does when no upstream answers in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UpstreamTimeoutAction {
    /// `servfail`: answer SERVFAIL, so the client gives up at once.
    #[default]
    ServFail,
    /// `noReply`: send nothing, as Cilium does; the client retries on its own timer.
    NoReply,
}

/// `onHoldTimeout`: what the proxy does when the datapath has not learned an answer within
/// `proxyResponseMaxDelay`, or failed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HoldFallback {
    /// `release`: release the answer anyway (Cilium's behaviour): the first packet may race
    /// the policy.
    #[default]
    Release,
    /// `servfail`: answer SERVFAIL instead: nothing the datapath does not know reaches the
    /// client.
    ServFail,
}

/// `onTruncated`: what the proxy does with an upstream UDP answer that has TC=1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TruncatedAction {
    /// `retryTcp`: ask the same upstream again over TCP, learn the full answer, then reply.
    #[default]
    RetryTcp,
    /// `passThrough`: pass the truncated answer back; the client retries over TCP itself.
    PassThrough,
}

/// `rejectResponseCode`: the response code for a query policy denies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RejectCode {
    /// `refused`: REFUSED (rcode 5), Cilium's default.
    #[default]
    Refused,
    /// `nameError`: NXDOMAIN (rcode 3).
    NxDomain,
}

/// `rateLimit.action`: what happens to a query over its client's rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RateLimitAction {
    /// `drop`: drop it silently (no reply to reflect at a spoofed source).
    #[default]
    Drop,
    /// `refused`: answer REFUSED.
    Refused,
}

/// The gateway's answer cache (`cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnswerCache {
    /// `size`: entries kept at most; past it the least useful go.
    pub max_entries: usize,
    /// `minTTL`: record TTLs below this are raised to it (seconds).
    pub min_ttl: u32,
    /// `maxTTL`: record TTLs above this are cut to it (seconds).
    pub max_ttl: u32,
    /// `maxNegativeTTL`: negative answers (NXDOMAIN, NODATA) are kept at most this long
    /// (seconds).
    pub max_negative_ttl: u32,
}

impl Default for AnswerCache {
    /// `cache: {}`: 10,000 entries, TTLs as the records say up to a day, negative answers up
    /// to an hour.
    fn default() -> Self {
        Self {
            max_entries: 10_000,
            min_ttl: 0,
            max_ttl: 86_400,
            max_negative_ttl: 3_600,
        }
    }
}
