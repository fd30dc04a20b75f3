//! Decoding errors. Every error carries the byte offset of the opcode (or
//! argument) that could not be decoded, so a broken multi-GB file can be
//! inspected with `python -m pickletools` at the right place.

use thiserror::Error;

/// A pickle that could not be decoded, and where.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("byte {offset}: {kind}")]
pub struct PickleError {
    /// Offset into the input of the opcode or argument at fault.
    pub offset: usize,
    /// What went wrong.
    pub kind: PickleErrorKind,
}

impl PickleError {
    pub(crate) fn new(offset: usize, kind: PickleErrorKind) -> Self {
        Self { offset, kind }
    }
}

/// What went wrong while decoding. The `Display` text is the part after
/// `byte N: `.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PickleErrorKind {
    /// An argument or length field runs past the end of the input.
    #[error("truncated {op}: {what} needs {need} bytes, {left} left")]
    Truncated {
        op: &'static str,
        what: &'static str,
        need: u64,
        left: usize,
    },
    /// A length field is larger than what remains of the input; checked
    /// before anything is allocated from it.
    #[error("truncated {op}: length {len} exceeds the {left} bytes left")]
    LengthTooLarge {
        op: &'static str,
        len: u64,
        left: usize,
    },
    /// The input ended without a STOP opcode.
    #[error("input ended without STOP")]
    MissingStop,
    /// An empty input.
    #[error("empty input")]
    Empty,
    #[error("unknown opcode 0x{0:02x}")]
    UnknownOpcode(u8),
    #[error("unsupported opcode {0} (class instances are not part of a memory snapshot)")]
    Unsupported(&'static str),
    #[error("unsupported pickle protocol {0} (2 to 5 are understood)")]
    Protocol(u8),
    #[error("{op}: stack underflow (needs {need} values, {have} on the stack)")]
    StackUnderflow {
        op: &'static str,
        need: usize,
        have: usize,
    },
    #[error("{op}: no MARK on the stack")]
    NoMark { op: &'static str },
    #[error("{op}: memo index {index} was never stored")]
    MemoMissing { op: &'static str, index: u64 },
    #[error("{op}: expected {expected} on the stack, got {got}")]
    WrongType {
        op: &'static str,
        expected: &'static str,
        got: &'static str,
    },
    #[error("{op}: odd number of values ({count}) for key/value pairs")]
    OddItems { op: &'static str, count: usize },
    #[error("{op}: integer wider than 64 bits ({bytes} bytes)")]
    IntTooWide { op: &'static str, bytes: u64 },
    /// `text`: a short quoted excerpt of the argument.
    #[error("{op}: malformed text argument {text}")]
    BadText { op: &'static str, text: String },
    /// A streaming import dropped this memoised value after converting it,
    /// and the pickle refers to it again; the importer then decodes the
    /// file again without streaming.
    #[error("memo index {index} refers to a value already streamed out")]
    Consumed { index: u64 },
    /// The streaming importer stopped decoding (it reports why).
    #[error("stopped by the importer")]
    Stopped,
    #[error("too many {what} (limit {limit})")]
    Limit { what: &'static str, limit: u64 },
}
