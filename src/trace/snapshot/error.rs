//! Import errors: either the pickle itself is broken (with a byte offset) or
//! it decoded but is not a snapshot (with the field path at fault).

use std::path::PathBuf;

use thiserror::Error;

use crate::trace::pickle::PickleError;

/// A decoded value that does not fit the snapshot schema.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{path}: {message}")]
pub struct SchemaError {
    /// Where, e.g. `segments[3].blocks[0].size`; `<root>` for the top level.
    pub path: String,
    /// What, e.g. `expected int, got str`.
    pub message: String,
}

/// Why a snapshot could not be imported.
#[derive(Debug, Error)]
pub enum SnapshotError {
    #[error("not a valid pickle: {0}")]
    Pickle(#[from] PickleError),
    #[error("not a memory snapshot: {0}")]
    Schema(#[from] SchemaError),
    /// The file wraps something else around (or instead of) the pickle.
    #[error("{0}")]
    Container(String),
    /// The file is another of vramscope's inputs: what it is and how to
    /// open it.
    #[error("{0}")]
    OtherInput(String),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Any of the above, for a named file.
    #[error("{}: {source}", path.display())]
    File {
        path: PathBuf,
        source: Box<SnapshotError>,
    },
}
