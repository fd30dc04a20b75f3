//! Typed field access over a decoded pickle, with the field path carried
//! along (as a chain on the call stack, rendered only on error).

use std::fmt::Write as _;

use crate::trace::pickle::{Document, SeqId, SharedStr, Value, ValueRef};

use super::error::SchemaError;

/// One part of a field path.
#[derive(Clone, Copy)]
pub(super) enum Part {
    Root,
    Key(&'static str),
    Index(usize),
}

/// A field path: `segments[3].blocks[0].size`. Built as a linked chain of
/// borrowed parts, so descending costs nothing until an error is rendered.
#[derive(Clone, Copy)]
pub(super) struct Path<'p> {
    parent: Option<&'p Path<'p>>,
    part: Part,
}

impl<'p> Path<'p> {
    pub const ROOT: Path<'static> = Path {
        parent: None,
        part: Part::Root,
    };

    pub fn key(&'p self, key: &'static str) -> Path<'p> {
        Path {
            parent: Some(self),
            part: Part::Key(key),
        }
    }

    pub fn index(&'p self, i: usize) -> Path<'p> {
        Path {
            parent: Some(self),
            part: Part::Index(i),
        }
    }

    pub fn render(&self) -> String {
        let mut parts = Vec::new();
        let mut p = Some(self);
        while let Some(cur) = p {
            parts.push(cur.part);
            p = cur.parent;
        }
        let mut out = String::new();
        for part in parts.iter().rev() {
            match part {
                Part::Root => {}
                Part::Key(k) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(k);
                }
                Part::Index(i) => {
                    let _ = write!(out, "[{i}]");
                }
            }
        }
        if out.is_empty() {
            out.push_str("<root>");
        }
        out
    }

    pub fn error(&self, message: impl Into<String>) -> SchemaError {
        SchemaError {
            path: self.render(),
            message: message.into(),
        }
    }
}

pub(super) type Res<T> = Result<T, SchemaError>;

/// Declares [`Key`]: every dict key the importer reads.
macro_rules! keys {
    ($($variant:ident = $name:literal,)*) => {
        /// A dict key of the snapshot schema. Looked up by index, so reading
        /// a field never hashes a string.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(super) enum Key { $($variant,)* }

        impl Key {
            pub const ALL: &'static [Key] = &[$(Key::$variant,)*];
            pub const COUNT: usize = Key::ALL.len();

            pub fn name(self) -> &'static str {
                match self { $(Key::$variant => $name,)* }
            }
        }
    };
}

keys! {
    Segments = "segments",
    DeviceTraces = "device_traces",
    AllocatorSettings = "allocator_settings",
    ExternalAnnotations = "external_annotations",
    Device = "device",
    Address = "address",
    TotalSize = "total_size",
    AllocatedSize = "allocated_size",
    ActiveSize = "active_size",
    RequestedSize = "requested_size",
    Stream = "stream",
    SegmentType = "segment_type",
    SegmentPoolId = "segment_pool_id",
    IsExpandable = "is_expandable",
    Frames = "frames",
    Blocks = "blocks",
    Size = "size",
    State = "state",
    History = "history",
    RealSize = "real_size",
    Action = "action",
    Addr = "addr",
    DeviceFree = "device_free",
    TimeUs = "time_us",
    CompileContext = "compile_context",
    UserMetadata = "user_metadata",
    Filename = "filename",
    Line = "line",
    Name = "name",
    Stage = "stage",
    AllocConf = "PYTORCH_CUDA_ALLOC_CONF",
    MaxSplitSize = "max_split_size",
    GarbageCollectionThreshold = "garbage_collection_threshold",
    ExpandableSegments = "expandable_segments",
    RoundupPower2Divisions = "roundup_power2_divisions",
}

/// The document plus the schema's key strings, looked up once: because
/// strings are interned, a key compare is then one integer compare.
pub(super) struct Fields<'d> {
    pub doc: &'d Document,
    /// The interned string of each [`Key`], by `Key as usize`; `None` when
    /// the pickle never mentions it.
    pub keys: KeyTable,
}

