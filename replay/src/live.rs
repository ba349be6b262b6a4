//! Live replay: the trace's queries sent to a running DNS server over UDP, at the capture's
//! timing (scaled by a speed factor) or as fast as the outstanding cap allows, each answer
//! compared with the response the capture holds for that query.
//!
//! One thread, one UDP socket. The trace is read as a stream: a query is sent when the wall
//! clock reaches its (scaled) capture time; while waiting, answers are received. Each query
//! sent takes a free transaction id (the wire id is rewritten), so up to 65,536 can be in
//! flight. A captured response is paired with its query by (client, server, id, name); answers
//! match when the RCODE and the answer set (type and data of every answer record, TTLs and
//! order ignored) are the same.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::Error;
use crate::capture::CaptureReader;
use crate::dns::{Data, Decoded, Decoder};
use crate::extract::{DnsPayload, Extractor, Limits};
use crate::histogram::Histogram;
use crate::wall::WallTime;

/// How to replay live.
#[derive(Debug, Clone)]
pub struct LiveOptions {
    /// The DNS server.
    pub server: SocketAddr,
    /// Capture files, read one after another.
    pub traces: Vec<PathBuf>,
    /// DNS ports in the capture.
    pub ports: Vec<u16>,
    /// Speed factor: 1 keeps the capture's timing, 2 sends twice as fast, 0 as fast as the
    /// outstanding cap allows.
    pub speed: f64,
    /// An answer not received within this is a timeout.
    pub timeout: Duration,
    /// Queries in flight at most.
    pub max_outstanding: usize,
    /// Send at most this many queries.
    pub limit: Option<u64>,
}

/// The result of a live replay (keys documented in `docs/replay.md`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct LiveReport {
    /// Schema version (1).
    pub schema_version: u32,
    /// The server.
    pub server: String,
    /// Queries found in the capture.
    pub queries_in_trace: u64,
    /// Queries sent.
    pub sent: u64,
    /// Answers received in time.
    pub received: u64,
    /// Queries with no answer within the timeout.
    pub timeouts: u64,
    /// Answers that arrived after their timeout, or for no query in flight.
    pub late_or_unknown: u64,
    /// Answers compared with a captured response.
    pub compared: u64,
    /// Of them, with the same RCODE and answer set.
    pub matched: u64,
    /// Of them, different.
    pub mismatched: u64,
    /// Of the mismatched, with a different RCODE.
    pub mismatched_rcode: u64,
    /// Of the mismatched, same RCODE but a different answer set.
    pub mismatched_answers: u64,
    /// Answers received whose query has no response in the capture.
    pub no_captured_response: u64,
    /// Queries not sent because the socket refused them.
    pub send_errors: u64,
    /// Wall time from the first query sent to the last answer or timeout, seconds.
    pub wall_seconds: f64,
    /// Queries sent per second of wall time.
    pub qps_sent: f64,
    /// Answers received per second of wall time.
    pub qps_received: f64,
    /// Latency of received answers: median, nanoseconds.
    pub latency_ns_p50: u64,
    /// 90th percentile.
    pub latency_ns_p90: u64,
    /// 99th percentile.
    pub latency_ns_p99: u64,
    /// Largest.
    pub latency_ns_max: u64,
    /// Mean.
    pub latency_ns_mean: f64,
}

