//! A Python pickle reader for plain data (protocols 0–5 minus class
//! instances), built for PyTorch memory snapshots.
//!
//! # Why not serde-pickle
//!
//! serde-pickle resolves every `BINGET` by cloning the memoised value. A
//! snapshot references one frames list from several trace entries and one
//! frame dict from thousands of lists, so cloning turns a 1 GB pickle into
//! tens of GB of values. This reader never copies a memoised value: a
//! reference is a 4-byte [`Value`] handle.
//!
//! # Memory layout
//!
//! Everything lives in a [`Document`] arena:
//! - a [`Value`] is a tagged `u32` (small int inline; wide ints, floats,
//!   strings and containers by index), so a container item costs 4 bytes,
//!   about what its `BINGET` costs in the file;
//! - strings are interned into [`SharedStr`] (`Rc<str>`) by content, so equal
//!   strings share one allocation even when the pickle did not memoise them,
//!   and interned keys compare as integers ([`Document::find_str`]);
//! - containers are ranges in one item pool, filled in place as APPENDS and
//!   SETITEMS arrive after the container was memoised (pickle mutates
//!   containers after memoising them, so values must be ids, not trees).
//!
//! Measured: the arena is 1.0–2.0× the file size on the real snapshots
//! (the small legacy files, with many tiny containers, are the 2×), and 1.35×
//! on a 226 MB synthetic trace. Decoding runs at 270–500 MB/s.
//!
//! # Streaming
//!
//! [`decode`] keeps everything. The snapshot importer decodes with a
//! `Sink` instead (`decode_with`): the sink *claims* lists as they are
//! created (it sees the stack below them), and the items appended to a
//! claimed list go to the sink, never to the arena. When a claimed list's
//! `MARK ... APPENDS` batch closes, `Document::compact` drops what the batch
//! built except what the memo can still reach (strings, frame dicts, frames
//! lists: what PyTorch shares), renumbering the kept containers, and the
//! memo slots of the dropped dicts become a marker: a later `BINGET` of one
//! is [`PickleErrorKind::Consumed`], on which the importer decodes again
//! without a sink. A batch that touched anything older (extended an older
//! container, rewrote an older memo slot) is not compacted. So the arena
//! holds the shared part of the file plus one batch, whatever the trace
//! length.
//!
//! # Robustness
//!
//! Input is `&[u8]` (the caller reads or maps the whole file). Every length
//! field is checked against the remaining input before use, and every
//! failure is a [`PickleError`] with the byte offset; nothing panics on bad
//! input.

mod error;
mod opcodes;
mod reader;
mod text;
mod value;
mod writer;

pub use error::{PickleError, PickleErrorKind};
pub use reader::decode;
pub(crate) use reader::{decode_with, Sink};
pub use value::{Document, SeqId, SharedStr, Value, ValueRef};
pub use writer::{PickleWriter, BATCH, FRAME_TARGET};

#[cfg(test)]
pub(crate) mod tests;
