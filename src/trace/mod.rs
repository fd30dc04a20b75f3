//! The event model every view works on, and PyTorch snapshot import/export.
//!
//! `pickle` decodes Python pickles (the opcodes `_dump_snapshot` writes) with
//! interned strings and shared frames; `snapshot` turns the decoded value into
//! typed segments, blocks and trace entries.

pub mod pickle;
pub mod replay;
pub mod snapshot;
