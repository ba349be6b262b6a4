//! Writing DNS traffic as pcapng, for `fqdnd record`: each message the proxy took from or sent
//! to a client becomes a packet between the client and the server it asked (link type RAW, so
//! no Ethernet header is invented), as it travelled — a UDP datagram, or over TCP a segment of
//! a connection that starts with a handshake (SYN, SYN-ACK, ACK) and carries the message with
//! its 2-byte length prefix — with a comment ([`Note`]) saying which way it went, the
//! transport, the endpoint or client group that asked and the verdict, so `fqdnd replay` and
//! tshark read it back as ordinary DNS. Files rotate by size and the oldest go past a count;
//! each file starts its TCP connections anew, so it reads alone.
//!
//! A message over UDP too big for a datagram (over 65,507 bytes) is counted and left out; over
//! TCP a message larger than [`MAX_SEGMENT`] is split over several segments.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use etherparse::{IpHeaders, PacketBuilder, PacketBuilderStep};
use pcap_parser::pcapng::{
    EnhancedPacketBlock, InterfaceDescriptionBlock, OptionCode, PcapNGOption, SectionHeaderBlock,
};
use pcap_parser::{Linktype, ToVec};

use crate::extract::Transport;

mod note;
pub use note::{Encryption, Note, Way};

/// The largest UDP payload an IP datagram carries.
const MAX_PAYLOAD: usize = 65_507;
/// The most bytes of a TCP stream one segment carries.
pub const MAX_SEGMENT: usize = 32 << 10;
/// TCP connections a recording keeps sequence numbers for; past it, the least recently used
/// half is forgotten (their next message starts a new connection).
const MAX_CONNECTIONS: usize = 4096;
/// The window every synthetic segment advertises.
const WINDOW: u16 = 65_535;

/// One message to write.
#[derive(Debug, Clone, Copy)]
pub struct Packet<'a> {
    /// Microseconds since the Unix epoch.
    pub unix_us: u64,
    /// Sender.
    pub src: SocketAddr,
    /// Receiver.
    pub dst: SocketAddr,
    /// The DNS message (without TCP's length prefix).
    pub bytes: &'a [u8],
    /// Which way, the transport (how it is written), who asked, the verdict.
    pub note: Note<'a>,
}

/// Bounds of a recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// A file is closed and the next one started past this many bytes.
    pub max_file_bytes: u64,
    /// At most this many files are kept; the oldest is deleted when a new one starts.
    pub max_files: usize,
}

/// What a recording wrote so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Written {
    /// DNS messages written (a message over TCP counts once, whatever segments carry it).
    pub packets: u64,
    /// Bytes written (all files, deleted ones included).
    pub bytes: u64,
    /// Messages left out: too big for a datagram, or client and server of different families.
    pub skipped: u64,
    /// Files deleted to stay within `max_files`.
    pub rotated_out: u64,
}

/// A TCP connection's next sequence numbers, each way.
#[derive(Debug, Clone, Copy)]
struct Connection {
    client: u32,
    server: u32,
    /// When it last carried a message (a count of messages), for eviction.
    used: u64,
}

/// The client's and the server's address of a TCP connection.
type ConnectionKey = (SocketAddr, SocketAddr);

/// pcapng files in a directory, rotated.
#[derive(Debug)]
pub struct Recording {
    dir: PathBuf,
    prefix: String,
    bounds: Bounds,
    file: Option<(BufWriter<File>, u64)>,
    files: VecDeque<PathBuf>,
    next: u64,
    written: Written,
    /// The blocks of the message being written.
    blocks: Vec<u8>,
    /// One packet's bytes.
    scratch: Vec<u8>,
    /// The TCP connections of the current file.
    connections: HashMap<ConnectionKey, Connection>,
    /// Initial sequence numbers are drawn from this counter.
    isn: u32,
}

