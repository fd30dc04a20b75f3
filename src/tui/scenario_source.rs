//! A scenario running live for the UI: the engine on a thread of its own,
//! events sent in batches as steps complete, the leak detector's findings and
//! `memory_stats()` after every iteration, and a restart on request. The
//! thread never blocks on the UI; the UI never blocks on it.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use super::source::{EngineCommand, Source, SourceMsg, TagDescription, TagInfo};
use crate::alloc::Tag;
use crate::device::{nvml, AnyDevice, AnyLauncher};
use crate::engine::{Engine, TagTable};
use crate::leak::Detector;
use crate::scenario::{to_trace, Built, NarrationTracker, Scenario};

/// The engine's tag table, shared with the UI and refreshed by the run.
struct EngineTags(RwLock<TagTable>);

impl TagInfo for EngineTags {
    fn describe(&self, tag: Tag) -> Option<TagDescription> {
        let table = self.0.read().ok()?;
        let t = table.info(tag)?;
        Some(TagDescription {
            category: Some(t.category.name().to_string()),
            op: Some(t.op.to_string()),
            module: (!t.module.is_empty()).then(|| t.module.to_string()),
            iteration: Some(t.iteration),
            frames: t.frames.to_vec(),
        })
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
    Arc<dyn Fn() -> Result<(AnyDevice, Option<AnyLauncher>), String> + Send + Sync>;

/// A real GPU for [`scenario_source_on`]: its CUDA ordinal (also NVML's
/// index for it) and how to open it.
#[derive(Clone)]
pub struct RealGpu {
    pub ordinal: u32,
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
    let tags = Arc::new(EngineTags(RwLock::new(TagTable::new())));
    let shared = tags.clone();
    let capacity = built.engine.device_bytes;
    let overhead = built.engine.device_overhead;
    let ordinal = gpu.as_ref().map(|g| g.ordinal);
    let name = format!("scenario {}", scenario.name);
    let spawned = std::thread::Builder::new().name(name).spawn(move || loop {
        match run_once(&scenario, &built, gpu.as_ref(), &tx, &cmd_rx, &shared, pace) {
            Ended::Restart => {
                if tx.send(SourceMsg::Restarted).is_err() {
                    return;
                }
            }
            Ended::UiGone => return,
            Ended::Done(held) => {
                let command = cmd_rx.recv();
                drop(held);
                match command {
                    Ok(EngineCommand::Restart) => {
                        if tx.send(SourceMsg::Restarted).is_err() {
                            return;
                        }
                    }
                    Err(_) => return,
                }
            }
        }
    });
    let mut source = Source::new(rx, Some(cmd_tx))
        .with_capacity(capacity)
        .with_tags(tags);
    source = match ordinal {
        Some(n) => source.on_cuda(n),
        None => source.with_overhead(overhead),
    };
    if let Err(e) = spawned {
        return Source::from_messages([SourceMsg::Failed(format!(
            "could not start the engine thread: {e}"
        ))]);
    }
    source
}

fn restart_requested(cmd: &flume::Receiver<EngineCommand>) -> bool {
    cmd.try_iter().any(|c| c == EngineCommand::Restart)
}

/// The engine for one run: on the simulated device, or on a freshly opened
/// GPU after telling the UI what NVML reads for this process before the
/// first allocation (the context baseline of the reconciliation panel).
fn open_engine(
    built: &Built,
    gpu: Option<&RealGpu>,
    tx: &flume::Sender<SourceMsg>,
) -> Result<Engine, String> {
    let Some(gpu) = gpu else {
        return Engine::new(built.engine.clone(), &built.model, &built.optimizer)
            .map_err(|e| e.message());
    };
    let (dev, launcher) = (gpu.open)()?;
    let baseline = nvml::own_process_used(gpu.ordinal).ok().flatten();
    let _ = tx.send(SourceMsg::ContextBaseline(baseline));
    Engine::new_launching(
        built.engine.clone(),
        &built.model,
        &built.optimizer,
        dev,
        launcher,
    )
    .map_err(|e| e.message())
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
    let mut narration = NarrationTracker::new(&scenario.narration);
    let send_events = |engine: &mut Engine, narration: &mut NarrationTracker| {
        let mut batch = Vec::new();
        for ev in engine.take_events() {
            if let Some(t) = to_trace(&ev) {
                let due = narration.after(&t);
                batch.push(t);
                batch.extend(due);
            }
        }
        if let Ok(mut table) = tags.0.write() {
            table.clone_from(engine.tag_table());
        }
        batch.is_empty() || tx.send(SourceMsg::Events(batch)).is_ok()
    };
    if tx.send(SourceMsg::Events(narration.start())).is_err() {
        return Ended::UiGone;
    }
    let mut engine = match open_engine(built, gpu, tx) {
        Ok(e) => e,
        Err(err) => {
            return if tx.send(SourceMsg::Failed(err)).is_ok() {
                Ended::Done(None)
            } else {
                Ended::UiGone
            };
        }
    };
    let program = &built.program;
    let mut detector = Detector::for_engine(&engine).with_program(program);
    let mut failure = None;
    for (i, step) in program.setup.iter().enumerate() {
        if let Err(err) = engine.run_step(step, i as u32, program) {
            failure = Some(err.message());
            break;
        }
    }
    if !send_events(&mut engine, &mut narration) {
        return Ended::UiGone;
    }
    if failure.is_none() {
        for _ in 0..program.iterations {
            let result = engine.run_iteration(program);
            if !send_events(&mut engine, &mut narration) {
                return Ended::UiGone;
            }
            if let Err(err) = result {
                detector.observe_error(&err, &engine.live_state());
                failure = Some(err.message());
                break;
            }
            let (allocated, reserved) = (engine.allocated_bytes(), engine.reserved_bytes());
            detector.observe(&engine.live_state(), allocated, reserved);
            let stats = Box::new(engine.allocator().stats().clone());
            if tx
                .send(SourceMsg::FindingsNow(detector.findings().to_vec()))
                .is_err()
                || tx.send(SourceMsg::Stats(stats)).is_err()
            {
                return Ended::UiGone;
            }
            if restart_requested(cmd) {
                return Ended::Restart;
            }
            std::thread::sleep(pace);
        }
    }
    let mut tail = narration.end();
    if let Some(message) = &failure {
        // A failure inside the scenario (an OOM, a second backward) is part of
        // the story: it is drawn, and the run counts as finished.
        tail.insert(
            0,
            crate::trace::Event::Marker(crate::trace::Marker::Error(message.as_str().into())),
        );
    }
    let stats = Box::new(engine.allocator().stats().clone());
    let sent = tx.send(SourceMsg::Events(tail)).is_ok()
        && tx
            .send(SourceMsg::FindingsNow(detector.findings().to_vec()))
            .is_ok()
        && tx.send(SourceMsg::Stats(stats)).is_ok()
        && tx.send(SourceMsg::Finished).is_ok();
    if sent {
        Ended::Done(Some(Box::new(engine)))
    } else {
        Ended::UiGone
    }
}
