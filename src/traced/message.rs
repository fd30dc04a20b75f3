//! A frame from the traced program as the message it stands for. Most
//! frames are JSON arrays (`["m", …]`, `["op", …]`); the two the helper
//! sends for nearly every storage, a malloc sent without waiting (`ma`)
//! and a free (`f`), are fixed-size binary frames instead, which cost the
//! program a `struct.pack` where JSON cost it two decimal conversions and
//! a format (python/vramscope_trace/_channel.py `_MA`, `_F`; docs/trace.md, "The
//! channel").
//! Each becomes the same `Value` its JSON would have been, so the
//! simulator, the saved requests and their replay see one kind of message.

use serde_json::{json, Value};

use super::error::TraceError;

/// The first byte of a binary `ma` frame: then the storage's key (u64),
/// its bytes (u64) and its stack id (u32), little-endian.
pub const MALLOC_POSTED: u8 = 1;
/// The first byte of a binary `f` frame: then the storage's key (u64).
pub const FREE: u8 = 2;

const MALLOC_POSTED_LEN: usize = 1 + 8 + 8 + 4;
const FREE_LEN: usize = 1 + 8;

/// Whether the frame is binary (not JSON): the JSON messages are arrays.
pub fn is_binary(bytes: &[u8]) -> bool {
    bytes.first().is_some_and(|b| *b != b'[')
}

/// The message frame `index` carries: its JSON, or its binary form read
/// as the JSON it stands for.
pub fn decode(index: u64, bytes: &[u8]) -> Result<Value, TraceError> {
    let bad = |why: String| TraceError::Protocol { index, why };
    match bytes.first() {
        Some(&MALLOC_POSTED) => {
            if bytes.len() != MALLOC_POSTED_LEN {
                return Err(bad(format!(
                    "a binary `ma` frame of {} bytes, not {MALLOC_POSTED_LEN}",
                    bytes.len()
                )));
            }
            let cd = u64_le(&bytes[1..9]);
            let size = u64_le(&bytes[9..17]);
            let stack = u32::from_le_bytes([bytes[17], bytes[18], bytes[19], bytes[20]]);
            Ok(json!(["ma", cd, size, stack]))
        }
        Some(&FREE) => {
            if bytes.len() != FREE_LEN {
                return Err(bad(format!(
                    "a binary `f` frame of {} bytes, not {FREE_LEN}",
                    bytes.len()
                )));
            }
            Ok(json!(["f", u64_le(&bytes[1..9])]))
        }
        Some(&b'[') | None => serde_json::from_slice(bytes).map_err(|e| bad(e.to_string())),
        Some(other) => Err(bad(format!(
            "a frame starting with byte {other}: neither JSON nor a binary `ma` ({MALLOC_POSTED}) or `f` ({FREE})"
        ))),
    }
}

fn u64_le(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_le_bytes(a)
}

/// A message's list of strings (a program's argv, a recording's command);
/// empty where the field is missing, and an entry that is not a string is
/// left out.
pub fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ma(cd: u64, size: u64, stack: u32) -> Vec<u8> {
        let mut v = vec![MALLOC_POSTED];
        v.extend_from_slice(&cd.to_le_bytes());
        v.extend_from_slice(&size.to_le_bytes());
        v.extend_from_slice(&stack.to_le_bytes());
        v
    }

    #[test]
    fn binary_frames_read_as_the_json_they_stand_for() {
        // A pointer-sized key (above 2^53, where a float would round it).
        let cd = (1u64 << 47) + 12_345;
        let m = decode(0, &ma(cd, 16_384, 7)).expect("an `ma` frame");
        assert_eq!(
            m,
            decode(1, format!("[\"ma\",{cd},16384,7]").as_bytes()).expect("its JSON")
        );
        let mut f = vec![FREE];
        f.extend_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(decode(2, &f).expect("an `f` frame"), json!(["f", u64::MAX]));
        assert!(is_binary(&f) && !is_binary(b"[\"f\",1]"));
    }

    #[test]
    fn a_binary_frame_of_the_wrong_size_or_kind_names_its_index() {
        let mut short = ma(1, 2, 3);
        short.pop();
        for (frame, says) in [
            (short, "`ma` frame of 20 bytes"),
            (vec![FREE, 0, 0], "`f` frame of 3 bytes"),
            (vec![9, 1, 2], "starting with byte 9"),
            (b"[\"m\",".to_vec(), "EOF"),
        ] {
            match decode(41, &frame) {
                Err(TraceError::Protocol { index, why }) => {
                    assert_eq!(index, 41);
                    assert!(why.contains(says), "{why}");
                }
                other => panic!("{frame:?}: {other:?}"),
            }
        }
    }
}
