//! Running a scenario headless: the engine on this thread, every event into the
//! one event model, narration where it is due, the leak detector after each
//! iteration, and the figures the report and the expectations read.

use serde::Serialize;

use super::build::Built;
use super::events::{to_trace, user_warning};
use super::format::Scenario;
use super::narration::NarrationTracker;
use crate::alloc::{memory_summary, MemoryStats, SegmentInfo};
use crate::device::{AnyDevice, AnyLauncher, SimDevice};
use crate::engine::{Engine, EngineError, EngineEvent, LaunchStats, TagTable};
use crate::leak::Finding;
use crate::trace::{Event, Marker};

#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Run this many iterations instead of the scenario's.
    pub iterations: Option<u32>,
    /// Keep every event (for the TUI or an export); off for plain reports.
    pub record_events: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IterationPoint {
    pub iteration: u32,
    pub allocated: u64,
    /// Bytes the live tensors asked for (`requested_bytes.all.current`).
    pub requested: u64,
    pub reserved: u64,
    pub peak_allocated: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OomReport {
    /// The iteration it happened in (0 = setup).
    pub iteration: u32,
    pub requested: u64,
    /// PyTorch's message.
    pub message: String,
}

#[derive(Debug, Clone)]
pub struct RunResult {
    pub scenario: String,
    pub iterations_run: u32,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub oom: Option<OomReport>,
    /// Any other error that stopped the run (e.g. a second backward).
    pub error: Option<String>,
    /// Python warnings the program printed, each once.
    pub warnings: Vec<String>,
    pub per_iteration: Vec<IterationPoint>,
    pub findings: Vec<Finding>,
    pub narration: Vec<(u32, String)>,
    pub stats: MemoryStats,
    pub summary: String,
    pub events: Vec<Event>,
    /// The allocator's segments at the end.
    pub segments: Vec<SegmentInfo>,
    /// Decodes the tags of the run's events and blocks.
    pub tags: TagTable,
    /// Kernel launches, when the run had a launcher (a CUDA run).
    pub kernels: Option<LaunchStats>,
    /// Why a CUDA run launched no kernels (e.g. NVRTC missing).
    pub kernels_unavailable: Option<String>,
    /// A run on a real GPU: the card, and NVML's reading against the model.
    pub gpu: Option<GpuRun>,
}

/// What a run on a real GPU adds to the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuRun {
    /// e.g. `cuda:0 NVIDIA H100 80GB HBM3`.
    pub device: String,
    pub device_total: u64,
    /// The scenario's capacity the allocator was held to (None: the card's own).
    pub held_to: Option<u64>,
    /// NVML after the run, before the memory was given back.
    pub at_end: crate::device::reconcile::Reconciliation,
}

struct Collector {
    record: bool,
    events: Vec<Event>,
    narration: NarrationTracker,
    said: Vec<(u32, String)>,
    warnings: Vec<String>,
    iteration: u32,
    per_iteration: Vec<IterationPoint>,
}

impl Collector {
    fn push(&mut self, e: Event) {
        if let Event::Marker(Marker::Narration(text)) = &e {
            self.said.push((self.iteration, text.to_string()));
        }
        if self.record {
            self.events.push(e);
        }
    }

    fn take(&mut self, engine: &mut Engine) {
        for ev in engine.take_events() {
            match &ev {
                EngineEvent::IterationBegin(i) => self.iteration = *i,
                EngineEvent::Warning(text) => {
                    // Its own list in the report; a callout (in the events) for the UI.
                    self.warnings.push(user_warning(text));
                    if let (true, Some(t)) = (self.record, to_trace(&ev)) {
                        self.events.push(t);
                    }
                    continue;
                }
                EngineEvent::IterationEnd {
                    iter,
                    allocated,
                    requested,
                    reserved,
                    peak_allocated,
                } => self.per_iteration.push(IterationPoint {
                    iteration: *iter,
                    allocated: *allocated,
                    requested: *requested,
                    reserved: *reserved,
                    peak_allocated: *peak_allocated,
                }),
                _ => {}
            }
            if let Some(t) = to_trace(&ev) {
                let due = self.narration.after(&t);
                self.push(t);
                for n in due {
                    self.push(n);
                }
            }
        }
    }
}

pub fn run(scenario: &Scenario, built: &Built, opts: &RunOptions) -> RunResult {
    let device = Box::new(SimDevice::new(
        &scenario.device.name,
        built.engine.device_bytes,
        built.engine.device_overhead,
    ));
    run_on(scenario, built, opts, device)
}

