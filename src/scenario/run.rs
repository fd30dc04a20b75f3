//! One scenario run, stepped: the engine, the narration tracker and the leak
//! detector together. Each [`ScenarioRun::advance`] runs one unit of the
//! program (the setup, one iteration, then the end) and hands back the events
//! it made in the one event model, with narration where it is due. The
//! headless report (`headless.rs`) and the UI's producer thread
//! (`producers::scenario`) both drive this loop, so a failure, a warning or a
//! finding means the same thing in both.

use serde::Serialize;

use super::events::{to_trace, user_warning};
use super::format::Narration;
use super::narration::NarrationTracker;
use crate::alloc::MemoryStats;
use crate::engine::{Engine, EngineError, EngineEvent, Program};
use crate::leak::{Detector, Finding, OomAnswer};
use crate::trace::{Event, Marker};

/// Device figures at the end of one iteration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IterationPoint {
    pub iteration: u32,
    pub allocated: u64,
    /// Bytes the live tensors asked for (`requested_bytes.all.current`).
    pub requested: u64,
    pub reserved: u64,
    pub peak_allocated: u64,
    /// The kernels' arithmetic and traffic (the report shows it as a time estimate).
    #[serde(skip)]
    pub work: crate::engine::work::WorkTally,
}

/// The part of the program an [`Advanced`] ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Building the model was part of it; then the setup steps.
    Setup,
    /// Iterations count from 1.
    Iteration(u32),
    /// The failure (if any) and the closing narration.
    End,
}

/// What one [`ScenarioRun::advance`] did.
#[derive(Debug, Clone)]
pub struct Advanced {
    pub unit: Unit,
    pub events: Vec<Event>,
}

/// A scenario's program running on an engine. See the module docs.
pub struct ScenarioRun<'a> {
    program: &'a Program,
    /// `None` when the model could not be built (its error is the failure).
    engine: Option<Engine>,
    narration: NarrationTracker,
    detector: Detector,
    next: Option<Unit>,
    iterations: u32,
    iterations_run: u32,
    /// The iteration of the latest event (narration and failures are dated by it).
    iteration: u32,
    failure: Option<EngineError>,
    said: Vec<(u32, String)>,
    warnings: Vec<String>,
    per_iteration: Vec<IterationPoint>,
}

