//! Capture files: pcap (micro- and nanosecond, either byte order) and pcapng (every interface
//! with its own link type and time resolution), plain or gzip-compressed (detected by magic,
//! any number of times over, up to [`MAX_GZIP_LAYERS`]). Read as a stream: memory does not grow
//! with the file.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;
use std::time::Duration;

use flate2::bufread::MultiGzDecoder;
use pcap_parser::pcapng::Block;
use pcap_parser::traits::PcapReaderIterator;
use pcap_parser::{PcapBlockOwned, PcapError};

/// Gzip layers unwrapped at most (the libtrace sample is gzipped twice).
pub const MAX_GZIP_LAYERS: usize = 4;
/// The read buffer; grown up to [`MAX_BUFFER`] for larger blocks.
const INITIAL_BUFFER: usize = 1 << 20;
/// The largest block accepted.
const MAX_BUFFER: usize = 16 << 20;

/// Link types this reader decodes (tcpdump.org/linktypes.html).
pub mod linktype {
    /// BSD loopback: a 4-byte address family in host order.
    pub const NULL: i32 = 0;
    /// Ethernet II (with 802.1Q/802.1ad tags and PPPoE sessions).
    pub const ETHERNET: i32 = 1;
    /// Raw IP (DLT_RAW on most systems).
    pub const RAW_12: i32 = 12;
    /// Raw IP (DLT_RAW on OpenBSD).
    pub const RAW_14: i32 = 14;
    /// Raw IP.
    pub const RAW: i32 = 101;
    /// OpenBSD loopback: a 4-byte address family in network order.
    pub const LOOP: i32 = 108;
    /// Linux cooked capture v1.
    pub const LINUX_SLL: i32 = 113;
    /// Raw IPv4.
    pub const IPV4: i32 = 228;
    /// Raw IPv6.
    pub const IPV6: i32 = 229;
    /// Linux cooked capture v2.
    pub const LINUX_SLL2: i32 = 276;
}

/// One captured frame.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    /// Capture time since the Unix epoch (0 for pcapng simple packets without a time before).
    pub ts: Duration,
    /// The link type of the interface it was captured on.
    pub linktype: i32,
    /// The captured bytes (at most the snap length).
    pub data: &'a [u8],
    /// The frame's length on the wire.
    pub orig_len: u32,
    /// The packet's comment (pcapng's `opt_comment`; the first, if several), if any.
    pub comment: Option<&'a str>,
}

/// Why a capture could not be read (from the start) or stopped being readable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// Opening or reading the file failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The bytes are neither pcap nor pcapng (after gzip layers are removed).
    #[error("not a pcap or pcapng capture (nor a gzip-compressed one)")]
    NotACapture,
    /// The file is damaged from some point on; the frames before it were delivered.
    #[error("capture damaged after {frames} frame(s): {reason}")]
    Damaged {
        /// Frames delivered before the damage.
        frames: u64,
        /// What was wrong.
        reason: String,
    },
}

/// A `Read` that fills the caller's buffer as far as it can (the pcap reader parses only what
/// one `read` gives it at first, and gzip hands out small pieces).
struct ReadFull<R>(R);

impl<R: Read> Read for ReadFull<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.0.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if filled > 0 => {
                    tracing::warn!(error = %e, "read error inside a capture");
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(filled)
    }
}

/// Removes gzip layers: returns a reader of the innermost content.
pub fn decompress(reader: impl Read + Send + 'static) -> io::Result<Box<dyn Read + Send>> {
    let mut current: Box<dyn BufRead + Send> = Box::new(BufReader::with_capacity(1 << 16, reader));
    for _ in 0..MAX_GZIP_LAYERS {
        let head = current.fill_buf()?;
        if head.len() >= 2 && head[0] == 0x1f && head[1] == 0x8b {
            current = Box::new(BufReader::with_capacity(
                1 << 16,
                MultiGzDecoder::new(current),
            ));
        } else {
            break;
        }
    }
    Ok(Box::new(current))
}

#[derive(Debug, Clone, Copy)]
struct Interface {
    linktype: i32,
    /// Units per second.
    resolution: u64,
    /// Seconds added to every timestamp.
    offset: i64,
}

/// A streaming reader of frames.
pub struct CaptureReader {
    inner: Box<dyn PcapReaderIterator + Send>,
    legacy: Option<(i32, bool)>,
    interfaces: Vec<Interface>,
    last_ts: Duration,
    frames: u64,
    buffer: usize,
}

impl std::fmt::Debug for CaptureReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptureReader")
            .field("frames", &self.frames)
            .finish_non_exhaustive()
    }
}

impl CaptureReader {
    /// Opens a capture file.
    pub fn open(path: &Path) -> Result<Self, CaptureError> {
        Self::new(File::open(path)?)
    }

    /// Reads a capture from any byte stream (gzip layers are removed first).
    pub fn new(reader: impl Read + Send + 'static) -> Result<Self, CaptureError> {
        let reader = ReadFull(decompress(reader)?);
        let inner = match pcap_parser::create_reader(INITIAL_BUFFER, reader) {
            Ok(inner) => inner,
            Err(PcapError::ReadError) => {
                return Err(CaptureError::Io(io::Error::other("read error")));
            }
            Err(_) => return Err(CaptureError::NotACapture),
        };
        Ok(Self {
            inner,
            legacy: None,
            interfaces: Vec::new(),
            last_ts: Duration::ZERO,
            frames: 0,
            buffer: INITIAL_BUFFER,
        })
    }

