//! The typed snapshot: what `_dump_snapshot` wrote, with PyTorch's string
//! enums turned into Rust enums and every stack interned in a [`FrameTable`].

use rustc_hash::FxHashMap;

use crate::trace::pickle::SharedStr;

use super::frames::{Frame, FrameTable, FramesId};

/// A decoded `torch.cuda.memory._snapshot()`.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Every segment, in file order (sorted by device, then address).
    pub segments: Vec<Segment>,
    /// One trace per CUDA device ordinal, oldest entry first. Empty for the
    /// legacy list layout, which has no traces.
    pub device_traces: Vec<Vec<TraceEntry>>,
    /// Absent before torch 2.4-ish (see [`Layout`]).
    pub allocator_settings: Option<AllocatorSettings>,
    pub external_annotations: Vec<Annotation>,
    pub layout: Layout,
    /// Every stack referenced by segments, blocks and trace entries.
    pub frames: FrameTable,
    /// The rare fields of trace entries, by [`TraceEntry::extra`].
    pub entry_extras: EntryExtras,
}

impl Snapshot {
    /// The innermost frame of `stack` that is the user's Python code rather
    /// than torch internals, C++ or the interpreter; used to group
    /// allocations by call site.
    pub fn first_user_frame(&self, stack: FramesId) -> Option<&Frame> {
        self.frames.first_user_frame(stack)
    }

    /// `file:line in name` of [`Snapshot::first_user_frame`]: the call
    /// site the reports group live bytes by.
    pub fn user_site(&self, stack: FramesId) -> Option<String> {
        self.first_user_frame(stack)
            .map(|f| format!("{}:{} in {}", f.filename, f.line, f.name))
    }

    /// The rare fields of `e` (compile context, user metadata, ...).
    pub fn extra(&self, e: &TraceEntry) -> &EntryExtra {
        self.entry_extras.get(e.extra())
    }

    /// PyTorch's spelling of `e.action`, including unknown actions.
    pub fn action_name<'a>(&'a self, e: &TraceEntry) -> &'a str {
        match (e.action, &self.extra(e).action) {
            (Action::Other, Some(name)) => name,
            (a, _) => a.name(),
        }
    }

    /// Free device memory the driver reported, for an `oom` entry.
    pub fn device_free(&self, e: &TraceEntry) -> Option<u64> {
        self.extra(e).device_free
    }
}

/// Which top-level shape the file had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// A dict with `allocator_settings` and/or `external_annotations`.
    CurrentDict,
    /// A dict with only `segments` and `device_traces`.
    OlderDict,
    /// A bare list of segment dicts (`torch.cuda.memory_snapshot()`).
    LegacyList,
}

/// Which pool a segment belongs to (`segment_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolKind {
    Small,
    Large,
}

impl PoolKind {
    /// PyTorch's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolKind::Small => "small",
            PoolKind::Large => "large",
        }
    }
}

/// One cudaMalloc'd range, or one mapped range of an expandable segment.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// CUDA device ordinal (`device`, default 0).
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    /// Sum of `active_allocated` block sizes (computed when absent).
    pub allocated_size: u64,
    /// Sum of non-`inactive` block sizes (computed when absent).
    pub active_size: u64,
    /// Sum of non-`inactive` block `requested_size` (computed when absent).
    pub requested_size: u64,
    /// Opaque CUDA stream handle; 0 is the default stream.
    pub stream: u64,
    pub segment_type: PoolKind,
    /// `segment_pool_id`; `(0, 0)` is the default pool.
    pub pool_id: (i64, i64),
    pub is_expandable: bool,
    /// Stack that created the segment (often empty).
    pub frames: FramesId,
    /// In address order, contiguous from `address`.
    pub blocks: Vec<Block>,
}

/// A block inside a segment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Block {
    /// From the file, or for legacy blocks the segment address plus the
    /// sizes of the blocks before it.
    pub address: u64,
    pub size: u64,
    /// The caller's unrounded size. For `Inactive` blocks it is often stale.
    pub requested_size: u64,
    pub state: BlockState,
    pub frames: FramesId,
}

/// `state` of a block: the allocator's own type, shared by imports and simulations.
pub use crate::alloc::BlockState;

