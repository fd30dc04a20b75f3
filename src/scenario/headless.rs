//! A scenario run to its end on this thread ([`ScenarioRun`] driven without
//! pause), gathered into the figures the report and the expectations read.

use serde::Serialize;

use super::build::Built;
use super::conditions::Conditions;
use super::format::Scenario;
use super::run::{IterationPoint, ScenarioRun};
use crate::alloc::{memory_summary, MemoryStats, SegmentInfo};
use crate::device::{AnyDevice, AnyLauncher, SimDevice};
use crate::engine::estimate::{estimate, ComputeEstimate};
use crate::engine::{Engine, EngineError, LaunchStats, TagTable};
use crate::leak::Finding;
use crate::trace::Event;

#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Run this many iterations instead of the scenario's.
    pub iterations: Option<u32>,
    /// Keep every event (for an export); off for plain reports.
    pub record_events: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OomReport {
    /// The iteration it happened in (0 = setup).
    pub iteration: u32,
    pub requested: u64,
    /// PyTorch's message.
    pub message: String,
    /// What held the memory, what grew, and what a setting would have
    /// changed (the leak detector's answer; never "none found").
    pub answer: Option<crate::leak::OomAnswer>,
}

#[derive(Debug, Clone)]
pub struct RunResult {
    pub scenario: String,
    /// What it ran under.
    pub conditions: Conditions,
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

impl RunResult {
    /// The last completed iteration's work as a time on the scenario's GPU
    /// (None without iterations or without a named GPU).
    pub fn compute_estimate(&self) -> Option<(u32, ComputeEstimate)> {
        last_iteration_estimate(&self.per_iteration, &self.conditions)
    }
}

/// The estimate of the last of `points` on the GPU `conditions` name: one
/// rule for the report and for the live run's Stats panel.
pub fn last_iteration_estimate(
    points: &[IterationPoint],
    conditions: &Conditions,
) -> Option<(u32, ComputeEstimate)> {
    let gpu = conditions.gpu.as_ref()?;
    let last = points.last()?;
    (!last.work.is_empty()).then(|| (last.iteration, estimate(&last.work, gpu)))
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

pub fn run(scenario: &Scenario, built: &Built, opts: &RunOptions) -> RunResult {
    let device = Box::new(
        SimDevice::new(
            &built.conditions.device_name,
            built.engine.device_bytes,
            built.engine.device_overhead,
        )
        .placed(built.engine.placement),
    );
    run_launching(scenario, built, opts, device, None)
}

/// [`run`] with memory from `device` (e.g. a real GPU via
/// `crate::device::cuda`) and kernels launched on the tensors through
/// `launcher` (`crate::device::kernels::Kernels` on a GPU): the same
/// allocator decisions.
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
    run_inner(scenario, built, opts, device, launcher, at_end, &mut |_| {})
}

/// [`run`], handing `observe` each unit's events as they are made, whether
/// or not the result keeps them (a sweep reads the peak's make-up from them).
pub fn run_observed(
    scenario: &Scenario,
    built: &Built,
    opts: &RunOptions,
    observe: &mut dyn FnMut(&[Event]),
) -> RunResult {
    let device = Box::new(
        SimDevice::new(
            &built.conditions.device_name,
            built.engine.device_bytes,
            built.engine.device_overhead,
        )
        .placed(built.engine.placement),
    );
    run_inner(scenario, built, opts, device, None, &mut |_| {}, observe)
}

fn run_inner(
    scenario: &Scenario,
    built: &Built,
    opts: &RunOptions,
    device: AnyDevice,
    launcher: Option<AnyLauncher>,
    at_end: &mut dyn FnMut(&Engine),
    observe: &mut dyn FnMut(&[Event]),
) -> RunResult {
    let engine = Engine::new_launching(
        built.engine.clone(),
        &built.model,
        &built.optimizer,
        device,
        launcher,
    );
    let iterations = opts.iterations.unwrap_or(built.program.iterations);
    let mut run = ScenarioRun::new(engine, &built.program, &scenario.narration, iterations);
    let mut events = Vec::new();
    while let Some(unit) = run.advance() {
        observe(&unit.events);
        if opts.record_events {
            events.extend(unit.events);
        }
    }
    let mut result = RunResult {
        scenario: scenario.name.clone(),
        conditions: built.conditions.clone(),
        iterations_run: run.iterations_run(),
        peak_allocated: 0,
        peak_reserved: 0,
        oom: None,
        error: None,
        warnings: run.warnings().to_vec(),
        per_iteration: run.per_iteration().to_vec(),
        findings: run.findings().to_vec(),
        narration: run.said().to_vec(),
        stats: MemoryStats::default(),
        summary: String::new(),
        events,
        segments: Vec::new(),
        tags: TagTable::default(),
        kernels: None,
        kernels_unavailable: None,
        gpu: None,
    };
    if let Some(err) = run.failure() {
        record_error(&mut result, err, run.iteration());
    }
    if let Some(o) = &mut result.oom {
        o.answer = run.oom_answer().cloned();
    }
    if let Some(engine) = run.engine_mut() {
        if engine.has_launcher() {
            engine.sync_launches();
            result.kernels = Some(engine.launch_stats().clone());
        }
        at_end(engine);
        let stats = engine.allocator().stats().clone();
        result.peak_allocated = stats.peak_allocated_bytes();
        result.peak_reserved = stats.peak_reserved_bytes();
        result.summary = memory_summary(&stats, 0, false);
        result.stats = stats;
        result.segments = engine.allocator().snapshot();
        result.tags = engine.tag_table().clone();
    }
    result
}

fn record_error(result: &mut RunResult, err: &EngineError, iteration: u32) {
    match err {
        EngineError::OutOfMemory { message, requested } => {
            result.oom = Some(OomReport {
                iteration,
                requested: *requested,
                message: message.clone(),
                answer: None,
            })
        }
        other => result.error = Some(other.message()),
    }
}
