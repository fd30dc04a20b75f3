//! Framing (PROTOCOL.md "Framing"): a 4-byte little-endian length, then that
//! many bytes of UTF-8 JSON. The length is checked against the 64 MiB bound
//! before anything is allocated, and a frame's bytes are read as they come,
//! so a stream that claims a long frame and ends costs only what it sent.

use std::io::{ErrorKind, Read, Write};

use super::error::LiveError;

/// PROTOCOL.md: "`N` is at most 64 MiB (67,108,864)".
pub const MAX_FRAME: u64 = 64 << 20;

/// Reads frames one at a time from any byte stream, counting them.
pub struct FrameReader<R> {
    inner: R,
    /// Where the bytes come from, for errors (an address or a file).
    at: String,
    /// Index of the next frame, from 0.
    index: u64,
    buf: Vec<u8>,
}

impl<R: Read> FrameReader<R> {
    pub fn new(inner: R, at: impl Into<String>) -> Self {
        FrameReader {
            inner,
            at: at.into(),
            index: 0,
            buf: Vec::new(),
        }
    }

    /// Where the stream comes from.
    pub fn at(&self) -> &str {
        &self.at
    }

    /// Index of the next frame (the number read so far).
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The next frame's bytes and index; `None` at the end of the stream
    /// between two frames.
    pub fn next_frame(&mut self) -> Result<Option<(u64, &[u8])>, LiveError> {
        let index = self.index;
        let mut len = [0u8; 4];
        let got = read_full(&mut self.inner, &mut len).map_err(|e| self.io(e))?;
        if got == 0 {
            return Ok(None);
        }
        if got < 4 {
            return Err(LiveError::Truncated {
                at: self.at.clone(),
                index,
                got: got as u64,
                want: 4,
            });
        }
        let want = u64::from(u32::from_le_bytes(len));
        if want > MAX_FRAME {
            return Err(LiveError::FrameTooLong {
                at: self.at.clone(),
                index,
                len: want,
            });
        }
        self.buf.clear();
        let read = (&mut self.inner)
            .take(want)
            .read_to_end(&mut self.buf)
            .map_err(|e| self.io(e))?;
        if (read as u64) < want {
            return Err(LiveError::Truncated {
                at: self.at.clone(),
                index,
                got: read as u64,
                want,
            });
        }
        self.index += 1;
        Ok(Some((index, &self.buf)))
    }

    fn io(&self, source: std::io::Error) -> LiveError {
        LiveError::Io {
            at: self.at.clone(),
            index: self.index,
            source,
        }
    }
}

/// Fill `buf` as far as the stream goes; the count read (short only at EOF).
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Write one frame holding `json`.
pub fn write_frame(w: &mut impl Write, json: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(json.len())
        .ok()
        .filter(|n| u64::from(*n) <= MAX_FRAME)
        .ok_or_else(|| {
            std::io::Error::new(
                ErrorKind::InvalidInput,
                format!("a frame of {} bytes is over the 64 MiB bound", json.len()),
            )
        })?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(json)
}

/// Write one frame holding `value` as JSON.
pub fn write_value(w: &mut impl Write, value: &serde_json::Value) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(value)?;
    write_frame(w, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_end_cleanly() {
        let mut bytes = Vec::new();
        write_frame(&mut bytes, br#"{"t":"a"}"#).expect("write");
        write_frame(&mut bytes, br#"{"t":"b"}"#).expect("write");
        let mut r = FrameReader::new(bytes.as_slice(), "mem");
        assert_eq!(
            r.next_frame().expect("0").map(|(i, b)| (i, b.to_vec())),
            Some((0, br#"{"t":"a"}"#.to_vec()))
        );
        assert_eq!(r.next_frame().expect("1").map(|(i, _)| i), Some(1));
        assert!(r.next_frame().expect("end").is_none());
    }

    #[test]
    fn a_length_over_the_bound_is_refused_before_reading_it() {
        let bytes = (MAX_FRAME as u32 + 1).to_le_bytes();
        let err = FrameReader::new(&bytes[..], "sock")
            .next_frame()
            .expect_err("too long");
        let text = err.to_string();
        assert!(
            text.contains("sock: frame 0") && text.contains("64 MiB"),
            "{text}"
        );
    }

    #[test]
    fn a_stream_ending_inside_a_frame_says_how_much_came() {
        let mut bytes = 100u32.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{\"t\"");
        let err = FrameReader::new(bytes.as_slice(), "f")
            .next_frame()
            .expect_err("short");
        assert!(err.to_string().contains("4 of 100 bytes"), "{err}");
        let err = FrameReader::new(&[1u8, 0][..], "f")
            .next_frame()
            .expect_err("short prefix");
        assert!(err.to_string().contains("2 of 4 bytes"), "{err}");
    }
}