/// `action` of a trace entry: the allocator's own type. One byte: the name
/// of an [`Action::Other`] lives in the entry's [`EntryExtra`] (see
/// [`Snapshot::action_name`]).
pub use crate::alloc::Action;

/// One `device_traces[d][i]` entry, 40 bytes.
///
/// The rare or nearly constant fields (`compile_context`, `user_metadata`,
/// an oom's `device_free`, the text of an unknown action) are interned in
/// [`Snapshot::entry_extras`] and named by a 24-bit [`ExtraId`]; `time_us`
/// is stored with `i64::MIN` meaning absent. Build entries with
/// [`TraceEntry::new`] and the `with_*` setters.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceEntry {
    /// Block or segment address; 0 for `oom` (which has no `addr`).
    pub addr: u64,
    /// Requested (unrounded) size for alloc/free; see SCHEMA.md §5.
    pub size: u64,
    pub stream: u64,
    time_us: i64,
    pub frames: FramesId,
    pub action: Action,
    extra: [u8; 3],
}

const NO_TIME: i64 = i64::MIN;

impl TraceEntry {
    /// An entry without `time_us` and without extras.
    pub fn new(action: Action, addr: u64, size: u64, stream: u64, frames: FramesId) -> Self {
        Self {
            addr,
            size,
            stream,
            time_us: NO_TIME,
            frames,
            action,
            extra: [0; 3],
        }
    }

    /// µs since the Unix epoch; absent in files before ~2024 (and for the
    /// value `i64::MIN`, which no clock produces).
    pub fn time_us(&self) -> Option<i64> {
        (self.time_us != NO_TIME).then_some(self.time_us)
    }

    pub fn with_time_us(mut self, t: Option<i64>) -> Self {
        self.time_us = t.unwrap_or(NO_TIME);
        self
    }

    /// The row of [`Snapshot::entry_extras`] holding this entry's rare fields.
    pub fn extra(&self) -> ExtraId {
        let [a, b, c] = self.extra;
        ExtraId(u32::from_le_bytes([a, b, c, 0]))
    }

    /// `id` must come from the snapshot's [`EntryExtras`] (24 bits).
    pub fn with_extra(mut self, id: ExtraId) -> Self {
        let [a, b, c, _] = id.0.to_le_bytes();
        self.extra = [a, b, c];
        self
    }
}

impl std::fmt::Debug for TraceEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceEntry")
            .field("action", &self.action)
            .field("addr", &self.addr)
            .field("size", &self.size)
            .field("stream", &self.stream)
            .field("time_us", &self.time_us())
            .field("frames", &self.frames)
            .field("extra", &self.extra())
            .finish()
    }
}

/// Index of one [`EntryExtra`] in [`EntryExtras`]; [`ExtraId::NONE`] is the
/// row with every field absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExtraId(pub u32);

impl ExtraId {
    pub const NONE: ExtraId = ExtraId(0);
    /// Rows are named by 24 bits inside a [`TraceEntry`].
    pub const LIMIT: u32 = 1 << 24;
}

/// The rare fields of a trace entry, shared by every entry that has the same
/// values (in real files: all of them, `("N/A", "")`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct EntryExtra {
    /// The text of an [`Action::Other`].
    pub action: Option<SharedStr>,
    /// `"N/A"` when present (torch 2.8+).
    pub compile_context: Option<SharedStr>,
    /// `""` when present (torch 2.9+).
    pub user_metadata: Option<SharedStr>,
    /// Free device memory the driver reported (`oom` only).
    pub device_free: Option<u64>,
}

/// Distinct [`EntryExtra`] rows; row 0 is the empty one.
#[derive(Debug, Clone)]
pub struct EntryExtras {
    rows: Vec<EntryExtra>,
    index: FxHashMap<EntryExtra, ExtraId>,
}

impl Default for EntryExtras {
    fn default() -> Self {
        Self::new()
    }
}

impl PartialEq for EntryExtras {
    fn eq(&self, other: &Self) -> bool {
        self.rows == other.rows
    }
}

