//! The journal's writer task: it owns the file and turns the queue into batches.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::journal::{Msg, Rotation, Shared};
use crate::writer::Writer;
use crate::{Error, Seq};

/// A batch is written early once it holds this much, so one write never grows unbounded.
const MAX_BATCH_BYTES: usize = 8 << 20;
/// Lazy records alone are written once they hold this much, even before the interval.
const MAX_LAZY_BYTES: usize = 1 << 20;

pub(crate) struct WriterTask {
    /// `None` only while a blocking call holds it, or after that call died.
    writer: Option<Writer>,
    shared: Arc<Shared>,
    buf: Vec<u8>,
    records: u64,
    acks: Vec<(u64, oneshot::Sender<Result<Seq, Error>>)>,
}

impl WriterTask {
    pub(crate) fn new(writer: Writer, shared: Arc<Shared>) -> Self {
        Self {
            writer: Some(writer),
            shared,
            buf: Vec::new(),
            records: 0,
            acks: Vec::new(),
        }
    }

    /// The loop: take everything queued, commit it as one batch when anyone waits (or the
    /// lazy records grew large or old), answer the waiters, repeat; commit the rest at the end.
    pub(crate) async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Msg>,
        lazy_interval: Duration,
    ) -> Result<(), Error> {
        let mut lazy_deadline: Option<Instant> = None;
        loop {
            let msg = match lazy_deadline {
                Some(deadline) => tokio::select! {
                    msg = rx.recv() => msg,
                    () = tokio::time::sleep_until(deadline) => {
                        lazy_deadline = None;
                        let _ = self.commit().await;
                        continue;
                    }
                },
                None => rx.recv().await,
            };
            let Some(msg) = msg else { break };
            let mut next = Some(msg);
            while let Some(msg) = next.take() {
                self.handle(msg).await;
                if self.buf.len() >= MAX_BATCH_BYTES {
                    let _ = self.commit().await;
                }
                next = rx.try_recv().ok();
            }
            if !self.acks.is_empty() || self.buf.len() >= MAX_LAZY_BYTES {
                let _ = self.commit().await;
            }
            if self.buf.is_empty() {
                lazy_deadline = None;
            } else if lazy_deadline.is_none() {
                lazy_deadline = Some(Instant::now() + lazy_interval);
            }
            if self.writer.is_none() {
                return Err(Error::Closed);
            }
        }
        self.commit().await.map(drop)
    }

    async fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Record { frame, ack } => {
                self.shared.queued.fetch_sub(frame.len() as u64, Relaxed);
                if let Some(ack) = ack {
                    self.acks.push((self.records, ack));
                }
                self.buf.extend_from_slice(&frame);
                self.records += 1;
            }
            Msg::Flush(reply) => {
                let _ = reply.send(self.commit().await);
            }
            Msg::Rotate(reply) => {
                let result = match self.commit().await {
                    Ok(_) => self.blocking(|w| w.rotate()).await,
                    Err(e) => Err(e),
                };
                let result = result.map(|(generation, next_seq)| {
                    self.shared.generation.store(generation, Relaxed);
                    Rotation {
                        generation,
                        next_seq,
                    }
                });
                let _ = reply.send(result);
            }
        }
    }

    /// Runs `f` on the writer in the blocking pool.
    async fn blocking<R: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut Writer) -> Result<R, Error> + Send + 'static,
    ) -> Result<R, Error> {
        let mut writer = self.writer.take().ok_or(Error::Closed)?;
        let (writer, result) = tokio::task::spawn_blocking(move || {
            let result = f(&mut writer);
            (writer, result)
        })
        .await
        .map_err(|_| Error::Closed)?;
        self.writer = Some(writer);
        result
    }

    /// Commits the pending batch and answers its waiters; returns the next seq.
    async fn commit(&mut self) -> Result<Seq, Error> {
        let records = std::mem::take(&mut self.records);
        let acks = std::mem::take(&mut self.acks);
        let buf = std::mem::take(&mut self.buf);
        let bytes = buf.len() as u64;
        let result = self
            .blocking(move |w| {
                let result = w.commit(&buf, records);
                result.map(|(first, timing)| (first, timing, buf))
            })
            .await;
        let s = &self.shared;
        match result {
            Ok((first, timing, mut buf)) => {
                buf.clear();
                self.buf = buf;
                if records > 0 {
                    s.records.fetch_add(records, Relaxed);
                    s.batches.fetch_add(1, Relaxed);
                    s.bytes.fetch_add(bytes, Relaxed);
                    s.last_batch_records.store(records, Relaxed);
                    let ns = u64::try_from(timing.sync.as_nanos()).unwrap_or(u64::MAX);
                    s.last_fsync_ns.store(ns, Relaxed);
                    s.fsync_total_ns.fetch_add(ns, Relaxed);
                }
                let next = Seq(first.0 + records);
                s.next_seq.store(next.0, Relaxed);
                for (index, ack) in acks {
                    let _ = ack.send(Ok(Seq(first.0 + index)));
                }
                Ok(next)
            }
            Err(e) => {
                if records > 0 {
                    s.failed_batches.fetch_add(1, Relaxed);
                    s.failed_records.fetch_add(records, Relaxed);
                }
                for (_, ack) in acks {
                    let _ = ack.send(Err(e.clone()));
                }
                Err(e)
            }
        }
    }
}
