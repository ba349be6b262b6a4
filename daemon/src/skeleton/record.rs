//! `fqdnd record`: the proxy's recording tap into rotating pcapng files, switched on and off
//! at run time through the admin API. The DNS path only copies the message into a bounded
//! queue (dropped and counted when the writer falls behind); a writer thread owns the files.
//! Switching off drains the queue before the files close, so nothing taken while on is lost.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

use crate::{Context, Result, bail};
use fqdnd_dnsproxy::{Direction, Recorded, Recorder, Transport};
use fqdnd_replay::record::{Bounds, Encryption, Note, Packet, Recording, Way, Written};
use serde::{Deserialize, Serialize};

/// Messages queued at most before new ones are dropped.
const QUEUE: usize = 65_536;

/// `POST /v1/record`: where and how much.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecordRequest {
    /// The directory (created if missing).
    pub dir: PathBuf,
    /// A file is closed past this many bytes.
    #[serde(default = "default_file_bytes")]
    pub max_file_bytes: u64,
    /// Files kept; the oldest is deleted when a new one starts.
    #[serde(default = "default_files")]
    pub max_files: usize,
}

fn default_file_bytes() -> u64 {
    100 << 20
}

fn default_files() -> usize {
    10
}

/// `GET /v1/record`: the recording's state.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RecordStatus {
    /// Whether a recording runs.
    pub recording: bool,
    /// Its directory.
    pub dir: Option<PathBuf>,
    /// Messages taken from the DNS path (this recording).
    pub taken: u64,
    /// Messages dropped because the writer fell behind.
    pub dropped: u64,
    /// Messages written.
    pub packets: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Messages left out (over UDP, too big for a datagram).
    pub skipped: u64,
    /// Files deleted by rotation.
    pub rotated_out: u64,
    /// The files kept, oldest first.
    pub files: Vec<PathBuf>,
    /// The writer's error, if it stopped on one.
    pub error: Option<String>,
}

/// One message, owned, on its way to the writer.
struct Owned {
    unix_us: u64,
    src: SocketAddr,
    dst: SocketAddr,
    bytes: Vec<u8>,
    note: Note<'static>,
}

/// What the writer thread reports when it ends.
struct Ended {
    written: Written,
    files: Vec<PathBuf>,
    error: Option<String>,
}

struct Active {
    tx: SyncSender<Owned>,
    writer: JoinHandle<Ended>,
    dir: PathBuf,
}

/// The recorder the proxy taps into.
#[derive(Default)]
pub struct PcapRecorder {
    on: AtomicBool,
    taken: AtomicU64,
    dropped: AtomicU64,
    /// Read on the DNS path; written only to switch on and off.
    active: RwLock<Option<Active>>,
    /// What the last recording ended with.
    last: Mutex<RecordStatus>,
}

