//! TC=1 from an upstream: the same question asked again over a new TCP connection to it,
//! then the full answer goes through the hold like any other.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use fqdnd_dnswire::Decoder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::{Answer, Held, Shared, addresses};
use crate::ids::IdSource;
use crate::metrics::DropReason;
use crate::question::Question;
use crate::upstream::{Origin, Upstream};
use crate::wire;

impl Shared {
    /// Asks the upstream again over TCP (within `upstream_timeout`), then observes the full
    /// answer and replies. A failed retry is answered like an upstream timeout but does not
    /// count against the upstream's health (its UDP side answered).
    pub(super) async fn retry_tcp(
        self: Arc<Self>,
        upstream: Arc<Upstream>,
        origin: Origin,
        mut query: Vec<u8>,
        question: Question,
    ) {
        let upstream = upstream.addr;
        let id = IdSource::new().next_id();
        wire::set_id(&mut query, id);
        let exchange = self.tcp_exchange(upstream, &query, id, question);
        let mut decoder = Decoder::new();
        let failure = match tokio::time::timeout(self.config.upstream_timeout, exchange).await {
            Ok(Ok(mut raw)) => match (decoder.decode_whole(&raw), Question::parse(&raw)) {
                (Ok(decoded), Some(answer_question)) => {
                    let answered = Instant::now();
                    let answer = Answer {
                        origin,
                        upstream,
                        rcode: decoded.rcode,
                        addresses: addresses(decoded),
                        question: answer_question,
                        answered,
                        cached: false,
                    };
                    if let Held::Pending(pending) = self
                        .observe_and_reply(answer, &mut raw, decoded, None)
                        .await
                    {
                        pending.await;
                    }
                    return;
                }
                _ => {
                    self.metrics.drop_answer(DropReason::Malformed);
                    "malformed answer".to_owned()
                }
            },
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_owned(),
        };
        tracing::debug!(%upstream, error = %failure, "DNS retry over TCP failed");
        self.upstream_failed(origin, upstream, &query, question)
            .await;
    }

    /// One query and its answer on a new TCP connection. Answers with another ID or question
    /// are dropped and counted; the caller bounds the time.
    async fn tcp_exchange(
        &self,
        upstream: SocketAddr,
        query: &[u8],
        id: u16,
        question: Question,
    ) -> io::Result<Vec<u8>> {
        let mut stream = TcpStream::connect(upstream).await?;
        stream.set_nodelay(true)?;
        let len = u16::try_from(query.len()).map_err(|_| io::ErrorKind::InvalidInput)?;
        let mut framed = Vec::with_capacity(query.len() + 2);
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(query);
        stream.write_all(&framed).await?;
        loop {
            let mut len = [0u8; 2];
            stream.read_exact(&mut len).await?;
            let mut answer = vec![0u8; usize::from(u16::from_be_bytes(len))];
            stream.read_exact(&mut answer).await?;
            if wire::id(&answer) != Some(id) || !wire::is_response(&answer) {
                self.dropped(DropReason::UnknownId, upstream);
                continue;
            }
            match Question::parse(&answer) {
                Some(answered) if answered.same(&answer, question, query) => {
                    return Ok(answer);
                }
                _ => self.dropped(DropReason::QuestionMismatch, upstream),
            }
        }
    }
}
