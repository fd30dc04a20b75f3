//! A small protocol-4 pickle writer for plain data, with the same memo habits
//! as CPython's pickler for strings (each distinct string written once, then
//! `BINGET`), and explicit `memoize`/`get` for shared containers.

use rustc_hash::FxHashMap;

use super::opcodes as op;

/// CPython batches APPENDS/SETITEMS in groups of this many.
pub const BATCH: usize = 1000;

/// Writes opcodes into a growing buffer. Starts with `PROTO 4`; call
/// [`PickleWriter::finish`] after the root object to add `STOP`.
pub struct PickleWriter {
    out: Vec<u8>,
    memo_len: u32,
    strings: FxHashMap<Box<str>, u32>,
    /// `PROTO 4` still at the head of `out` (streamed output only).
    header: bool,
}

/// CPython starts a new protocol-4 frame once the current one reaches this.
pub const FRAME_TARGET: usize = 64 * 1024;

impl Default for PickleWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl PickleWriter {
    pub fn new() -> Self {
        Self {
            out: vec![op::PROTO, 4],
            memo_len: 0,
            strings: FxHashMap::default(),
            header: true,
        }
    }

    /// Bytes written since the last [`PickleWriter::flush_frame`].
    pub fn buffered(&self) -> usize {
        self.out.len()
    }

    /// Streamed output: writes what was buffered as one `FRAME` (after the
    /// `PROTO` header the first time), as CPython does for protocol 4, and
    /// empties the buffer. The memo carries on. Returns the bytes written.
    pub fn flush_frame(&mut self, w: &mut impl std::io::Write) -> std::io::Result<u64> {
        let mut written = 0u64;
        let mut body = &self.out[..];
        if self.header {
            let (head, rest) = body.split_at(2.min(body.len()));
            w.write_all(head)?;
            written += head.len() as u64;
            body = rest;
            self.header = false;
        }
        if !body.is_empty() {
            w.write_all(&[op::FRAME])?;
            w.write_all(&(body.len() as u64).to_le_bytes())?;
            w.write_all(body)?;
            written += 9 + body.len() as u64;
        }
        self.out.clear();
        Ok(written)
    }

    /// Streamed output: `STOP` and the last frame.
    pub fn finish_into(mut self, w: &mut impl std::io::Write) -> std::io::Result<u64> {
        self.out.push(op::STOP);
        self.flush_frame(w)
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.out.push(op::STOP);
        self.out
    }

    pub fn none(&mut self) {
        self.out.push(op::NONE);
    }

    pub fn bool(&mut self, b: bool) {
        self.out.push(if b { op::NEWTRUE } else { op::NEWFALSE });
    }

    /// The shortest encoding CPython would pick.
    pub fn int(&mut self, v: i64) {
        if (0..0x100).contains(&v) {
            self.out.extend_from_slice(&[op::BININT1, v as u8]);
        } else if (0..0x1_0000).contains(&v) {
            self.out.push(op::BININT2);
            self.out.extend_from_slice(&(v as u16).to_le_bytes());
        } else if i32::try_from(v).is_ok() {
            self.out.push(op::BININT);
            self.out.extend_from_slice(&(v as i32).to_le_bytes());
        } else {
            let bytes = v.to_le_bytes();
            let mut n = 8;
            // Drop sign-extension bytes while the sign bit stays right.
            while n > 1 {
                let (top, next) = (bytes[n - 1], bytes[n - 2]);
                let redundant =
                    (top == 0x00 && next & 0x80 == 0) || (top == 0xff && next & 0x80 != 0);
                if !redundant {
                    break;
                }
                n -= 1;
            }
            self.out.extend_from_slice(&[op::LONG1, n as u8]);
            self.out.extend_from_slice(&bytes[..n]);
        }
    }

    /// A u64 as a Python int; values above i64::MAX are clamped, which no
    /// real address or size reaches.
    pub fn uint(&mut self, v: u64) {
        self.int(i64::try_from(v).unwrap_or(i64::MAX));
    }

