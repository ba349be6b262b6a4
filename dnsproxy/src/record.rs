//! The recording tap: every DNS message the proxy takes from a client or sends to one, as the
//! client saw it (before the ID is rewritten on the way out, after it is restored on the way
//! back), with what the proxy decided — for `fqdnd record`. The recorder is asked whether it
//! is on before anything is copied, so an idle tap costs one atomic load per message.

use std::net::SocketAddr;

use crate::policy::Transport;

/// Which way a message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the client to the server it asked (the proxy, or the original resolver).
    Query,
    /// From that server back to the client.
    Reply,
}

/// One recorded message.
#[derive(Debug, Clone, Copy)]
pub struct Recorded<'a> {
    /// Which way.
    pub direction: Direction,
    /// The client.
    pub client: SocketAddr,
    /// The address the client sent its query to (what the reply comes from).
    pub server: SocketAddr,
    /// UDP or TCP.
    pub transport: Transport,
    /// The message, without TCP's length prefix.
    pub bytes: &'a [u8],
    /// The policy's tag of the client (the endpoint or client group whose rules judged the
    /// query, refused or allowed); `None` for an unknown client or a malformed query.
    pub tag: Option<u64>,
    /// Whether the query was redirected at the socket level ([`crate::Redirect`]): its tag
    /// comes from who the redirect named, not from the client's address.
    pub redirected: bool,
    /// For a query, the verdict (`allow`, `deny`, `unknown_client`, `rate_limited`,
    /// `malformed`); for a reply, how the query ended (a `QueryResult` name).
    pub verdict: &'static str,
    /// Microseconds since the Unix epoch.
    pub unix_us: u64,
}

/// Takes recorded messages. Called on the DNS path: `record` must not block (copy and queue).
pub trait Recorder: Send + Sync + 'static {
    /// Whether recording is on now (checked before each message).
    fn active(&self) -> bool;
    /// One message.
    fn record(&self, message: &Recorded<'_>);
}

/// Microseconds since the Unix epoch: recordings carry wall-clock time.
#[allow(
    clippy::disallowed_types,
    reason = "a recording's timestamps are wall-clock time"
)]
pub(crate) fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
