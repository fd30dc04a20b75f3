//! What can go wrong before a sweep's points run, each naming the flag or
//! field to change.

use crate::scenario::LoadError;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SweepError {
    #[error(transparent)]
    Load(#[from] LoadError),
    /// `--batch 1,x`, `--batch 0`, an empty list.
    #[error("{flag} {text}: {reason}")]
    List {
        flag: &'static str,
        text: String,
        reason: ListProblem,
    },
    #[error("--seq: {model} has no sequence length; --seq applies to GPT, LSTM and token-input Modules models")]
    NoSeq { model: String },
    #[error("sweep: no batch sizes: give --batch (e.g. --batch 1,2,4,8) or --find-max-batch; scenario \"{0}\" carries no `sweep:` section")]
    NoPoints(String),
    /// More points than [`super::plan::MAX_POINTS`].
    #[error("{from}: {batches} batch sizes × {seqs} sequence lengths make {points} points; a sweep runs at most {max} (each point is a run of its own)", points = crate::units::format_count(*points), max = crate::units::format_count(super::plan::MAX_POINTS as u64))]
    TooManyPoints {
        /// The flags or the scenario's `sweep:` fields the lists came from.
        from: String,
        batches: usize,
        seqs: usize,
        points: u64,
    },
    /// A point the scenario cannot run at (e.g. a sequence longer than the
    /// model's block size).
    #[error("sweep point batch {batch}{}: {source}", seq.map_or(String::new(), |t| format!(", seq {t}")))]
    Point {
        batch: u64,
        seq: Option<u64>,
        source: Box<crate::scenario::BuildError>,
    },
}

/// What is wrong with one entry of a `--batch`/`--seq` list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListProblem {
    #[error("an empty entry: write the sizes separated by commas, e.g. 1,2,4,8")]
    EmptyEntry,
    #[error("`{0}` is not a whole number")]
    NotWhole(String),
    #[error("0 is not a size: each must be at least 1")]
    Zero,
    #[error("{0} is larger than {max}, the largest dimension modelled", max = crate::scenario::MAX_DIM)]
    TooLarge(u64),
}