    /// Frames delivered so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Delivers every frame to `f`, in file order.
    ///
    /// # Errors
    /// [`CaptureError::Damaged`] when the file cannot be read past some point (a cut-off last
    /// record, a corrupt block); every frame before it has been delivered.
    pub fn for_each(&mut self, mut f: impl FnMut(&Frame<'_>)) -> Result<(), CaptureError> {
        loop {
            let damaged = |frames, reason: String| CaptureError::Damaged { frames, reason };
            match self.inner.next() {
                Ok((offset, block)) => {
                    if let Some(frame) = frame_of(
                        block,
                        &mut self.legacy,
                        &mut self.interfaces,
                        &mut self.last_ts,
                    ) {
                        self.frames += 1;
                        f(&frame);
                    }
                    self.inner.consume(offset);
                }
                Err(PcapError::Eof) => return Ok(()),
                Err(PcapError::Incomplete(_)) => {
                    if let Err(e) = self.inner.refill() {
                        return Err(damaged(self.frames, format!("{e:?}")));
                    }
                }
                Err(PcapError::BufferTooSmall) => {
                    if self.buffer >= MAX_BUFFER {
                        return Err(damaged(
                            self.frames,
                            format!("a block larger than {MAX_BUFFER} bytes"),
                        ));
                    }
                    self.buffer *= 2;
                    self.inner.grow(self.buffer);
                    if let Err(e) = self.inner.refill() {
                        return Err(damaged(self.frames, format!("{e:?}")));
                    }
                }
                Err(PcapError::UnexpectedEof) => {
                    let reason = if self.frames == 0 {
                        "cut off before its first packet"
                    } else {
                        "the last record is cut off"
                    };
                    return Err(damaged(self.frames, reason.into()));
                }
                Err(e) => {
                    let reason = match e {
                        PcapError::NomError(_, kind) | PcapError::OwnedNomError(_, kind) => {
                            format!("undecodable block ({kind:?})")
                        }
                        other => format!("{other:?}"),
                    };
                    return Err(damaged(self.frames, reason));
                }
            }
        }
    }
}

fn frame_of<'a>(
    block: PcapBlockOwned<'a>,
    legacy: &mut Option<(i32, bool)>,
    interfaces: &mut Vec<Interface>,
    last_ts: &mut Duration,
) -> Option<Frame<'a>> {
    match block {
        PcapBlockOwned::LegacyHeader(h) => {
            *legacy = Some((h.network.0, h.is_nanosecond_precision()));
            None
        }
        PcapBlockOwned::Legacy(b) => {
            let (linktype, nanos) = (*legacy)?;
            let frac = u64::from(b.ts_usec) * if nanos { 1 } else { 1000 };
            let ts = Duration::from_secs(u64::from(b.ts_sec)) + Duration::from_nanos(frac);
            *last_ts = ts;
            Some(Frame {
                ts,
                linktype,
                data: b.data,
                orig_len: b.origlen,
                comment: None,
            })
        }
        PcapBlockOwned::NG(Block::SectionHeader(_)) => {
            interfaces.clear();
            None
        }
        PcapBlockOwned::NG(Block::InterfaceDescription(idb)) => {
            interfaces.push(Interface {
                linktype: idb.linktype.0,
                resolution: idb.ts_resolution().unwrap_or(1_000_000).max(1),
                offset: idb.ts_offset(),
            });
            None
        }
        PcapBlockOwned::NG(Block::EnhancedPacket(epb)) => {
            let iface = *interfaces.get(usize::try_from(epb.if_id).ok()?)?;
            let units = (u64::from(epb.ts_high) << 32) | u64::from(epb.ts_low);
            let secs = units / iface.resolution;
            let frac = units % iface.resolution;
            let nanos = u128::from(frac) * 1_000_000_000 / u128::from(iface.resolution);
            let secs = secs.saturating_add_signed(iface.offset);
            let ts = Duration::from_secs(secs)
                .checked_add(Duration::from_nanos(u64::try_from(nanos).unwrap_or(0)))
                .unwrap_or(Duration::from_secs(secs));
            *last_ts = ts;
            Some(Frame {
                ts,
                linktype: iface.linktype,
                data: if (epb.caplen as usize) < epb.data.len() {
                    &epb.data[..epb.caplen as usize]
                } else {
                    epb.data
                },
                orig_len: epb.origlen,
                comment: comment_of(&epb.options),
            })
        }
        PcapBlockOwned::NG(Block::SimplePacket(spb)) => {
            let iface = *interfaces.first()?;
            Some(Frame {
                ts: *last_ts,
                linktype: iface.linktype,
                data: if (spb.origlen as usize) < spb.data.len() {
                    &spb.data[..spb.origlen as usize]
                } else {
                    spb.data
                },
                orig_len: spb.origlen,
                comment: None,
            })
        }
        PcapBlockOwned::NG(_) => None,
    }
}

/// The first comment among a block's options, if it is text.
fn comment_of<'a>(options: &[pcap_parser::PcapNGOption<'a>]) -> Option<&'a str> {
    options.iter().find_map(|o| match (&o.code, &o.value) {
        (&pcap_parser::pcapng::OptionCode::Comment, std::borrow::Cow::Borrowed(value)) => {
            let text = value.get(..usize::from(o.len))?;
            std::str::from_utf8(text).ok()
        }
        _ => None,
    })
}
