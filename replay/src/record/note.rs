//! The comment `fqdnd record` writes on each packet, and reads back: which way the message
//! went, its transport, who asked and the verdict.

use std::fmt;

use crate::extract::Transport;

/// Which way a message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// From the client to the server it asked.
    Query,
    /// From that server back to the client.
    Reply,
}

/// The encryption a stream message came in, when the client used DoT or DoH: the recording
/// holds the DNS message itself, as a TCP segment to the listener's port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encryption {
    /// DNS over TLS (RFC 7858).
    Dot,
    /// DNS over HTTPS (RFC 8484).
    Doh,
}

/// What a recording says of a message besides its bytes: the packet's comment,
/// `fqdnd query transport=tcp endpoint=7 by=socket verdict=deny` (and `encrypted=dot` or
/// `encrypted=doh` for a query that came over TLS or HTTPS). `endpoint` is the endpoint
/// or client group whose rules judged the query (`-`: none, an unknown client or a malformed
/// query); `by=socket` (node mode, host processes) says the kernel named the endpoint for the
/// client's socket — the client's address (loopback) says nothing of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Note<'a> {
    /// Which way.
    pub way: Way,
    /// How the message travelled.
    pub transport: Transport,
    /// DoT or DoH, when the stream was encrypted.
    pub encrypted: Option<Encryption>,
    /// The endpoint or client group that asked, if known.
    pub endpoint: Option<u16>,
    /// Whether the endpoint was named by the client's socket (not found by its address).
    pub by_socket: bool,
    /// For a query, the verdict (`allow`, `deny`, …); for a reply, how the query ended.
    pub verdict: &'a str,
}

impl fmt::Display for Note<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let way = match self.way {
            Way::Query => "query",
            Way::Reply => "reply",
        };
        let transport = match self.transport {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        };
        write!(f, "fqdnd {way} transport={transport}")?;
        match self.encrypted {
            Some(Encryption::Dot) => f.write_str(" encrypted=dot")?,
            Some(Encryption::Doh) => f.write_str(" encrypted=doh")?,
            None => {}
        }
        f.write_str(" endpoint=")?;
        match self.endpoint {
            Some(id) => write!(f, "{id}")?,
            None => f.write_str("-")?,
        }
        if self.by_socket {
            f.write_str(" by=socket")?;
        }
        write!(f, " verdict={}", self.verdict)
    }
}

impl<'a> Note<'a> {
    /// Reads a packet comment written by `fqdnd record` (any version); `None` for any other
    /// comment. Unknown fields are skipped.
    pub fn parse(comment: &'a str) -> Option<Self> {
        let mut words = comment.split_ascii_whitespace();
        if words.next()? != "fqdnd" {
            return None;
        }
        let way = match words.next()? {
            "query" => Way::Query,
            "reply" => Way::Reply,
            _ => return None,
        };
        let mut note = Note {
            way,
            transport: Transport::Udp,
            encrypted: None,
            endpoint: None,
            by_socket: false,
            verdict: "",
        };
        let mut transport = None;
        for word in words {
            match word.split_once('=') {
                Some(("transport", "udp")) => transport = Some(Transport::Udp),
                Some(("transport", "tcp")) => transport = Some(Transport::Tcp),
                Some(("encrypted", "dot")) => note.encrypted = Some(Encryption::Dot),
                Some(("encrypted", "doh")) => note.encrypted = Some(Encryption::Doh),
                Some(("endpoint", id)) => note.endpoint = id.parse().ok(),
                Some(("by", by)) => note.by_socket = by == "socket",
                Some(("verdict", verdict)) => note.verdict = verdict,
                _ => {}
            }
        }
        note.transport = transport?;
        Some(note)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_read_back_and_older_comments_too() {
        let n = Note {
            way: Way::Reply,
            transport: Transport::Tcp,
            encrypted: None,
            endpoint: Some(42),
            by_socket: true,
            verdict: "denied",
        };
        let text = n.to_string();
        assert_eq!(
            text,
            "fqdnd reply transport=tcp endpoint=42 by=socket verdict=denied"
        );
        assert_eq!(Note::parse(&text), Some(n));
        // Before endpoints were named by socket: no `by`.
        let old = Note::parse("fqdnd query transport=udp endpoint=- verdict=deny").unwrap();
        assert_eq!(
            (old.way, old.transport, old.endpoint, old.by_socket),
            (Way::Query, Transport::Udp, None, false)
        );
        let doh = Note {
            encrypted: Some(Encryption::Doh),
            ..n
        };
        assert_eq!(
            doh.to_string(),
            "fqdnd reply transport=tcp encrypted=doh endpoint=42 by=socket verdict=denied"
        );
        assert_eq!(Note::parse(&doh.to_string()), Some(doh));
        assert_eq!(Note::parse("a comment of someone else"), None);
        assert_eq!(Note::parse("fqdnd query endpoint=7"), None, "no transport");
    }
}
