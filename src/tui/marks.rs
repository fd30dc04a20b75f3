//! Per-kind index of the marks the timeline draws, kept up to date as events
//! arrive, so each column finds its mark with a binary search instead of
//! walking every op mark in view.

use crate::alloc::Action;
use crate::trace::{Event, Marker, Phase, Timeline};

/// What a timeline column shows on its mark row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Glyph {
    Oom,
    Error,
    Narration,
    Iteration,
    Phase(Phase),
}

impl Glyph {
    pub fn symbol(self) -> &'static str {
        match self {
            Glyph::Oom => "X",
            Glyph::Error => "E",
            Glyph::Narration => "*",
            Glyph::Iteration => "|",
            Glyph::Phase(Phase::Forward) => "f",
            Glyph::Phase(Phase::Backward) => "b",
            Glyph::Phase(Phase::Optimizer) => "o",
            Glyph::Phase(Phase::Eval) => "e",
            Glyph::Phase(Phase::Setup | Phase::User) => "·",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MarkIndex {
    pub oom: Vec<usize>,
    pub error: Vec<usize>,
    pub narration: Vec<usize>,
    /// `IterationBegin` events with their iteration number.
    pub iteration: Vec<(usize, u32)>,
    pub phase: Vec<(usize, Phase)>,
    /// `Step` markers with the scenario step's number (the code pane's line).
    pub step: Vec<(usize, u32)>,
    /// Events indexed so far.
    pub seen: usize,
}

impl MarkIndex {
    /// Index the events that arrived since the last call.
    pub fn update(&mut self, tl: &Timeline) {
        for (i, e) in tl.events().range(self.seen..tl.len()).enumerate() {
            let i = self.seen + i;
            match e {
                Event::Alloc(a) if a.action == Action::Oom => self.oom.push(i),
                Event::Alloc(_) => {}
                Event::Marker(Marker::Error(_)) => self.error.push(i),
                Event::Marker(Marker::Narration(_)) => self.narration.push(i),
                Event::Marker(Marker::IterationBegin(k)) => self.iteration.push((i, k)),
                Event::Marker(Marker::PhaseBegin(p)) => self.phase.push((i, p)),
                Event::Marker(Marker::Step(k)) => self.step.push((i, k)),
                Event::Marker(_) => {}
            }
        }
        self.seen = tl.len();
    }

    /// The most important mark in events `[a, b)`.
    pub fn glyph_in(&self, a: usize, b: usize) -> Option<Glyph> {
        let any = |v: &[usize]| {
            let i = v.partition_point(|x| *x < a);
            v.get(i).is_some_and(|x| *x < b)
        };
        if any(&self.oom) {
            return Some(Glyph::Oom);
        }
        if any(&self.error) {
            return Some(Glyph::Error);
        }
        if any(&self.narration) {
            return Some(Glyph::Narration);
        }
        let i = self.iteration.partition_point(|x| x.0 < a);
        if self.iteration.get(i).is_some_and(|x| x.0 < b) {
            return Some(Glyph::Iteration);
        }
        let i = self.phase.partition_point(|x| x.0 < a);
        self.phase
            .get(i)
            .filter(|x| x.0 < b)
            .map(|x| Glyph::Phase(x.1))
    }

    /// The scenario step running after the first `pos` events: the last
    /// `Step` marker among them.
    pub fn step_at(&self, pos: usize) -> Option<u32> {
        let k = self.step.partition_point(|x| x.0 < pos);
        k.checked_sub(1).map(|k| self.step[k].1)
    }

    /// Event range of iteration `k`: its begin up to the next iteration mark.
    pub fn iteration_begin(&self, k: u32) -> Option<usize> {
        self.iteration.iter().find(|x| x.1 == k).map(|x| x.0)
    }
}
