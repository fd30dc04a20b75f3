//! TEST / DEMO PRODUCER — not a scenario and not the engine.
//!
//! It drives a `CachingAllocator<SimDevice>` through a fixed, training-*like*
//! pattern so the UI has live data before the engine exists: parameters once,
//! then per iteration a forward pass (saved activations), a backward pass
//! that frees them in reverse and creates gradients, and an Adam-like step
//! whose state is allocated at the first step. With `leak_bytes > 0` one block
//! per iteration is kept ("history.append(logits)"), and the finding it sends
//! is synthetic (its evidence says so): nothing here is a real measurement.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::alloc::{AllocConfig, CachingAllocator, Tag};
use crate::device::SimDevice;
use crate::leak::{Finding, FindingKind, Severity};
use crate::trace::{Event, Marker, Phase};

use super::source::{EngineCommand, Source, SourceMsg, TagDescription, TagInfo};
use super::theme::CATEGORIES;

const MIB: u64 = 1 << 20;

#[derive(Debug, Clone)]
pub struct DemoConfig {
    pub iterations: u32,
    pub layers: usize,
    pub weight_bytes: u64,
    pub activation_bytes: u64,
    /// Bytes kept per iteration (0: no leak).
    pub leak_bytes: u64,
    pub device_total: u64,
    pub device_overhead: u64,
    /// Pause between op-sized batches, so live playback is visible.
    pub batch_sleep: Duration,
}

impl DemoConfig {
    /// Leaks 24 MiB per iteration on a 2 GiB device: OOMs after ~45 iterations.
    pub fn leaky() -> DemoConfig {
        DemoConfig {
            iterations: 80,
            layers: 8,
            weight_bytes: 16 * MIB,
            activation_bytes: 8 * MIB,
            leak_bytes: 24 * MIB,
            device_total: 2 << 30,
            device_overhead: 256 * MIB,
            batch_sleep: Duration::from_millis(25),
        }
    }

    /// The same loop without the leak.
    pub fn fixed() -> DemoConfig {
        DemoConfig {
            leak_bytes: 0,
            ..DemoConfig::leaky()
        }
    }

    /// No pause, many iterations, a small leak on a large device (benches).
    pub fn bulk(iterations: u32) -> DemoConfig {
        DemoConfig {
            iterations,
            leak_bytes: 4096,
            device_total: 80 << 30,
            batch_sleep: Duration::ZERO,
            ..DemoConfig::leaky()
        }
    }
}

/// Ops the demo names; the tag carries the index.
const OPS: [(&str, &str); 7] = [
    ("init_parameters", "model"),
    ("zero_grad", "optimizer"),
    ("to(cuda)", "data"),
    ("linear", "layers"),
    ("cross_entropy", "loss"),
    ("linear_backward", "layers"),
    ("adam_step", "optimizer"),
];

/// Tag layout: category+1 (8 bits) | op (8) | layer+1 (8) | iteration+1 (32).
fn tag(category: &str, op: usize, layer: Option<usize>, iteration: Option<u32>) -> Tag {
    let cat = CATEGORIES
        .iter()
        .position(|c| *c == category)
        .map_or(0, |i| i as u64 + 1);
    let layer = layer.map_or(0, |l| l as u64 + 1);
    let iter = iteration.map_or(0, |i| u64::from(i) + 1);
    Tag(cat | (op as u64) << 8 | layer << 16 | iter << 24)
}

/// Decodes the demo's tags.
#[derive(Debug, Default)]
pub struct DemoTags;

