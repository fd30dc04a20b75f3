//! What wraps the pickle, if anything. `torch.save(torch.cuda.memory._snapshot(), f)`
//! writes a zip archive whose `data.pkl` is the snapshot pickle, stored
//! uncompressed: that entry is read in place. Other wrappers (gzip, JSON)
//! get an error that says what the file is and what to do.

use super::error::SnapshotError;

/// The first bytes of a vramscope live recording (`job::recording`, PROTOCOL.md
/// "Recordings"): defined here, below `job`, so that opening one as a
/// snapshot can say how to play it.
pub const LIVE_RECORDING_MAGIC: &[u8; 8] = b"VSLIVE1\n";

const ZIP_LOCAL: &[u8; 4] = b"PK\x03\x04";
const ZIP_LOCAL_HEADER: usize = 30;
const STORED: u16 = 0;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The pickle inside `bytes`: `bytes` itself, or a torch.save archive's `data.pkl`.
pub(super) fn pickle_bytes(bytes: &[u8]) -> Result<&[u8], SnapshotError> {
    if bytes.starts_with(ZIP_LOCAL) {
        return zip_data_pkl(bytes);
    }
    let not = |what: &str| Err(SnapshotError::Container(what.to_string()));
    if bytes.starts_with(&[0x1f, 0x8b]) {
        return not("gzip-compressed: decompress it first (gunzip), then open the pickle");
    }
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{' | b'[') => {
            not("JSON text, not a pickle: open the file torch.cuda.memory._dump_snapshot wrote")
        }
        _ => Ok(bytes),
    }
}

/// Walk the archive's local headers to the entry named `…/data.pkl`.
fn zip_data_pkl(bytes: &[u8]) -> Result<&[u8], SnapshotError> {
    let bad = |what: String| {
        SnapshotError::Container(format!("a zip archive (torch.save's format) {what}"))
    };
    let mut at = 0usize;
    while bytes.get(at..at + 4) == Some(ZIP_LOCAL) {
        let field = |off: usize| u16_at(bytes, at + off);
        let (Some(flags), Some(method), Some(size), Some(name_len), Some(extra_len)) = (
            field(6),
            field(8),
            u32_at(bytes, at + 18),
            field(26),
            field(28),
        ) else {
            break;
        };
        let name_at = at + ZIP_LOCAL_HEADER;
        let data_at = name_at + usize::from(name_len) + usize::from(extra_len);
        let name = bytes
            .get(name_at..name_at + usize::from(name_len))
            .unwrap_or(&[]);
        if flags & 0x8 != 0 {
            // Sizes follow the data (a streamed archive): the walk cannot go on.
            return Err(bad("whose entries do not record their sizes".into()));
        }
        let end = data_at.saturating_add(size as usize);
        if name == b"data.pkl" || name.ends_with(b"/data.pkl") {
            if method != STORED {
                return Err(bad(format!(
                    "whose data.pkl is compressed (method {method}); re-save it with torch.cuda.memory._dump_snapshot"
                )));
            }
            return bytes
                .get(data_at..end)
                .ok_or_else(|| bad("cut short inside data.pkl".into()));
        }
        at = end;
    }
    Err(bad(
        "without a data.pkl entry: not a saved memory snapshot".into()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored zip entry, as torch.save writes them (no data descriptor).
    fn entry(name: &str, data: &[u8], method: u16) -> Vec<u8> {
        let mut e = Vec::new();
        e.extend_from_slice(ZIP_LOCAL);
        e.extend_from_slice(&20u16.to_le_bytes()); // version
        e.extend_from_slice(&0u16.to_le_bytes()); // flags
        e.extend_from_slice(&method.to_le_bytes());
        e.extend_from_slice(&[0; 8]); // time, date, crc
        e.extend_from_slice(&(data.len() as u32).to_le_bytes());
        e.extend_from_slice(&(data.len() as u32).to_le_bytes());
        e.extend_from_slice(&(name.len() as u16).to_le_bytes());
        let pad = 7u16; // torch aligns data with an extra field
        e.extend_from_slice(&pad.to_le_bytes());
        e.extend_from_slice(name.as_bytes());
        e.extend_from_slice(&vec![0; usize::from(pad)]);
        e.extend_from_slice(data);
        e
    }

    #[test]
    fn a_torch_save_archive_yields_its_data_pkl() {
        let mut zip = entry("snap/version", b"3\n", STORED);
        zip.extend(entry("snap/data.pkl", b"\x80\x02}q\x00.", STORED));
        zip.extend_from_slice(b"PK\x01\x02 central directory ...");
        assert_eq!(pickle_bytes(&zip).expect("found"), b"\x80\x02}q\x00.");
        let plain = b"\x80\x04}.";
        assert_eq!(pickle_bytes(plain).expect("as is"), plain);
    }

    #[test]
    fn other_wrappers_say_what_they_are() {
        let err = |b: &[u8]| {
            pickle_bytes(b)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(err(&entry("snap/data.pkl", b"x", 8)).contains("compressed (method 8)"));
        assert!(err(&entry("snap/other", b"x", STORED)).contains("without a data.pkl"));
        assert!(err(&[0x1f, 0x8b, 8, 0]).contains("gzip"));
        assert!(err(b"  {\"segments\": []}").contains("JSON"));
    }
}
