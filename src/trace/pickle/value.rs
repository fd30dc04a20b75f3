//! The decoded value graph: a 4-byte `Value` handle plus the `Document` arena
//! that owns every string, number and container.
//!
//! Layout of a `Value` (one `u32`): the low 3 bits are a tag, the upper 29
//! bits a payload.
//!
//! | tag | meaning | payload |
//! | --- | --- | --- |
//! | 0 | int in -2^28 .. 2^28 | the value |
//! | 1 | any other i64 | index into `wide_ints` |
//! | 2 | str | index into `strings` (interned) |
//! | 3 / 4 / 5 | list / dict / tuple | container index |
//! | 6 | float | index into `floats` |
//! | 7 | misc | low 3 payload bits: None, False, True, (hole), bytes, set, frozenset; the rest an index |
//!
//! Containers are `(start, len)` ranges in one shared pool. Pickle fills a
//! container after creating (and memoising) it, in batches of up to 1000
//! items; the first batch lands at the end of the pool. A container whose next
//! batch arrives when it is no longer at the end moves to its own `Vec` (in
//! practice only the big top-level lists do), so no batch is ever copied twice.

use std::rc::Rc;

use rustc_hash::FxHashMap;

pub(crate) use compact::Checkpoint;
use compact::Scratch;

mod compact;

/// Shared, immutable string. One type alias so the whole importer can switch
/// to `Arc<str>` in one line if snapshots must cross threads.
pub type SharedStr = Rc<str>;

/// A handle to one decoded value. `Copy`, 4 bytes; meaningful only with the
/// [`Document`] that produced it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Value(u32);

/// Index of a container (list, dict, tuple, set) in its [`Document`]. Two
/// references to one memoised container give the same id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u32);

/// What a [`Value`] is, borrowed from its [`Document`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ValueRef<'a> {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(&'a SharedStr),
    Bytes(&'a [u8]),
    List(SeqId),
    /// Items are stored flat: key, value, key, value, ...
    Dict(SeqId),
    Tuple(SeqId),
    Set(SeqId),
    FrozenSet(SeqId),
}

const TAG_BITS: u32 = 3;
const TAG_MASK: u32 = (1 << TAG_BITS) - 1;
const PAYLOAD_LIMIT: u64 = 1 << (32 - TAG_BITS);
const SMALL_MIN: i64 = -(1 << 28);
const SMALL_MAX: i64 = (1 << 28) - 1;

const T_SMALL: u32 = 0;
const T_WIDE: u32 = 1;
const T_STR: u32 = 2;
const T_LIST: u32 = 3;
const T_DICT: u32 = 4;
const T_TUPLE: u32 = 5;
const T_FLOAT: u32 = 6;
const T_MISC: u32 = 7;

const M_NONE: u32 = 0;
const M_FALSE: u32 = 1;
const M_TRUE: u32 = 2;
const M_HOLE: u32 = 3;
const M_BYTES: u32 = 4;
const M_SET: u32 = 5;
const M_FROZENSET: u32 = 6;
const MISC_BITS: u32 = 3;
const MISC_LIMIT: u64 = 1 << (32 - TAG_BITS - MISC_BITS);

/// Marks a container that was moved out of the pool into `owned`.
const OWNED: u32 = u32::MAX;

impl Value {
    pub const NONE: Value = Value::misc(M_NONE, 0);
    pub const TRUE: Value = Value::misc(M_TRUE, 0);
    pub const FALSE: Value = Value::misc(M_FALSE, 0);
    /// Internal: an unset memo slot. Never reaches the stack.
    pub(crate) const HOLE: Value = Value::misc(M_HOLE, 0);
    /// Internal: a memo slot whose value was streamed out and dropped (see
    /// [`Document::compact`]). Never reaches the stack.
    pub(crate) const CONSUMED: Value = Value::misc(M_HOLE, 1);

    const fn tagged(tag: u32, payload: u32) -> Value {
        Value((payload << TAG_BITS) | tag)
    }

    const fn misc(kind: u32, index: u32) -> Value {
        Value::tagged(T_MISC, (index << MISC_BITS) | kind)
    }

    pub fn bool(b: bool) -> Value {
        if b {
            Value::TRUE
        } else {
            Value::FALSE
        }
    }

    /// The raw handle, for use as a hash key (equal strings are equal
    /// handles, as strings are interned).
    pub(crate) fn raw(self) -> u32 {
        self.0
    }

    /// The index of a string among the document's strings (dense from 0).
    pub(crate) fn str_index(self) -> Option<u32> {
        (self.tag() == T_STR).then_some(self.payload())
    }

    fn tag(self) -> u32 {
        self.0 & TAG_MASK
    }

