//! Writing DNS traffic as pcapng, for `fqdnd record`: each message the proxy took from or sent
//! to a client becomes one packet — an IP/UDP datagram between the client and the server it
//! asked (link type RAW, so no Ethernet header is invented), with a comment saying the
//! transport it really used, the endpoint and the verdict — so `fqdnd replay` and tshark read
//! it back as ordinary DNS. Files rotate by size and the oldest go past a count.
//!
//! A message over TCP is written as a datagram too (the capture is of DNS messages, not of TCP
//! segments); one too big for a datagram (over 65,507 bytes) is counted and left out.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use etherparse::PacketBuilder;
use pcap_parser::pcapng::{
    EnhancedPacketBlock, InterfaceDescriptionBlock, OptionCode, PcapNGOption, SectionHeaderBlock,
};
use pcap_parser::{Linktype, ToVec};

/// The largest UDP payload an IP datagram carries.
const MAX_PAYLOAD: usize = 65_507;

/// One message to write.
#[derive(Debug, Clone, Copy)]
pub struct Packet<'a> {
    /// Microseconds since the Unix epoch.
    pub unix_us: u64,
    /// Sender.
    pub src: SocketAddr,
    /// Receiver.
    pub dst: SocketAddr,
    /// The DNS message.
    pub bytes: &'a [u8],
    /// The packet's comment (transport, endpoint, verdict).
    pub comment: &'a str,
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
    /// Packets written.
    pub packets: u64,
    /// Bytes written (all files, deleted ones included).
    pub bytes: u64,
    /// Messages left out: too big for a datagram, or client and server of different families.
    pub skipped: u64,
    /// Files deleted to stay within `max_files`.
    pub rotated_out: u64,
}

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
    scratch: Vec<u8>,
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
            scratch: Vec::new(),
        })
    }

    /// Writes one packet (opening or rotating files as needed).
    ///
    /// # Errors
    /// A file cannot be created or written.
    pub fn write(&mut self, packet: &Packet<'_>) -> io::Result<()> {
        let (src, dst) = (canonical(packet.src), canonical(packet.dst));
        if packet.bytes.len() > MAX_PAYLOAD {
            self.written.skipped += 1;
            return Ok(());
        }
        self.scratch.clear();
        let builder = match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => PacketBuilder::ipv4(s.octets(), d.octets(), 64),
            (IpAddr::V6(s), IpAddr::V6(d)) => PacketBuilder::ipv6(s.octets(), d.octets(), 64),
            _ => {
                self.written.skipped += 1;
                return Ok(());
            }
        };
        builder
            .udp(src.port(), dst.port())
            .write(&mut self.scratch, packet.bytes)
            .map_err(|e| io::Error::other(e.to_string()))?;
        let comment = packet.comment.as_bytes();
        let mut epb = EnhancedPacketBlock {
            block_type: 0,
            block_len1: 0,
            if_id: 0,
            ts_high: (packet.unix_us >> 32) as u32,
            ts_low: packet.unix_us as u32,
            caplen: u32::try_from(self.scratch.len()).unwrap_or(u32::MAX),
            origlen: u32::try_from(self.scratch.len()).unwrap_or(u32::MAX),
            data: &self.scratch,
            options: vec![PcapNGOption {
                code: OptionCode::Comment,
                len: u16::try_from(comment.len()).unwrap_or(u16::MAX),
                value: comment.into(),
            }],
            block_len2: 0,
        };
        let block = epb
            .to_vec()
            .map_err(|e| io::Error::other(format!("{e:?}")))?;
        let len = block.len() as u64;
        if self
            .file
            .as_ref()
            .is_some_and(|(_, size)| size + len > self.bounds.max_file_bytes)
        {
            self.close()?;
        }
        if self.file.is_none() {
            self.open()?;
        }
        if let Some((file, size)) = &mut self.file {
            file.write_all(&block)?;
            *size += len;
        }
        self.written.packets += 1;
        self.written.bytes += len;
        Ok(())
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

    fn packet<'a>(bytes: &'a [u8], comment: &'a str) -> Packet<'a> {
        Packet {
            unix_us: 1_700_000_000_123_456,
            src: "[::ffff:192.0.2.1]:40000".parse().unwrap(),
            dst: "192.0.2.53:53".parse().unwrap(),
            bytes,
            comment,
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
            rec.write(&packet(&msg, "transport=udp endpoint=7 verdict=allow"))
                .unwrap();
        }
        rec.close().unwrap();
        // A second recording with the same prefix never overwrites the first one's files.
        let mut second = Recording::new(dir.path(), "t", bounds).unwrap();
        second.write(&packet(&msg, "again")).unwrap();
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
                read += 1;
            });
        }
        assert!(
            read > 0 && read < 100,
            "only the last files are kept: {read}"
        );
        // Too big for a datagram: left out, counted.
        let big = vec![0u8; 70_000];
        rec.write(&packet(&big, "transport=tcp")).unwrap();
        assert_eq!(rec.written().skipped, 1);
    }
}
