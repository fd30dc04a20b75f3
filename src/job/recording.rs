//! Recordings (PROTOCOL.md "Recordings"): `VSLIVE1\n`, then the frames the
//! helper would send a client attached from `start()`. Reading one is
//! reading a connection that has already said everything.

use std::io::{BufReader, Read, Write};
use std::path::Path;

use super::error::LiveError;
use super::frame::FrameReader;

/// The first bytes of every recording (defined in `trace`, which recognises
/// a recording opened as a snapshot).
pub use crate::trace::snapshot::LIVE_RECORDING_MAGIC as MAGIC;

/// A recording's frames, after checking its magic.
pub fn open_recording(path: &Path) -> Result<FrameReader<Box<dyn Read + Send>>, LiveError> {
    let at = path.display().to_string();
    // A named pipe or a device is refused, never waited on in open(2).
    let (file, _) = crate::files::open_regular(path).map_err(|e| LiveError::Open {
        at: at.clone(),
        why: e.to_string(),
    })?;
    read_recording(Box::new(BufReader::new(file)), at)
}

/// A recording from any reader.
pub fn read_recording(
    mut r: Box<dyn Read + Send>,
    at: String,
) -> Result<FrameReader<Box<dyn Read + Send>>, LiveError> {
    let mut magic = [0u8; 8];
    let mut got = 0;
    while got < magic.len() {
        match r.read(&mut magic[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(LiveError::Io {
                    at,
                    index: 0,
                    source,
                })
            }
        }
    }
    if got < magic.len() || &magic != MAGIC {
        // A pickle starts with PROTO (0x80): most likely a snapshot.
        let hint = if got > 0 && magic[0] == 0x80 {
            format!("; it is a pickle: a PyTorch snapshot opens with `vramscope open {at}`")
        } else {
            String::new()
        };
        return Err(LiveError::NotARecording { at, hint });
    }
    Ok(FrameReader::new(r, at))
}

/// Start a recording on `w`.
pub fn write_magic(w: &mut impl Write) -> std::io::Result<()> {
    w.write_all(MAGIC)
}