impl LiveReport {
    /// The summary block, in the same style as the replay's.
    pub fn summary(&self) -> String {
        let pct = |n: u64, d: u64| {
            if d == 0 {
                0.0
            } else {
                100.0 * n as f64 / d as f64
            }
        };
        let us = |ns: u64| ns as f64 / 1000.0;
        format!(
            "Statistics:\n\n\
             \x20 Server:                {}\n\
             \x20 Queries in trace:      {}\n\
             \x20 Queries sent:          {}\n\
             \x20 Answers received:      {} ({:.2}%)\n\
             \x20 Timeouts:              {} ({:.2}%)\n\
             \x20 Late or unknown:       {}\n\
             \x20 Compared with capture: {}\n\
             \x20   matched              {} ({:.2}%)\n\
             \x20   mismatched           {} (rcode {}, answers {})\n\
             \x20 No captured response:  {}\n\
             \x20 Send errors:           {}\n\n\
             \x20 Run time (s):          {:.3}\n\
             \x20 Queries per second:    {:.0} sent, {:.0} answered\n\
             \x20 Latency (us):          p50 {:.1}, p90 {:.1}, p99 {:.1}, max {:.1}, mean {:.1}\n",
            self.server,
            self.queries_in_trace,
            self.sent,
            self.received,
            pct(self.received, self.sent),
            self.timeouts,
            pct(self.timeouts, self.sent),
            self.late_or_unknown,
            self.compared,
            self.matched,
            pct(self.matched, self.compared),
            self.mismatched,
            self.mismatched_rcode,
            self.mismatched_answers,
            self.no_captured_response,
            self.send_errors,
            self.wall_seconds,
            self.qps_sent,
            self.qps_received,
            us(self.latency_ns_p50),
            us(self.latency_ns_p90),
            us(self.latency_ns_p99),
            us(self.latency_ns_max),
            self.latency_ns_mean / 1000.0,
        )
    }
}

/// What an answer says, for comparison: RCODE and the sorted answer set.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Summary {
    rcode: u8,
    answers: Vec<(u16, String)>,
}

fn summarize(msg: &Decoded, raw: &[u8]) -> Summary {
    let mut answers: Vec<(u16, String)> = msg
        .answers
        .iter()
        .map(|rr| {
            let data = match &rr.data {
                Data::Addr(a) => a.to_string(),
                Data::Name(n) => msg.name(n).to_owned(),
                Data::Raw(r) => raw
                    .get(r.clone())
                    .unwrap_or_default()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect(),
            };
            (rr.rtype, format!("{} {data}", msg.name(&rr.owner)))
        })
        .collect();
    answers.sort();
    Summary {
        rcode: msg.header.rcode,
        answers,
    }
}

type Key = (SocketAddr, SocketAddr, u16, Box<str>);

#[derive(Debug)]
struct Slot {
    key: Key,
    sent: WallTime,
    deadline: WallTime,
    trace_time: Duration,
    live: Option<Summary>,
    captured: Option<Summary>,
    done_waiting: bool,
}

struct State {
    socket: UdpSocket,
    opts: LiveOptions,
    slots: Vec<Option<Slot>>,
    by_key: HashMap<Key, u16>,
    /// Wire ids in send order, to time out and to give up waiting for captured responses.
    order: VecDeque<u16>,
    next_id: u16,
    outstanding: usize,
    report: LiveReport,
    latency: Histogram,
    decoder: Decoder,
    recv_buf: Vec<u8>,
    send_buf: Vec<u8>,
    origin: Option<Duration>,
    started: Option<WallTime>,
    trace_now: Duration,
    stop: bool,
}

/// How long, in capture time, a query waits for its captured response to be read.
const CAPTURE_WAIT: Duration = Duration::from_secs(10);

impl State {
    fn payload(&mut self, p: &DnsPayload<'_>) {
        if self.stop {
            return;
        }
        let origin = *self.origin.get_or_insert(p.ts);
        self.trace_now = self.trace_now.max(p.ts.saturating_sub(origin));
        let Ok(msg) = self.decoder.decode(p.bytes) else {
            return;
        };
        if msg.header.opcode != 0 {
            return;
        }
        let key: Key;
        if msg.header.response {
            key = (p.dst, p.src, msg.header.id, msg.qname().into());
            let summary = summarize(msg, p.bytes);
            if let Some(id) = self.by_key.get(&key).copied() {
                if let Some(slot) = self.slots[usize::from(id)].as_mut() {
                    slot.captured = Some(summary);
                }
                self.settle(id);
            }
            return;
        }
        key = (p.src, p.dst, msg.header.id, msg.qname().into());
        self.report.queries_in_trace += 1;
        if self.opts.limit.is_some_and(|l| self.report.sent >= l) {
            self.stop = true;
            return;
        }
        let trace_time = self.trace_now;
        let mut bytes = std::mem::take(&mut self.send_buf);
        bytes.clear();
        bytes.extend_from_slice(p.bytes);
        self.send(key, &mut bytes, trace_time);
        self.send_buf = bytes;
    }

