//! The lesson file format (RON), documented for teachers in
//! `scenarios/lessons/README.md`.

use serde::{Deserialize, Serialize};

use crate::scenario::{Expectation, Size};

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Lesson {
    /// What `vramscope lesson NAME` takes (a built-in's file stem).
    pub name: String,
    pub title: String,
    /// One line for `vramscope lessons`.
    pub description: String,
    /// About how long the lesson takes in a workshop.
    #[serde(default)]
    pub minutes: Option<u32>,
    /// Paragraphs shown before the first question.
    pub intro: Vec<String>,
    pub parts: Vec<Part>,
    /// Paragraphs shown after the last part.
    pub summary: Vec<String>,
}

/// One question, answered before its scenario runs.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Part {
    /// A built-in scenario's name, or a scenario file relative to the lesson file.
    pub scenario: String,
    /// What to watch for, shown above the question.
    #[serde(default)]
    pub setup: Vec<String>,
    pub question: String,
    /// Two to four choices, answered with the keys a, b, c, d.
    pub choices: Vec<String>,
    /// The right choice's letter, e.g. 'b'.
    pub answer: char,
    /// Paragraphs shown once the learner has answered.
    pub explanation: Vec<String>,
    /// What the scenario's run must show for the answer to be true (any
    /// scenario expectation: `PeakReservedOver("4GiB")`, `AllocatedFlat`, …).
    #[serde(default)]
    pub check: Vec<Expectation>,
    /// The run's figures against another scenario's run.
    #[serde(default)]
    pub compare: Vec<Comparison>,
    /// Figures of the run no scenario expectation states.
    #[serde(default)]
    pub figures: Vec<Figure>,
    /// Sizes the part's text (or its scenario's narration) states, each
    /// with the figure of the run it states: `Says("870.36 MiB",
    /// PeakAllocated)`. Every other size the text states must be one the
    /// run shows (see `verify`).
    #[serde(default)]
    pub says: Vec<Says>,
}

/// A size as the text writes it, and which figure of the run it is.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Says(pub String, pub Quantity);

/// A figure of a run, as a lesson's text states it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub enum Quantity {
    PeakAllocated,
    PeakReserved,
    /// Allocated (reserved) at the moment the text is shown: a narration's
    /// own event, or the run's end for the lesson's text.
    Allocated,
    Reserved,
    /// Allocated at every iteration's end (each rounds to the figure).
    StepEndAllocated,
    /// The lowest and the highest allocated at an iteration's end.
    StepEndLow,
    StepEndHigh,
    /// What allocated at an iteration's end grows by from one iteration to
    /// the next (each step's growth rounds to the figure).
    StepGrowth,
    /// The highest allocated while this phase runs ("forward", …).
    PhasePeak(String),
    /// Inactive split bytes at the run's end (memory_summary's
    /// "Non-releasable memory").
    InactiveSplit,
    /// The device memory never the allocator's (the CUDA context).
    Context,
    /// The device's capacity.
    Capacity,
    /// The quantity in another scenario's run (a built-in's name or a file
    /// relative to the lesson file), read at that run's end.
    Of(String, Box<Quantity>),
    /// The first less the second.
    Minus(Box<Quantity>, Box<Quantity>),
}

/// A figure of the part's run against a size.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub enum Figure {
    /// Allocated at every iteration's end (where a between-steps
    /// `memory_allocated()` reads it) is under this size.
    BetweenStepsAllocatedUnder(Size),
    BetweenStepsAllocatedOver(Size),
    /// The device memory never the allocator's (the CUDA context and other
    /// processes: what nvidia-smi adds to reserved) is over this size.
    ContextOver(Size),
    ContextUnder(Size),
    /// At the run's end, `memory_stats()`'s active bytes equal its allocated
    /// bytes (no freed block waits on another stream).
    ActiveEqualsAllocated,
    /// At the run's end, inactive split bytes (memory_summary's
    /// "Non-releasable memory": free blocks in segments that also hold live
    /// ones) are over this size.
    InactiveSplitOver(Size),
    /// Allocated first reaches the run's peak in this phase: "forward",
    /// "backward", "optimizer", "eval", "setup" or "user".
    PeakIn(String),
    /// The run maps pages into expandable segments, and every page it maps
    /// or unmaps is at a segment's end: segments grow and shrink at their
    /// ends, and nothing inside one (a hole between live blocks) is
    /// unmapped or mapped again.
    PagesOnlyAtSegmentEnds,
    /// At the run's end, the free blocks that lie between live blocks of
    /// a segment (holes, not the free end of a segment) are over this size.
    HolesOver(Size),
}

/// This part's run against another scenario's (a built-in's name or a file
/// relative to the lesson file).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub enum Comparison {
    PeakAllocatedAbove(String),
    PeakAllocatedBelow(String),
    /// The same peak allocated, to the byte.
    PeakAllocatedSame(String),
    PeakReservedAbove(String),
    PeakReservedBelow(String),
}

impl Quantity {
    /// The other scenarios this quantity reads (its `Of` names).
    pub fn others(&self) -> Vec<&str> {
        match self {
            Quantity::Of(name, q) => std::iter::once(name.as_str()).chain(q.others()).collect(),
            Quantity::Minus(a, b) => a.others().into_iter().chain(b.others()).collect(),
            _ => Vec::new(),
        }
    }
}

impl Comparison {
    pub fn other(&self) -> &str {
        match self {
            Comparison::PeakAllocatedAbove(s)
            | Comparison::PeakAllocatedBelow(s)
            | Comparison::PeakAllocatedSame(s)
            | Comparison::PeakReservedAbove(s)
            | Comparison::PeakReservedBelow(s) => s,
        }
    }
}