impl Recorder for PcapRecorder {
    fn active(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    fn record(&self, m: &Recorded<'_>) {
        let Ok(active) = self.active.read() else {
            return;
        };
        let Some(active) = active.as_ref() else {
            return;
        };
        let (src, dst, way) = match m.direction {
            Direction::Query => (m.client, m.server, Way::Query),
            Direction::Reply => (m.server, m.client, Way::Reply),
        };
        let owned = Owned {
            unix_us: m.unix_us,
            src,
            dst,
            bytes: m.bytes.to_vec(),
            note: Note {
                way,
                transport: match m.transport {
                    Transport::Udp => fqdnd_replay::Transport::Udp,
                    Transport::Tcp | Transport::Dot | Transport::Doh => {
                        fqdnd_replay::Transport::Tcp
                    }
                },
                encrypted: match m.transport {
                    Transport::Dot => Some(Encryption::Dot),
                    Transport::Doh => Some(Encryption::Doh),
                    Transport::Udp | Transport::Tcp => None,
                },
                // Endpoint and client group ids are 16-bit.
                endpoint: m.tag.and_then(|t| u16::try_from(t).ok()),
                by_socket: m.redirected,
                verdict: m.verdict,
            },
        };
        self.taken.fetch_add(1, Ordering::Relaxed);
        match active.tx.try_send(owned) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn write_all(rx: &Receiver<Owned>, mut recording: Recording) -> Ended {
    let mut error = None;
    for m in rx {
        let packet = Packet {
            unix_us: m.unix_us,
            src: m.src,
            dst: m.dst,
            bytes: &m.bytes,
            note: m.note,
        };
        if let Err(e) = recording.write(&packet) {
            error = Some(format!("writing the recording: {e}"));
            break;
        }
    }
    if let Err(e) = recording.close() {
        error.get_or_insert_with(|| format!("closing the recording: {e}"));
    }
    Ended {
        written: recording.written().clone(),
        files: recording.files().map(PathBuf::from).collect(),
        error,
    }
}

impl PcapRecorder {
    /// Starts recording into `request.dir`.
    pub fn start(&self, request: &RecordRequest, mode: &str) -> Result<RecordStatus> {
        let mut active = self
            .active
            .write()
            .map_err(|_| crate::refused!("recorder lock poisoned"))?;
        if let Some(a) = active.as_ref() {
            bail!("already recording into {}; stop it first", a.dir.display());
        }
        let prefix = format!("fqdnd-{mode}-{}", unix_seconds());
        let recording = Recording::new(
            &request.dir,
            &prefix,
            Bounds {
                max_file_bytes: request.max_file_bytes,
                max_files: request.max_files,
            },
        )
        .with_context(|| format!("creating {}", request.dir.display()))?;
        let (tx, rx) = sync_channel(QUEUE);
        let writer = std::thread::Builder::new()
            .name("fqdnd-record".into())
            .spawn(move || write_all(&rx, recording))
            .context("starting the recording thread")?;
        self.taken.store(0, Ordering::Relaxed);
        self.dropped.store(0, Ordering::Relaxed);
        *active = Some(Active {
            tx,
            writer,
            dir: request.dir.clone(),
        });
        self.on.store(true, Ordering::Relaxed);
        tracing::info!(dir = %request.dir.display(), max_file_bytes = request.max_file_bytes, max_files = request.max_files, "recording DNS traffic");
        Ok(RecordStatus {
            recording: true,
            dir: Some(request.dir.clone()),
            ..RecordStatus::default()
        })
    }

    /// Stops recording: every message taken is written, the files closed. Blocks until then.
    pub fn stop(&self) -> Result<RecordStatus> {
        self.on.store(false, Ordering::Relaxed);
        let taken = {
            let mut active = self
                .active
                .write()
                .map_err(|_| crate::refused!("recorder lock poisoned"))?;
            active.take()
        };
        let Some(Active { tx, writer, dir }) = taken else {
            bail!("not recording");
        };
        drop(tx);
        let ended = writer
            .join()
            .map_err(|_| crate::refused!("the recording thread panicked"))?;
        let status = RecordStatus {
            recording: false,
            dir: Some(dir),
            taken: self.taken.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            packets: ended.written.packets,
            bytes: ended.written.bytes,
            skipped: ended.written.skipped,
            rotated_out: ended.written.rotated_out,
            files: ended.files,
            error: ended.error,
        };
        tracing::info!(
            packets = status.packets,
            dropped = status.dropped,
            files = status.files.len(),
            "recording stopped"
        );
        if let Ok(mut last) = self.last.lock() {
            *last = status.clone();
        }
        Ok(status)
    }

    /// The recording's state now (or the last one's, when none runs).
    pub fn status(&self) -> RecordStatus {
        let recording = self
            .active
            .read()
            .ok()
            .and_then(|a| a.as_ref().map(|a| a.dir.clone()));
        match recording {
            Some(dir) => RecordStatus {
                recording: true,
                dir: Some(dir),
                taken: self.taken.load(Ordering::Relaxed),
                dropped: self.dropped.load(Ordering::Relaxed),
                ..RecordStatus::default()
            },
            None => self.last.lock().map(|l| l.clone()).unwrap_or_default(),
        }
    }
}

/// Seconds since the Unix epoch, for file names.
fn unix_seconds() -> u64 {
    use fqdnd_engine::Clock as _;
    let clock = crate::clock::Clock::start();
    clock.unix_ms_of(clock.now()) / 1000
}

/// The recorder, shared by the proxy and the admin API.
pub type SharedRecorder = Arc<PcapRecorder>;