    pub fn float(&mut self, f: f64) {
        self.out.push(op::BINFLOAT);
        self.out.extend_from_slice(&f.to_be_bytes());
    }

    /// A str, memoised: the second time the same text is written it becomes
    /// a `BINGET`.
    pub fn str(&mut self, s: &str) {
        if let Some(&idx) = self.strings.get(s) {
            self.get(idx);
            return;
        }
        let b = s.as_bytes();
        if b.len() < 0x100 {
            self.out
                .extend_from_slice(&[op::SHORT_BINUNICODE, b.len() as u8]);
        } else if let Ok(n) = u32::try_from(b.len()) {
            self.out.push(op::BINUNICODE);
            self.out.extend_from_slice(&n.to_le_bytes());
        } else {
            self.out.push(op::BINUNICODE8);
            self.out.extend_from_slice(&(b.len() as u64).to_le_bytes());
        }
        self.out.extend_from_slice(b);
        let idx = self.memoize();
        self.strings.insert(s.into(), idx);
    }

    pub fn empty_list(&mut self) {
        self.out.push(op::EMPTY_LIST);
    }

    pub fn empty_dict(&mut self) {
        self.out.push(op::EMPTY_DICT);
    }

    pub fn mark(&mut self) {
        self.out.push(op::MARK);
    }

    pub fn append(&mut self) {
        self.out.push(op::APPEND);
    }

    pub fn appends(&mut self) {
        self.out.push(op::APPENDS);
    }

    pub fn setitems(&mut self) {
        self.out.push(op::SETITEMS);
    }

    pub fn tuple2(&mut self) {
        self.out.push(op::TUPLE2);
    }

    /// Store the top of the stack in the next memo slot; returns its index.
    pub fn memoize(&mut self) -> u32 {
        self.out.push(op::MEMOIZE);
        let idx = self.memo_len;
        self.memo_len += 1;
        idx
    }

    /// Push a memoised object again.
    pub fn get(&mut self, idx: u32) {
        if let Ok(small) = u8::try_from(idx) {
            self.out.extend_from_slice(&[op::BINGET, small]);
        } else {
            self.out.push(op::LONG_BINGET);
            self.out.extend_from_slice(&idx.to_le_bytes());
        }
    }

    /// `EMPTY_LIST MEMOIZE` then the items in MARK ... APPENDS batches, like
    /// CPython's `save_list`. Returns the list's memo index.
    pub fn list<T>(&mut self, items: &[T], mut item: impl FnMut(&mut Self, &T)) -> u32 {
        self.empty_list();
        let idx = self.memoize();
        for chunk in items.chunks(BATCH) {
            self.mark();
            for x in chunk {
                item(self, x);
            }
            self.appends();
        }
        idx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::pickle::{decode, ValueRef};

    #[test]
    fn ints_decode_back() {
        for v in [
            0,
            255,
            256,
            65535,
            65536,
            -1,
            i32::MIN as i64,
            i32::MAX as i64 + 1,
            -(1 << 40),
            1 << 47,
            1_700_000_000_000_000,
            i64::MAX,
            i64::MIN,
        ] {
            let mut w = PickleWriter::new();
            w.int(v);
            let bytes = w.finish();
            let doc = decode(&bytes).expect("decodes");
            assert_eq!(doc.get(doc.root()), ValueRef::Int(v), "{v}");
        }
    }

    #[test]
    fn repeated_strings_share_one_memo_slot() {
        let mut w = PickleWriter::new();
        w.list(&["a", "b", "a", "a"], |w, s| w.str(s));
        let bytes = w.finish();
        let doc = decode(&bytes).expect("decodes");
        let ValueRef::List(id) = doc.get(doc.root()) else {
            panic!("not a list");
        };
        let items = doc.items(id);
        assert_eq!(items.len(), 4);
        assert_eq!(items[0], items[2]);
        assert_eq!(doc.string_count(), 2);
    }
}
