//! The traced program's requests, one at a time: each storage the program
//! makes is a `malloc` on the caching allocator model, each one that dies a
//! `free`; GEMMs take the engine's workspaces, SDPA the engine's backend;
//! `torch.cuda`'s questions are answered from the allocator. Everything the
//! allocator records goes out as the live stream ([`super::wire`]) and is
//! kept for `_dump_snapshot()` and `--export`.
//!
//! This file holds the simulator's state and the dispatch of each request
//! to its handler; the handlers live by job in `simulator/`: [`device`]
//! (CUDA starts, `torch.cuda`'s answers), [`storages`] (mallocs, frees,
//! workspaces, stacks), [`notes`] (what the outcome says about the trace)
//! and [`export`] (snapshots and the end of the run).

mod device;
mod export;
mod notes;
mod storages;

use std::io::Write;

use rustc_hash::FxHashMap;
use serde_json::{json, Value};

use super::args::{bad, ok, stack_at, str_at, u64_at};
use super::error::TraceError;
use super::outcome::{TraceOutcome, Untraced};
use super::plans::KernelPlan;
use super::rules::Rules;
use super::wire::LiveOut;
use crate::alloc::{memory_summary, AllocConfig, AllocEvent, CachingAllocator, TorchVersion};
use crate::device::{Device, GpuProfile, SimDevice};

/// How the simulated device is set up.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub gpu: &'static GpuProfile,
    /// Stop after this many optimizer steps.
    pub steps: Option<u32>,
    /// `--conf`: the allocator config, over the program's environment.
    pub conf: Option<String>,
    /// What one holder walk in the program may take, in ms (0: no walks).
    pub holders_budget_ms: f64,
}

/// What one holder walk in the program may take by default (PROTOCOL.md
/// `holders`: `budget_ms`; `trace --holders-budget`); the walk stops there
/// and says so.
pub const HOLDERS_BUDGET_MS: f64 = 250.0;

/// The largest segment a mid-size request can make (allocator.md §3): the
/// unit of the headroom's count.
const HEADROOM_SEGMENT: u64 = 20 << 20;

/// A request's answer: the reply to send, if the request waits for one.
pub(super) type Reply = Option<Value>;

type Frames = Vec<(String, i64, String)>;

/// The cached workspaces per thread (0: the program's, 1: autograd's).
#[derive(Debug, Default)]
pub(super) struct Workspaces {
    pub(super) cublas: [Option<u64>; 2],
    pub(super) lt: [Option<u64>; 2],
    /// cuDNN's RNN dropout state, made once and kept (`get_dropout_state`).
    pub(super) dropout_state: Option<u64>,
}

pub struct Simulator<W: Write> {
    opts: SimOptions,
    out: LiveOut<W>,
    alloc: Option<CachingAllocator<SimDevice>>,
    config: AllocConfig,
    pub(super) rules: Option<Rules>,
    version: TorchVersion,
    /// The program's storages (`_cdata`) and their blocks.
    storages: FxHashMap<u64, u64>,
    pub(super) ws: Workspaces,
    /// The buffers the current planned call took so far (by number).
    pub(super) pending: Vec<Option<u64>>,
    /// The planned call under way, between its `before` and its `op`.
    pub(super) plan: Option<KernelPlan>,
    /// Replaying saved requests: a storage sent without waiting may not
    /// fit here (the replay stops there), which is no fault.
    pub(super) replaying: bool,
    stacks: Vec<Frames>,
    /// The program has made a request outside a module's `.to()`: its
    /// kernels have started (the device was told, `Device::kernels_started`).
    kernels_started: bool,
    events: Vec<AllocEvent>,
    /// Where the program's own snapshots begin: the trace as of its last
    /// `_record_memory_history(enabled=None)` (which clears PyTorch's
    /// buffer, allocator.md §13.1). vramscope's views keep every event.
    history_from: usize,
    /// `_record_memory_history` is off: the program's snapshots hold no
    /// trace entries (until it is turned on again, from then).
    history_off: bool,
    /// The program has called `_record_memory_history`: before that, its
    /// snapshots hold every event (a program that never turns recording on
    /// still gets one), from then on what PyTorch would have recorded.
    history_asked: bool,
    pid: u64,
    argv: Vec<String>,
    outcome: TraceOutcome,
}

impl<W: Write> Simulator<W> {
    pub fn new(opts: SimOptions, sink: W, command: Vec<String>) -> Simulator<W> {
        let outcome = TraceOutcome {
            gpu: opts.gpu.name.to_string(),
            command,
            ..TraceOutcome::default()
        };
        Simulator {
            opts,
            out: LiveOut::new(sink),
            alloc: None,
            config: AllocConfig::default(),
            rules: None,
            version: TorchVersion::DEFAULT,
            storages: FxHashMap::default(),
            ws: Workspaces::default(),
            pending: Vec::new(),
            plan: None,
            replaying: false,
            stacks: Vec::new(),
            kernels_started: false,
            events: Vec::new(),
            history_from: 0,
            history_off: false,
            history_asked: false,
            pid: 0,
            argv: Vec::new(),
            outcome,
        }
    }

    /// One request; `index` counts the program's messages (for errors).
    pub fn handle(&mut self, index: u64, v: &Value) -> Result<Reply, TraceError> {
        let mut reply = self.handle_one(index, v)?;
        if let Some(r) = reply.as_mut() {
            if matches!(
                v.get(0).and_then(Value::as_str),
                Some("op" | "before" | "out" | "sdpa")
            ) {
                self.with_headroom(r)?;
            }
        }
        if reply.is_some() {
            self.outcome.waited += 1;
        } else {
            self.outcome.posted += 1;
        }
        Ok(reply)
    }

