//! Narration: text that appears when its moment comes, as a `Narration` marker
//! in the event stream (the TUI shows it as a callout, the report prints it).

use std::sync::Arc;

use super::format::{At, Narration};
use crate::alloc::Action;
use crate::trace::{Event, Marker};
use crate::units::escape_controls;

/// Watches the events of a run and says which narration is due.
#[derive(Debug, Clone)]
pub struct NarrationTracker {
    pending: Vec<(At, Arc<str>)>,
    iteration: u32,
    allocated: u64,
    reserved: u64,
}

impl NarrationTracker {
    pub fn new(narration: &[Narration]) -> NarrationTracker {
        NarrationTracker {
            pending: narration
                .iter()
                // A scenario file's text is shown, never sent to the terminal.
                .map(|n| (n.at.clone(), Arc::from(escape_controls(&n.text).as_ref())))
                .collect(),
            iteration: 0,
            allocated: 0,
            reserved: 0,
        }
    }

    /// Narration due at the start, before any event.
    pub fn start(&mut self) -> Vec<Event> {
        self.take(|at| matches!(at, At::Start))
    }

    /// Narration due at the end of the run.
    pub fn end(&mut self) -> Vec<Event> {
        self.take(|at| matches!(at, At::End))
    }

    /// Narration due right after `event`.
    pub fn after(&mut self, event: &Event) -> Vec<Event> {
        let mut oom = false;
        let mut released = false;
        let mut op: Option<Arc<str>> = None;
        let mut phase = None;
        match event {
            Event::Alloc(a) => match a.action {
                Action::Alloc => self.allocated += a.block_size,
                Action::FreeRequested => {
                    self.allocated = self.allocated.saturating_sub(a.block_size)
                }
                Action::SegmentAlloc | Action::SegmentMap => self.reserved += a.size,
                Action::SegmentFree | Action::SegmentUnmap => {
                    self.reserved = self.reserved.saturating_sub(a.size);
                    released = true;
                }
                Action::Oom => oom = true,
                Action::FreeCompleted | Action::Snapshot | Action::Annotate | Action::Other => {}
            },
            Event::Marker(Marker::IterationBegin(i)) => self.iteration = *i,
            Event::Marker(Marker::OpBegin { name, .. }) => op = Some(name.clone()),
            Event::Marker(Marker::PhaseBegin(p)) => phase = Some(p.name()),
            Event::Marker(_) => {}
        }
        let (it, allocated, reserved) = (self.iteration, self.allocated, self.reserved);
        self.take(|at| match at {
            At::Iteration(n) => matches!(event, Event::Marker(Marker::IterationBegin(i)) if i == n),
            At::Phase(n, p) => *n == it && phase.is_some_and(|ph| ph.eq_ignore_ascii_case(p)),
            At::Op(name) => op.as_deref() == Some(name.as_str()),
            At::ReservedExceeds(s) => reserved > s.0,
            At::AllocatedExceeds(s) => allocated > s.0,
            At::SegmentReleased => released,
            At::Oom => oom,
            At::Start | At::End => false,
        })
    }

    fn take(&mut self, due: impl Fn(&At) -> bool) -> Vec<Event> {
        let mut out = Vec::new();
        self.pending.retain(|(at, text)| {
            if due(at) {
                out.push(Event::Marker(Marker::Narration(text.clone())));
                false
            } else {
                true
            }
        });
        out
    }
}
