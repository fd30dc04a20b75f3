//! The typed snapshot: what `_dump_snapshot` wrote, with PyTorch's string
//! enums turned into Rust enums and every stack interned in a [`FrameTable`].

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
}

impl Snapshot {
    /// The innermost frame of `stack` that is the user's Python code rather
    /// than torch internals, C++ or the interpreter; used to group
    /// allocations by call site.
    pub fn first_user_frame(&self, stack: FramesId) -> Option<&Frame> {
        self.frames.first_user_frame(stack)
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
#[derive(Debug, Clone, PartialEq)]
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

/// `action` of a trace entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
    Snapshot,
    Annotate,
    /// An action this version does not know; kept, not rejected.
    Other(SharedStr),
}

impl Action {
    pub fn parse(s: &SharedStr) -> Action {
        match &**s {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "oom" => Action::Oom,
            "snapshot" => Action::Snapshot,
            "annotate" => Action::Annotate,
            _ => Action::Other(s.clone()),
        }
    }

    /// PyTorch's spelling.
    pub fn as_str(&self) -> &str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
            Action::Snapshot => "snapshot",
            Action::Annotate => "annotate",
            Action::Other(s) => s,
        }
    }
}

/// One `device_traces[d][i]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceEntry {
    pub action: Action,
    /// Block or segment address; 0 for `oom` (which has no `addr`).
    pub addr: u64,
    /// Requested (unrounded) size for alloc/free; see SCHEMA.md §5.
    pub size: u64,
    pub stream: u64,
    /// Free device memory the driver reported (`oom` only).
    pub device_free: Option<u64>,
    /// µs since the Unix epoch; absent in files before ~2024.
    pub time_us: Option<i64>,
    pub frames: FramesId,
    /// `"N/A"` when present (torch 2.8+).
    pub compile_context: Option<SharedStr>,
    /// `""` when present (torch 2.9+).
    pub user_metadata: Option<SharedStr>,
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