    /// Waits for the query's time and a free slot, then sends it.
    fn send(&mut self, key: Key, bytes: &mut [u8], trace_time: Duration) {
        let started = *self.started.get_or_insert_with(WallTime::now);
        if self.opts.speed > 0.0 {
            let offset =
                Duration::from_secs_f64((trace_time.as_secs_f64() / self.opts.speed).min(1e9));
            let at = started.plus(offset);
            loop {
                let now = WallTime::now();
                if now >= at {
                    break;
                }
                self.poll(now.until(at).min(Duration::from_millis(5)));
            }
        }
        while self.outstanding >= self.opts.max_outstanding.max(1) || self.free_id().is_none() {
            self.poll(Duration::from_millis(5));
        }
        let Some(id) = self.free_id() else { return };
        if let Some(b) = bytes.get_mut(..2) {
            b.copy_from_slice(&id.to_be_bytes());
        }
        let now = WallTime::now();
        if self.socket.send(bytes).is_err() {
            self.report.send_errors += 1;
            return;
        }
        self.report.sent += 1;
        self.outstanding += 1;
        if let Some(old) = self.by_key.insert(key.clone(), id)
            && old != id
            && let Some(slot) = self.slots[usize::from(old)].as_mut()
        {
            // A retransmission of a query still in flight: the captured response pairs with
            // the newest; the older one is answered without comparison.
            slot.done_waiting = true;
        }
        self.slots[usize::from(id)] = Some(Slot {
            key,
            sent: now,
            deadline: now.plus(self.opts.timeout),
            trace_time,
            live: None,
            captured: None,
            done_waiting: false,
        });
        self.order.push_back(id);
        self.next_id = id.wrapping_add(1);
        self.poll(Duration::ZERO);
    }

    fn free_id(&self) -> Option<u16> {
        (0..=u16::MAX)
            .map(|i| self.next_id.wrapping_add(i))
            .take(4096)
            .find(|id| self.slots[usize::from(*id)].is_none())
    }

    /// Receives answers for up to `wait`, then expires timeouts.
    fn poll(&mut self, wait: Duration) {
        let mut wait = wait;
        loop {
            let got = if wait.is_zero() {
                self.socket.set_nonblocking(true).ok();
                let r = self.socket.recv(&mut self.recv_buf);
                self.socket.set_nonblocking(false).ok();
                r
            } else {
                self.socket
                    .set_read_timeout(Some(wait.max(Duration::from_micros(100))))
                    .ok();
                self.socket.recv(&mut self.recv_buf)
            };
            match got {
                Ok(n) => {
                    self.answer(n);
                    wait = Duration::ZERO;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    break;
                }
                Err(_) => break,
            }
        }
        self.expire();
    }

