//! DNS over TLS to one upstream (RFC 7858): one long-lived connection, queries pipelined on
//! it with RFC 7766 framing (two length bytes before each message), answers taken in any
//! order and matched by ID in the upstream's in-flight table as UDP answers are.
//!
//! The connection is opened by the first query and kept. When it fails or the server closes
//! it (servers close idle connections), the next query opens a new one; the queries it had
//! carried that were not answered yet are sent once more on the new connection (a server
//! that closes an idle connection may not have read a query that crossed its close), and
//! after that they time out.

use std::collections::HashMap;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::framing::{FrameReader, Next};
use crate::upstream_encrypted::{Query, Transport};
use crate::wire;

/// Queries written in one go at most (the rest wait for the next write).
const WRITE_BATCH: usize = 64;

/// Runs the upstream's connection until the proxy stops.
pub(crate) async fn run(mut t: Transport, answers: mpsc::Sender<Vec<u8>>) {
    let mut waiting: Vec<Query> = Vec::new();
    loop {
        if waiting.is_empty() {
            match t.queries.recv().await {
                Some(query) => waiting.push(query),
                None => return,
            }
        }
        let stream = match tokio::time::timeout(t.timeout, t.connector.connect()).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                t.report.failed(error);
                waiting.clear();
                t.drop_waiting();
                continue;
            }
            Err(_) => {
                t.report
                    .failed(format!("no connection within {:?}", t.timeout));
                waiting.clear();
                t.drop_waiting();
                continue;
            }
        };
        t.report.connected();
        let mut sent = Sent::new(t.timeout);
        let why = serve(&mut t, stream, &mut waiting, &mut sent, &answers).await;
        t.report.closed(&why);
        if why == STOPPED {
            return;
        }
        // Sent once, unanswered: once more on the next connection.
        for bytes in sent.unanswered(Instant::now()) {
            let _ = t.requeue.send(Query {
                bytes,
                retried: true,
            });
        }
    }
}

const STOPPED: &str = "the proxy stopped";

