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
    /// `optimizer.zero_grad()`: the engine counts it in the optimizer's
    /// phase, but it runs before the forward, so it is marked on its own
    /// (a room asks why "the optimizer" runs before the forward).
    ZeroGrad,
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
            Glyph::ZeroGrad => "z",
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
    /// The phase begins (in `phase`) whose first op is `zero_grad`.
    pub zero_grad: Vec<usize>,
    /// An optimizer phase began here and its first op has not come yet.
    optimizer_open: Option<usize>,
    /// `Step` markers with the scenario step's number (the code pane's line).
    pub step: Vec<(usize, u32)>,
    /// Events indexed so far.
    pub seen: usize,
}

impl MarkIndex {
    /// Index the events that arrived since the last call.
    pub fn update(&mut self, tl: &Timeline) {
        for (i, e) in tl.events().markers_and_ooms(self.seen..tl.len()) {
            match e {
                Event::Alloc(a) if a.action == Action::Oom => self.oom.push(i),
                Event::Alloc(_) => {}
                Event::Marker(Marker::Error(_)) => self.error.push(i),
                Event::Marker(Marker::Narration(_)) => self.narration.push(i),
                Event::Marker(Marker::IterationBegin(k)) => self.iteration.push((i, k)),
                Event::Marker(Marker::PhaseBegin(p)) => {
                    self.phase.push((i, p));
                    self.optimizer_open = (p == Phase::Optimizer).then_some(i);
                }
                Event::Marker(Marker::OpBegin { name, .. }) => {
                    if let Some(at) = self.optimizer_open.take() {
                        if name.as_ref() == "zero_grad" {
                            self.zero_grad.push(at);
                        }
                    }
                }
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
            .map(|x| self.phase_glyph(*x))
    }

    /// A phase begin's glyph: `zero_grad` apart from the optimizer's step.
    pub fn phase_glyph(&self, (at, phase): (usize, Phase)) -> Glyph {
        if self.zero_grad.binary_search(&at).is_ok() {
            Glyph::ZeroGrad
        } else {
            Glyph::Phase(phase)
        }
    }

    /// A phase begin's name for the status line.
    pub fn phase_name(&self, (at, phase): (usize, Phase)) -> &'static str {
        match self.phase_glyph((at, phase)) {
            Glyph::ZeroGrad => "zero_grad",
            _ => phase.name(),
        }
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