impl TagInfo for DemoTags {
    fn describe(&self, tag: Tag) -> Option<TagDescription> {
        if tag == Tag::NONE {
            return None;
        }
        let cat = (tag.0 & 0xff) as usize;
        let op = ((tag.0 >> 8) & 0xff) as usize;
        let layer = ((tag.0 >> 16) & 0xff) as usize;
        let iter = (tag.0 >> 24) as u32;
        let (op_name, module) = OPS.get(op).copied().unwrap_or(("?", "?"));
        let module = if layer > 0 {
            format!("{module}.{}", layer - 1)
        } else {
            module.to_string()
        };
        Some(TagDescription {
            category: cat
                .checked_sub(1)
                .and_then(|c| CATEGORIES.get(c))
                .map(|s| s.to_string()),
            op: Some(op_name.to_string()),
            module: Some(module),
            iteration: iter.checked_sub(1),
            frames: vec![format!("demo.rs (synthetic) {op_name}")],
        })
    }
}

/// The generator: one iteration's events at a time.
pub struct DemoGen {
    cfg: DemoConfig,
    alloc: CachingAllocator<SimDevice>,
    out: Vec<Event>,
    params: Vec<u64>,
    grads: Vec<u64>,
    opt_state: Vec<u64>,
    kept: Vec<u64>,
    iteration: u32,
    failed: bool,
}

impl DemoGen {
    pub fn new(cfg: DemoConfig) -> DemoGen {
        let device = SimDevice::new("sim:demo", cfg.device_total, cfg.device_overhead);
        DemoGen {
            alloc: CachingAllocator::new(device, AllocConfig::default()),
            cfg,
            out: Vec::new(),
            params: Vec::new(),
            grads: Vec::new(),
            opt_state: Vec::new(),
            kept: Vec::new(),
            iteration: 0,
            failed: false,
        }
    }

    pub fn done(&self) -> bool {
        self.failed || self.iteration >= self.cfg.iterations
    }

    pub fn stats(&self) -> crate::alloc::MemoryStats {
        self.alloc.stats().clone()
    }

    fn flush(&mut self) {
        let events = self.alloc.take_events();
        self.out.extend(events.into_iter().map(Event::Alloc));
    }

    fn mark(&mut self, m: Marker) {
        self.flush();
        self.out.push(Event::Marker(m));
    }

    fn op(&mut self, op: usize, layer: Option<usize>) {
        let (name, module) = OPS[op];
        let module = layer.map_or(module.to_string(), |l| format!("{module}.{l}"));
        self.mark(Marker::OpBegin {
            name: name.into(),
            module: module.into(),
        });
    }

    fn malloc(&mut self, size: u64, t: Tag) -> Result<u64, String> {
        let r = self.alloc.malloc(size, 0, t);
        self.flush();
        r.map_err(|e| e.to_string())
    }

    fn free(&mut self, addr: u64) {
        // Only addresses this generator got back from malloc are freed.
        let _ = self.alloc.free(addr);
        self.flush();
    }

    /// The next iteration's events (parameters come with the first), or
    /// `None` when done. An OOM ends the run with an error marker.
    pub fn next_iteration(&mut self) -> Option<Vec<Event>> {
        if self.done() {
            return None;
        }
        if let Err(msg) = self.iteration_body() {
            self.flush();
            self.mark(Marker::Error(msg.into()));
            self.failed = true;
        }
        self.iteration += 1;
        Some(std::mem::take(&mut self.out))
    }

