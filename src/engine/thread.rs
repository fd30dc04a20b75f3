//! The engine on its own thread (DESIGN.md): commands in over one `flume`
//! channel, event batches out over another. The engine pauses at safe points
//! (every allocation and op boundary) by blocking inside its hook, so the
//! engine's state always matches the events released so far. Sending never
//! blocks (unbounded channel); failures arrive as `EngineEvent::Error`.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use flume::{Receiver, Sender, TryRecvError};

use super::config::EngineConfig;
use super::error::{EngineError, ErrorKind};
use super::events::EngineEvent;
use super::optim::OptimizerConfig;
use super::presets::ModelConfig;
use super::program::Program;
use super::Engine;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Command {
    Play,
    Pause,
    /// Release one more event, then pause.
    StepEvent,
    /// Run to the end of the next op (its `OpEnd`), then pause.
    StepOp,
    /// Run to the next `PhaseEnd`, then pause.
    StepPhase,
    /// Run to the next `IterationEnd`, then pause.
    StepIteration,
    /// Play at full speed to the end.
    RunToEnd,
    /// Rebuild the engine and start the program again (paused).
    Restart,
    /// Events per second while playing; 0 = unlimited.
    SetSpeed(f64),
    /// Answer with an `EngineEvent::LiveState`.
    QueryLiveState,
    Shutdown,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Paused,
    Playing,
    Until(Boundary),
    Events(u32),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Boundary {
    Op,
    Phase,
    Iteration,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Stop {
    Restart,
    Shutdown,
}

struct Driver {
    rx: Receiver<Command>,
    tx: Sender<Vec<EngineEvent>>,
    mode: Mode,
    speed: f64,
    backlog: VecDeque<EngineEvent>,
    stop: Option<Stop>,
}

impl Driver {
    /// Apply a command; Restart/Shutdown make the engine stop at once.
    fn apply(&mut self, c: Command, e: &Engine) {
        match c {
            Command::Play | Command::RunToEnd => {
                self.mode = Mode::Playing;
                if c == Command::RunToEnd {
                    self.speed = 0.0;
                }
            }
            Command::Pause => self.mode = Mode::Paused,
            Command::StepEvent => {
                self.mode = match self.mode {
                    Mode::Events(n) => Mode::Events(n + 1),
                    _ => Mode::Events(1),
                }
            }
            Command::StepOp => self.mode = Mode::Until(Boundary::Op),
            Command::StepPhase => self.mode = Mode::Until(Boundary::Phase),
            Command::StepIteration => self.mode = Mode::Until(Boundary::Iteration),
            Command::SetSpeed(s) => self.speed = s.max(0.0),
            Command::QueryLiveState => {
                let _ = self
                    .tx
                    .send(vec![EngineEvent::LiveState(Box::new(e.live_state()))]);
            }
            Command::Restart => {
                self.stop = Some(Stop::Restart);
                self.mode = Mode::Paused;
            }
            Command::Shutdown => self.stop = Some(Stop::Shutdown),
        }
    }

    /// Release backlog events as the mode allows; returns how many went out.
    fn release(&mut self) -> usize {
        let mut out = Vec::new();
        loop {
            let limit = match self.mode {
                Mode::Paused => break,
                Mode::Playing if self.speed > 0.0 => (self.speed * 0.05).max(1.0) as usize,
                _ => usize::MAX,
            };
            if out.len() >= limit {
                break;
            }
            let Some(ev) = self.backlog.pop_front() else {
                break;
            };
            let boundary = match &ev {
                EngineEvent::OpEnd => Some(Boundary::Op),
                EngineEvent::PhaseEnd(_) => Some(Boundary::Phase),
                EngineEvent::IterationEnd { .. } => Some(Boundary::Iteration),
                _ => None,
            };
            let terminal = matches!(ev, EngineEvent::Finished | EngineEvent::Error { .. });
            out.push(ev);
            match self.mode {
                Mode::Until(b) if Some(b) == boundary || terminal => self.mode = Mode::Paused,
                Mode::Events(n) => {
                    self.mode = if n <= 1 {
                        Mode::Paused
                    } else {
                        Mode::Events(n - 1)
                    }
                }
                _ => {}
            }
        }
        let n = out.len();
        if n > 0 {
            let _ = self.tx.send(out);
        }
        if self.mode == Mode::Playing && self.speed > 0.0 && n > 0 {
            std::thread::sleep(Duration::from_millis(50));
        }
        n
    }

    /// Called at every engine safe point (and after the program ends with
    /// `finished = true`): forward events, wait while paused, apply commands.
    fn pump(&mut self, e: &mut Engine, finished: bool) -> Result<(), Stop> {
        self.backlog.extend(e.take_events());
        loop {
            loop {
                match self.rx.try_recv() {
                    Ok(c) => self.apply(c, e),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => self.stop = Some(Stop::Shutdown),
                }
                if self.stop.is_some() {
                    break;
                }
            }
            if let Some(s) = self.stop.take() {
                return Err(s);
            }
            self.release();
            if self.backlog.is_empty() && self.mode != Mode::Paused && !finished {
                return Ok(());
            }
            if self.mode == Mode::Paused || self.backlog.is_empty() {
                match self.rx.recv() {
                    Ok(c) => self.apply(c, e),
                    Err(_) => return Err(Stop::Shutdown),
                }
                // Stop before reading further commands: they belong to the next run.
                if let Some(s) = self.stop.take() {
                    return Err(s);
                }
            }
        }
    }
}

/// Handle on a running engine thread.
pub struct EngineThread {
    commands: Sender<Command>,
    events: Receiver<Vec<EngineEvent>>,
    handle: Option<JoinHandle<()>>,
}

impl EngineThread {
    /// Start the engine thread, paused before the first event.
    pub fn spawn(
        cfg: EngineConfig,
        model: ModelConfig,
        optim: OptimizerConfig,
        program: Program,
    ) -> EngineThread {
        let (ctx, crx) = flume::unbounded();
        let (etx, erx) = flume::unbounded();
        let handle = std::thread::Builder::new()
            .name("vramscope-engine".into())
            .spawn(move || run(cfg, model, optim, program, crx, etx))
            .ok();
        EngineThread {
            commands: ctx,
            events: erx,
            handle,
        }
    }

    pub fn send(&self, c: Command) {
        let _ = self.commands.send(c);
    }

    /// All event batches available now, flattened (never blocks).
    pub fn try_events(&self) -> Vec<EngineEvent> {
        self.events.try_iter().flatten().collect()
    }

    /// The event receiver, for callers that want to block or select.
    pub fn receiver(&self) -> &Receiver<Vec<EngineEvent>> {
        &self.events
    }

    pub fn is_alive(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }

    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for EngineThread {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(
    cfg: EngineConfig,
    model: ModelConfig,
    optim: OptimizerConfig,
    program: Program,
    rx: Receiver<Command>,
    tx: Sender<Vec<EngineEvent>>,
) {
    let driver = Arc::new(Mutex::new(Driver {
        rx,
        tx,
        mode: Mode::Paused,
        speed: 0.0,
        backlog: VecDeque::new(),
        stop: None,
    }));
    loop {
        let mut engine = match Engine::new(cfg.clone(), &model, &optim) {
            Ok(e) => e,
            Err(err) => match Engine::bare(cfg.clone()) {
                Ok(mut e) => {
                    e.events.push(EngineEvent::Error {
                        kind: err.kind(),
                        message: err.message(),
                    });
                    e
                }
                Err(_) => return,
            },
        };
        let built_ok = engine.model.is_some();
        let d = driver.clone();
        engine.set_hook(Some(Box::new(move |e: &mut Engine| {
            let mut g = d.lock().unwrap_or_else(PoisonError::into_inner);
            g.pump(e, false).map_err(|s| {
                g.stop = Some(s);
                EngineError::Interrupted
            })
        })));
        if built_ok {
            let r = catch_unwind(AssertUnwindSafe(|| engine.run_program(&program)));
            match r {
                Ok(Ok(())) => {}
                Ok(Err(EngineError::Interrupted)) => {}
                Ok(Err(err)) => engine.events.push(EngineEvent::Error {
                    kind: err.kind(),
                    message: err.message(),
                }),
                Err(panic) => {
                    let msg = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "engine panicked".into());
                    engine.events.push(EngineEvent::Error {
                        kind: ErrorKind::Internal,
                        message: msg,
                    });
                }
            }
        }
        engine.set_hook(None);
        let mut g = driver.lock().unwrap_or_else(PoisonError::into_inner);
        let stop = match g.stop.take() {
            Some(s) => s,
            // The program ended (or failed): keep serving commands.
            None => match g.pump(&mut engine, true) {
                Err(s) => s,
                Ok(()) => Stop::Shutdown,
            },
        };
        match stop {
            Stop::Shutdown => return,
            Stop::Restart => g.backlog.clear(),
        }
    }
}