impl EntryExtras {
    pub fn new() -> Self {
        let mut index = FxHashMap::default();
        index.insert(EntryExtra::default(), ExtraId::NONE);
        Self {
            rows: vec![EntryExtra::default()],
            index,
        }
    }

    /// The id of `row`, adding it if new; `None` past [`ExtraId::LIMIT`] rows.
    pub fn intern(&mut self, row: EntryExtra) -> Option<ExtraId> {
        if let Some(&id) = self.index.get(&row) {
            return Some(id);
        }
        if self.rows.len() as u64 >= ExtraId::LIMIT as u64 {
            return None;
        }
        let id = ExtraId(self.rows.len() as u32);
        self.rows.push(row.clone());
        self.index.insert(row, id);
        Some(id)
    }

    /// A row; an unknown id gives the empty row.
    pub fn get(&self, id: ExtraId) -> &EntryExtra {
        self.rows.get(id.0 as usize).unwrap_or(&self.rows[0])
    }

    /// Number of rows, the empty one included.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Never true: the empty row is always there.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// `allocator_settings` (torch 2.4+).
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatorSettings {
    /// `PYTORCH_CUDA_ALLOC_CONF`, the raw env string (`""` if unset).
    pub conf: String,
    /// Bytes, or -1 for unlimited.
    pub max_split_size: i64,
    pub garbage_collection_threshold: f64,
    pub expandable_segments: bool,
    /// `(interval start in MiB, divisions)`, from the dict keyed "1".."32768".
    pub roundup_power2_divisions: Vec<(u64, u64)>,
    /// Every other key, in file order, with its typed value so that export
    /// writes it back unchanged. `Display` on the value gives the text form.
    pub other: Vec<(SharedStr, SettingValue)>,
}

/// The value of an `allocator_settings` key this importer does not model.
#[derive(Debug, Clone, PartialEq)]
pub enum SettingValue {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(SharedStr),
    /// Anything else (a container), kept as Python-like text.
    Text(String),
}

impl std::fmt::Display for SettingValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SettingValue::None => f.write_str("None"),
            SettingValue::Bool(b) => f.write_str(if *b { "True" } else { "False" }),
            SettingValue::Int(i) => write!(f, "{i}"),
            SettingValue::Float(x) => write!(f, "{x:?}"),
            SettingValue::Str(s) => f.write_str(s),
            SettingValue::Text(s) => f.write_str(s),
        }
    }
}

/// One `external_annotations` entry: a `record_function` region boundary.
#[derive(Debug, Clone, PartialEq)]
pub struct Annotation {
    /// `"START"` or `"END"`.
    pub stage: SharedStr,
    pub name: SharedStr,
    pub device: i64,
    pub time_us: i64,
}

// The whole point of the layout above: a 1 GB trace is ~20 M entries.
const _: () = assert!(std::mem::size_of::<TraceEntry>() == 40);

#[cfg(test)]
mod tests {
    use super::Action;

    #[test]
    fn actions_spell_as_pytorch_does_and_parse_back() {
        // The spellings SCHEMA.md lists for `device_traces` entries.
        let spelled = [
            ("alloc", Action::Alloc),
            ("free_requested", Action::FreeRequested),
            ("free_completed", Action::FreeCompleted),
            ("segment_alloc", Action::SegmentAlloc),
            ("segment_free", Action::SegmentFree),
            ("segment_map", Action::SegmentMap),
            ("segment_unmap", Action::SegmentUnmap),
            ("oom", Action::Oom),
            ("snapshot", Action::Snapshot),
            ("annotate", Action::Annotate),
        ];
        for (text, action) in spelled {
            assert_eq!(Action::parse(text), action, "{text}");
            assert_eq!(action.name(), text);
        }
        assert_eq!(Action::parse("defragment"), Action::Other);
        assert_eq!(Action::parse(""), Action::Other);
    }

    #[test]
    fn the_allocator_makes_every_action_but_snapshot_annotate_and_unknown_ones() {
        for a in Action::ALL {
            assert!(a.is_allocator(), "{a:?}");
        }
        for other in [Action::Snapshot, Action::Annotate, Action::Other] {
            assert!(!other.is_allocator(), "{other:?}");
        }
    }
}
