//! What can stop a trace before or while the program runs.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("no program to run: give one after `--`, e.g. `vramscope trace -- python train.py`")]
    NoCommand,
    #[error("could not make the private folder {path}: {source}")]
    Folder {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("could not start `{program}`: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("the trace channel: {0}")]
    Channel(String),
    #[error("the traced program sent message {index} that vramscope cannot read: {why}")]
    Protocol { index: u64, why: String },
    #[error("writing the trace stream: {0}")]
    Sink(std::io::Error),
}