/// The interned string of each [`Key`] in one document.
pub(super) type KeyTable = [Option<Value>; Key::COUNT];

/// Looks the keys up in `doc`.
pub(super) fn key_table(doc: &Document) -> KeyTable {
    let mut keys = [None; Key::COUNT];
    for (slot, k) in keys.iter_mut().zip(Key::ALL) {
        *slot = doc.find_str(k.name());
    }
    keys
}

impl<'d> Fields<'d> {
    pub fn new(doc: &'d Document) -> Self {
        Self {
            doc,
            keys: key_table(doc),
        }
    }

    /// With keys looked up earlier (still valid: strings are never dropped).
    pub fn with_keys(doc: &'d Document, keys: KeyTable) -> Self {
        Self { doc, keys }
    }

    /// The interned string of `key`, if the document has it.
    #[inline]
    pub fn key(&self, key: Key) -> Option<Value> {
        self.keys[key as usize]
    }

    #[cold]
    fn negative(i: i64, path: &Path) -> SchemaError {
        // The reader keeps a uint64 in [2^63, 2^64) bit for bit (text.rs):
        // the same bits may be meant either way.
        path.error(format!(
            "expected a non-negative int below 2^63, got {i} (read as an unsigned 64-bit \
             number: {})",
            i as u64
        ))
    }

    #[cold]
    pub fn expected(&self, v: Value, what: &str, path: &Path) -> SchemaError {
        path.error(format!("expected {what}, got {}", self.doc.type_name(v)))
    }

    #[inline]
    pub fn dict(&self, v: Value, path: &Path) -> Res<SeqId> {
        Document::dict_id(v).ok_or_else(|| self.expected(v, "dict", path))
    }

