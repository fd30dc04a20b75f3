//! A scenario running live for the UI: [`ScenarioRun`], the loop the
//! headless report also drives, stepped on a thread of its own. Events go out
//! as each unit (the setup, an iteration, the end) completes, followed by the
//! leak detector's findings and `memory_stats()`; a restart starts over. The
//! thread never blocks on the UI; the UI never blocks on it.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use super::source::{
    EngineCommand, RunMsg, ScenarioMsg, ScenarioStep, SiteKind, Source, SourceMsg, TagDescription,
    TagInfo,
};
use crate::alloc::Tag;
use crate::device::{nvml, AnyDevice, AnyLauncher, GpuUnavailable, PciAddress};
use crate::engine::{Engine, EngineError, TagTable};
use crate::scenario::{
    last_iteration_estimate, Built, Listing, Scenario, ScenarioRun, StepSites, Unit,
};

/// The engine's tag table, shared with the UI and refreshed by the run, and
/// where the scenario's steps are written.
struct EngineTags {
    table: RwLock<TagTable>,
    steps: Arc<StepSites>,
}

impl EngineTags {
    fn step(&self, index: u32) -> ScenarioStep {
        match self.steps.get(index) {
            Some(site) => ScenarioStep {
                location: self.steps.location(site),
                statement: site.statement.clone(),
            },
            None => ScenarioStep {
                location: self.steps.file.to_string(),
                statement: "made while the model and optimizer were built, before the first step"
                    .into(),
            },
        }
    }
}

impl TagInfo for EngineTags {
    fn describe(&self, tag: Tag) -> Option<TagDescription> {
        let table = self.table.read().ok()?;
        let t = table.info(tag)?;
        Some(TagDescription {
            category: Some(t.category),
            op: Some(t.op.to_string()),
            module: (!t.module.is_empty()).then(|| t.module.to_string()),
            iteration: Some(t.iteration),
            frames: Vec::new(),
            step: Some(self.step(t.step)),
        })
    }

    /// The engine's op and module: a simulated run has no Python stack to
    /// take a line from.
    fn site(&self, tag: Tag, _addr: u64) -> Option<Arc<str>> {
        let table = self.table.read().ok()?;
        let t = table.info(tag)?;
        Some(if t.module.is_empty() {
            Arc::from(t.op)
        } else {
            Arc::from(format!("{} in {}", t.op, t.module))
        })
    }

    fn site_kind(&self) -> SiteKind {
        SiteKind::EngineOp
    }
}

/// How long the producer waits after each iteration, so a live run unfolds at
/// a pace a person can follow (the UI's own playback speed still applies).
pub const ITERATION_PACE: Duration = Duration::from_millis(120);

enum Ended {
    Restart,
    /// The run is over; its engine, if it started, still holds its memory,
    /// so a real GPU keeps what the map shows until a restart or quit.
    Done(Option<Box<Engine>>),
    UiGone,
}

/// Opens the real GPU a run allocates on, with the kernel launcher for it
/// when there is one; called once per run (a restart opens it again), on the
/// engine's thread.
pub type DeviceOpener =
    Arc<dyn Fn() -> Result<(AnyDevice, Option<AnyLauncher>), GpuUnavailable> + Send + Sync>;

/// A real GPU for [`scenario_source_on`]: its CUDA ordinal (also NVML's
/// index for it) and how to open it.
#[derive(Clone)]
pub struct RealGpu {
    pub ordinal: u32,
    /// Where it sits on the PCI bus: how NVML's reading of it is found.
    pub pci: Option<PciAddress>,
    pub open: DeviceOpener,
}

/// Start `scenario` on its own thread; the UI reads it as a [`Source`].
pub fn scenario_source(scenario: Scenario, built: Built, pace: Duration) -> Source {
    scenario_source_on(scenario, built, pace, None)
}