    fn iteration_body(&mut self) -> Result<(), String> {
        let k = self.iteration;
        let (layers, w, act) = (
            self.cfg.layers,
            self.cfg.weight_bytes,
            self.cfg.activation_bytes,
        );
        if k == 0 {
            self.mark(Marker::Narration(
                "Parameters are allocated once. Each iteration, forward saves activations for backward; backward frees them in reverse.".into(),
            ));
            self.op(0, None);
            for l in 0..layers {
                let p = self.malloc(w, tag("parameter", 0, Some(l), None))?;
                self.params.push(p);
                let b = self.malloc(4096, tag("parameter", 0, Some(l), None))?;
                self.params.push(b);
            }
            self.mark(Marker::OpEnd);
        }
        self.mark(Marker::IterationBegin(k));
        // zero_grad(set_to_none=True) drops the gradients.
        self.op(1, None);
        for g in std::mem::take(&mut self.grads) {
            self.free(g);
        }
        self.mark(Marker::OpEnd);
        self.mark(Marker::PhaseBegin(Phase::Forward));
        self.op(2, None);
        let input = self.malloc(2 * MIB, tag("input", 2, None, Some(k)))?;
        self.mark(Marker::OpEnd);
        let mut saved = Vec::with_capacity(layers);
        for l in 0..layers {
            self.op(3, Some(l));
            let ws = self.malloc(256 * 1024, tag("workspace", 3, Some(l), Some(k)))?;
            // Sizes vary a little per layer and iteration, as real shapes do.
            let size = act + (l as u64 * 3 + u64::from(k % 5)) * 64 * 1024;
            saved.push(self.malloc(size, tag("autograd_saved", 3, Some(l), Some(k)))?);
            self.free(ws);
            self.mark(Marker::OpEnd);
        }
        self.op(4, None);
        let logits_size = self.cfg.leak_bytes.max(MIB);
        let logits = self.malloc(logits_size, tag("activation", 4, None, Some(k)))?;
        let loss = self.malloc(512, tag("activation", 4, None, Some(k)))?;
        self.mark(Marker::OpEnd);
        self.mark(Marker::PhaseEnd(Phase::Forward));
        self.mark(Marker::PhaseBegin(Phase::Backward));
        for l in (0..layers).rev() {
            self.op(5, Some(l));
            let g = self.malloc(w, tag("gradient", 5, Some(l), Some(k)))?;
            self.grads.push(g);
            let tmp = self.malloc(act, tag("temporary", 5, Some(l), Some(k)))?;
            self.free(tmp);
            if let Some(s) = saved.pop() {
                self.free(s);
            }
            self.mark(Marker::OpEnd);
        }
        self.free(input);
        self.free(loss);
        if self.cfg.leak_bytes > 0 {
            self.kept.push(logits);
        } else {
            self.free(logits);
        }
        self.mark(Marker::PhaseEnd(Phase::Backward));
        self.mark(Marker::PhaseBegin(Phase::Optimizer));
        self.op(6, None);
        if self.opt_state.is_empty() {
            for l in 0..layers * 2 {
                let s = self.malloc(w, tag("optimizer_state", 6, Some(l / 2), Some(k)))?;
                self.opt_state.push(s);
            }
        }
        let tmp = self.malloc(w, tag("temporary", 6, None, Some(k)))?;
        self.free(tmp);
        self.mark(Marker::OpEnd);
        self.mark(Marker::PhaseEnd(Phase::Optimizer));
        if k == 1 {
            self.mark(Marker::Narration(
                "Adam's exp_avg and exp_avg_sq were allocated at the first step and stay for the whole run.".into(),
            ));
        }
        if k == 3 && self.cfg.leak_bytes > 0 {
            self.mark(Marker::Narration(
                "Allocated grows by one logits block per iteration: history.append(logits) keeps each one alive.".into(),
            ));
        }
        self.mark(Marker::IterationEnd(k));
        Ok(())
    }

    /// The synthetic finding for the kept blocks (none without a leak).
    pub fn findings(&self) -> Vec<Finding> {
        if self.kept.len() < 2 {
            return Vec::new();
        }
        let per = self.cfg.leak_bytes;
        let n = self.kept.len() as u64;
        let free = self
            .cfg
            .device_total
            .saturating_sub(self.cfg.device_overhead + self.alloc.stats().reserved_bytes());
        // `Finding::new` keeps this compiling as the finding grows fields.
        let mut f = Finding::new("history", FindingKind::StoredTensors);
        f.bytes = n * per;
        f.growth_per_iter = per as i64;
        f.iterations = self.kept.len() as u32;
        f.path = vec![
            "history (list)".into(),
            format!(
                "history[0..{n}] → logits [{}]",
                crate::alloc::format_size(per)
            ),
        ];
        f.fix = "history.append(logits.detach().cpu()) or keep loss.item()".into();
        f.severity = if n * per > self.cfg.device_total / 4 {
            Severity::Critical
        } else {
            Severity::Warning
        };
        f.evidence = "demo producer: synthetic finding, not from the leak detector".into();
        f.full_at_iteration = (per > 0).then(|| u64::from(self.iteration) + free / per);
        f.by_category = vec![("activation", n * per)];
        f.blocks = self.kept.clone();
        vec![f]
    }
}