    /// Any answer the helper waits for ends its headroom (the op may have
    /// taken a workspace: `Channel.ask_raw`). An `ok` answer to an op's
    /// report carries the headroom from here on, as a malloc's answer does,
    /// so that the op's next storages need not wait for one of their own.
    /// Before CUDA starts there is none to give (asking would start it).
    fn with_headroom(&mut self, reply: &mut Value) -> Result<(), TraceError> {
        if self.alloc.is_none() || reply.get(0).and_then(Value::as_str) != Some("ok") {
            return Ok(());
        }
        let (room, count) = self.headroom()?;
        let Some(items) = reply.as_array_mut() else {
            return Ok(());
        };
        match items.last_mut() {
            Some(Value::Object(o)) => {
                o.insert("room".into(), json!([room, count]));
            }
            _ => items.push(json!({ "room": [room, count] })),
        }
        Ok(())
    }

    fn handle_one(&mut self, index: u64, v: &Value) -> Result<Reply, TraceError> {
        let kind = v
            .get(0)
            .and_then(Value::as_str)
            .ok_or_else(|| bad(index, "not an array starting with its kind"))?;
        match kind {
            "m" => self.malloc_request(index, v),
            "ma" => self.malloc_posted(index, v),
            "f" => {
                let cd = u64_at(v, 1, index)?;
                self.free(cd)?;
                Ok(None)
            }
            "s" => self.define_stack(index, v),
            "op" => self.after_op(v),
            "oa" => {
                // An op the helper sent without waiting (a quiet GEMM within
                // its headroom): it cannot run out of memory.
                let r = self.after_op(v)?;
                if let Some(a) = r.filter(|a| a[0] != "ok") {
                    if !self.replaying {
                        self.outcome.untraced.push(Untraced {
                            what: format!("{} sent without waiting", str_at(v, 1)),
                            why: a.to_string(),
                            at: None,
                            instead: "the program did not get its OOM: vramscope's headroom was wrong (a bug)".into(),
                        });
                    }
                }
                Ok(None)
            }
            "before" => self.before_op(v),
            "out" => self.after_output(v),
            "sdpa" => Ok(self.sdpa(v)),
            "step" => {
                self.outcome.steps += 1;
                let stats = self.stats_value();
                self.out.step(&stats)?;
                Ok(None)
            }
            "hello" => Ok(Some(self.hello(v))),
            "init" => self.init(v),
            "stats" => Ok(Some(json!(["ok", self.stats_value()]))),
            "reset_peak" => {
                self.allocator()?.reset_peak_stats();
                Ok(ok())
            }
            "reset_accumulated" => {
                self.allocator()?.reset_accumulated_stats();
                Ok(ok())
            }
            "empty_cache" => {
                self.allocator()?.empty_cache();
                self.emit()?;
                Ok(ok())
            }
            "fraction" => {
                let f = v.get(1).and_then(Value::as_f64).unwrap_or(1.0);
                self.allocator()?.set_memory_fraction(f);
                Ok(ok())
            }
            "get_fraction" => {
                let a = self.allocator()?;
                let f = a.fraction.unwrap_or(1.0);
                Ok(Some(json!(["ok", f])))
            }
            "mem_get_info" => {
                let (free, total) = self.allocator()?.device().mem_get_info();
                Ok(Some(json!(["ok", [free, total]])))
            }
            "summary" => {
                let abbreviated = v.get(1).and_then(Value::as_bool).unwrap_or(false);
                let text = memory_summary(self.allocator()?.stats(), 0, abbreviated);
                Ok(Some(json!(["ok", text])))
            }
            "dump" => Ok(Some(self.dump(&str_at(v, 1)))),
            "history" => {
                // Off clears the buffer and records nothing; on records
                // from then if it was off or is asked to clear.
                let on = v.get(1).and_then(Value::as_bool).unwrap_or(true);
                let clear = v.get(2).and_then(Value::as_bool).unwrap_or(false);
                if !on || self.history_off || clear || !self.history_asked {
                    self.history_from = self.events.len();
                }
                self.history_off = !on;
                self.history_asked = true;
                Ok(ok())
            }
            "clear_workspaces" => {
                self.clear_workspaces()?;
                Ok(ok())
            }
            "untraced" => {
                self.untraced(v);
                Ok(None)
            }
            "known" => {
                // An op meta cannot run, sized from its inputs' known values.
                let what = str_at(v, 1);
                let what = what.strip_suffix(".default").unwrap_or(&what).to_string();
                self.outcome_known(&what, stack_at(v, 2));
                Ok(None)
            }
            "exception" => {
                self.exception(v);
                Ok(None)
            }
            "bye" => {
                self.outcome.ended = Some(str_at(v, 1));
                Ok(ok())
            }
            "holders" => {
                self.holders(index, v)?;
                Ok(None)
            }
            other => Err(bad(index, format!("unknown kind {other:?}"))),
        }
    }

    /// The allocator's new entries, out and kept.
    pub(super) fn emit(&mut self) -> Result<(), TraceError> {
        let Some(a) = self.alloc.as_mut() else {
            return Ok(());
        };
        let events = a.take_events();
        self.out.entries(&events)?;
        self.events.extend(events);
        Ok(())
    }
}