fn header_blocks() -> io::Result<Vec<u8>> {
    let mut shb = SectionHeaderBlock {
        block_type: 0,
        block_len1: 0,
        bom: pcap_parser::pcapng::BOM_MAGIC,
        major_version: 1,
        minor_version: 0,
        section_len: -1,
        options: Vec::new(),
        block_len2: 0,
    };
    let mut idb = InterfaceDescriptionBlock {
        block_type: 0,
        block_len1: 0,
        linktype: Linktype::RAW,
        reserved: 0,
        snaplen: 0,
        options: Vec::new(),
        block_len2: 0,
        // Microseconds: the default resolution, so no option is needed.
        if_tsresol: 6,
        if_tsoffset: 0,
    };
    let mut out = shb
        .to_vec()
        .map_err(|e| io::Error::other(format!("{e:?}")))?;
    out.extend(
        idb.to_vec()
            .map_err(|e| io::Error::other(format!("{e:?}")))?,
    );
    Ok(out)
}

/// Appends one Enhanced Packet Block holding `packet`, with `comment` if any.
fn push_block(
    out: &mut Vec<u8>,
    unix_us: u64,
    packet: &[u8],
    comment: Option<&str>,
) -> io::Result<()> {
    let len = u32::try_from(packet.len()).unwrap_or(u32::MAX);
    let options = comment
        .map(|c| PcapNGOption {
            code: OptionCode::Comment,
            len: u16::try_from(c.len()).unwrap_or(u16::MAX),
            value: c.as_bytes().into(),
        })
        .into_iter()
        .collect();
    let mut epb = EnhancedPacketBlock {
        block_type: 0,
        block_len1: 0,
        if_id: 0,
        ts_high: (unix_us >> 32) as u32,
        ts_low: unix_us as u32,
        caplen: len,
        origlen: len,
        data: packet,
        options,
        block_len2: 0,
    };
    out.extend(
        epb.to_vec()
            .map_err(|e| io::Error::other(format!("{e:?}")))?,
    );
    Ok(())
}

/// The IP layer of a packet from `src` to `dst`; `None` if their families differ.
fn ip(src: IpAddr, dst: IpAddr) -> Option<PacketBuilderStep<IpHeaders>> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => Some(PacketBuilder::ipv4(s.octets(), d.octets(), 64)),
        (IpAddr::V6(s), IpAddr::V6(d)) => Some(PacketBuilder::ipv6(s.octets(), d.octets(), 64)),
        _ => None,
    }
}

/// TCP flags of a synthetic segment.
#[derive(Clone, Copy)]
enum Segment {
    Syn,
    SynAck,
    Ack,
    Data,
}

