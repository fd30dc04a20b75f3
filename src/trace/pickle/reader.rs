//! The opcode loop: one pass over `&[u8]`, a value stack with a separate mark
//! stack, and the memo.

use rustc_hash::{FxHashMap, FxHashSet};

use super::error::{PickleError, PickleErrorKind as K};
use super::opcodes::name;
use super::text;
use super::value::{Checkpoint, Document, LimitError, SeqId, Value};

mod opcode_loop;

/// Decode a whole pickle held in memory.
pub fn decode(input: &[u8]) -> Result<Document, PickleError> {
    decode_with(input, &mut NoSink)
}

/// Receives the items of chosen lists while decoding, instead of the arena
/// (see the module doc, "Streaming").
pub(crate) trait Sink {
    /// False for [`NoSink`]: lets the plain decoder skip every hook.
    const ACTIVE: bool = true;

    /// A list was just created on top of `stack` (`marks` are the MARK
    /// heights). True to receive its items through [`Sink::append`]
    /// instead of storing them.
    fn claim(&mut self, doc: &Document, stack: &[Value], marks: &[usize]) -> bool;

    /// Items appended to a claimed list, in order. Containers the sink has
    /// converted and will not look at again go to `consumed`: a batch
    /// closed by APPENDS drops them from the arena. `Err` stops decoding.
    fn append(
        &mut self,
        doc: &Document,
        list: SeqId,
        items: &[Value],
        consumed: &mut Vec<SeqId>,
    ) -> Result<(), ()>;

    /// After a compaction, container `first + i` became `map[i]`
    /// (`u32::MAX`: dropped); lower ids are unchanged.
    fn relocate(&mut self, first: u32, map: &[u32]);

    /// Decoding has passed byte `pos` for good (called at FRAME opcodes).
    fn progress(&mut self, pos: usize);
}

/// The plain decoder: stores everything.
pub(crate) struct NoSink;

impl Sink for NoSink {
    const ACTIVE: bool = false;
    fn claim(&mut self, _: &Document, _: &[Value], _: &[usize]) -> bool {
        false
    }
    fn append(
        &mut self,
        _: &Document,
        _: SeqId,
        _: &[Value],
        _: &mut Vec<SeqId>,
    ) -> Result<(), ()> {
        Ok(())
    }
    fn relocate(&mut self, _: u32, _: &[u32]) {}
    fn progress(&mut self, _: usize) {}
}

/// Decode with a [`Sink`] receiving the claimed lists.
pub(crate) fn decode_with<S: Sink>(input: &[u8], sink: &mut S) -> Result<Document, PickleError> {
    if input.is_empty() {
        return Err(PickleError::new(0, K::Empty));
    }
    let mut r = Reader {
        input,
        pos: 0,
        at: 0,
        op: 0,
        stack: Vec::with_capacity(64),
        marks: Vec::with_capacity(16),
        memo: Memo::default(),
        doc: if S::ACTIVE {
            Document::for_streaming()
        } else {
            Document::with_input_len(input.len())
        },
        sink,
        claimed: FxHashSet::default(),
        batch: None,
        closing: None,
        consumed: Vec::new(),
    };
    let root = r.run()?;
    r.doc.finish(root);
    Ok(r.doc)
}

/// A MARK opened over a claimed list: what to compact at its APPENDS.
struct Batch {
    /// `marks.len()` right after the MARK.
    depth: usize,
    doc: Checkpoint,
    memo_len: usize,
}

/// The memo. Pickles write indices 0, 1, 2, ... so a vector is the fast
/// path; an index far beyond its end (possible with PUT) goes to a map
/// rather than letting an input-derived number size an allocation.
#[derive(Default)]
struct Memo {
    dense: Vec<Value>,
    sparse: FxHashMap<u64, Value>,
    count: u64,
    /// While a streamed batch is open: writing below this slot, or to the
    /// sparse map, sets `dirty` (the batch cannot be compacted).
    floor: Option<u64>,
    dirty: bool,
}

impl Memo {
    fn put(&mut self, idx: u64, v: Value) {
        let len = self.dense.len() as u64;
        if let Some(floor) = self.floor {
            if idx < floor || idx > len {
                self.dirty = true;
            }
        }
        if idx == len {
            if !self.sparse.is_empty() && self.sparse.remove(&idx).is_some() {
                self.count -= 1;
            }
            self.dense.push(v);
            self.count += 1;
        } else if idx < len {
            let slot = &mut self.dense[idx as usize];
            if *slot == Value::HOLE {
                self.count += 1;
            }
            *slot = v;
        } else if self.sparse.insert(idx, v).is_none() {
            self.count += 1;
        }
    }

    #[inline]
    fn get(&self, idx: u64) -> Option<Value> {
        match self.dense.get(idx as usize) {
            Some(&v) if v != Value::HOLE => Some(v),
            Some(_) => None,
            None => self.sparse.get(&idx).copied(),
        }
    }
}