impl<'a> ScenarioRun<'a> {
    /// A run of `iterations` iterations of `program` on `engine` (the
    /// result of building it: a model that does not fit is the run's failure).
    pub fn new(
        engine: Result<Engine, EngineError>,
        program: &'a Program,
        narration: &[Narration],
        iterations: u32,
    ) -> ScenarioRun<'a> {
        let (engine, failure) = match engine {
            Ok(e) => (Some(e), None),
            Err(err) => (None, Some(err)),
        };
        let detector = engine.as_ref().map_or_else(Detector::default, |e| {
            Detector::for_engine(e).with_program(program)
        });
        ScenarioRun {
            program,
            engine,
            narration: NarrationTracker::new(narration),
            detector,
            next: Some(Unit::Setup),
            iterations,
            iterations_run: 0,
            iteration: 0,
            failure,
            said: Vec::new(),
            warnings: Vec::new(),
            per_iteration: Vec::new(),
        }
    }

    /// Run the next unit; `None` once the end has been handed out.
    pub fn advance(&mut self) -> Option<Advanced> {
        let unit = self.next?;
        let mut events = Vec::new();
        self.next = match unit {
            Unit::Setup => {
                let start = self.narration.start();
                self.record_narration(&start);
                events.extend(start);
                self.run_setup(&mut events);
                self.after_setup()
            }
            Unit::Iteration(k) => {
                self.run_iteration(&mut events);
                match self.failure {
                    Some(_) => Some(Unit::End),
                    None if k < self.iterations => Some(Unit::Iteration(k + 1)),
                    None => Some(Unit::End),
                }
            }
            Unit::End => {
                if self.failure.is_none() {
                    // A `with torch.autocast(...)` the setup opened around the
                    // loop ends after it (its weight-cast cache is freed).
                    if let Some(e) = self.engine.as_mut() {
                        e.leave_autocast();
                    }
                    self.collect(&mut events);
                }
                self.detector.finish();
                if let Some(err) = &self.failure {
                    // A failure inside the scenario (an OOM, a second
                    // backward) is part of the story, drawn where it happened;
                    // an OOM with the detector's answer after it.
                    let mut text = err.message();
                    if let Some(a) = self.detector.oom_answer() {
                        text.push_str("\n\n");
                        text.push_str(&a.summary());
                        text.push_str("\n\n");
                        text.push_str(&a.lines().join("\n"));
                    }
                    events.push(Event::Marker(Marker::Error(text.into())));
                }
                let end = self.narration.end();
                self.record_narration(&end);
                events.extend(end);
                None
            }
        };
        Some(Advanced { unit, events })
    }

    fn after_setup(&self) -> Option<Unit> {
        if self.failure.is_some() || self.iterations == 0 {
            Some(Unit::End)
        } else {
            Some(Unit::Iteration(1))
        }
    }

    fn run_setup(&mut self, events: &mut Vec<Event>) {
        let Some(engine) = self.engine.as_mut() else {
            return;
        };
        for (index, step) in crate::engine::numbered(&self.program.setup, 0) {
            if let Err(err) = engine.run_step(step, index, self.program) {
                self.failure = Some(err);
                break;
            }
        }
        self.collect(events);
        self.observe();
    }

    fn run_iteration(&mut self, events: &mut Vec<Event>) {
        let Some(engine) = self.engine.as_mut() else {
            return;
        };
        let result = engine.run_iteration(self.program);
        self.collect(events);
        match result {
            Ok(()) => {
                self.iterations_run += 1;
                self.observe();
            }
            Err(err) => {
                self.failure = Some(err);
                self.observe();
            }
        }
    }

    /// The detector's look at the engine after a unit: a completed iteration
    /// is an observation, a failure is evidence (a setup that completed is
    /// not an iteration boundary).
    fn observe(&mut self) {
        let Some(engine) = &self.engine else { return };
        match &self.failure {
            Some(err) => {
                self.detector.observe_error(err, &engine.held_state());
            }
            None if engine.iteration() > 0 => {
                let (allocated, reserved) = (engine.allocated_bytes(), engine.reserved_bytes());
                self.detector
                    .observe(&engine.held_state(), allocated, reserved);
            }
            None => {}
        }
    }

    /// The engine's events since the last unit, in the one event model, with
    /// the narration they make due after each.
    fn collect(&mut self, out: &mut Vec<Event>) {
        let Some(engine) = self.engine.as_mut() else {
            return;
        };
        for ev in engine.take_events() {
            if let EngineEvent::StepBegin {
                label: "empty_cache",
                ..
            } = &ev
            {
                // The requests' replay (the detector's what-ifs) calls it here too.
                self.detector.record(&Event::Marker(Marker::EmptyCache));
            }
            match &ev {
                EngineEvent::IterationBegin(i) => self.iteration = *i,
                EngineEvent::Warning(text) => self.warnings.push(user_warning(text)),
                EngineEvent::IterationEnd {
                    iter,
                    allocated,
                    requested,
                    reserved,
                    peak_allocated,
                    work,
                } => self.per_iteration.push(IterationPoint {
                    iteration: *iter,
                    allocated: *allocated,
                    requested: *requested,
                    reserved: *reserved,
                    peak_allocated: *peak_allocated,
                    work: **work,
                }),
                _ => {}
            }
            if let Some(t) = to_trace(&ev) {
                self.detector.record(&t);
                let due = self.narration.after(&t);
                out.push(t);
                self.record_narration(&due);
                out.extend(due);
            }
        }
    }

    fn record_narration(&mut self, events: &[Event]) {
        for e in events {
            if let Event::Marker(Marker::Narration(text)) = e {
                self.said.push((self.iteration, text.to_string()));
            }
        }
    }

    /// The engine, unless the model could not be built.
    pub fn engine(&self) -> Option<&Engine> {
        self.engine.as_ref()
    }

    pub fn engine_mut(&mut self) -> Option<&mut Engine> {
        self.engine.as_mut()
    }

    /// The engine, which still holds its memory (a real GPU's too).
    pub fn into_engine(self) -> Option<Engine> {
        self.engine
    }

    /// `memory_stats()` now (empty when the model could not be built).
    pub fn stats(&self) -> MemoryStats {
        self.engine
            .as_ref()
            .map(|e| e.allocator().stats().clone())
            .unwrap_or_default()
    }

    /// The leak detector's findings as of the last unit.
    pub fn findings(&self) -> &[Finding] {
        self.detector.findings()
    }

    /// At an OOM, the detector's answer: holders, growth, what-ifs.
    pub fn oom_answer(&self) -> Option<&OomAnswer> {
        self.detector.oom_answer()
    }

    /// What stopped the run, if anything did.
    pub fn failure(&self) -> Option<&EngineError> {
        self.failure.as_ref()
    }

    /// The iteration the latest event belongs to (0: setup).
    pub fn iteration(&self) -> u32 {
        self.iteration
    }

    pub fn iterations_run(&self) -> u32 {
        self.iterations_run
    }

    /// Narration said so far, with the iteration it was said in.
    pub fn said(&self) -> &[(u32, String)] {
        &self.said
    }

    /// Python warnings the program printed, each once.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    pub fn per_iteration(&self) -> &[IterationPoint] {
        &self.per_iteration
    }

    /// Run every remaining unit; the events, if `keep` (the report's own
    /// figures do not need them).
    pub fn run_to_end(&mut self, keep: bool) -> Vec<Event> {
        let mut events = Vec::new();
        while let Some(a) = self.advance() {
            if keep {
                events.extend(a.events);
            }
        }
        events
    }
}