    fn answer(&mut self, n: usize) {
        let now = WallTime::now();
        let raw = &self.recv_buf[..n.min(self.recv_buf.len())];
        let Some(id) = raw.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]])) else {
            return;
        };
        let Some(slot) = self.slots[usize::from(id)].as_mut() else {
            self.report.late_or_unknown += 1;
            return;
        };
        if slot.live.is_some() || now > slot.deadline {
            self.report.late_or_unknown += 1;
            return;
        }
        let summary = match self.decoder.decode(raw) {
            Ok(msg) => summarize(msg, raw),
            Err(_) => Summary {
                rcode: u8::MAX,
                answers: Vec::new(),
            },
        };
        let latency = slot.sent.until(now);
        slot.live = Some(summary);
        self.latency
            .record(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX));
        self.report.received += 1;
        self.outstanding -= 1;
        self.settle(id);
    }

    /// Compares and frees a slot once both sides are known, or once it is over.
    fn settle(&mut self, id: u16) {
        let Some(slot) = self.slots[usize::from(id)].as_ref() else {
            return;
        };
        let done = match (&slot.live, &slot.captured) {
            (Some(live), Some(captured)) => {
                self.report.compared += 1;
                if live == captured {
                    self.report.matched += 1;
                } else {
                    self.report.mismatched += 1;
                    if live.rcode != captured.rcode {
                        self.report.mismatched_rcode += 1;
                    } else {
                        self.report.mismatched_answers += 1;
                    }
                }
                true
            }
            (Some(_), None) if slot.done_waiting => {
                self.report.no_captured_response += 1;
                true
            }
            _ => false,
        };
        if done
            && let Some(slot) = self.slots[usize::from(id)].take()
            && self.by_key.get(&slot.key) == Some(&id)
        {
            self.by_key.remove(&slot.key);
        }
    }

    fn expire(&mut self) {
        let now = WallTime::now();
        let mut i = 0;
        while i < self.order.len() {
            let id = self.order[i];
            let Some(slot) = self.slots[usize::from(id)].as_mut() else {
                self.order.remove(i);
                continue;
            };
            let timed_out = slot.live.is_none() && now > slot.deadline;
            let waited = self.trace_now.saturating_sub(slot.trace_time) > CAPTURE_WAIT;
            let in_flight = slot.live.is_none();
            if timed_out {
                self.report.timeouts += 1;
                self.outstanding -= 1;
                if let Some(slot) = self.slots[usize::from(id)].take()
                    && self.by_key.get(&slot.key) == Some(&id)
                {
                    self.by_key.remove(&slot.key);
                }
                self.order.remove(i);
                continue;
            }
            if waited {
                slot.done_waiting = true;
                self.settle(id);
                if self.slots[usize::from(id)].is_none() {
                    self.order.remove(i);
                    continue;
                }
            }
            if !timed_out && !waited && in_flight {
                // In send order: later queries time out later.
                break;
            }
            i += 1;
        }
    }

    /// End of the trace: waits for what is in flight, then settles everything.
    fn drain(&mut self) {
        while self.outstanding > 0 {
            self.poll(Duration::from_millis(5));
        }
        self.trace_now = Duration::MAX;
        self.expire();
        for id in 0..=u16::MAX {
            if let Some(slot) = self.slots[usize::from(id)].as_mut() {
                slot.done_waiting = true;
                self.settle(id);
            }
        }
    }
}

/// Runs a live replay.
///
/// # Errors
/// The socket cannot be opened, or a capture cannot be opened at all.
pub fn live(options: &LiveOptions) -> Result<LiveReport, Error> {
    let bind: SocketAddr = match options.server.ip() {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let live_err = |what: &'static str, source: io::Error| Error::Live {
        what,
        server: options.server,
        source,
    };
    let socket = UdpSocket::bind(bind).map_err(|e| live_err("binding a UDP socket to reach", e))?;
    socket
        .connect(options.server)
        .map_err(|e| live_err("connecting to", e))?;
    let mut state = State {
        socket,
        opts: options.clone(),
        slots: (0..=u16::MAX).map(|_| None).collect(),
        by_key: HashMap::new(),
        order: VecDeque::new(),
        next_id: 0,
        outstanding: 0,
        report: LiveReport {
            schema_version: 1,
            server: options.server.to_string(),
            ..LiveReport::default()
        },
        latency: Histogram::default(),
        decoder: Decoder::new(),
        recv_buf: vec![0; 65_536],
        send_buf: Vec::new(),
        origin: None,
        started: None,
        trace_now: Duration::ZERO,
        stop: false,
    };
    let mut extractor = Extractor::new(&options.ports, Limits::default());
    for path in &options.traces {
        let mut reader = CaptureReader::open(path).map_err(|source| Error::Capture {
            path: path.clone(),
            source,
        })?;
        let result = reader.for_each(|frame| extractor.frame(frame, &mut |p| state.payload(p)));
        if let Err(e) = result {
            tracing::warn!(file = %path.display(), error = %e, "capture damaged; replaying what was read");
        }
        if state.stop {
            break;
        }
    }
    extractor.finish(&mut |p| state.payload(p));
    state.drain();
    let mut report = state.report;
    let wall = state.started.map_or(0.0, |s| s.elapsed().as_secs_f64());
    report.wall_seconds = wall;
    report.qps_sent = report.sent as f64 / wall.max(1e-9);
    report.qps_received = report.received as f64 / wall.max(1e-9);
    report.latency_ns_p50 = state.latency.quantile(0.5);
    report.latency_ns_p90 = state.latency.quantile(0.9);
    report.latency_ns_p99 = state.latency.quantile(0.99);
    report.latency_ns_max = state.latency.max();
    report.latency_ns_mean = state.latency.mean();
    Ok(report)
}
