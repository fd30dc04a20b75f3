//! The scenario-run leak detector (engine.md §9, §9.1, §11.2).
//!
//! Fed the engine's [`LiveState`] after every iteration (and on demand at any
//! frame), it groups the roots (a variable, a list, the carried hidden state,
//! the gradients, …), computes what each group keeps alive *exclusively* —
//! its own storages plus the saved tensors of graphs only it reaches — and
//! keeps a compact history per group. Findings are only made where that
//! history supports them: growth over at least [`MIN_GROWTH_STEPS`]
//! iteration boundaries, or a graph chain spanning that many iterations.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::finding::{Finding, FindingKind, Severity};
use super::format::{block_bytes, dtype, shape, signed_size, size};
use super::program::{Binder, ProgramFacts};
use crate::engine::{
    Category, DeviceKind, Engine, EngineError, EngineEvent, KeepWhat, LiveState, Program, RootKind,
    BACKWARD_TWICE,
};

/// Growth must be seen across this many consecutive iteration boundaries.
pub const MIN_GROWTH_STEPS: usize = 3;
/// Samples kept per group and for the whole device.
const HISTORY: usize = 64;
const NONE: u32 = u32::MAX;
const SHARED: u32 = u32::MAX - 1;

/// One iteration's device-wide figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IterationSample {
    pub iteration: u32,
    pub allocated: u64,
    pub reserved: u64,
    pub host_graph_nodes: usize,
}

/// One group's figures at one iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroupSample {
    pub iteration: u32,
    /// Block bytes of the group's own GPU storages held by nothing else.
    pub own: u64,
    /// Block bytes of un-released saved tensors only this group's graphs reach.
    pub graph: u64,
    /// Distinct autograd Nodes reachable (host memory).
    pub nodes: u32,
    /// Of those, released (spent) ones.
    pub spent: u32,
    pub oldest_node_iteration: Option<u32>,
    /// Of `own` and `graph`: bytes of storages created before this iteration
    /// (what survived a boundary; growth is judged on these).
    pub own_old: u64,
    pub graph_old: u64,
    /// Roots in the group (list length, 2 for a hidden pair).
    pub elements: u32,
    /// Oldest creation iteration among the group's exclusive storages.
    pub oldest_storage_iteration: Option<u32>,
}

impl GroupSample {
    pub fn gpu(&self) -> u64 {
        self.own + self.graph
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GroupKind {
    Variable,
    List,
    Hidden,
    Other,
}

#[derive(Debug, Clone)]
struct GroupHistory {
    samples: VecDeque<GroupSample>,
}

/// Per-observation scratch for one group.
#[derive(Debug, Clone)]
struct GroupAcc<'a> {
    name: &'a str,
    kind: GroupKind,
    roots: Vec<usize>,
    sample: GroupSample,
    by_cat: [u64; CATS],
}

const CATS: usize = 14;
const CAT_NAMES: [&str; CATS] = [
    "autograd_saved",
    "activation",
    "gradient",
    "parameter",
    "optimizer_state",
    "temporary",
    "input",
    "buffer",
    "workspace",
    "amp_cache",
    "scaler",
    "recompute",
    "cpu",
    "other",
];

fn cat_index(c: Category, saved: bool) -> usize {
    if saved {
        return 0;
    }
    match c {
        Category::AutogradSaved => 0,
        Category::Activation => 1,
        Category::Gradient => 2,
        Category::Parameter => 3,
        Category::OptimizerState => 4,
        Category::Temporary => 5,
        Category::Input => 6,
        Category::Buffer => 7,
        Category::Workspace => 8,
        Category::AmpCache => 9,
        Category::Scaler => 10,
        Category::Recompute => 11,
        Category::Cpu => 12,
    }
}

/// The leak detector for scenario runs. See the module docs.
#[derive(Debug, Clone, Default)]
pub struct Detector {
    capacity: u64,
    facts: ProgramFacts,
    iterations: VecDeque<IterationSample>,
    groups: FxHashMap<String, GroupHistory>,
    /// Per gradient root: (name, storage creation iteration) at the last sample;
    /// the count of consecutive samples in which every grad persisted.
    grad_persist_streak: u32,
    grad_bytes: u64,
    grad_blocks: Vec<u64>,
    findings: Vec<Finding>,
    error: Option<String>,
    pending_end: Option<(u32, u64, u64)>,
    // Scratch buffers reused between observations.
    owner: Vec<u32>,
    is_own: Vec<bool>,
    node_pos: Vec<u32>,
    node_mark: Vec<u32>,
}

impl Detector {
    /// A detector for a device of `capacity` bytes (0: no projection).
    pub fn new(capacity: u64) -> Detector {
        Detector {
            capacity,
            ..Detector::default()
        }
    }

    /// A detector sized for the engine's device.
    pub fn for_engine(engine: &Engine) -> Detector {
        use crate::device::Device;
        Detector::new(engine.allocator().device().total_memory())
    }

