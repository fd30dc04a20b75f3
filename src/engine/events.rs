//! What the engine reports: allocator trace entries plus markers
//! (DESIGN.md "one event model").

use std::sync::Arc;

use crate::alloc::AllocEvent;

use super::error::ErrorKind;
use crate::trace::Phase;

#[derive(Debug, Clone)]
pub enum EngineEvent {
    /// One allocator trace entry, untouched.
    Alloc(AllocEvent),
    IterationBegin(u32),
    IterationEnd {
        iter: u32,
        allocated: u64,
        /// `requested_bytes.all.current`: unlike `allocated`, it does not
        /// depend on which cached block served a request.
        requested: u64,
        reserved: u64,
        peak_allocated: u64,
        /// The kernels' arithmetic and traffic in this iteration (boxed: it
        /// is larger than every other event).
        work: Box<crate::engine::work::WorkTally>,
    },
    PhaseBegin(Phase),
    PhaseEnd(Phase),
    /// A program step starts (index into the program's steps, its label).
    StepBegin {
        index: u32,
        label: &'static str,
    },
    OpBegin {
        name: &'static str,
        module: Arc<str>,
    },
    OpEnd,
    Error {
        kind: ErrorKind,
        message: String,
    },
    /// A Python warning the program would print (`warnings.warn`), once per run.
    Warning(&'static str),
}