impl Recording {
    /// A recording into `dir` (created if missing), files named `<prefix>-<n>.pcapng`.
    ///
    /// # Errors
    /// The directory cannot be created.
    pub fn new(dir: &Path, prefix: &str, bounds: Bounds) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            prefix: prefix.to_owned(),
            bounds: Bounds {
                max_file_bytes: bounds.max_file_bytes.max(4096),
                max_files: bounds.max_files.max(1),
            },
            file: None,
            files: VecDeque::new(),
            next: 0,
            written: Written::default(),
            blocks: Vec::new(),
            scratch: Vec::new(),
            connections: HashMap::new(),
            isn: 0,
        })
    }

    /// Writes one message (opening or rotating files as needed).
    ///
    /// # Errors
    /// A file cannot be created or written.
    pub fn write(&mut self, packet: &Packet<'_>) -> io::Result<()> {
        let (src, dst) = (canonical(packet.src), canonical(packet.dst));
        let comment = packet.note.to_string();
        let fits = match packet.note.transport {
            Transport::Udp => packet.bytes.len() <= MAX_PAYLOAD,
            Transport::Tcp => u16::try_from(packet.bytes.len()).is_ok(),
        };
        if !fits || ip(src.ip(), dst.ip()).is_none() {
            self.written.skipped += 1;
            return Ok(());
        }
        let mut connection = self.encode(packet, src, dst, &comment)?;
        let len = self.blocks.len() as u64;
        if self
            .file
            .as_ref()
            .is_some_and(|(_, size)| size + len > self.bounds.max_file_bytes)
        {
            // The next file starts its connections anew: encoded again, with a handshake.
            self.close()?;
            connection = self.encode(packet, src, dst, &comment)?;
        }
        let len = self.blocks.len() as u64;
        if self.file.is_none() {
            self.open()?;
        }
        if let Some((file, size)) = &mut self.file {
            file.write_all(&self.blocks)?;
            *size += len;
        }
        if let Some((key, connection)) = connection {
            if self.connections.len() >= MAX_CONNECTIONS && !self.connections.contains_key(&key) {
                self.forget_old_connections();
            }
            self.connections.insert(key, connection);
        }
        self.written.packets += 1;
        self.written.bytes += len;
        Ok(())
    }

    /// Encodes `packet` into `self.blocks`: a datagram, or TCP segments (after a handshake
    /// when its connection is new to this file). Returns the connection's state after it.
    fn encode(
        &mut self,
        packet: &Packet<'_>,
        src: SocketAddr,
        dst: SocketAddr,
        comment: &str,
    ) -> io::Result<Option<(ConnectionKey, Connection)>> {
        self.blocks.clear();
        let at = packet.unix_us;
        if packet.note.transport == Transport::Udp {
            self.scratch.clear();
            if let Some(ip) = ip(src.ip(), dst.ip()) {
                ip.udp(src.port(), dst.port())
                    .write(&mut self.scratch, packet.bytes)
                    .map_err(|e| io::Error::other(e.to_string()))?;
            }
            push_block(&mut self.blocks, at, &self.scratch, Some(comment))?;
            return Ok(None);
        }
        let (client, server) = match packet.note.way {
            Way::Query => (src, dst),
            Way::Reply => (dst, src),
        };
        let key = (client, server);
        let used = self.written.packets;
        let mut c = match self.connections.get(&key) {
            Some(c) => *c,
            None => {
                // A new connection: SYN, SYN-ACK, ACK, with fresh initial sequence numbers.
                self.isn = self.isn.wrapping_add(0x9e37_79b9);
                let (ci, si) = (self.isn, self.isn.rotate_left(16) ^ 0x5bd1_e995);
                self.segment(at, client, server, ci, 0, Segment::Syn, &[], None)?;
                self.segment(
                    at,
                    server,
                    client,
                    si,
                    ci.wrapping_add(1),
                    Segment::SynAck,
                    &[],
                    None,
                )?;
                let (c, s) = (ci.wrapping_add(1), si.wrapping_add(1));
                self.segment(at, client, server, c, s, Segment::Ack, &[], None)?;
                Connection {
                    client: c,
                    server: s,
                    used,
                }
            }
        };
        c.used = used;
        let len = u16::try_from(packet.bytes.len()).unwrap_or(u16::MAX);
        let mut stream = Vec::with_capacity(packet.bytes.len() + 2);
        stream.extend_from_slice(&len.to_be_bytes());
        stream.extend_from_slice(packet.bytes);
        for chunk in stream.chunks(MAX_SEGMENT) {
            let step = chunk.len() as u32;
            match packet.note.way {
                Way::Query => {
                    self.segment(
                        at,
                        src,
                        dst,
                        c.client,
                        c.server,
                        Segment::Data,
                        chunk,
                        Some(comment),
                    )?;
                    c.client = c.client.wrapping_add(step);
                }
                Way::Reply => {
                    self.segment(
                        at,
                        src,
                        dst,
                        c.server,
                        c.client,
                        Segment::Data,
                        chunk,
                        Some(comment),
                    )?;
                    c.server = c.server.wrapping_add(step);
                }
            }
        }
        Ok(Some((key, c)))
    }

    /// Appends one TCP segment's block.
    #[allow(clippy::too_many_arguments, reason = "one segment's fields")]
    fn segment(
        &mut self,
        at: u64,
        src: SocketAddr,
        dst: SocketAddr,
        seq: u32,
        ack: u32,
        kind: Segment,
        payload: &[u8],
        comment: Option<&str>,
    ) -> io::Result<()> {
        let Some(ip) = ip(src.ip(), dst.ip()) else {
            return Ok(());
        };
        let tcp = ip.tcp(src.port(), dst.port(), seq, WINDOW);
        let tcp = match kind {
            Segment::Syn => tcp.syn(),
            Segment::SynAck => tcp.syn().ack(ack),
            Segment::Ack => tcp.ack(ack),
            Segment::Data => tcp.psh().ack(ack),
        };
        self.scratch.clear();
        tcp.write(&mut self.scratch, payload)
            .map_err(|e| io::Error::other(e.to_string()))?;
        push_block(&mut self.blocks, at, &self.scratch, comment)
    }

    /// Forgets the least recently used half of the connections.
    fn forget_old_connections(&mut self) {
        let mut used: Vec<u64> = self.connections.values().map(|c| c.used).collect();
        let half = used.len() / 2;
        let (_, median, _) = used.select_nth_unstable(half);
        let median = *median;
        self.connections.retain(|_, c| c.used >= median);
    }

    fn open(&mut self) -> io::Result<()> {
        while self.files.len() >= self.bounds.max_files {
            if let Some(old) = self.files.pop_front() {
                match std::fs::remove_file(&old) {
                    Ok(()) => self.written.rotated_out += 1,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
        // A new file, never an existing one (an earlier recording's, say): the next free number.
        let (file, path) = loop {
            let path = self
                .dir
                .join(format!("{}-{:06}.pcapng", self.prefix, self.next));
            self.next += 1;
            // 0600: a recording says which client asked for which name.
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(file) => break (file, path),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        };
        let mut file = BufWriter::new(file);
        let header = header_blocks()?;
        file.write_all(&header)?;
        self.written.bytes += header.len() as u64;
        self.files.push_back(path);
        self.file = Some((file, header.len() as u64));
        Ok(())
    }

    /// Flushes the current file.
    ///
    /// # Errors
    /// Writing failed.
    pub fn flush(&mut self) -> io::Result<()> {
        match &mut self.file {
            Some((file, _)) => file.flush(),
            None => Ok(()),
        }
    }

    /// Flushes and closes the current file (the next packet starts a new one).
    ///
    /// # Errors
    /// Writing failed.
    pub fn close(&mut self) -> io::Result<()> {
        self.connections.clear();
        match self.file.take() {
            Some((mut file, _)) => {
                file.flush()?;
                file.get_ref().sync_data()
            }
            None => Ok(()),
        }
    }

    /// The files kept, oldest first.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(PathBuf::as_path)
    }

    /// What was written so far.
    pub fn written(&self) -> &Written {
        &self.written
    }
}

/// An IPv4-mapped IPv6 address as IPv4 (a dual-stack socket's view of an IPv4 client).
fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::extract_bytes;

    fn note(transport: Transport, way: Way) -> Note<'static> {
        Note {
            way,
            transport,
            encrypted: None,
            endpoint: Some(7),
            by_socket: false,
            verdict: "allow",
        }
    }

    fn packet(bytes: &[u8], transport: Transport) -> Packet<'_> {
        Packet {
            unix_us: 1_700_000_000_123_456,
            src: "[::ffff:192.0.2.1]:40000".parse().unwrap(),
            dst: "192.0.2.53:53".parse().unwrap(),
            bytes,
            note: note(transport, Way::Query),
        }
    }

    #[test]
    fn files_read_back_and_rotate_within_their_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let bounds = Bounds {
            max_file_bytes: 4096,
            max_files: 3,
        };
        let mut rec = Recording::new(dir.path(), "t", bounds).unwrap();
        let msg = [0x12u8; 300];
        for _ in 0..100 {
            rec.write(&packet(&msg, Transport::Udp)).unwrap();
        }
        rec.close().unwrap();
        // A second recording with the same prefix never overwrites the first one's files.
        let mut second = Recording::new(dir.path(), "t", bounds).unwrap();
        second.write(&packet(&msg, Transport::Udp)).unwrap();
        second.close().unwrap();
        let files: Vec<PathBuf> = rec.files().map(Path::to_path_buf).collect();
        assert!(files.iter().all(|f| !second.files().any(|g| g == f)));
        assert_eq!(files.len(), 3, "at most max_files kept");
        assert!(rec.written().rotated_out > 0);
        let mut read = 0;
        for f in &files {
            let bytes = std::fs::read(f).unwrap();
            assert!(
                bytes.len() as u64 <= 4096,
                "{} is {} bytes",
                f.display(),
                bytes.len()
            );
            extract_bytes(&bytes, &[53], &mut |p| {
                assert_eq!(p.bytes, msg);
                assert_eq!(p.src, "192.0.2.1:40000".parse().unwrap());
                assert_eq!(p.note, Some(note(Transport::Udp, Way::Query)));
                read += 1;
            });
        }
        assert!(
            read > 0 && read < 100,
            "only the last files are kept: {read}"
        );
        // Too big for a datagram: left out, counted.
        let big = vec![0u8; 70_000];
        rec.write(&packet(&big, Transport::Udp)).unwrap();
        assert_eq!(rec.written().skipped, 1);
    }

    /// A message over TCP is a segment of a connection that starts with a handshake, with its
    /// length prefix; one larger than a segment spans several. Replay reads them back as TCP
    /// messages with their notes, every stream from its SYN; each file starts its own
    /// connections.
    #[test]
    fn tcp_messages_are_segments_of_connections_each_file_starts() {
        let dir = tempfile::tempdir().unwrap();
        let bounds = Bounds {
            max_file_bytes: 1 << 20,
            max_files: 10,
        };
        let mut rec = Recording::new(dir.path(), "t", bounds).unwrap();
        let query = [0x21u8; 40];
        let big = vec![0x42u8; 65_535];
        let client: SocketAddr = "192.0.2.1:40000".parse().unwrap();
        let server: SocketAddr = "192.0.2.53:53".parse().unwrap();
        let reply = |bytes| Packet {
            src: server,
            dst: client,
            note: note(Transport::Tcp, Way::Reply),
            ..packet(bytes, Transport::Tcp)
        };
        for _ in 0..3 {
            rec.write(&packet(&query, Transport::Tcp)).unwrap();
            rec.write(&reply(&big)).unwrap();
        }
        // A new file: the same connection starts again there, with a handshake.
        rec.close().unwrap();
        rec.write(&packet(&query, Transport::Tcp)).unwrap();
        rec.write(&reply(&query)).unwrap();
        rec.close().unwrap();
        assert_eq!(rec.written().packets, 8);
        assert_eq!(rec.written().skipped, 0);
        let files: Vec<PathBuf> = rec.files().map(Path::to_path_buf).collect();
        assert_eq!(files.len(), 2);
        let mut seen = Vec::new();
        for f in &files {
            let (counters, error) = extract_bytes(&std::fs::read(f).unwrap(), &[53], &mut |p| {
                assert_eq!(p.transport, Transport::Tcp);
                let way = if p.src == client {
                    Way::Query
                } else {
                    Way::Reply
                };
                assert_eq!(p.note, Some(note(Transport::Tcp, way)));
                seen.push(p.bytes.len());
            });
            assert!(error.is_none(), "{error:?}");
            assert_eq!(counters.tcp_streams_without_syn, 0, "{counters:?}");
            assert_eq!(counters.tcp_skipped_bytes + counters.tcp_gaps, 0);
        }
        assert_eq!(seen, [40, big.len(), 40, big.len(), 40, big.len(), 40, 40]);
    }
}