    /// Read the program too: fixes can name the real statement, and
    /// `zero_grad` / `no_grad` facts come from the steps (§9 pitfalls 4, 6).
    pub fn with_program(mut self, p: &Program) -> Detector {
        self.facts = ProgramFacts::from_program(p);
        self
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The per-iteration device history (oldest first, at most 64).
    pub fn history(&self) -> impl Iterator<Item = &IterationSample> {
        self.iterations.iter()
    }

    /// One group's history (a variable, a list name, `hidden`).
    pub fn group_history(&self, name: &str) -> Vec<GroupSample> {
        self.groups
            .get(name)
            .map(|g| g.samples.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The findings as of the last observation.
    pub fn findings(&self) -> &[Finding] {
        &self.findings
    }

    /// Feed engine events (from `take_events` or the thread's channel): an
    /// `IterationEnd` followed by a `LiveState` is one observation.
    pub fn observe_events(&mut self, events: &[EngineEvent]) {
        for ev in events {
            match ev {
                EngineEvent::IterationEnd {
                    iter,
                    allocated,
                    reserved,
                    ..
                } => self.pending_end = Some((*iter, *allocated, *reserved)),
                EngineEvent::LiveState(ls) => {
                    let (a, r) = match self.pending_end {
                        Some((i, a, r)) if i == ls.iteration => (a, r),
                        _ => (ls.allocated, ls.reserved),
                    };
                    self.observe(ls, a, r);
                }
                EngineEvent::Error { message, .. } => self.error = Some(message.clone()),
                _ => {}
            }
        }
    }

    /// Feed one observation. A second observation of the same iteration (an
    /// on-demand query at a frame) replaces that iteration's sample.
    pub fn observe(&mut self, ls: &LiveState, allocated: u64, reserved: u64) -> &[Finding] {
        let it = ls.iteration;
        push_sample(
            &mut self.iterations,
            IterationSample {
                iteration: it,
                allocated,
                reserved,
                host_graph_nodes: ls.host_graph_nodes,
            },
            |s| s.iteration,
        );
        self.analyze(ls);
        &self.findings
    }

    /// Feed an engine error that stopped the run (e.g. the backward-twice
    /// error of a hidden state carried without `detach`, §8.3).
    pub fn observe_error(&mut self, err: &EngineError, ls: &LiveState) -> &[Finding] {
        self.error = Some(err.to_string());
        let before = self.findings.clone();
        let (a, r) = (ls.allocated, ls.reserved);
        self.observe(ls, a, r);
        // The failing iteration stopped part-way, so it cannot show growth;
        // what the complete iterations before it showed still stands.
        for f in before {
            if !self.findings.iter().any(|n| n.root == f.root) {
                self.findings.push(f);
            }
        }
        &self.findings
    }

    fn analyze(&mut self, ls: &LiveState) {
        let it = ls.iteration;
        // Index storages and nodes by id.
        let max_sid = ls
            .storages
            .iter()
            .map(|s| s.id.0)
            .max()
            .map_or(0, |m| m as usize + 1);
        let mut spos = std::mem::take(&mut self.node_pos);
        spos.clear();
        spos.resize(max_sid, NONE);
        for (i, s) in ls.storages.iter().enumerate() {
            spos[s.id.0 as usize] = i as u32;
        }
        let max_nid = ls
            .nodes
            .iter()
            .map(|n| n.id.0)
            .max()
            .map_or(0, |m| m as usize + 1);
        let mut npos = vec![NONE; max_nid];
        for (i, n) in ls.nodes.iter().enumerate() {
            npos[n.id.0 as usize] = i as u32;
        }

        // Group the roots.
        let mut accs: Vec<GroupAcc> = Vec::new();
        let mut index: FxHashMap<&str, usize> = FxHashMap::default();
        let mut root_group = vec![NONE; ls.roots.len()];
        let mut grads: Vec<usize> = Vec::new();
        for (ri, r) in ls.roots.iter().enumerate() {
            let (name, kind) = match r.kind {
                RootKind::Variable => (r.name.as_str(), GroupKind::Variable),
                RootKind::ListElement { .. } => (strip_index(&r.name), GroupKind::List),
                RootKind::HiddenState => (strip_index(&r.name), GroupKind::Hidden),
                RootKind::Gradient => {
                    grads.push(ri);
                    ("gradients", GroupKind::Other)
                }
                RootKind::Parameter => ("parameters", GroupKind::Other),
                RootKind::ModuleBuffer => ("module buffers", GroupKind::Other),
                RootKind::AmpCache => ("autocast cache", GroupKind::Other),
                RootKind::OptimizerState => ("optimizer state", GroupKind::Other),
                RootKind::ScalerState => ("grad scaler", GroupKind::Other),
                RootKind::CheckpointInput => ("checkpoint inputs", GroupKind::Other),
            };
            let g = *index.entry(name).or_insert_with(|| {
                accs.push(GroupAcc {
                    name,
                    kind,
                    roots: Vec::new(),
                    sample: GroupSample {
                        iteration: it,
                        ..GroupSample::default()
                    },
                    by_cat: [0; CATS],
                });
                accs.len() - 1
            });
            accs[g].roots.push(ri);
            root_group[ri] = g as u32;
        }

        // Nodes per group (deduplicated: a hidden pair shares one graph).
        let mut mark = std::mem::take(&mut self.node_mark);
        mark.clear();
        mark.resize(max_nid, NONE);
        for (g, acc) in accs.iter_mut().enumerate() {
            if acc.kind == GroupKind::Other {
                continue;
            }
            acc.sample.elements = acc.roots.len() as u32;
            for &ri in &acc.roots {
                let r = &ls.roots[ri];
                if let Some(o) = r.oldest_node_iteration {
                    acc.sample.oldest_node_iteration =
                        Some(acc.sample.oldest_node_iteration.map_or(o, |x| x.min(o)));
                }
                for n in &r.nodes {
                    let i = n.0 as usize;
                    if i >= mark.len() || mark[i] == g as u32 {
                        continue;
                    }
                    mark[i] = g as u32;
                    acc.sample.nodes += 1;
                    let p = npos[i];
                    if p != NONE && ls.nodes[p as usize].released {
                        acc.sample.spent += 1;
                    }
                }
            }
        }

        // Who holds each storage. Own storages: the group whose tensor it is
        // (two groups' tensors on one storage: shared, nobody's alone). Saved
        // storages no tensor holds: charged to the most direct holder, the
        // group with the smallest graph that reaches them (a hidden state's
        // chain is also reached by the `loss` computed from it).
        let mut owner = std::mem::take(&mut self.owner);
        let mut is_own = std::mem::take(&mut self.is_own);
        owner.clear();
        owner.resize(ls.storages.len(), NONE);
        is_own.clear();
        is_own.resize(ls.storages.len(), false);
        for (ri, r) in ls.roots.iter().enumerate() {
            let g = root_group[ri];
            let p = lookup(&spos, r.storage.0);
            if p == NONE {
                continue;
            }
            let p = p as usize;
            owner[p] = match owner[p] {
                NONE => g,
                x if x == g => g,
                _ => SHARED,
            };
            is_own[p] = true;
        }
        let weight = |g: u32| -> u32 {
            let a = &accs[g as usize];
            if a.kind == GroupKind::Other {
                u32::MAX
            } else {
                a.sample.nodes
            }
        };
        for (ri, r) in ls.roots.iter().enumerate() {
            let g = root_group[ri];
            for sid in &r.saved_storages {
                let p = lookup(&spos, sid.0);
                if p == NONE || is_own[p as usize] {
                    continue;
                }
                let p = p as usize;
                owner[p] = match owner[p] {
                    NONE => g,
                    x if x == g || x == SHARED => x,
                    x => match weight(g).cmp(&weight(x)) {
                        std::cmp::Ordering::Less => g,
                        std::cmp::Ordering::Greater => x,
                        std::cmp::Ordering::Equal => SHARED,
                    },
                };
            }
        }

        // Bytes per group.
        for (p, s) in ls.storages.iter().enumerate() {
            let g = owner[p];
            if g == NONE || g == SHARED || s.device != DeviceKind::Cuda {
                continue;
            }
            let acc = &mut accs[g as usize];
            let b = block_bytes(s.bytes);
            let old = s.iteration < it;
            if is_own[p] {
                acc.sample.own += b;
                acc.sample.own_old += if old { b } else { 0 };
                acc.by_cat[cat_index(s.category, s.saved_by > 0)] += b;
            } else if s.tensor_refs == 0 && !s.engine_held {
                acc.sample.graph += b;
                acc.sample.graph_old += if old { b } else { 0 };
                acc.by_cat[cat_index(s.category, true)] += b;
            } else {
                continue;
            }
            acc.sample.oldest_storage_iteration = Some(
                acc.sample
                    .oldest_storage_iteration
                    .map_or(s.iteration, |o| o.min(s.iteration)),
            );
        }

        // Gradients that persist across iterations (never zeroed with set_to_none).
        let mut grad_bytes = 0;
        let mut grad_blocks = Vec::new();
        let mut persisted = !grads.is_empty();
        let mut grad_storages: Vec<u32> = grads
            .iter()
            .map(|&ri| lookup(&spos, ls.roots[ri].storage.0))
            .filter(|p| *p != NONE)
            .collect();
        grad_storages.sort_unstable();
        grad_storages.dedup();
        for p in grad_storages {
            let s = &ls.storages[p as usize];
            persisted &= s.iteration < it;
            grad_bytes += block_bytes(s.bytes);
            if let Some(a) = s.addr {
                grad_blocks.push(a);
            }
        }
        let last_it = self.iterations.iter().rev().nth(1).map(|s| s.iteration);
        if persisted {
            if last_it != Some(it) {
                self.grad_persist_streak += 1;
            }
        } else {
            self.grad_persist_streak = 0;
        }
        self.grad_bytes = grad_bytes;
        self.grad_blocks = grad_blocks;

        // Record the history and forget groups that are gone.
        for acc in &accs {
            if acc.kind == GroupKind::Other {
                continue;
            }
            match self.groups.get_mut(acc.name) {
                Some(h) => {
                    if h.samples.back().is_some_and(|s| s.iteration + 1 < it) {
                        h.samples.clear();
                    }
                    push_sample(&mut h.samples, acc.sample, |s| s.iteration);
                }
                None => {
                    let mut samples = VecDeque::with_capacity(8);
                    samples.push_back(acc.sample);
                    self.groups
                        .insert(acc.name.to_string(), GroupHistory { samples });
                }
            }
        }
        if self.groups.len() > accs.len() {
            self.groups.retain(|k, _| index.contains_key(k.as_str()));
        }

        // Classify.
        let mut findings = Vec::new();
        let ctx = Ctx {
            ls,
            owner: &owner,
            is_own: &is_own,
            spos: &spos,
            npos: &npos,
        };
        let mut gpu_leak = false;
        for (g, acc) in accs.iter().enumerate() {
            if acc.kind == GroupKind::Other {
                continue;
            }
            let Some(h) = self.groups.get(acc.name) else {
                continue;
            };
            if let Some(f) = self.classify(&ctx, g as u32, acc, h) {
                gpu_leak |= f.growth_per_iter > 0 && f.kind != FindingKind::RetainedGraphHost;
                findings.push(f);
            }
        }
        if let Some(f) = self.fragmentation(gpu_leak) {
            findings.push(f);
        }
        if let Some(f) = self.missing_zero_grad() {
            findings.push(f);
        }
        if findings.iter().all(|f| !f.kind.is_leak()) {
            if let Some(f) = self.one_off_peak(&ctx, &accs) {
                findings.push(f);
            }
        }
        findings.sort_by(|a, b| b.severity.cmp(&a.severity).then(b.bytes.cmp(&a.bytes)));
        self.findings = findings;
        self.owner = owner;
        self.is_own = is_own;
        self.node_pos = spos;
        self.node_mark = mark;
    }

    fn classify(&self, ctx: &Ctx, g: u32, acc: &GroupAcc, h: &GroupHistory) -> Option<Finding> {
        let s: Vec<GroupSample> = h.samples.iter().copied().collect();
        let cur = *s.last()?;
        let it = cur.iteration;
        let graph = trend(&s, |x| x.graph_old);
        let own = trend(&s, |x| x.own_old);
        let nodes = trend(&s, |x| x.nodes as u64);
        let chain_span = cur
            .oldest_node_iteration
            .map_or(0, |o| it.saturating_sub(o) as usize + 1);
        let gpu_total = trend(&s, |x| x.own_old + x.graph_old);
        let name = acc.name;

        let graph_growing = graph.steps >= MIN_GROWTH_STEPS
            || (chain_span >= MIN_GROWTH_STEPS && graph.steps >= MIN_GROWTH_STEPS - 1);
        let (kind, per_iter, growth_steps) = if cur.graph > 0 && graph_growing {
            let kind = if acc.kind == GroupKind::Hidden {
                FindingKind::CarriedHiddenState
            } else {
                FindingKind::RetainedGraphGpu
            };
            let per = gpu_total.per_iter.max(graph.per_iter);
            (kind, per, graph.steps)
        } else if own.steps >= MIN_GROWTH_STEPS && cur.own > 0 {
            // A container (or accumulator) gains GPU storages every iteration.
            let zero_dim = acc.kind == GroupKind::List
                && cur.elements > 0
                && cur.own / cur.elements as u64 <= 512;
            let kind = if zero_dim && nodes.steps >= MIN_GROWTH_STEPS && cur.spent > 0 {
                FindingKind::RetainedGraphHost
            } else {
                FindingKind::StoredTensors
            };
            (kind, own.per_iter, own.steps)
        } else if nodes.steps >= MIN_GROWTH_STEPS && chain_span >= 2 && cur.graph == 0 {
            (
                FindingKind::RetainedGraphHost,
                gpu_total.per_iter.max(0),
                nodes.steps,
            )
        } else if self.error.as_deref().is_some_and(|e| {
            e.contains(BACKWARD_TWICE)
                || (acc.kind == GroupKind::Hidden && e.contains("RuntimeError"))
        }) && chain_span >= 2
        {
            // The run stopped: a carried graph reached an already-released one.
            let kind = if acc.kind == GroupKind::Hidden {
                FindingKind::CarriedHiddenState
            } else {
                FindingKind::RetainedGraphHost
            };
            (kind, 0, 0)
        } else {
            return None;
        };

        let mut f = Finding::new(name, kind);
        f.bytes = cur.gpu();
        f.growth_per_iter = per_iter;
        f.iterations = match kind {
            FindingKind::StoredTensors => cur
                .oldest_storage_iteration
                .map_or(1, |o| it.saturating_sub(o) + 1),
            _ => chain_span.max(1) as u32,
        };
        f.by_category = categories(&acc.by_cat);
        f.blocks = blocks_of(ctx, g);
        f.path = path_for(ctx, g, acc, kind);
        f.full_at_iteration = self.projection(it, per_iter, kind);
        f.fix = self.fix_for(name, kind);
        let node_growth = nodes.per_iter;
        f.evidence = match kind {
            FindingKind::RetainedGraphGpu => format!(
                "`{name}` reaches {} autograd Nodes created over {} iterations whose saved tensors were never \
                 released; {} of saved activations are reachable only through it and grew by {} per \
                 iteration over the last {growth_steps} iterations (engine.md §9.1: S_iter per iteration).",
                cur.nodes,
                f.iterations,
                size(cur.graph),
                signed_size(graph.per_iter),
            ),
            FindingKind::CarriedHiddenState => {
                if growth_steps == 0 {
                    format!(
                        "`{name}` is carried into the next batch without detach(): its graph reaches Nodes of \
                         iteration {} and the run stopped with \"{}\" (engine.md §8.3).",
                        cur.oldest_node_iteration.unwrap_or(0),
                        self.error.as_deref().unwrap_or(""),
                    )
                } else {
                    format!(
                        "`{name}` carries the graph of every batch since iteration {}: {} Nodes, {} of saved \
                         tensors (reserve, outputs, log-probs) kept alive, growing by {} per iteration; \
                         backward also walks the whole history (engine.md §8.3, pitfall 3b).",
                        cur.oldest_node_iteration.unwrap_or(0),
                        cur.nodes,
                        size(cur.graph),
                        signed_size(graph.per_iter),
                    )
                }
            }
            FindingKind::StoredTensors => {
                let mut e = format!(
                    "`{name}` holds {} GPU tensors ({}) that nothing else references and gains {} per \
                     iteration over the last {growth_steps} iterations; they carry no un-released graph \
                     (a growing list, not a retained graph).",
                    cur.elements,
                    size(cur.own),
                    signed_size(own.per_iter),
                );
                if cur.nodes > 0 {
                    e.push_str(&format!(
                        " They also keep {} spent autograd Nodes on the host.",
                        cur.nodes
                    ));
                }
                e
            }
            FindingKind::RetainedGraphHost => {
                if growth_steps == 0 {
                    format!(
                        "`{name}` links graphs of iterations {}..{it}; the run stopped with \"{}\".",
                        cur.oldest_node_iteration.unwrap_or(0),
                        self.error.as_deref().unwrap_or(""),
                    )
                } else {
                    format!(
                        "`{name}` keeps every iteration's spent graph linked since iteration {}: {} Nodes on \
                         the host (+{} per iteration), all saved tensors already freed by backward. GPU growth \
                         is {} per iteration ({} now) — host memory grows, the GPU does not run out \
                         from this (engine.md §9 pitfalls 1, 2). A later `{name}.backward()` would raise the \
                         backward-twice error.",
                        cur.oldest_node_iteration.unwrap_or(0),
                        cur.nodes,
                        node_growth.max(0),
                        signed_size(per_iter),
                        size(cur.gpu()),
                    )
                }
            }
            _ => String::new(),
        };
        f.severity = match kind {
            FindingKind::RetainedGraphGpu | FindingKind::CarriedHiddenState => Severity::Critical,
            FindingKind::StoredTensors => {
                if f.full_at_iteration.is_some_and(|n| n < it as u64 + 10_000) {
                    Severity::Critical
                } else {
                    Severity::Warning
                }
            }
            _ => Severity::Warning,
        };
        Some(f)
    }

    fn projection(&self, it: u32, per_iter: i64, kind: FindingKind) -> Option<u64> {
        if per_iter <= 0 || self.capacity == 0 || kind == FindingKind::RetainedGraphHost {
            return None;
        }
        let alloc = self.iterations.back().map_or(0, |s| s.allocated);
        let free = self.capacity.saturating_sub(alloc);
        Some(it as u64 + free.div_ceil(per_iter as u64))
    }

    fn fragmentation(&self, gpu_leak: bool) -> Option<Finding> {
        if gpu_leak || self.iterations.len() < MIN_GROWTH_STEPS + 1 {
            return None;
        }
        let v: Vec<&IterationSample> = self.iterations.iter().collect();
        // Skip iteration 1 (and setup): first-iteration state is not drift.
        let w: Vec<&IterationSample> = v.iter().copied().filter(|s| s.iteration >= 2).collect();
        if w.len() < MIN_GROWTH_STEPS + 1 {
            return None;
        }
        let ups = w
            .windows(2)
            .filter(|p| p[1].reserved > p[0].reserved)
            .count();
        let (first, last) = (w[0], w[w.len() - 1]);
        let r_growth = last.reserved.saturating_sub(first.reserved);
        let a_min = w.iter().map(|s| s.allocated).min().unwrap_or(0);
        let a_max = w.iter().map(|s| s.allocated).max().unwrap_or(0);
        let a_drift = a_max - a_min;
        let gap_first = first.reserved.saturating_sub(first.allocated);
        let gap_last = last.reserved.saturating_sub(last.allocated);
        // Reserved moves in steps (a new largest shape), not every iteration.
        if ups < 2 || r_growth == 0 || a_drift * 4 > r_growth || gap_last <= gap_first {
            return None;
        }
        let n = (last.iteration - first.iteration).max(1) as i64;
        let mut f = Finding::new("allocator cache", FindingKind::CacheFragmentation);
        f.bytes = gap_last;
        f.growth_per_iter = r_growth as i64 / n;
        f.iterations = last.iteration - first.iteration + 1;
        f.path = vec![
            format!(
                "reserved {} → {}",
                size(first.reserved),
                size(last.reserved)
            ),
            format!("allocated {}..{} (flat)", size(a_min), size(a_max)),
            format!("reserved but unallocated {}", size(gap_last)),
        ];
        f.fix = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or pad/bucket shapes, largest first)".into();
        f.evidence = format!(
            "Reserved grew in {ups} of {} iterations (+{} in total) while allocated at iteration end stayed \
             within {}: cached free blocks of the wrong sizes, not a leak — no tensor is retained \
             (engine.md §9 pitfall 11). empty_cache() would return only fully free segments.",
            w.len() - 1,
            size(r_growth),
            size(a_drift),
        );
        f.severity = if self.capacity > 0 && last.reserved * 10 > self.capacity * 9 {
            Severity::Warning
        } else {
            Severity::Info
        };
        Some(f)
    }

    fn missing_zero_grad(&self) -> Option<Finding> {
        let streak = self.grad_persist_streak as usize;
        if streak < MIN_GROWTH_STEPS {
            return None;
        }
        let known = self.facts.known;
        if known && (self.facts.has_zero_grad || !self.facts.has_backward) {
            return None;
        }
        let mut f = Finding::new("gradients", FindingKind::MissingZeroGrad);
        f.bytes = self.grad_bytes;
        f.growth_per_iter = 0;
        f.iterations = streak as u32;
        f.blocks = self.grad_blocks.clone();
        f.by_category = vec![("gradient", self.grad_bytes)];
        f.path = vec![
            "param.grad".into(),
            format!("same storages for {streak} iterations"),
            "AccumulateGrad adds in place".into(),
        ];
        f.fix = "optimizer.zero_grad()  # every step, before the forward".into();
        if known {
            f.severity = Severity::Warning;
            f.evidence = format!(
                "The program calls backward() every iteration but never zero_grad(): the {} of .grad \
                 storages have persisted for {streak} iterations and every backward adds into them in \
                 place. Memory stays flat (engine.md §3.1); the gradients are summed over iterations, \
                 so the values are wrong.",
                size(self.grad_bytes)
            );
        } else {
            f.severity = Severity::Info;
            f.evidence = format!(
                "Every .grad storage ({}) has persisted unchanged for {streak} iterations. Either \
                 zero_grad() is never called (gradients summed: wrong values, memory flat) or it is \
                 called with set_to_none=False; the live state alone cannot tell which (the engine does \
                 not expose when a grad was last zeroed).",
                size(self.grad_bytes)
            );
        }
        Some(f)
    }

    fn one_off_peak(&self, ctx: &Ctx, accs: &[GroupAcc]) -> Option<Finding> {
        if !(self.facts.known && self.facts.eval_with_grad)
            || self.iterations.len() < MIN_GROWTH_STEPS
        {
            return None;
        }
        // The graph variables hold at iteration end, shared or not.
        let ls = ctx.ls;
        let mut names = Vec::new();
        let mut bytes = 0;
        let mut blocks = Vec::new();
        let mut seen = vec![false; ls.storages.len()];
        for acc in accs.iter().filter(|a| a.kind == GroupKind::Variable) {
            let mut any = false;
            for &ri in &acc.roots {
                for s in &ls.roots[ri].saved_storages {
                    let p = lookup(ctx.spos, s.0);
                    if p == NONE || seen[p as usize] {
                        continue;
                    }
                    let st = &ls.storages[p as usize];
                    if st.device != DeviceKind::Cuda || st.tensor_refs > 0 || st.engine_held {
                        continue;
                    }
                    seen[p as usize] = true;
                    any = true;
                    bytes += block_bytes(st.bytes);
                    if let Some(a) = st.addr {
                        blocks.push(a);
                    }
                }
            }
            if any {
                names.push(acc.name);
            }
        }
        if bytes == 0 {
            return None;
        }
        let mut f = Finding::new(names.join(", "), FindingKind::OneOffPeak);
        f.bytes = bytes;
        f.iterations = 1;
        f.blocks = blocks;
        f.by_category = vec![("autograd_saved", bytes)];
        f.path = names
            .iter()
            .map(|n| format!("{n} → graph of iteration {} (saved tensors)", ls.iteration))
            .collect();
        f.fix = "with torch.no_grad():  # around evaluation; model.eval() alone still records the graph".into();
        f.evidence = format!(
            "Evaluation runs with grad enabled: {} of saved tensors stay alive through `{}` until the next \
             forward rebinds them, so the peak is about two iterations' activations. Flat across \
             iterations: a higher peak, not a leak (engine.md §9 pitfall 4).",
            size(bytes),
            names.join("`, `"),
        );
        f.severity = Severity::Info;
        Some(f)
    }

    fn fix_for(&self, name: &str, kind: FindingKind) -> String {
        let no_grad = "with torch.no_grad(): ";
        if let Some((b, eval_grad)) = self.facts.binder(name) {
            let pre = if eval_grad && kind == FindingKind::RetainedGraphGpu {
                no_grad
            } else {
                ""
            };
            let scalar = |from: &str| from.contains("loss");
            match b {
                Binder::Accumulate { from, .. } => return format!("{pre}{name} += {from}.item()"),
                Binder::Append { from, what } => {
                    return match (what, scalar(from)) {
                        (_, true) => format!("{pre}{name}.append({from}.item())"),
                        (KeepWhat::Tensor, false) if kind == FindingKind::RetainedGraphGpu => {
                            format!("{pre}{name}.append({from}.detach().cpu())")
                        }
                        _ => format!(
                            "{name}.append({from}.detach().cpu())  # or reduce to a metric first"
                        ),
                    }
                }
                Binder::Keep { from, .. } => return format!("{pre}{name} = {from}.detach()"),
                _ => {}
            }
        }
        match kind {
            FindingKind::CarriedHiddenState => {
                "hidden = tuple(h.detach() for h in hidden)  # repackage_hidden each batch".into()
            }
            FindingKind::RetainedGraphGpu => {
                format!("{name} = {name}.detach()  # or .item(); evaluate under torch.no_grad()")
            }
            FindingKind::RetainedGraphHost => {
                format!("{name} += loss.item()  # keep numbers, not graph-carrying tensors")
            }
            FindingKind::StoredTensors => {
                format!("{name}.append(out.detach().cpu())  # or reduce to a metric on the fly")
            }
            _ => String::new(),
        }
    }
}

struct Ctx<'a> {
    ls: &'a LiveState,
    owner: &'a [u32],
    is_own: &'a [bool],
    spos: &'a [u32],
    npos: &'a [u32],
}

fn lookup(pos: &[u32], id: u32) -> u32 {
    pos.get(id as usize).copied().unwrap_or(NONE)
}

fn strip_index(name: &str) -> &str {
    match name.rfind('[') {
        Some(i) if name.ends_with(']') => &name[..i],
        _ => name,
    }
}

fn push_sample<T: Copy>(q: &mut VecDeque<T>, s: T, it: impl Fn(&T) -> u32) {
    if q.back().is_some_and(|b| it(b) == it(&s)) {
        q.pop_back();
    }
    if q.len() == HISTORY {
        q.pop_front();
    }
    q.push_back(s);
}

#[derive(Debug, Clone, Copy)]
struct Trend {
    /// Trailing consecutive iteration boundaries with strict growth.
    steps: usize,
    /// Mean growth per iteration over that run (at most the last 8 steps).
    per_iter: i64,
}

fn trend(s: &[GroupSample], f: impl Fn(&GroupSample) -> u64) -> Trend {
    let mut steps = 0;
    for w in s.windows(2).rev() {
        if w[1].iteration == w[0].iteration + 1 && f(&w[1]) > f(&w[0]) {
            steps += 1;
        } else {
            break;
        }
    }
    let k = steps.min(8);
    let per_iter = if k == 0 {
        0
    } else {
        let n = s.len();
        (f(&s[n - 1]) as i64 - f(&s[n - 1 - k]) as i64) / k as i64
    };
    Trend { steps, per_iter }
}

fn categories(by_cat: &[u64; CATS]) -> Vec<(&'static str, u64)> {
    let mut v: Vec<(&'static str, u64)> = CAT_NAMES
        .iter()
        .zip(by_cat.iter())
        .filter(|(_, b)| **b > 0)
        .map(|(n, b)| (*n, *b))
        .collect();
    v.sort_by_key(|c| std::cmp::Reverse(c.1));
    v
}

fn blocks_of(ctx: &Ctx, g: u32) -> Vec<u64> {
    ctx.ls
        .storages
        .iter()
        .enumerate()
        .filter(|(p, s)| {
            ctx.owner[*p] == g
                && s.device == DeviceKind::Cuda
                && (ctx.is_own[*p] || (s.tensor_refs == 0 && !s.engine_held))
        })
        .filter_map(|(_, s)| s.addr)
        .collect()
}

/// From the root to what it holds, e.g. `total_loss → AddBackward0 → … →
/// AddmmBackward0 (iter 12) → saved mat1 [256×1024 fp32, 1.0 MiB]`.
fn path_for(ctx: &Ctx, g: u32, acc: &GroupAcc, kind: FindingKind) -> Vec<String> {
    let ls = ctx.ls;
    if kind == FindingKind::StoredTensors {
        let mut v = vec![format!("{} ({} entries)", acc.name, acc.roots.len())];
        if let Some(&ri) = acc.roots.last() {
            let r = &ls.roots[ri];
            let p = lookup(ctx.spos, r.storage.0);
            let what = if p == NONE {
                String::new()
            } else {
                let s = &ls.storages[p as usize];
                format!(
                    " [{}, {}, iter {}]",
                    size(s.bytes),
                    s.category.name(),
                    s.iteration
                )
            };
            v.push(format!("{}{what}", r.name));
        }
        return v;
    }
    // The root whose graph is largest; its grad_fn is nodes[0].
    let Some(&ri) = acc
        .roots
        .iter()
        .max_by_key(|&&ri| (ls.roots[ri].nodes.len(), std::cmp::Reverse(ri)))
    else {
        return Vec::new();
    };
    let r = &ls.roots[ri];
    let Some(start) = r.nodes.first() else {
        return vec![r.name.clone()];
    };
    // BFS with parents over `next` edges.
    let n = ls.nodes.len();
    let mut parent = vec![NONE; n];
    let mut seen = vec![false; n];
    let sp = lookup(ctx.npos, start.0);
    if sp == NONE {
        return vec![r.name.clone()];
    }
    let mut queue = VecDeque::from([sp]);
    seen[sp as usize] = true;
    // Target: the largest saved slot held only by this group; ties → oldest.
    let mut best: Option<(u64, std::cmp::Reverse<u32>, u32, usize)> = None;
    let mut oldest: (u32, u32) = (u32::MAX, sp);
    while let Some(p) = queue.pop_front() {
        let node = &ls.nodes[p as usize];
        if node.iteration < oldest.0 && node.name != "AccumulateGrad" {
            oldest = (node.iteration, p);
        }
        for (si, s) in node.saved.iter().enumerate() {
            let Some(sid) = s.storage else { continue };
            let sp = lookup(ctx.spos, sid.0);
            if sp == NONE || ctx.owner[sp as usize] != g {
                continue;
            }
            let key = (s.bytes, std::cmp::Reverse(node.iteration), p, si);
            if best.is_none_or(|b| (key.0, key.1) > (b.0, b.1)) {
                best = Some(key);
            }
        }
        for nx in &node.next {
            let q = lookup(ctx.npos, nx.0);
            if q != NONE && !seen[q as usize] {
                seen[q as usize] = true;
                parent[q as usize] = p;
                queue.push_back(q);
            }
        }
    }
    let target = best.map_or(oldest.1, |b| b.2);
    let mut chain = vec![target];
    while let Some(&c) = chain.last() {
        let p = parent[c as usize];
        if p == NONE {
            break;
        }
        chain.push(p);
    }
    chain.reverse();
    let label = |p: u32, last: bool| {
        let node = &ls.nodes[p as usize];
        if last || node.iteration != ls.iteration {
            format!("{} (iter {})", node.name, node.iteration)
        } else {
            node.name.to_string()
        }
    };
    let mut out = vec![r.name.clone()];
    let k = chain.len();
    for (i, &p) in chain.iter().enumerate() {
        if k > 6 && i == 3 {
            out.push("…".into());
        }
        if k > 6 && (3..k - 2).contains(&i) {
            continue;
        }
        out.push(label(p, i + 1 == k));
    }
    match best {
        Some((_, _, p, si)) => {
            let s = &ls.nodes[p as usize].saved[si];
            out.push(format!(
                "saved {} [{} {}, {}]",
                s.name,
                shape(&s.shape),
                dtype(s.dtype),
                size(s.bytes)
            ));
        }
        None => out.push(format!(
            "(all saved tensors released; {} Nodes on the host)",
            r.nodes.len()
        )),
    }
    out
}

/// Run `program` on `engine` iteration by iteration (its setup first if the
/// engine has not started), feeding the detector after each one, and return
/// the findings. An engine error stops the run and is part of the evidence.
/// Events stay buffered in the engine for the caller.
pub fn analyze_run(engine: &mut Engine, program: &Program) -> Vec<Finding> {
    let mut d = Detector::for_engine(engine).with_program(program);
    if engine.iteration() == 0 {
        for (i, s) in program.setup.iter().enumerate() {
            if let Err(e) = engine.run_step(s, i as u32, program) {
                let ls = engine.live_state();
                return d.observe_error(&e, &ls).to_vec();
            }
        }
    }
    for _ in 0..program.iterations {
        match engine.run_iteration(program) {
            Ok(()) => {
                let ls = engine.live_state();
                let (a, r) = (engine.allocated_bytes(), engine.reserved_bytes());
                d.observe(&ls, a, r);
            }
            Err(e) => {
                let ls = engine.live_state();
                d.observe_error(&e, &ls);
                break;
            }
        }
    }
    d.findings().to_vec()
}