/// [`scenario_source`] with memory from a real GPU instead of the simulated one.
pub fn scenario_source_on(
    scenario: Scenario,
    built: Built,
    pace: Duration,
    gpu: Option<RealGpu>,
) -> Source {
    let (tx, rx) = flume::unbounded();
    let (cmd_tx, cmd_rx) = flume::unbounded();
    let tags = Arc::new(EngineTags {
        table: RwLock::new(TagTable::new()),
        steps: built.steps.clone(),
    });
    let shared = tags.clone();
    let capacity = built.engine.device_bytes;
    let overhead = built.engine.device_overhead;
    let conditions = built.conditions.clone();
    let listing = Arc::new(Listing::new(&built.program, built.steps.clone()));
    let on = gpu.as_ref().map(|g| (g.ordinal, g.pci));
    let name = format!("scenario {}", scenario.name);
    let spawned = std::thread::Builder::new().name(name).spawn(move || loop {
        match run_once(&scenario, &built, gpu.as_ref(), &tx, &cmd_rx, &shared, pace) {
            Ended::Restart => {
                if tx.send(SourceMsg::Run(RunMsg::Restarted)).is_err() {
                    return;
                }
            }
            Ended::UiGone => return,
            Ended::Done(held) => {
                // Only a restart matters to a finished scenario.
                let restart = cmd_rx.iter().find(|c| *c == EngineCommand::Restart);
                drop(held);
                if restart.is_none() || tx.send(SourceMsg::Run(RunMsg::Restarted)).is_err() {
                    return;
                }
            }
        }
    });
    let mut source = Source::new(rx, Some(cmd_tx))
        .with_capacity(capacity)
        .with_tags(tags)
        .with_conditions(conditions)
        .with_listing(listing);
    source = match on {
        Some((n, pci)) => source.on_cuda(n, pci),
        None => source.with_overhead(overhead),
    };
    if let Err(e) = spawned {
        return Source::from_messages([SourceMsg::Run(RunMsg::Failed(format!(
            "could not start the engine thread: {e}"
        )))]);
    }
    source
}

fn restart_requested(cmd: &flume::Receiver<EngineCommand>) -> bool {
    cmd.try_iter().any(|c| c == EngineCommand::Restart)
}

/// The engine for one run: on the simulated device, or on a freshly opened
/// GPU after telling the UI what NVML reads for this process before the
/// first allocation (the context baseline of the reconciliation panel). The
/// outer error is a GPU that would not open; the inner one a model that could
/// not be built, which is the run's own failure.
fn open_engine(
    built: &Built,
    gpu: Option<&RealGpu>,
    tx: &flume::Sender<SourceMsg>,
) -> Result<Result<Engine, EngineError>, GpuUnavailable> {
    let Some(gpu) = gpu else {
        return Ok(Engine::new(
            built.engine.clone(),
            &built.model,
            &built.optimizer,
        ));
    };
    let (dev, launcher) = (gpu.open)()?;
    let baseline = nvml::own_process_used(gpu.pci).ok().flatten();
    let _ = tx.send(SourceMsg::Scenario(ScenarioMsg::ContextBaseline(baseline)));
    Ok(Engine::new_launching(
        built.engine.clone(),
        &built.model,
        &built.optimizer,
        dev,
        launcher,
    ))
}

fn run_once(
    scenario: &Scenario,
    built: &Built,
    gpu: Option<&RealGpu>,
    tx: &flume::Sender<SourceMsg>,
    cmd: &flume::Receiver<EngineCommand>,
    tags: &EngineTags,
    pace: Duration,
) -> Ended {
    let engine = match open_engine(built, gpu, tx) {
        Ok(e) => e,
        Err(err) => {
            return if tx
                .send(SourceMsg::Run(RunMsg::Failed(err.to_string())))
                .is_ok()
            {
                Ended::Done(None)
            } else {
                Ended::UiGone
            };
        }
    };
    let program = &built.program;
    let mut run = ScenarioRun::new(engine, program, &scenario.narration, program.iterations);
    while let Some(step) = run.advance() {
        if let (Some(engine), Ok(mut table)) = (run.engine(), tags.table.write()) {
            table.clone_from(engine.tag_table());
        }
        let sent = tx.send(SourceMsg::Run(RunMsg::Events(step.events))).is_ok()
            && tx
                .send(SourceMsg::Run(RunMsg::FindingsNow(run.findings().to_vec())))
                .is_ok()
            && tx
                .send(SourceMsg::Run(RunMsg::Stats(Box::new(run.stats()))))
                .is_ok();
        if !sent {
            return Ended::UiGone;
        }
        if let Unit::Iteration(_) = step.unit {
            if let Some(e) = last_iteration_estimate(run.per_iteration(), &built.conditions) {
                if tx
                    .send(SourceMsg::Scenario(ScenarioMsg::Compute(Box::new(e))))
                    .is_err()
                {
                    return Ended::UiGone;
                }
            }
            if restart_requested(cmd) {
                return Ended::Restart;
            }
            if run.failure().is_none() {
                std::thread::sleep(pace);
            }
        }
    }
    if tx.send(SourceMsg::Run(RunMsg::Finished)).is_err() {
        return Ended::UiGone;
    }
    Ended::Done(run.into_engine().map(Box::new))
}