struct Reader<'a, 's, S: Sink> {
    input: &'a [u8],
    pos: usize,
    /// Offset of the opcode being decoded, for errors.
    at: usize,
    /// The opcode being decoded, for errors.
    op: u8,
    stack: Vec<Value>,
    /// Stack heights at each MARK. Values below the top mark are not
    /// reachable by POP/APPEND/... (Python keeps them on a separate stack).
    marks: Vec<usize>,
    memo: Memo,
    doc: Document,
    sink: &'s mut S,
    /// Lists whose items go to the sink.
    claimed: FxHashSet<u32>,
    /// The open streamed batch, if any.
    batch: Option<Batch>,
    /// Set by `pop_mark` when it closes `batch`; taken by APPENDS.
    closing: Option<Batch>,
    consumed: Vec<SeqId>,
}

type R<T> = Result<T, PickleError>;

impl<'a, 's, S: Sink> Reader<'a, 's, S> {
    fn err(&self, kind: K) -> PickleError {
        PickleError::new(self.at, kind)
    }

    fn limit(&self, e: LimitError) -> PickleError {
        self.err(K::Limit {
            what: e.what,
            limit: e.limit,
        })
    }

    fn left(&self) -> usize {
        self.input.len().saturating_sub(self.pos)
    }

    /// `n` argument bytes; `n` is checked against the input first.
    #[inline]
    fn take(&mut self, what: &'static str, n: usize) -> R<&'a [u8]> {
        match self.input.get(self.pos..self.pos.saturating_add(n)) {
            Some(b) => {
                self.pos += n;
                Ok(b)
            }
            _ => Err(self.err(K::Truncated {
                op: name(self.op),
                what,
                need: n as u64,
                left: self.left(),
            })),
        }
    }

    #[inline]
    fn array<const N: usize>(&mut self, what: &'static str) -> R<[u8; N]> {
        let b = self.take(what, N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    #[inline]
    fn u8_arg(&mut self) -> R<u8> {
        Ok(self.array::<1>("argument")?[0])
    }

    /// A length-prefixed payload: reads the `L`-byte length, then checks it
    /// against the remaining input before touching the data.
    #[inline]
    fn payload<const L: usize>(&mut self) -> R<&'a [u8]> {
        let raw = self.array::<L>("length")?;
        let mut buf = [0u8; 8];
        buf[..L].copy_from_slice(&raw);
        let len = u64::from_le_bytes(buf);
        if len > self.left() as u64 {
            return Err(self.err(K::LengthTooLarge {
                op: name(self.op),
                len,
                left: self.left(),
            }));
        }
        self.take("data", len as usize)
    }

    /// A signed 4-byte length (BINSTRING, LONG4): negative is malformed.
    fn payload_i32(&mut self) -> R<&'a [u8]> {
        let len = i32::from_le_bytes(self.array::<4>("length")?);
        if len < 0 || len as u64 > self.left() as u64 {
            return Err(self.err(K::LengthTooLarge {
                op: name(self.op),
                len: len as i64 as u64,
                left: self.left(),
            }));
        }
        self.take("data", len as usize)
    }

    /// Text argument up to (not including) the next newline.
    fn line(&mut self) -> R<&'a [u8]> {
        let rest = self.input.get(self.pos..).unwrap_or(&[]);
        match rest.iter().position(|&b| b == b'\n') {
            Some(n) => {
                self.pos += n + 1;
                Ok(&rest[..n])
            }
            None => Err(self.err(K::Truncated {
                op: name(self.op),
                what: "newline-terminated argument",
                need: rest.len() as u64 + 1,
                left: rest.len(),
            })),
        }
    }

    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn underflow(&self, need: usize) -> PickleError {
        self.err(K::StackUnderflow {
            op: name(self.op),
            need,
            have: self.stack.len().saturating_sub(self.floor()),
        })
    }

    #[inline]
    fn pop(&mut self) -> R<Value> {
        if self.stack.len() > self.floor() {
            if let Some(v) = self.stack.pop() {
                return Ok(v);
            }
        }
        Err(self.underflow(1))
    }

    #[inline]
    fn top(&self) -> R<Value> {
        if self.stack.len() > self.floor() {
            if let Some(&v) = self.stack.last() {
                return Ok(v);
            }
        }
        Err(self.underflow(1))
    }

    /// Pops the top mark and returns the stack height it recorded; the values
    /// above it are `self.stack[mark..]`.
    #[inline]
    fn pop_mark(&mut self) -> R<usize> {
        match self.marks.pop() {
            Some(m) => {
                if S::ACTIVE {
                    self.closing = None;
                    self.mark_popped();
                }
                Ok(m)
            }
            None => Err(self.err(K::NoMark { op: name(self.op) })),
        }
    }

