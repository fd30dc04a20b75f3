//! The traced program's requests, one at a time: each storage the program
//! makes is a `malloc` on the caching allocator model, each one that dies a
//! `free`; GEMMs take the engine's workspaces, SDPA the engine's backend;
//! `torch.cuda`'s questions are answered from the allocator. Everything the
//! allocator records goes out as the live stream ([`super::wire`]) and is
//! kept for `_dump_snapshot()` and `--export`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use rustc_hash::FxHashMap;
use serde_json::{json, Value};

use super::args::{bad, ok, stack_at, str_at, u64_at};
use super::error::TraceError;
use super::outcome::{Assumed, Estimate, Exception, Known, TraceOutcome, Untraced};
use super::plans::{KernelPlan, ORDERED_OPS, PLANNED_OPS, STAGED_OPS};
use super::rules::{
    after_ops, autocast_table, backend_name, dtype_named, release_of, Rules, HOST_OUTPUTS,
};
use super::wire::{tag_of, LiveOut};
use crate::alloc::{
    memory_summary, AllocConfig, AllocError, AllocEvent, CachingAllocator, TorchVersion,
};
use crate::device::{Device, GpuProfile, SimDevice};
use crate::engine::ops::sdpa_select::SdpaCall;
use crate::engine::SdpaBackend;
use crate::trace::snapshot::from_run::{snapshot_of_run, DeviceRun};
use crate::trace::snapshot::Snapshot;
use crate::trace::snapshot::{export_bytes, is_module_conversion};

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
        let reply = self.handle_one(index, v)?;
        if reply.is_some() {
            self.outcome.waited += 1;
        } else {
            self.outcome.posted += 1;
        }
        Ok(reply)
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

    fn hello(&mut self, v: &Value) -> Value {
        let h = v.get(1).cloned().unwrap_or(Value::Null);
        self.pid = h.get("pid").and_then(Value::as_u64).unwrap_or(0);
        self.argv = h
            .get("argv")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        if let Some(t) = h.get("torch").and_then(Value::as_str) {
            let (version, rules) = release_of(t);
            self.version = version;
            self.outcome.torch = Some(t.to_string());
            self.outcome.rules = Some(rules);
        }
        let g = self.opts.gpu;
        json!({
            "device": {
                "name": g.product,
                "total_memory": g.total_memory,
                "major": g.arch.major(),
                "minor": minor_of(g),
                "sm_count": g.sm_count,
                "max_threads_per_sm": g.max_threads_per_sm,
            },
            "steps": self.opts.steps,
            "after_ops": after_ops(),
            "before_ops": PLANNED_OPS,
            "staged_ops": STAGED_OPS.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            "register_order": STAGED_OPS
                .iter()
                .filter_map(|(n, o)| o.map(|o| (n.to_string(), o.to_vec())))
                .chain(ORDERED_OPS.iter().map(|(n, o)| (n.to_string(), o.to_vec())))
                .collect::<BTreeMap<_, _>>(),
            "host_outputs": HOST_OUTPUTS.iter().map(|(n, i)| (n.to_string(), i.to_vec())).collect::<BTreeMap<_, _>>(),
            "sdpa": true,
            "autocast": autocast_table(),
            "holders_budget_ms": (self.opts.holders_budget_ms > 0.0).then_some(self.opts.holders_budget_ms),
        })
    }

    /// The program's holder walk (`["holders", fields]`: PROTOCOL.md
    /// `holders` but `t`, `seq`, `step` and `allocated`, which are the
    /// stream's and the allocator's, added here).
    fn holders(&mut self, index: u64, v: &Value) -> Result<(), TraceError> {
        let Some(fields) = v.get(1).and_then(Value::as_object) else {
            return Err(bad(index, "holders: element 1 is not an object"));
        };
        self.emit()?;
        let allocated = self.alloc.as_ref().map(|a| a.stats().allocated_bytes());
        self.out.holders(fields, allocated)
    }

    /// CUDA starts: the allocator's config and the engine's rules from the
    /// program's environment (or `--conf`), read as PyTorch reads them then.
    fn init(&mut self, v: &Value) -> Result<Reply, TraceError> {
        let env: BTreeMap<String, String> = v
            .get(1)
            .and_then(Value::as_object)
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let (conf, from) = match (
            &self.opts.conf,
            env.get("PYTORCH_CUDA_ALLOC_CONF"),
            env.get("PYTORCH_ALLOC_CONF"),
        ) {
            (Some(c), _, _) => (c.clone(), "--conf".to_string()),
            (None, Some(c), _) => (
                c.clone(),
                "the program's PYTORCH_CUDA_ALLOC_CONF".to_string(),
            ),
            (None, None, Some(c)) => (c.clone(), "the program's PYTORCH_ALLOC_CONF".to_string()),
            (None, None, None) => (
                String::new(),
                "the default (no PYTORCH_CUDA_ALLOC_CONF)".to_string(),
            ),
        };
        let config = match AllocConfig::parse_for(&conf, self.version) {
            Ok(c) => c,
            Err(e) => {
                return Ok(Some(json!([
                    "error",
                    format!("PYTORCH_CUDA_ALLOC_CONF {conf:?}: {e}")
                ])))
            }
        };
        let rules = match Rules::new(self.opts.gpu, self.version, &env, &conf) {
            Ok(r) => r,
            Err(e) => return Ok(Some(json!(["error", e]))),
        };
        self.start_device(config, rules, conf, from)?;
        Ok(ok())
    }

    fn start_device(
        &mut self,
        config: AllocConfig,
        rules: Rules,
        conf: String,
        from: String,
    ) -> Result<(), TraceError> {
        let g = self.opts.gpu;
        let device = SimDevice::new(g.product, g.total_memory, g.context_bytes.unwrap_or(0))
            .placed(g.placement);
        self.alloc = Some(CachingAllocator::new(device, config.clone()));
        self.kernels_started = false;
        self.config = config;
        self.rules = Some(rules);
        self.outcome.alloc_conf = conf.clone();
        self.outcome.alloc_conf_from = from;
        self.outcome.cuda_started = true;
        let hello = json!({
            "t": "hello", "protocol": 1, "pid": self.pid, "rank": 0, "world_size": 1,
            "hostname": Value::Null, "argv": self.argv, "torch": self.outcome.torch,
            "mode": "trace", "stacks": true, "poll_interval_s": Value::Null,
            "devices": [{"device": 0, "name": format!("{} (simulated)", g.product), "total_memory": g.total_memory,
                          "pci_bus_id": Value::Null, "uuid": Value::Null}],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": conf},
            "started_us": self.out.started_us(),
        });
        self.out.open(&hello)
    }

    pub(super) fn allocator(&mut self) -> Result<&mut CachingAllocator<SimDevice>, TraceError> {
        if self.alloc.is_none() {
            let rules = Rules::new(self.opts.gpu, self.version, &BTreeMap::new(), "")
                .map_err(TraceError::Channel)?;
            let conf = self.opts.conf.clone().unwrap_or_default();
            let config = AllocConfig::parse_for(&conf, self.version)
                .map_err(|e| TraceError::Channel(format!("--conf {conf:?}: {e}")))?;
            self.start_device(config, rules, conf, "--conf or the default".into())?;
        }
        self.alloc
            .as_mut()
            .ok_or_else(|| TraceError::Channel("no simulated device".into()))
    }

    /// The allocator's new entries, out and kept.
    fn emit(&mut self) -> Result<(), TraceError> {
        let Some(a) = self.alloc.as_mut() else {
            return Ok(());
        };
        let events = a.take_events();
        self.out.entries(&events)?;
        self.events.extend(events);
        Ok(())
    }

    /// One block for the program or a workspace: its address, or the OOM
    /// message PyTorch would raise (the OOM is out on the stream too).
    pub(super) fn malloc(
        &mut self,
        bytes: u64,
        stack: Option<u32>,
    ) -> Result<Result<u64, String>, TraceError> {
        if !self.kernels_started && !self.converting(stack) {
            self.kernels_started = true;
            self.allocator()?.device_mut().kernels_started();
        }
        let r = self.allocator()?.malloc(bytes, 0, tag_of(stack));
        self.emit()?;
        match r {
            Ok(addr) => Ok(Ok(addr)),
            Err(AllocError::OutOfMemory(info)) => {
                self.outcome.ooms += 1;
                let stats = self.stats_value();
                self.out.oom(
                    &info.message,
                    info.device_free,
                    info.device_total,
                    info.alloc_size,
                    &stats,
                )?;
                Ok(Err(info.message))
            }
            Err(e) => Ok(Err(e.to_string())),
        }
    }

    /// Whether a request from `stack` is a module's `.to()` (`nn.Module._apply`).
    fn converting(&self, stack: Option<u32>) -> bool {
        stack
            .and_then(|s| self.stacks.get(s as usize))
            .is_some_and(|frames| {
                frames
                    .iter()
                    .any(|(file, _, name)| is_module_conversion(file, name))
            })
    }

    /// `m`: a storage the program waits on (it may not fit), answered with
    /// the headroom for the ones it may then send without waiting (`ma`).
    fn malloc_request(&mut self, index: u64, v: &Value) -> Result<Reply, TraceError> {
        let cd = u64_at(v, 1, index)?;
        let bytes = u64_at(v, 2, index)?;
        let stack = stack_at(v, 3);
        Ok(Some(match self.malloc(bytes, stack)? {
            Ok(addr) => {
                self.outcome.allocations += 1;
                self.storages.insert(cd, addr);
                let (room, count) = self.headroom()?;
                json!(["ok", room, count])
            }
            Err(message) => json!(["oom", message]),
        }))
    }

    /// `ma`: a storage sent within the headroom, which cannot run out of
    /// memory; should it (a fault of the headroom), the trace says so.
    fn malloc_posted(&mut self, index: u64, v: &Value) -> Result<Reply, TraceError> {
        let cd = u64_at(v, 1, index)?;
        let bytes = u64_at(v, 2, index)?;
        match self.malloc(bytes, stack_at(v, 3))? {
            Ok(addr) => {
                self.outcome.allocations += 1;
                self.storages.insert(cd, addr);
            }
            Err(_) if self.replaying => {}
            Err(message) => self.outcome.untraced.push(Untraced {
                what: format!("a {bytes} B storage sent without waiting"),
                why: message,
                at: None,
                instead: "the program did not get its OOM: vramscope's headroom was wrong (a bug)"
                    .into(),
            }),
        }
        Ok(None)
    }

    /// How much the program may allocate before it must wait again: storages
    /// of at most `room` bytes in all and `count` in number cannot run out of
    /// memory, whatever the cache holds. Each takes at most a segment of
    /// 2·size + 20 MiB (size rounding, `roundup_power2_divisions` at most
    /// doubling, a 20 MiB segment for a mid-size request; allocator.md §3),
    /// and 2·room + 20 MiB·count stays within half the memory the device and
    /// the fraction leave.
    fn headroom(&mut self) -> Result<(u64, u64), TraceError> {
        let a = self.allocator()?;
        let (device_free, _) = a.device().mem_get_info();
        let free = match a.memory_fraction_limit() {
            Some(limit) => device_free.min(limit.saturating_sub(a.reserved_total())),
            None => device_free,
        };
        let half = free / 2;
        Ok((half / 4, half / 2 / HEADROOM_SEGMENT))
    }

    fn free(&mut self, cd: u64) -> Result<(), TraceError> {
        if let Some(addr) = self.storages.remove(&cd) {
            self.free_block(addr)?;
        }
        Ok(())
    }

    pub(super) fn free_block(&mut self, addr: u64) -> Result<(), TraceError> {
        let r = self.allocator()?.free(addr);
        self.emit()?;
        r.map_err(|e| TraceError::Channel(format!("the allocator refused a free: {e}")))
    }

    fn define_stack(&mut self, index: u64, v: &Value) -> Result<Reply, TraceError> {
        let id = u64_at(v, 1, index)?;
        let id32 = u32::try_from(id).map_err(|_| bad(index, "stack id past 2^32"))?;
        let raw = v.get(2).cloned().unwrap_or(Value::Array(Vec::new()));
        let frames: Frames = raw
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|f| {
                        (
                            str_at(f, 0),
                            f.get(1).and_then(Value::as_i64).unwrap_or(0),
                            str_at(f, 2),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let slot = usize::try_from(id).map_err(|_| bad(index, "stack id"))?;
        if self.stacks.len() <= slot {
            self.stacks.resize(slot + 1, Vec::new());
        }
        self.stacks[slot] = frames;
        self.out.stack(id32, &raw)?;
        Ok(None)
    }

    fn clear_workspaces(&mut self) -> Result<(), TraceError> {
        let held: Vec<u64> = self
            .ws
            .cublas
            .iter_mut()
            .chain(self.ws.lt.iter_mut())
            .filter_map(Option::take)
            .collect();
        for a in held {
            self.free_block(a)?;
        }
        Ok(())
    }

    /// The SDPA backend PyTorch's dispatcher takes on this GPU.
    fn sdpa(&mut self, v: &Value) -> Reply {
        let o = v.get(1).cloned().unwrap_or(Value::Null);
        let dtype = o.get("dtype").and_then(Value::as_str).and_then(dtype_named);
        let Some(dtype) = dtype else {
            return Some(json!(["ok", "math"]));
        };
        let call = SdpaCall {
            dtype,
            mask: o.get("mask").and_then(Value::as_bool).unwrap_or(false),
            dropout: o.get("dropout").and_then(Value::as_f64).unwrap_or(0.0),
            head_dim: o.get("head_dim").and_then(Value::as_u64).unwrap_or(0),
            gqa: o.get("gqa").and_then(Value::as_bool).unwrap_or(false),
        };
        let enabled = o.get("enabled").cloned().unwrap_or(Value::Null);
        let on = |b: SdpaBackend| {
            enabled
                .get(backend_name(b))
                .and_then(Value::as_bool)
                .unwrap_or(true)
        };
        let rules = match &self.rules {
            Some(r) => r.clone(),
            None => match Rules::new(self.opts.gpu, self.version, &BTreeMap::new(), "") {
                Ok(r) => r,
                Err(_) => return Some(json!(["ok", "math"])),
            },
        };
        let b = rules.sdpa_backend(&call, on);
        Some(json!(["ok", backend_name(b)]))
    }

    fn stats_value(&self) -> Value {
        match &self.alloc {
            Some(a) => json!(a.stats().to_map(self.version.0 >= 12)),
            None => json!({}),
        }
    }

    /// OOMs so far.
    pub(super) fn ooms(&self) -> u64 {
        self.outcome.ooms
    }

    /// The program's own line for a stack it defined.
    pub(super) fn user_frame_of(&self, stack: u32) -> Option<String> {
        self.stacks.get(stack as usize).and_then(|f| user_frame(f))
    }

    /// A size taken from an estimate, once per kind of call.
    pub(super) fn outcome_estimate(&mut self, what: &str, bytes: u64) {
        match self.outcome.estimates.iter_mut().find(|e| e.what == what) {
            Some(e) => e.calls += 1,
            None => self.outcome.estimates.push(Estimate {
                what: what.to_string(),
                bytes,
                calls: 1,
            }),
        }
    }

    /// A data-dependent shape taken from an assumption, once per op, line
    /// and assumption (the calls counted).
    pub(super) fn outcome_assumed(&mut self, what: &str, assumption: &str, stack: Option<u32>) {
        let at = stack.and_then(|s| self.user_frame_of(s));
        let same = |a: &&mut Assumed| a.what == what && a.assumption == assumption && a.at == at;
        match self.outcome.assumed.iter_mut().find(same) {
            Some(a) => a.calls += 1,
            None => self.outcome.assumed.push(Assumed {
                what: what.to_string(),
                assumption: assumption.to_string(),
                at,
                calls: 1,
            }),
        }
    }

    /// A data-dependent shape taken from the program's own values, once
    /// per op and line (the calls counted).
    pub(super) fn outcome_known(&mut self, what: &str, stack: Option<u32>) {
        let at = stack.and_then(|s| self.user_frame_of(s));
        match self
            .outcome
            .known
            .iter_mut()
            .find(|k| k.what == what && k.at == at)
        {
            Some(k) => k.calls += 1,
            None => self.outcome.known.push(Known {
                what: what.to_string(),
                at,
                calls: 1,
            }),
        }
    }

    fn untraced(&mut self, v: &Value) {
        let at = stack_at(v, 3)
            .and_then(|s| self.stacks.get(s as usize))
            .and_then(|f| user_frame(f));
        self.outcome.untraced.push(Untraced {
            what: str_at(v, 1),
            why: str_at(v, 2),
            at,
            instead: v.get(4).and_then(Value::as_str).map_or_else(
                || "nothing: the op raised NotImplementedError in the program, which decides what follows".into(),
                String::from,
            ),
        });
    }

    fn exception(&mut self, v: &Value) {
        let frames: Vec<String> = v
            .get(3)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|f| {
                        format!(
                            "{}:{} in {}",
                            str_at(f, 0),
                            f.get(1).and_then(Value::as_i64).unwrap_or(0),
                            str_at(f, 2)
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        self.outcome.exception = Some(Exception {
            kind: str_at(v, 1),
            message: str_at(v, 2),
            at: frames,
        });
    }

    /// Everything so far as a PyTorch snapshot (`_dump_snapshot`, `--export`).
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_since(0)
    }

    /// The snapshot with the trace entries from event `from` on.
    fn snapshot_since(&self, from: usize) -> Snapshot {
        let segments = self
            .alloc
            .as_ref()
            .map(|a| a.snapshot())
            .unwrap_or_default();
        let stacks = &self.stacks;
        let frames_of = |_: usize, tag: crate::alloc::Tag| -> Vec<(String, i64, String)> {
            usize::try_from(tag.0)
                .ok()
                .and_then(|t| t.checked_sub(1))
                .and_then(|i| stacks.get(i))
                .cloned()
                .unwrap_or_default()
        };
        let devices = [DeviceRun {
            device: 0,
            segments: &segments,
            events: self.events.get(from..).unwrap_or_default(),
        }];
        snapshot_of_run(&devices, &self.config, &frames_of)
    }

    fn dump(&mut self, path: &str) -> Value {
        let from = if self.history_off {
            self.events.len()
        } else {
            self.history_from
        };
        let bytes = export_bytes(&self.snapshot_since(from));
        match crate::files::write_replacing(Path::new(path), &bytes) {
            Ok(()) => json!(["ok"]),
            Err(e) => json!(["error", format!("{path}: {e}")]),
        }
    }

    /// The end: figures into the outcome, `bye` on the stream.
    pub fn finish(
        mut self,
        exit_status: Option<i32>,
    ) -> Result<(TraceOutcome, Snapshot), TraceError> {
        self.emit()?;
        if let Some(a) = &self.alloc {
            let s = a.stats();
            self.outcome.peak_allocated = s.peak_allocated_bytes();
            self.outcome.peak_reserved = s.peak_reserved_bytes();
            self.outcome.allocated = s.allocated_bytes();
            self.outcome.reserved = s.reserved_bytes();
        }
        self.outcome.exit_status = exit_status;
        let reason = match (&self.outcome.ended, exit_status) {
            (Some(r), _) => r.clone(),
            (None, Some(c)) => format!("the program exited with status {c}"),
            (None, None) => "the program was killed".to_string(),
        };
        if self.outcome.ended.is_none() {
            self.outcome.ended = Some(reason.clone());
        }
        if !self.outcome.cuda_started {
            // A stream needs its hello and start state even when nothing ran.
            self.allocator()?;
        }
        self.out.bye(&reason)?;
        let snap = self.snapshot();
        Ok((self.outcome, snap))
    }
}

/// Compute capability minor of a profile's architecture.
fn minor_of(g: &GpuProfile) -> u32 {
    use crate::device::GpuArch::*;
    match g.arch {
        Sm75 => 5,
        Sm86 => 6,
        Sm89 => 9,
        _ => 0,
    }
}

/// The innermost frame of the program's own code (not PyTorch's, not the
/// standard library's): `file:line in name`.
pub fn user_frame(frames: &[(String, i64, String)]) -> Option<String> {
    let is_library = |f: &str| {
        f.starts_with('<')
            || f.contains("/site-packages/")
            || f.contains("/dist-packages/")
            || f.contains("/lib/python3")
    };
    frames
        .iter()
        .find(|(f, _, _)| !is_library(f))
        .or_else(|| frames.first())
        .map(|(f, l, n)| format!("{f}:{l} in {n}"))
}
