//! The event model every view works on, and PyTorch snapshot import/export.
//!
//! `pickle` decodes Python pickles (the opcodes `_dump_snapshot` writes) with
//! interned strings and shared frames; `snapshot` turns the decoded value into
//! typed segments, blocks and trace entries; `mirror` turns a recorded trace
//! into events; `replay` runs its requests through the allocator model;
//! `stack` holds an allocation's frames as the views read them and `sites`
//! groups live bytes by the first user frame.

pub mod allocated_curve;
pub mod chunked;
pub mod event;
pub mod event_store;
pub mod frozen_map;
pub mod memory_map;
pub mod mirror;
pub mod pickle;
pub mod placing_map;
pub mod replay;
pub mod sites;
pub mod snapshot;
pub mod stack;
pub mod timeline;

pub use event::{Event, Marker, Phase};
pub use memory_map::{MapBlock, MapSegment, MapStats, MemoryMap};
pub use timeline::{MarkKind, Timeline};