    /// A mark was popped: if it was the open batch's, move the batch to
    /// `closing` (only APPENDS compacts it; anything else abandons it).
    fn mark_popped(&mut self) {
        if matches!(&self.batch, Some(b) if self.marks.len() < b.depth) {
            self.closing = self.batch.take();
            self.memo.floor = None;
        }
    }

    fn is_claimed(&self, id: SeqId) -> bool {
        S::ACTIVE && self.claimed.contains(&id.0)
    }

    /// Items for a claimed list go to the sink.
    fn send_to_sink(&mut self, id: SeqId, from: usize) -> R<()> {
        self.consumed.clear();
        let items = self.stack.get(from..).unwrap_or(&[]);
        let r = self.sink.append(&self.doc, id, items, &mut self.consumed);
        self.stack.truncate(from);
        r.map_err(|()| self.err(K::Stopped))
    }

    /// After a claimed list's APPENDS: drop what the batch built.
    fn close_batch(&mut self, batch: Batch) {
        let memo_dirty = std::mem::take(&mut self.memo.dirty);
        let slots = self.memo.dense.get_mut(batch.memo_len..).unwrap_or(&mut []);
        if memo_dirty {
            // Closes the document's batch without dropping anything.
            self.doc.end_batch();
            return;
        }
        if let Some(map) = self.doc.compact(&batch.doc, slots, &self.consumed) {
            self.sink.relocate(batch.doc.first_seq(), map);
        }
    }

    #[inline]
    fn push(&mut self, v: Result<Value, LimitError>) -> R<()> {
        match v {
            Ok(v) => {
                self.stack.push(v);
                Ok(())
            }
            Err(e) => Err(self.limit(e)),
        }
    }

    fn wrong_type(&self, expected: &'static str, got: Value) -> PickleError {
        self.err(K::WrongType {
            op: name(self.op),
            expected,
            got: self.doc.type_name(got),
        })
    }

    /// The container just below the items of a MARK-delimited batch (after
    /// the mark was popped), checked with `kind`.
    fn batch_target(
        &self,
        mark: usize,
        kind: fn(Value) -> Option<SeqId>,
        expected: &'static str,
    ) -> R<SeqId> {
        let floor = self.floor();
        if mark <= floor || mark == 0 {
            return Err(self.underflow(1));
        }
        let Some(&target) = self.stack.get(mark - 1) else {
            return Err(self.underflow(1));
        };
        kind(target).ok_or_else(|| self.wrong_type(expected, target))
    }

    fn extend(&mut self, id: SeqId, from: usize) -> R<()> {
        let r = self.doc.extend(id, self.stack.get(from..).unwrap_or(&[]));
        self.stack.truncate(from);
        r.map_err(|e| self.limit(e))
    }

    /// Moves the values above `from` into the new container `v` and pushes it.
    fn fill_new(&mut self, v: Value, from: usize) -> R<()> {
        if let Some(id) = Document::container_id(v) {
            self.extend(id, from)?;
        }
        self.stack.push(v);
        Ok(())
    }

    fn memo_put(&mut self, idx: u64) -> R<()> {
        let v = self.top()?;
        self.memo.put(idx, v);
        Ok(())
    }

    #[inline]
    fn memo_get(&mut self, idx: u64) -> R<()> {
        match self.memo.get(idx) {
            Some(v) if S::ACTIVE && v == Value::CONSUMED => {
                Err(self.err(K::Consumed { index: idx }))
            }
            Some(v) => {
                self.stack.push(v);
                Ok(())
            }
            None => Err(self.err(K::MemoMissing {
                op: name(self.op),
                index: idx,
            })),
        }
    }

    fn text_int(&mut self) -> R<i64> {
        let line = self.line()?;
        text::parse_int(line).ok_or_else(|| self.bad_text(line))
    }

    fn bad_text(&self, line: &[u8]) -> PickleError {
        self.err(K::BadText {
            op: name(self.op),
            text: crate::units::quote_bytes_excerpt(line),
        })
    }

    fn long_bytes(&mut self, bytes: &[u8]) -> R<()> {
        match text::decode_long(bytes) {
            Some(i) => {
                let v = self.doc.int(i);
                self.push(v)
            }
            None => Err(self.err(K::IntTooWide {
                op: name(self.op),
                bytes: bytes.len() as u64,
            })),
        }
    }

    fn push_str_bytes(&mut self, b: &[u8]) -> R<()> {
        let v = match std::str::from_utf8(b) {
            Ok(s) => self.doc.string(s),
            // Python writes lone surrogates with "surrogatepass"; keep the
            // rest of the text rather than failing the whole file.
            Err(_) => self.doc.string(&String::from_utf8_lossy(b)),
        };
        self.push(v)
    }
}
