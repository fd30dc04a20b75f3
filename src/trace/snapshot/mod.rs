//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot` pickles) as
//! typed Rust values, and back.
//!
//! [`import_bytes`] / [`import_file`] decode with [`crate::trace::pickle`]
//! and convert every layout described in `shared/snapshots/real/SCHEMA.md`:
//! the current dict, the older dict without settings, the bare list of
//! segments, and legacy blocks that carry `history` instead of `address`.
//! Keys beyond the few each record needs are optional; a value of the wrong
//! type is a [`SchemaError`] naming its path (`segments[3].blocks[0].size`).
//!
//! Stacks are interned in a [`FrameTable`]: a frames list the pickle shares
//! through its memo is converted once, and equal stacks share one
//! [`FramesId`] whatever their origin.
//!
//! [`export::export_bytes`] writes the current dict layout back as pickle
//! protocol 4, readable by Python's `pickle` and MemoryViz.

mod consumed;
mod container;
mod dict_keys;
mod error;
pub mod export;
mod field;
mod frames;
pub mod from_run;
#[cfg(unix)]
mod guarded_map;
mod import;
pub mod synth;
mod types;

pub use consumed::ConsumedTrace;
pub use container::LIVE_RECORDING_MAGIC;
pub use error::{SchemaError, SnapshotError};
pub use export::export_bytes;
pub use frames::{is_module_conversion, Frame, FrameId, FrameKind, FrameTable, FramesId};
pub use import::{
    import_bytes, import_document, import_file, import_file_reporting, import_file_tapped, Tables,
    Tapped, TraceTap,
};
pub use synth::{synthetic_snapshot, SynthStats};
pub use types::{
    Action, AllocatorSettings, Annotation, Block, BlockState, EntryExtra, EntryExtras, ExtraId,
    Layout, PoolKind, Segment, SettingValue, Snapshot, TraceEntry,
};

#[cfg(test)]
mod tests;