    fn payload(self) -> u32 {
        self.0 >> TAG_BITS
    }
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Value(tag {}, payload {})", self.tag(), self.payload())
    }
}

/// A pool range or, when `start == OWNED`, an index into `owned`.
#[derive(Clone, Copy)]
struct Seq {
    start: u32,
    len: u32,
}

/// The arena behind every [`Value`] of one decoded pickle.
pub struct Document {
    root: Value,
    pool: Vec<Value>,
    seqs: Vec<Seq>,
    owned: Vec<Vec<Value>>,
    strings: Vec<SharedStr>,
    interner: FxHashMap<SharedStr, u32>,
    wide_ints: Vec<i64>,
    floats: Vec<f64>,
    bytes: Vec<Box<[u8]>>,
    /// While a streamed batch is open: the first container id created in it.
    /// Extending an older container then sets `dirty` (the batch cannot be
    /// compacted). 0 when no batch is open.
    floor: u32,
    dirty: bool,
    scratch: Scratch,
}

/// An arena index ran out of bits (more than 2^29 containers, strings, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LimitError {
    pub what: &'static str,
    pub limit: u64,
}

type Built = Result<Value, LimitError>;

fn index(len: usize, limit: u64, what: &'static str) -> Result<u32, LimitError> {
    if (len as u64) < limit {
        Ok(len as u32)
    } else {
        Err(LimitError { what, limit })
    }
}

impl Document {
    /// An empty arena; `capacity_hint` is the input length in bytes.
    pub(crate) fn with_input_len(capacity_hint: usize) -> Self {
        Self {
            root: Value::NONE,
            // Real snapshots hold one container item per 3 to 5 input bytes.
            pool: Vec::with_capacity(capacity_hint / 4),
            seqs: Vec::new(),
            owned: Vec::new(),
            strings: Vec::new(),
            interner: FxHashMap::default(),
            wide_ints: Vec::new(),
            floats: Vec::new(),
            bytes: Vec::new(),
            floor: 0,
            dirty: false,
            scratch: Scratch::default(),
        }
    }

    /// An empty arena for a streamed decode: the big lists never land in
    /// the pool, so no reservation from the input size.
    pub(crate) fn for_streaming() -> Self {
        Self::with_input_len(0)
    }

    /// Called once decoding is done: hands back the pool's unused
    /// reservation (a large `Vec` shrinks in place, without copying).
    pub(crate) fn finish(&mut self, root: Value) {
        self.root = root;
        self.pool.shrink_to_fit();
        self.seqs.shrink_to_fit();
    }

    /// The object the pickle's STOP returned.
    pub fn root(&self) -> Value {
        self.root
    }