/// Every event and the final findings of a demo run, synchronously.
pub fn generate(cfg: DemoConfig) -> (Vec<Event>, Vec<Finding>) {
    let mut g = DemoGen::new(cfg);
    let mut events = Vec::new();
    while let Some(mut batch) = g.next_iteration() {
        events.append(&mut batch);
    }
    (events, g.findings())
}

/// Events until at least `n` have been produced (benches).
pub fn generate_at_least(n: usize) -> (Vec<Event>, Vec<Finding>) {
    let mut g = DemoGen::new(DemoConfig::bulk(u32::MAX));
    let mut events = Vec::with_capacity(n + 1024);
    while events.len() < n {
        match g.next_iteration() {
            Some(mut b) => events.append(&mut b),
            None => break,
        }
    }
    (events, g.findings())
}

/// Run the demo on its own thread, paced, honouring `Restart`.
pub fn spawn(cfg: DemoConfig) -> Source {
    let (tx, rx) = flume::unbounded();
    let (cmd_tx, cmd_rx) = flume::unbounded::<EngineCommand>();
    let capacity = cfg.device_total;
    let spawned = thread::Builder::new()
        .name("vramscope-demo".into())
        .spawn(move || producer(cfg, &tx, &cmd_rx));
    if let Err(e) = spawned {
        // No thread: the UI shows the failure instead of waiting.
        let (tx2, rx2) = flume::unbounded();
        let _ = tx2.send(SourceMsg::Failed(format!(
            "could not start the demo thread: {e}"
        )));
        return Source::new(rx2, None).with_capacity(capacity);
    }
    Source::new(rx, Some(cmd_tx))
        .with_capacity(capacity)
        .with_tags(Arc::new(DemoTags))
}

/// Returns when the UI hangs up (a send fails or the command channel closes).
fn producer(cfg: DemoConfig, tx: &flume::Sender<SourceMsg>, cmd: &flume::Receiver<EngineCommand>) {
    'run: loop {
        let mut g = DemoGen::new(cfg.clone());
        while let Some(events) = g.next_iteration() {
            for chunk in split_after_ops(events) {
                if tx.send(SourceMsg::Events(chunk)).is_err() {
                    return;
                }
                if let Ok(EngineCommand::Restart) = cmd.try_recv() {
                    if tx.send(SourceMsg::Restarted).is_err() {
                        return;
                    }
                    continue 'run;
                }
                if !cfg.batch_sleep.is_zero() {
                    thread::sleep(cfg.batch_sleep);
                }
            }
            let sent = tx.send(SourceMsg::Findings(g.findings())).is_ok()
                && tx.send(SourceMsg::Stats(Box::new(g.stats()))).is_ok();
            if !sent {
                return;
            }
        }
        if tx.send(SourceMsg::Finished).is_err() {
            return;
        }
        // Finished: wait for a restart or for the UI to go away.
        match cmd.recv() {
            Ok(EngineCommand::Restart) => {
                if tx.send(SourceMsg::Restarted).is_err() {
                    return;
                }
            }
            Err(_) => return,
        }
    }
}

/// One batch per op, so playback advances op by op.
fn split_after_ops(events: Vec<Event>) -> Vec<Vec<Event>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    for e in events {
        let end = matches!(e, Event::Marker(Marker::OpEnd));
        cur.push(e);
        if end {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}