/// Carries queries and answers on one connection until it ends; says why.
async fn serve(
    t: &mut Transport,
    stream: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    waiting: &mut Vec<Query>,
    sent: &mut Sent,
    answers: &mpsc::Sender<Vec<u8>>,
) -> String {
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut frames = FrameReader::default();
    let mut out = Vec::new();
    // Both halves note queries in it, one at a time (never across an `.await`).
    let sent = std::sync::Mutex::new(sent);
    let sent = || {
        sent.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    let write = async {
        loop {
            if waiting.is_empty() {
                match t.queries.recv().await {
                    Some(query) => waiting.push(query),
                    None => return STOPPED.to_owned(),
                }
            }
            while waiting.len() < WRITE_BATCH {
                match t.queries.try_recv() {
                    Ok(query) => waiting.push(query),
                    Err(_) => break,
                }
            }
            out.clear();
            let now = Instant::now();
            for query in waiting.drain(..) {
                if frame(&mut out, &query.bytes) {
                    sent().insert(query, now);
                }
            }
            if let Err(e) = wr.write_all(&out).await {
                return format!("write failed: {e}");
            }
            if let Err(e) = wr.flush().await {
                return format!("write failed: {e}");
            }
        }
    };
    let read = async {
        loop {
            loop {
                match frames.next() {
                    Next::Message(len) => {
                        let answer = frames.message(len).to_vec();
                        if let Some(id) = wire::id(&answer) {
                            sent().answered(id);
                        }
                        if answers.send(answer).await.is_err() {
                            return STOPPED.to_owned();
                        }
                        frames.consume(len);
                    }
                    Next::NeedMore => break,
                    Next::Empty => return "the server sent an empty message".to_owned(),
                }
            }
            match rd.read(frames.spare()).await {
                Ok(0) => return "closed by the server".to_owned(),
                Ok(n) => frames.filled(n),
                Err(e) => return format!("read failed: {e}"),
            }
        }
    };
    tokio::select! {
        why = write => why,
        why = read => why,
    }
}

/// Writes `query` with its length before it; false if it is too long to frame (never the
/// case for a query the proxy accepted, whose size fits two bytes).
fn frame(out: &mut Vec<u8>, query: &[u8]) -> bool {
    let Ok(len) = u16::try_from(query.len()) else {
        return false;
    };
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(query);
    true
}

/// The queries a connection carried that were not answered yet (by ID), so they can be sent
/// again if it closes. Entries older than the upstream timeout are forgotten (the sweep has
/// answered them).
struct Sent {
    queries: HashMap<u16, (Instant, Query)>,
    timeout: Duration,
    /// The size at which the old entries are pruned next.
    prune_at: usize,
}

impl Sent {
    fn new(timeout: Duration) -> Self {
        Self {
            queries: HashMap::new(),
            timeout,
            prune_at: 256,
        }
    }

    fn insert(&mut self, query: Query, now: Instant) {
        let Some(id) = wire::id(&query.bytes) else {
            return;
        };
        if self.queries.len() >= self.prune_at {
            let timeout = self.timeout;
            self.queries
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < timeout);
            self.prune_at = (self.queries.len() * 2).max(256);
        }
        self.queries.insert(id, (now, query));
    }

    fn answered(&mut self, id: u16) {
        self.queries.remove(&id);
    }

    /// The queries still waiting for their answer, sent only once and not timed out yet.
    fn unanswered(&mut self, now: Instant) -> Vec<Vec<u8>> {
        let timeout = self.timeout;
        self.queries
            .drain()
            .filter(|(_, (at, q))| !q.retried && now.saturating_duration_since(*at) < timeout)
            .map(|(_, (_, q))| q.bytes)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(id: u16, retried: bool) -> Query {
        let mut bytes = Vec::new();
        wire::write_probe(&mut bytes, id).unwrap();
        Query { bytes, retried }
    }

    #[test]
    fn queries_are_framed_with_their_length() {
        let mut out = Vec::new();
        assert!(frame(&mut out, &[1, 2, 3]));
        assert!(frame(&mut out, &[4]));
        assert_eq!(out, [0, 3, 1, 2, 3, 0, 1, 4]);
        assert!(!frame(&mut out, &vec![0; 65_536]));
        assert_eq!(out.len(), 8, "nothing written for a message too long");
        // What the reader cuts out of such a stream, in pieces, is the messages again.
        let mut frames = FrameReader::default();
        frames.spare()[..3].copy_from_slice(&out[..3]);
        frames.filled(3);
        assert_eq!(frames.next(), Next::NeedMore);
        frames.spare()[..5].copy_from_slice(&out[3..]);
        frames.filled(5);
        assert_eq!(frames.next(), Next::Message(3));
        assert_eq!(frames.message(3), &[1, 2, 3]);
        frames.consume(3);
        assert_eq!(frames.next(), Next::Message(1));
    }

    #[tokio::test(start_paused = true)]
    async fn unanswered_queries_are_sent_again_once_and_only_while_fresh() {
        let timeout = Duration::from_secs(5);
        let mut sent = Sent::new(timeout);
        let t0 = Instant::now();
        sent.insert(query(1, false), t0);
        sent.insert(query(2, false), t0);
        sent.insert(query(3, true), t0);
        sent.insert(query(4, false), t0 - timeout);
        sent.answered(2);
        let again = sent.unanswered(t0);
        let ids: Vec<u16> = again.iter().filter_map(|q| wire::id(q)).collect();
        assert_eq!(ids, [1], "2 answered, 3 already sent twice, 4 timed out");
        assert!(sent.unanswered(t0).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn old_entries_are_pruned_so_the_table_stays_bounded() {
        let timeout = Duration::from_secs(1);
        let mut sent = Sent::new(timeout);
        let t0 = Instant::now();
        for id in 0..256u16 {
            sent.insert(query(id, false), t0);
        }
        // Unanswered for longer than the timeout: forgotten at the next prune.
        sent.insert(query(1000, false), t0 + Duration::from_secs(2));
        assert_eq!(sent.queries.len(), 1);
    }
}
