//! The one event model every view and report reads (DESIGN.md "One event model"):
//! the allocator's trace entries plus markers for iterations, phases, ops,
//! narration and annotations. A scenario run and an imported snapshot both
//! become a sequence of these.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::alloc::AllocEvent;

/// Where in the training step an event happens (engine.md §11.1): the
/// engine tags every request with it, and phase markers carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Model construction and other one-time work before the loop.
    Setup,
    Forward,
    Backward,
    Optimizer,
    /// A forward run with the model in eval mode or with grad disabled.
    Eval,
    /// Scenario-level work outside the model (bookkeeping, buffers, `empty_cache`).
    User,
}

impl Phase {
    pub const ALL: [Phase; 6] = [
        Phase::Setup,
        Phase::Forward,
        Phase::Backward,
        Phase::Optimizer,
        Phase::Eval,
        Phase::User,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Setup => "setup",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
            Phase::Eval => "eval",
            Phase::User => "user",
        }
    }
}

/// Our own markers between allocator entries.
#[derive(Debug, Clone, PartialEq)]
pub enum Marker {
    IterationBegin(u32),
    IterationEnd(u32),
    PhaseBegin(Phase),
    PhaseEnd(Phase),
    OpBegin {
        name: Arc<str>,
        module: Arc<str>,
    },
    OpEnd,
    /// A scenario step starts: its number ([`crate::engine::numbered`]),
    /// which the code pane highlights.
    Step(u32),
    Narration(Arc<str>),
    /// A `record_function` region of an imported snapshot (`external_annotations`).
    Annotation {
        name: Arc<str>,
        start: bool,
    },
    EmptyCache,
    /// A failure inside the run (an OOM, a bad step), with its message.
    Error(Arc<str>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Alloc(AllocEvent),
    Marker(Marker),
}

impl From<AllocEvent> for Event {
    fn from(e: AllocEvent) -> Event {
        Event::Alloc(e)
    }
}

impl From<Marker> for Event {
    fn from(m: Marker) -> Event {
        Event::Marker(m)
    }
}
