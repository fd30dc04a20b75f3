//! Trace entries as PyTorch's `_snapshot()["device_traces"]` records them (allocator.md §13.2).

use super::rounding::Pool;
use super::Tag;

/// `action` of a trace entry (PyTorch's `TraceEntry::Action`). The
/// allocator makes the first eight; a snapshot's trace may also hold
/// `snapshot` and `annotate` entries, and actions of releases this model does
/// not know, kept as [`Action::Other`] (their text stays with the entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
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
    Other,
}

impl Action {
    /// Every action the allocator records.
    pub const ALL: [Action; 8] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Oom,
    ];

    /// The action whose `repr(u8)` value is `value`.
    pub fn from_repr(value: u8) -> Option<Action> {
        Some(match value {
            0 => Action::Alloc,
            1 => Action::FreeRequested,
            2 => Action::FreeCompleted,
            3 => Action::SegmentAlloc,
            4 => Action::SegmentFree,
            5 => Action::SegmentMap,
            6 => Action::SegmentUnmap,
            7 => Action::Oom,
            8 => Action::Snapshot,
            9 => Action::Annotate,
            10 => Action::Other,
            _ => return None,
        })
    }

    /// PyTorch's spelling to the enum; unknown text gives [`Action::Other`].
    pub fn parse(s: &str) -> Action {
        match s {
            "snapshot" => Action::Snapshot,
            "annotate" => Action::Annotate,
            _ => Action::ALL
                .into_iter()
                .find(|a| a.name() == s)
                .unwrap_or(Action::Other),
        }
    }

    /// Whether the allocator makes this entry (all but `snapshot`,
    /// `annotate` and unknown actions).
    pub fn is_allocator(self) -> bool {
        !matches!(self, Action::Snapshot | Action::Annotate | Action::Other)
    }

    /// PyTorch's action string; `"other"` for [`Action::Other`].
    pub fn name(self) -> &'static str {
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
            Action::Other => "other",
        }
    }

    pub fn is_segment(self) -> bool {
        matches!(
            self,
            Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap
        )
    }
}

/// One allocator trace entry. `size` means what PyTorch's entry means (the
/// request for alloc/free entries, the rounded request for `oom`); `block_size`
/// is the block the request got, which PyTorch's trace leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocEvent {
    pub action: Action,
    /// Block or segment address; 0 for `oom`.
    pub addr: u64,
    pub size: u64,
    pub block_size: u64,
    pub stream: u64,
    pub pool: Pool,
    /// `device_free` of an `oom` entry; 0 otherwise.
    pub device_free: u64,
    pub tag: Tag,
}