    /// Look at a value.
    pub fn get(&self, v: Value) -> ValueRef<'_> {
        let p = v.payload();
        match v.tag() {
            T_SMALL => ValueRef::Int(((v.0 as i32) >> TAG_BITS) as i64),
            T_WIDE => ValueRef::Int(self.wide_ints.get(p as usize).copied().unwrap_or(0)),
            T_STR => match self.strings.get(p as usize) {
                Some(s) => ValueRef::Str(s),
                None => ValueRef::None,
            },
            T_LIST => ValueRef::List(SeqId(p)),
            T_DICT => ValueRef::Dict(SeqId(p)),
            T_TUPLE => ValueRef::Tuple(SeqId(p)),
            T_FLOAT => ValueRef::Float(self.floats.get(p as usize).copied().unwrap_or(0.0)),
            _ => {
                let i = (p >> MISC_BITS) as usize;
                match p & ((1 << MISC_BITS) - 1) {
                    M_FALSE => ValueRef::Bool(false),
                    M_TRUE => ValueRef::Bool(true),
                    M_BYTES => ValueRef::Bytes(self.bytes.get(i).map_or(&[][..], |b| &b[..])),
                    M_SET => ValueRef::Set(SeqId(i as u32)),
                    M_FROZENSET => ValueRef::FrozenSet(SeqId(i as u32)),
                    _ => ValueRef::None,
                }
            }
        }
    }

    /// Python's name for the value's type, for error messages.
    pub fn type_name(&self, v: Value) -> &'static str {
        match self.get(v) {
            ValueRef::None => "None",
            ValueRef::Bool(_) => "bool",
            ValueRef::Int(_) => "int",
            ValueRef::Float(_) => "float",
            ValueRef::Str(_) => "str",
            ValueRef::Bytes(_) => "bytes",
            ValueRef::List(_) => "list",
            ValueRef::Dict(_) => "dict",
            ValueRef::Tuple(_) => "tuple",
            ValueRef::Set(_) => "set",
            ValueRef::FrozenSet(_) => "frozenset",
        }
    }

    /// The items of a container (a dict's are flat key, value pairs).
    pub fn items(&self, id: SeqId) -> &[Value] {
        let Some(seq) = self.seqs.get(id.0 as usize) else {
            return &[];
        };
        if seq.start == OWNED {
            return self.owned.get(seq.len as usize).map_or(&[], |v| &v[..]);
        }
        let (s, n) = (seq.start as usize, seq.len as usize);
        self.pool.get(s..s + n).unwrap_or(&[])
    }

    /// A dict's entries as (key, value) pairs, in file order.
    pub fn pairs(&self, id: SeqId) -> impl Iterator<Item = (Value, Value)> + '_ {
        self.items(id).chunks_exact(2).map(|kv| (kv[0], kv[1]))
    }

    /// The string value equal to `s`, if the pickle contains one. Strings are
    /// interned, so comparing a key with this is one integer compare.
    pub fn find_str(&self, s: &str) -> Option<Value> {
        self.interner.get(s).map(|&i| Value::tagged(T_STR, i))
    }

    /// `d[key]` for a dict and an interned key from [`Document::find_str`].
    /// Duplicate keys keep Python's rule: the last one wins.
    pub fn dict_get(&self, id: SeqId, key: Value) -> Option<Value> {
        let items = self.items(id);
        items
            .chunks_exact(2)
            .rev()
            .find(|kv| kv[0] == key)
            .map(|kv| kv[1])
    }

    /// Number of distinct strings.
    pub fn string_count(&self) -> usize {
        self.strings.len()
    }

    /// Number of containers.
    pub fn container_count(&self) -> usize {
        self.seqs.len()
    }

    /// Bytes of heap this document holds (capacity, not just length), for
    /// memory budgets and tests.
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        let owned: usize = self
            .owned
            .iter()
            .map(|v| v.capacity() * size_of::<Value>())
            .sum();
        let strs: usize = self.strings.iter().map(|s| s.len() + 16).sum();
        let bytes: usize = self.bytes.iter().map(|b| b.len()).sum();
        self.pool.capacity() * size_of::<Value>()
            + self.seqs.capacity() * size_of::<Seq>()
            + self.owned.capacity() * size_of::<Vec<Value>>()
            + owned
            + self.strings.capacity() * size_of::<SharedStr>()
            + strs
            + self.interner.capacity() * (size_of::<SharedStr>() + 8)
            + self.wide_ints.capacity() * 8
            + self.floats.capacity() * 8
            + self.bytes.capacity() * size_of::<Box<[u8]>>()
            + bytes
    }

    // ---- building (used by the reader) ----

    pub(crate) fn int(&mut self, i: i64) -> Built {
        if (SMALL_MIN..=SMALL_MAX).contains(&i) {
            return Ok(Value(((i as i32) << TAG_BITS) as u32 | T_SMALL));
        }
        let idx = index(self.wide_ints.len(), PAYLOAD_LIMIT, "integers")?;
        self.wide_ints.push(i);
        Ok(Value::tagged(T_WIDE, idx))
    }

    pub(crate) fn float(&mut self, f: f64) -> Built {
        let idx = index(self.floats.len(), PAYLOAD_LIMIT, "floats")?;
        self.floats.push(f);
        Ok(Value::tagged(T_FLOAT, idx))
    }

    pub(crate) fn string(&mut self, s: &str) -> Built {
        if let Some(&i) = self.interner.get(s) {
            return Ok(Value::tagged(T_STR, i));
        }
        let idx = index(self.strings.len(), PAYLOAD_LIMIT, "strings")?;
        let rc: SharedStr = Rc::from(s);
        self.strings.push(rc.clone());
        self.interner.insert(rc, idx);
        Ok(Value::tagged(T_STR, idx))
    }

    pub(crate) fn bytes(&mut self, b: &[u8]) -> Built {
        let idx = index(self.bytes.len(), MISC_LIMIT, "bytes objects")?;
        self.bytes.push(b.into());
        Ok(Value::misc(M_BYTES, idx))
    }

    fn new_seq(&mut self, limit: u64) -> Result<u32, LimitError> {
        let idx = index(self.seqs.len(), limit, "containers")?;
        self.seqs.push(Seq { start: 0, len: 0 });
        Ok(idx)
    }

    pub(crate) fn new_list(&mut self) -> Built {
        Ok(Value::tagged(T_LIST, self.new_seq(PAYLOAD_LIMIT)?))
    }

    pub(crate) fn new_dict(&mut self) -> Built {
        Ok(Value::tagged(T_DICT, self.new_seq(PAYLOAD_LIMIT)?))
    }

    pub(crate) fn new_tuple(&mut self, items: &[Value]) -> Built {
        let idx = self.new_seq(PAYLOAD_LIMIT)?;
        self.extend(SeqId(idx), items)?;
        Ok(Value::tagged(T_TUPLE, idx))
    }

    pub(crate) fn new_set(&mut self, frozen: bool) -> Built {
        let idx = self.new_seq(MISC_LIMIT)?;
        Ok(Value::misc(if frozen { M_FROZENSET } else { M_SET }, idx))
    }

    /// The list behind `v`, if it is a list (no arena access needed).
    #[inline]
    pub fn list_id(v: Value) -> Option<SeqId> {
        (v.tag() == T_LIST).then_some(SeqId(v.payload()))
    }

    /// The dict behind `v`, if it is a dict.
    #[inline]
    pub fn dict_id(v: Value) -> Option<SeqId> {
        (v.tag() == T_DICT).then_some(SeqId(v.payload()))
    }

    /// Any container kind (list, dict, tuple, set, frozenset).
    pub(crate) fn container_id(v: Value) -> Option<SeqId> {
        match v.tag() {
            T_LIST | T_DICT | T_TUPLE => Some(SeqId(v.payload())),
            T_MISC => {
                let p = v.payload();
                matches!(p & ((1 << MISC_BITS) - 1), M_SET | M_FROZENSET)
                    .then_some(SeqId(p >> MISC_BITS))
            }
            _ => None,
        }
    }

    pub(crate) fn set_id(v: Value) -> Option<SeqId> {
        let p = v.payload();
        (v.tag() == T_MISC && p & ((1 << MISC_BITS) - 1) == M_SET).then_some(SeqId(p >> MISC_BITS))
    }

    /// Append items to a container (see the module doc for the pool rule).
    pub(crate) fn extend(&mut self, id: SeqId, items: &[Value]) -> Result<(), LimitError> {
        if items.is_empty() {
            return Ok(());
        }
        if id.0 < self.floor {
            self.dirty = true;
        }
        let Some(seq) = self.seqs.get_mut(id.0 as usize) else {
            return Ok(());
        };
        if seq.start == OWNED {
            if let Some(v) = self.owned.get_mut(seq.len as usize) {
                v.extend_from_slice(items);
            }
            return Ok(());
        }
        let pool_len = self.pool.len();
        let (start, len) = (seq.start as usize, seq.len as usize);
        if len == 0 || start + len == pool_len {
            let new_len = len + items.len();
            let start = if len == 0 { pool_len } else { start };
            if (start + new_len) as u64 >= OWNED as u64 {
                return Err(LimitError {
                    what: "container items",
                    limit: OWNED as u64,
                });
            }
            *seq = Seq {
                start: start as u32,
                len: new_len as u32,
            };
            self.pool.extend_from_slice(items);
            return Ok(());
        }
        // Not at the end of the pool any more: give it its own vector.
        let owned_idx = index(self.owned.len(), OWNED as u64, "growing containers")?;
        let mut v = Vec::with_capacity(len + items.len());
        v.extend_from_slice(self.pool.get(start..start + len).unwrap_or(&[]));
        v.extend_from_slice(items);
        self.owned.push(v);
        *seq = Seq {
            start: OWNED,
            len: owned_idx,
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_round_trip_through_both_encodings() {
        let mut d = Document::with_input_len(0);
        for i in [
            0,
            1,
            -1,
            SMALL_MIN,
            SMALL_MAX,
            SMALL_MIN - 1,
            SMALL_MAX + 1,
            i64::MIN,
            i64::MAX,
        ] {
            let v = d.int(i).expect("room");
            assert_eq!(d.get(v), ValueRef::Int(i), "{i}");
        }
    }

    #[test]
    fn strings_are_interned() {
        let mut d = Document::with_input_len(0);
        let a = d.string("frames").expect("room");
        let b = d.string("frames").expect("room");
        assert_eq!(a, b);
        assert_eq!(d.find_str("frames"), Some(a));
        assert_eq!(d.string_count(), 1);
    }

    #[test]
    fn container_moves_out_of_the_pool_when_not_at_the_end() {
        let mut d = Document::with_input_len(0);
        let outer = d.new_list().expect("room");
        let inner = d.new_list().expect("room");
        let (o, i) = (
            Document::list_id(outer).expect("list"),
            Document::list_id(inner).expect("list"),
        );
        let one = d.int(1).expect("room");
        let two = d.int(2).expect("room");
        d.extend(o, &[one]).expect("room");
        d.extend(i, &[two, two]).expect("room");
        d.extend(o, &[two]).expect("room");
        assert_eq!(d.items(o), &[one, two]);
        assert_eq!(d.items(i), &[two, two]);
        d.extend(o, &[one]).expect("room");
        assert_eq!(d.items(o), &[one, two, one]);
    }
}