    pub fn list(&self, v: Value, path: &Path) -> Res<&'d [Value]> {
        match self.doc.get(v) {
            ValueRef::List(id) => Ok(self.doc.items(id)),
            _ => Err(self.expected(v, "list", path)),
        }
    }

    /// The container id of a list, for caching per shared list.
    #[inline]
    pub fn list_id(&self, v: Value, path: &Path) -> Res<SeqId> {
        Document::list_id(v).ok_or_else(|| self.expected(v, "list", path))
    }

    /// A list or a tuple (PyTorch writes pairs as tuples, JSON-ish
    /// converters as lists).
    pub fn sequence(&self, v: Value, path: &Path) -> Res<&'d [Value]> {
        match self.doc.get(v) {
            ValueRef::List(id) | ValueRef::Tuple(id) => Ok(self.doc.items(id)),
            _ => Err(self.expected(v, "tuple", path)),
        }
    }

    // Inlined, with the errors out of line: a `Res` returned from a call goes
    // through the stack, and reading it back whole stalls on the callee's
    // narrower stores (once per field of every trace entry).
    #[inline]
    pub fn int(&self, v: Value, path: &Path) -> Res<i64> {
        match self.doc.get(v) {
            ValueRef::Int(i) => Ok(i),
            _ => Err(self.expected(v, "int", path)),
        }
    }

    #[inline]
    pub fn uint(&self, v: Value, path: &Path) -> Res<u64> {
        let i = self.int(v, path)?;
        u64::try_from(i).map_err(|_| Self::negative(i, path))
    }

    pub fn float(&self, v: Value, path: &Path) -> Res<f64> {
        match self.doc.get(v) {
            ValueRef::Float(f) => Ok(f),
            ValueRef::Int(i) => Ok(i as f64),
            _ => Err(self.expected(v, "float", path)),
        }
    }

    pub fn bool(&self, v: Value, path: &Path) -> Res<bool> {
        match self.doc.get(v) {
            ValueRef::Bool(b) => Ok(b),
            _ => Err(self.expected(v, "bool", path)),
        }
    }

    pub fn str(&self, v: Value, path: &Path) -> Res<SharedStr> {
        match self.doc.get(v) {
            ValueRef::Str(s) => Ok(s.clone()),
            _ => Err(self.expected(v, "str", path)),
        }
    }

    /// `d[key]` if present.
    #[inline]
    pub fn get(&self, d: SeqId, key: Key) -> Option<Value> {
        let k = self.key(key)?;
        self.doc.dict_get(d, k)
    }

    /// `d[key]`, or an error naming the missing key.
    pub fn req(&self, d: SeqId, key: Key, path: &Path) -> Res<Value> {
        self.get(d, key)
            .ok_or_else(|| path.error(format!("missing key {:?}", key.name())))
    }

    /// `d[key]` unless absent or Python's `None`: how an optional field is
    /// read (tools that rewrite snapshots write `None` for "not recorded").
    #[inline]
    pub fn get_some(&self, d: SeqId, key: Key) -> Option<Value> {
        self.get(d, key).filter(|&v| v != Value::NONE)
    }

    /// Optional typed field: `None` when absent or `None`, an error when
    /// present with the wrong type.
    pub fn opt<T>(
        &self,
        d: SeqId,
        key: Key,
        path: &Path,
        conv: impl FnOnce(&Self, Value, &Path) -> Res<T>,
    ) -> Res<Option<T>> {
        match self.get_some(d, key) {
            Some(v) => conv(self, v, &path.key(key.name())).map(Some),
            None => Ok(None),
        }
    }

    /// Required typed field.
    pub fn field<T>(
        &self,
        d: SeqId,
        key: Key,
        path: &Path,
        conv: impl FnOnce(&Self, Value, &Path) -> Res<T>,
    ) -> Res<T> {
        let v = self.req(d, key, path)?;
        conv(self, v, &path.key(key.name()))
    }

    /// A short Python-like rendering for values kept as text. Bounded in
    /// size: a pickle can build a list that contains itself many times.
    pub fn repr(&self, v: Value) -> String {
        let mut out = String::new();
        let mut budget = 256usize;
        self.repr_into(v, &mut out, &mut budget);
        out
    }

    fn repr_into(&self, v: Value, out: &mut String, budget: &mut usize) {
        if *budget == 0 {
            out.push_str("...");
            return;
        }
        *budget -= 1;
        let doc = self.doc;
        let seq =
            |items: &[Value], open: &str, close: &str, out: &mut String, budget: &mut usize| {
                out.push_str(open);
                for (i, &x) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    self.repr_into(x, out, budget);
                    if *budget == 0 {
                        break;
                    }
                }
                out.push_str(close);
            };
        match doc.get(v) {
            ValueRef::None => out.push_str("None"),
            ValueRef::Bool(b) => out.push_str(if b { "True" } else { "False" }),
            ValueRef::Int(i) => {
                let _ = write!(out, "{i}");
            }
            ValueRef::Float(f) => {
                let _ = write!(out, "{f:?}");
            }
            ValueRef::Str(s) => out.push_str(&crate::units::quote_excerpt(s)),
            ValueRef::Bytes(b) => {
                out.push('b');
                out.push_str(&crate::units::quote_bytes_excerpt(b));
            }
            ValueRef::List(id) => seq(doc.items(id), "[", "]", out, budget),
            ValueRef::Tuple(id) => seq(doc.items(id), "(", ")", out, budget),
            ValueRef::Set(id) | ValueRef::FrozenSet(id) => {
                seq(doc.items(id), "{", "}", out, budget)
            }
            ValueRef::Dict(id) => {
                out.push('{');
                for (i, (k, x)) in doc.pairs(id).enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    self.repr_into(k, out, budget);
                    out.push_str(": ");
                    self.repr_into(x, out, budget);
                    if *budget == 0 {
                        break;
                    }
                }
                out.push('}');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_render_like_python_access() {
        let root = Path::ROOT;
        let segs = root.key("segments");
        let s3 = segs.index(3);
        let blocks = s3.key("blocks");
        let b0 = blocks.index(0);
        assert_eq!(b0.key("size").render(), "segments[3].blocks[0].size");
        assert_eq!(root.render(), "<root>");
        assert_eq!(root.index(2).key("size").render(), "[2].size");
    }
}