/// [`run`] with memory from `device` (e.g. a real GPU via `crate::device::cuda`).
pub fn run_on(
    scenario: &Scenario,
    built: &Built,
    opts: &RunOptions,
    device: AnyDevice,
) -> RunResult {
    run_launching(scenario, built, opts, device, None)
}

/// [`run_on`] with kernels launched on the tensors through `launcher`
/// (`crate::device::kernels::Kernels` on a GPU): same allocator decisions.
pub fn run_launching(
    scenario: &Scenario,
    built: &Built,
    opts: &RunOptions,
    device: AnyDevice,
    launcher: Option<AnyLauncher>,
) -> RunResult {
    run_launching_with(scenario, built, opts, device, launcher, &mut |_| {})
}

/// [`run_launching`], calling `at_end` once the run is over and before the
/// engine (and the device memory it holds) is dropped: where a real GPU's
/// reading is taken against the allocator's state.
pub fn run_launching_with(
    scenario: &Scenario,
    built: &Built,
    opts: &RunOptions,
    device: AnyDevice,
    launcher: Option<AnyLauncher>,
    at_end: &mut dyn FnMut(&Engine),
) -> RunResult {
    let mut c = Collector {
        record: opts.record_events,
        events: Vec::new(),
        narration: NarrationTracker::new(&scenario.narration),
        said: Vec::new(),
        warnings: Vec::new(),
        iteration: 0,
        per_iteration: Vec::new(),
    };
    for n in c.narration.start() {
        c.push(n);
    }
    let mut result = RunResult {
        scenario: scenario.name.clone(),
        iterations_run: 0,
        peak_allocated: 0,
        peak_reserved: 0,
        oom: None,
        error: None,
        warnings: Vec::new(),
        per_iteration: Vec::new(),
        findings: Vec::new(),
        narration: Vec::new(),
        stats: MemoryStats::default(),
        summary: String::new(),
        events: Vec::new(),
        segments: Vec::new(),
        tags: TagTable::default(),
        kernels: None,
        kernels_unavailable: None,
        gpu: None,
    };
    let cfg = built.engine.clone();
    let mut engine =
        match Engine::new_launching(cfg, &built.model, &built.optimizer, device, launcher) {
            Ok(e) => e,
            Err(err) => {
                record_error(&mut result, err, 0);
                return result;
            }
        };
    let program = &built.program;
    let iterations = opts.iterations.unwrap_or(program.iterations);
    let mut detector = crate::leak::Detector::for_engine(&engine).with_program(program);
    let mut failed = None;
    for (i, step) in program.setup.iter().enumerate() {
        if let Err(err) = engine.run_step(step, i as u32, program) {
            failed = Some(err);
            break;
        }
    }
    c.take(&mut engine);
    if failed.is_none() {
        for _ in 0..iterations {
            let r = engine.run_iteration(program);
            c.take(&mut engine);
            if let Err(err) = r {
                detector.observe_error(&err, &engine.live_state());
                failed = Some(err);
                break;
            }
            result.iterations_run += 1;
            let (allocated, reserved) = (engine.allocated_bytes(), engine.reserved_bytes());
            detector.observe(&engine.live_state(), allocated, reserved);
        }
    }
    if let Some(err) = failed {
        let message = err.message();
        c.push(Event::Marker(Marker::Error(message.as_str().into())));
        record_error(&mut result, err, c.iteration);
    }
    for n in c.narration.end() {
        c.push(n);
    }
    if engine.has_launcher() {
        engine.sync_launches();
        result.kernels = Some(engine.launch_stats().clone());
    }
    at_end(&engine);
    let stats = engine.allocator().stats().clone();
    result.peak_allocated = stats.peak_allocated_bytes();
    result.peak_reserved = stats.peak_reserved_bytes();
    result.summary = memory_summary(&stats, 0, false);
    result.stats = stats;
    result.findings = detector.findings().to_vec();
    result.per_iteration = c.per_iteration;
    result.narration = c.said;
    result.warnings = c.warnings;
    result.events = c.events;
    result.segments = engine.allocator().snapshot();
    result.tags = engine.tag_table().clone();
    result
}

fn record_error(result: &mut RunResult, err: EngineError, iteration: u32) {
    match err {
        EngineError::OutOfMemory { message, requested } => {
            result.oom = Some(OomReport {
                iteration,
                requested,
                message,
            })
        }
        other => result.error = Some(other.message()),
    }
}
