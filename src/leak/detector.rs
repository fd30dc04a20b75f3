//! The scenario-run leak detector (engine.md §9, §9.1, §11.2).
//!
//! Fed the engine's [`HeldState`] after every iteration (and on demand at any
//! frame), it groups the roots (a variable, a list, the carried hidden state,
//! the gradients, …), computes what each group keeps alive *exclusively* —
//! its own storages plus the saved tensors of graphs only it reaches — and
//! keeps a compact history per group. Findings are only made where that
//! history supports them: growth over at least [`MIN_GROWTH_STEPS`]
//! iteration boundaries, or a graph chain spanning that many iterations.
//!
//! The work is split by job across the sibling files of this module:
//! `observe.rs` ingests the engine's events and live states and keeps the
//! history, `reach.rs` groups the roots and walks what each one reaches,
//! and `classify.rs` turns a group's history into [`Finding`]s.
//!
//! [`HeldState`]: crate::engine::HeldState

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::finding::Finding;
use super::holders::Holder;
use super::oom::OomAnswer;
use super::program::ProgramFacts;
use super::requests::{RequestLog, RunDevice};
use crate::engine::{Engine, Program};

/// Growth must be seen across this many consecutive iteration boundaries.
pub const MIN_GROWTH_STEPS: usize = 3;
/// Samples kept per group and for the whole device: enough to see growth
/// that comes once an epoch (three epochs of 80 batches).
pub(super) const HISTORY: usize = 256;
pub(super) const NONE: u32 = u32::MAX;
pub(super) const SHARED: u32 = u32::MAX - 1;

/// One iteration's device-wide figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IterationSample {
    pub iteration: u32,
    pub allocated: u64,
    pub reserved: u64,
    /// The largest allocated total seen up to this iteration.
    pub peak_allocated: u64,
    pub host_graph_nodes: usize,
}

/// One group's figures at one iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroupSample {
    pub iteration: u32,
    /// Block bytes of the group's own GPU storages held by nothing else.
    pub own: u64,
    /// Block bytes of un-released saved tensors only this group's graphs
    /// reach, and of the leaves (and their `.grad`s) only those graphs'
    /// `AccumulateGrad`s hold.
    pub graph: u64,
    /// Of `graph`: the leaves and their `.grad`s.
    pub leaf: u64,
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
pub(super) enum GroupKind {
    Variable,
    List,
    Hidden,
    /// Objects in reference cycles bound to one name, reachable or left
    /// for the collector.
    Cycle,
    Other,
}

#[derive(Debug, Clone)]
pub(super) struct GroupHistory {
    pub(super) samples: VecDeque<GroupSample>,
}

/// The leak detector for scenario runs. See the module docs.
#[derive(Debug, Clone, Default)]
pub struct Detector {
    pub(super) capacity: u64,
    pub(super) facts: ProgramFacts,
    pub(super) iterations: VecDeque<IterationSample>,
    pub(super) groups: FxHashMap<String, GroupHistory>,
    /// Per gradient root: (name, storage creation iteration) at the last sample;
    /// the count of consecutive samples in which every grad persisted.
    pub(super) grad_persist_streak: u32,
    pub(super) grad_bytes: u64,
    pub(super) grad_blocks: Vec<u64>,
    pub(super) findings: Vec<Finding>,
    pub(super) error: Option<String>,
    /// The error that stopped the run was an OOM.
    pub(super) ran_out: bool,
    /// The run's requests, for what-ifs at an OOM (and of the cache's growth).
    pub(super) requests: RequestLog,
    pub(super) device: RunDevice,
    /// Who held what at the last observation, largest first.
    pub(super) holders: Vec<Holder>,
    /// The first completed iteration's figures, and each holder's bytes
    /// when first seen then or later: (iteration, bytes).
    pub(super) first_sample: Option<IterationSample>,
    pub(super) first_bytes: FxHashMap<String, (u32, u64)>,
    pub(super) oom_answer: Option<OomAnswer>,
    // Scratch buffers reused between observations.
    pub(super) owner: Vec<u32>,
    pub(super) is_own: Vec<bool>,
    pub(super) node_pos: Vec<u32>,
    pub(super) node_mark: Vec<u32>,
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
        let mut d = Detector::new(engine.allocator().device().total_memory());
        d.device = RunDevice {
            name: engine.allocator().device().name().to_string(),
            total: engine.cfg.device_bytes,
            overhead: engine.cfg.device_overhead,
            placement: engine.cfg.placement,
            config: engine.allocator().config().clone(),
        };
        d
    }

    /// Take the run's events as they go by: its requests, for what-ifs.
    pub fn record(&mut self, e: &crate::trace::Event) {
        self.requests.record(e);
    }

    /// At an OOM: who held the memory, what grew, what a setting would have
    /// changed (None until the run ran out of memory).
    pub fn oom_answer(&self) -> Option<&OomAnswer> {
        self.oom_answer.as_ref()
    }

    /// Who held what at the last observation, largest first.
    pub fn holders(&self) -> &[Holder] {
        &self.holders
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

    /// The per-iteration device history (oldest first, at most 256).
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
}
