//! DNS over TCP framing (RFC 1035 §4.2.2, RFC 7766): each message is preceded by its length
//! as two bytes. The reader keeps the bytes received and cuts whole messages out of them; a
//! connection's buffer grows only to the largest message seen (at most 2 + 65535 bytes).

/// A TCP connection's read buffer to start with.
const INITIAL_BUFFER: usize = 2048;

/// What is at the front of the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// A whole message of this many bytes: [`FrameReader::message`], then
    /// [`FrameReader::consume`].
    Message(usize),
    /// Not a whole message yet: read more into [`FrameReader::spare`].
    NeedMore,
    /// A zero length prefix: no DNS message is empty, the client is confused; close.
    Empty,
}

/// The bytes a TCP client sent that were not handled yet.
#[derive(Debug)]
pub(crate) struct FrameReader {
    buf: Vec<u8>,
    /// Where the unhandled bytes start (messages before it were handled).
    start: usize,
    /// Where they end.
    end: usize,
}

impl Default for FrameReader {
    fn default() -> Self {
        Self {
            buf: vec![0; INITIAL_BUFFER],
            start: 0,
            end: 0,
        }
    }
}

impl FrameReader {
    /// What the front of the buffer holds. Makes room for the rest of a message it has the
    /// length of.
    pub(crate) fn next(&mut self) -> Next {
        let pending = &self.buf[self.start..self.end];
        let [hi, lo, ..] = *pending else {
            return Next::NeedMore;
        };
        let len = usize::from(u16::from_be_bytes([hi, lo]));
        if len == 0 {
            return Next::Empty;
        }
        if pending.len() >= 2 + len {
            return Next::Message(len);
        }
        if self.buf.len() - self.start < 2 + len {
            self.compact();
            if self.buf.len() < 2 + len {
                self.buf.resize(2 + len, 0);
            }
        }
        Next::NeedMore
    }

    /// The whole message [`FrameReader::next`] reported, `len` bytes, to read and rewrite in
    /// place.
    pub(crate) fn message(&mut self, len: usize) -> &mut [u8] {
        &mut self.buf[self.start + 2..self.start + 2 + len]
    }

    /// Drops the message of `len` bytes at the front.
    pub(crate) fn consume(&mut self, len: usize) {
        self.start = (self.start + 2 + len).min(self.end);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Where the next read goes; never empty after [`FrameReader::next`] said `NeedMore`.
    pub(crate) fn spare(&mut self) -> &mut [u8] {
        if self.end == self.buf.len() {
            self.compact();
        }
        &mut self.buf[self.end..]
    }

    /// `n` bytes were read into [`FrameReader::spare`].
    pub(crate) fn filled(&mut self, n: usize) {
        self.end = (self.end + n).min(self.buf.len());
    }

    /// Bytes received and not handled yet.
    pub(crate) fn pending(&self) -> usize {
        self.end - self.start
    }

    /// Moves the unhandled bytes to the front, once per read at most (not once per message).
    fn compact(&mut self) {
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(msg: &[u8]) -> Vec<u8> {
        let mut out = u16::try_from(msg.len()).unwrap().to_be_bytes().to_vec();
        out.extend_from_slice(msg);
        out
    }

    /// Feeds `stream` in chunks of `chunk` bytes; returns the messages and how it ended.
    fn feed(stream: &[u8], chunk: usize) -> (Vec<Vec<u8>>, Next) {
        let mut reader = FrameReader::default();
        let mut out = Vec::new();
        let mut rest = stream;
        loop {
            loop {
                match reader.next() {
                    Next::Message(len) => {
                        out.push(reader.message(len).to_vec());
                        reader.consume(len);
                    }
                    other @ Next::Empty => return (out, other),
                    Next::NeedMore => break,
                }
            }
            if rest.is_empty() {
                return (out, Next::NeedMore);
            }
            let spare = reader.spare();
            assert!(!spare.is_empty());
            let n = chunk.min(spare.len()).min(rest.len());
            spare[..n].copy_from_slice(&rest[..n]);
            reader.filled(n);
            rest = &rest[n..];
        }
    }

    #[test]
    fn messages_come_out_whole_whatever_the_reads() {
        let big = vec![7u8; 65_535];
        let msgs: Vec<Vec<u8>> = vec![b"abc".to_vec(), vec![1; 3000], big, b"x".to_vec()];
        let stream: Vec<u8> = msgs.iter().flat_map(|m| frame(m)).collect();
        for chunk in [1, 2, 3, 1000, 4096, 70_000] {
            let (out, end) = feed(&stream, chunk);
            assert_eq!(out, msgs, "chunk {chunk}");
            assert_eq!(end, Next::NeedMore);
        }
    }

    #[test]
    fn a_zero_length_prefix_ends_the_stream_and_a_partial_message_waits() {
        let mut stream = frame(b"abc");
        stream.extend_from_slice(&[0, 0]);
        let (out, end) = feed(&stream, 5);
        assert_eq!(out, vec![b"abc".to_vec()]);
        assert_eq!(end, Next::Empty);
        let (out, end) = feed(&frame(b"abcdef")[..5], 100);
        assert!(out.is_empty());
        assert_eq!(end, Next::NeedMore);
    }
}
