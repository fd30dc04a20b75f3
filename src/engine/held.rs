//! What the engine holds, for the leak detector (engine.md §9.1, §11.2): which root
//! (variable, list element, hidden state, buffers, caches, optimizer state)
//! reaches which autograd Nodes and saved storages, with bytes.

use std::sync::Arc;

use crate::alloc::Tag;

use super::bindings::Value;
use super::dtype::DType;
use super::held_walk::Walk;
use super::storage::{DeviceKind, StorageId};
use super::tag::Category;
use super::tensor::TensorId;
use super::Engine;
use crate::engine::autograd::NodeId;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootKind {
    Variable,
    ListElement {
        index: usize,
    },
    HiddenState,
    ModuleBuffer,
    Parameter,
    Gradient,
    AmpCache,
    OptimizerState,
    /// A parameter the optimizer holds that is not the model's (the model
    /// was re-created after the optimizer was built), its `.grad`, or its
    /// state.
    StaleOptimizerParam,
    /// The `.grad` of a second model's parameter (`BuildModel`), named
    /// `name.param[i].grad`: no optimizer zeroes or steps it.
    NamedModelGradient,
    ScalerState,
    CheckpointInput,
    /// What an object in a reference cycle holds (`MakeCycle`): `index` 0
    /// while its name is still bound, then 1, 2, … for the unreachable
    /// cycles it left, newest first, until `gc.collect()`.
    Cycle {
        index: usize,
    },
}

#[derive(Debug, Clone)]
pub struct RootInfo {
    pub kind: RootKind,
    pub name: String,
    pub tensor: TensorId,
    /// The root's own storage (shared views count once).
    pub storage: StorageId,
    pub bytes: u64,
    pub device: DeviceKind,
    /// Nodes reachable from the root's grad_fn (host memory, §2.1).
    pub nodes: Vec<NodeId>,
    /// Un-released saved storages in that graph (§9.1 a, b).
    pub saved_storages: Vec<StorageId>,
    pub saved_bytes: u64,
    /// Saved bytes kept alive *only* by the graph (§9.1 c): what dies with it.
    pub exclusive_saved_bytes: u64,
    /// Storages of leaves (and their `.grad`s) that only an `AccumulateGrad`
    /// in that graph keeps alive (a `requires_grad` input no name holds any
    /// more), not already among `saved_storages`.
    pub leaf_storages: Vec<StorageId>,
    /// The earliest iteration of a reachable Node (GRAPH_CHAIN_ACROSS_ITERATIONS).
    pub oldest_node_iteration: Option<u32>,
    /// Reachable nodes whose slots are all released (spent graph, §2.3.5).
    pub spent_nodes: usize,
}

#[derive(Debug, Clone)]
pub struct SavedInfo {
    pub name: &'static str,
    pub shape: Vec<u64>,
    pub dtype: DType,
    pub bytes: u64,
    /// None once released.
    pub storage: Option<StorageId>,
    /// Saved as an output of the same Node (e.g. relu's result).
    pub is_output: bool,
}

#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub id: NodeId,
    /// PyTorch's name (AddmmBackward0, …).
    pub name: &'static str,
    pub iteration: u32,
    pub seq: u64,
    pub released: bool,
    pub module: Arc<str>,
    pub saved: Vec<SavedInfo>,
    /// What an `AccumulateGrad` alone keeps alive: its `variable` (the leaf)
    /// and the leaf's `.grad`, where nothing else holds them (empty for
    /// other Nodes, and for a parameter's or a named tensor's accumulator).
    pub held: Vec<SavedInfo>,
    pub next: Vec<NodeId>,
}

#[derive(Debug, Clone)]
pub struct StorageInfo {
    pub id: StorageId,
    pub device: DeviceKind,
    pub bytes: u64,
    /// The allocator's block for it: `round_size` under the run's own
    /// `PYTORCH_CUDA_ALLOC_CONF` (allocator.md §2.2, `roundup_power2_divisions`
    /// included); 0 off the GPU and for an empty storage.
    pub block: u64,
    pub addr: Option<u64>,
    /// Category at creation.
    pub category: Category,
    pub tag: Tag,
    pub iteration: u32,
    pub tensor_refs: u32,
    /// Saved slots holding it now: an "activation" with saved_by > 0 is
    /// autograd_saved in the leak view.
    pub saved_by: u32,
    pub engine_held: bool,
    /// Its one tensor is a leaf that only its `AccumulateGrad` holds, or
    /// such a leaf's `.grad`: the graphs reaching the accumulator keep it.
    pub graph_leaf: bool,
}

#[derive(Debug, Clone)]
pub struct HeldState {
    pub iteration: u32,
    pub roots: Vec<RootInfo>,
    pub nodes: Vec<NodeInfo>,
    pub storages: Vec<StorageInfo>,
    /// All live Nodes (host-side graph size, §9 pitfall 1).
    pub host_graph_nodes: usize,
    pub allocated: u64,
    pub reserved: u64,
    /// `max_memory_allocated()`: the allocator's peak since the last reset.
    pub peak_allocated: u64,
    /// The Node a failed backward reached after an earlier backward had
    /// run it and freed its saved tensors ("backward through the graph a
    /// second time"); None when no backward failed so.
    pub spent_reached: Option<NodeId>,
}

impl HeldState {
    pub fn root(&self, name: &str) -> Option<&RootInfo> {
        self.roots.iter().find(|r| r.name == name)
    }

    pub fn storage(&self, id: StorageId) -> Option<&StorageInfo> {
        self.storages.iter().find(|s| s.id == id)
    }
}

impl Engine {
    /// The roots of a list's or deque's elements, `name[i]`.
    fn element_roots<'a>(
        &self,
        walk: &mut Walk,
        name: &str,
        items: impl Iterator<Item = &'a Value>,
        roots: &mut Vec<RootInfo>,
    ) {
        for (i, x) in items.enumerate() {
            self.element_root(walk, format!("{name}[{i}]"), i, x, roots);
        }
    }

    /// One container element: a tensor, or a kept hidden state's two.
    fn element_root(
        &self,
        walk: &mut Walk,
        name: String,
        index: usize,
        x: &Value,
        roots: &mut Vec<RootInfo>,
    ) {
        let kind = RootKind::ListElement { index };
        match x {
            Value::Tensor(t) => roots.push(self.root_info(walk, kind, name, *t)),
            Value::Pair(h, c) => {
                roots.push(self.root_info(walk, kind.clone(), format!("{name}[0]"), *h));
                roots.push(self.root_info(walk, kind, format!("{name}[1]"), *c));
            }
            // A tuple of tensors kept whole (`g_hist.append(g)`).
            Value::List(l) => {
                for (j, x) in l.iter().enumerate() {
                    if let Value::Tensor(t) = x {
                        let n = format!("{name}[{j}]");
                        roots.push(self.root_info(walk, kind.clone(), n, *t));
                    }
                }
            }
            _ => {}
        }
    }

    /// What a reference cycle holds: a tensor, or a kept hidden state's two.
    fn cycle_roots(
        &self,
        walk: &mut Walk,
        kind: RootKind,
        name: String,
        v: &Value,
        roots: &mut Vec<RootInfo>,
    ) {
        match v {
            Value::Tensor(t) => roots.push(self.root_info(walk, kind, name, *t)),
            Value::Pair(h, c) => {
                roots.push(self.root_info(walk, kind.clone(), format!("{name}[0]"), *h));
                roots.push(self.root_info(walk, kind, format!("{name}[1]"), *c));
            }
            _ => {}
        }
    }

    pub fn held_state(&self) -> HeldState {
        let mut roots = Vec::new();
        let walk = &mut Walk::new(self);
        for name in &self.bindings.order {
            let Some(v) = self.bindings.vars.get(name) else {
                continue;
            };
            match v {
                Value::Tensor(t) => {
                    roots.push(self.root_info(walk, RootKind::Variable, name.clone(), *t))
                }
                Value::Pair(h, c) => {
                    roots.push(self.root_info(
                        walk,
                        RootKind::HiddenState,
                        format!("{name}[0]"),
                        *h,
                    ));
                    roots.push(self.root_info(
                        walk,
                        RootKind::HiddenState,
                        format!("{name}[1]"),
                        *c,
                    ));
                }
                Value::List(l) => self.element_roots(walk, name, l.iter(), &mut roots),
                Value::Deque { items, .. } => {
                    self.element_roots(walk, name, items.iter(), &mut roots)
                }
                Value::Dict(d) => {
                    for (i, (key, x)) in d.iter().enumerate() {
                        self.element_root(walk, format!("{name}[{key}]"), i, x, &mut roots);
                    }
                }
                Value::Cycle { key, value } => {
                    let kind = RootKind::Cycle { index: 0 };
                    self.cycle_roots(walk, kind, format!("{name}[{key:?}]"), value, &mut roots);
                }
                Value::Float(_) | Value::None => {}
            }
        }
        for (i, (name, v)) in self.bindings.garbage.iter().rev().enumerate() {
            if let Value::Cycle { key, value } = v {
                let kind = RootKind::Cycle { index: i + 1 };
                let what = format!("{name}[{key:?}] (unreachable cycle {})", i + 1);
                self.cycle_roots(walk, kind, what, value, &mut roots);
            }
        }
        if let Some(m) = &self.model {
            for (i, p) in m.params.iter().enumerate() {
                roots.push(self.root_info(walk, RootKind::Parameter, format!("param[{i}]"), *p));
                if let Some(g) = self.grad(*p) {
                    roots.push(self.root_info(
                        walk,
                        RootKind::Gradient,
                        format!("param[{i}].grad"),
                        g,
                    ));
                }
            }
            for (n, b) in &m.buffers {
                roots.push(self.root_info(walk, RootKind::ModuleBuffer, n.clone(), *b));
            }
        }
        for (name, m) in &self.named_models {
            for (i, p) in m.params.iter().enumerate() {
                let kind = RootKind::Parameter;
                roots.push(self.root_info(walk, kind, format!("{name}.param[{i}]"), *p));
                if let Some(g) = self.grad(*p) {
                    // A gradient an optimizer of its own steps (a GAN's
                    // generator) is a gradient like the model's.
                    let kind = if self.named_optimizer_holds(*p) {
                        RootKind::Gradient
                    } else {
                        RootKind::NamedModelGradient
                    };
                    roots.push(self.root_info(walk, kind, format!("{name}.param[{i}].grad"), g));
                }
            }
            for (n, b) in &m.buffers {
                let kind = RootKind::ModuleBuffer;
                roots.push(self.root_info(walk, kind, format!("{name}.{n}"), *b));
            }
        }
        let mut cache: Vec<(&TensorId, &TensorId)> = self.amp.cache.iter().collect();
        cache.sort();
        for (leaf, c) in cache {
            roots.push(self.root_info(
                walk,
                RootKind::AmpCache,
                format!("autocast_cache[{}]", leaf.0),
                *c,
            ));
        }
        if let Some(o) = &self.optimizer {
            let model: Vec<TensorId> = self.parameters();
            let stale: Vec<TensorId> = o
                .params
                .iter()
                .flatten()
                .copied()
                .filter(|p| !model.contains(p))
                .collect();
            for (i, p) in o.params.iter().flatten().enumerate() {
                if !stale.contains(p) {
                    continue;
                }
                let name = format!("optimizer.param_groups[0][\"params\"][{i}]");
                let kind = RootKind::StaleOptimizerParam;
                roots.push(self.root_info(walk, kind.clone(), name.clone(), *p));
                if let Some(g) = self.grad(*p) {
                    roots.push(self.root_info(walk, kind.clone(), format!("{name}.grad"), g));
                }
                if let Some(s) = o.state.get(p) {
                    for (k, b) in s.bufs.iter().chain(s.step.iter()).enumerate() {
                        let n = format!("optimizer.state[{name}][{k}]");
                        roots.push(self.root_info(walk, kind.clone(), n, *b));
                    }
                }
            }
            let mut st: Vec<_> = o.state.iter().filter(|(p, _)| !stale.contains(p)).collect();
            st.sort_by_key(|(k, _)| **k);
            for (p, s) in st {
                for (i, b) in s.bufs.iter().chain(s.step.iter()).enumerate() {
                    roots.push(self.root_info(
                        walk,
                        RootKind::OptimizerState,
                        format!("state[{}][{i}]", p.0),
                        *b,
                    ));
                }
            }
        }
        for (name, o) in &self.named_optimizers {
            let mut st: Vec<_> = o.state.iter().collect();
            st.sort_by_key(|(k, _)| **k);
            for (p, s) in st {
                for (i, b) in s.bufs.iter().chain(s.step.iter()).enumerate() {
                    roots.push(self.root_info(
                        walk,
                        RootKind::OptimizerState,
                        format!("{name}.state[{}][{i}]", p.0),
                        *b,
                    ));
                }
            }
        }
        if let Some(s) = &self.scaler {
            for (n, t) in [
                ("scale", s.scale),
                ("growth_tracker", s.growth_tracker),
                ("found_inf", s.found_inf),
            ] {
                if let Some(t) = t {
                    roots.push(self.root_info(
                        walk,
                        RootKind::ScalerState,
                        format!("scaler.{n}"),
                        t,
                    ));
                }
            }
        }
        for (id, r) in &self.ckpt.regions {
            for t in &r.inputs {
                roots.push(self.root_info(
                    walk,
                    RootKind::CheckpointInput,
                    format!("checkpoint[{id}]"),
                    *t,
                ));
            }
        }
        let nodes = self
            .nodes
            .iter()
            .map(|(id, n)| NodeInfo {
                id: NodeId(id),
                name: n.name,
                iteration: n.iteration,
                seq: n.seq,
                released: n.released,
                module: self.tags.module_path(n.module),
                saved: n
                    .saved
                    .iter()
                    .map(|s| SavedInfo {
                        name: s.name,
                        shape: s.shape.to_vec(),
                        dtype: s.dtype,
                        bytes: s.bytes(),
                        storage: s.storage,
                        is_output: s.is_output,
                    })
                    // A custom Function's `ctx` attributes (bitsandbytes'
                    // `ctx.tensors`): held by the Node as saved tensors are.
                    .chain(n.ctx_attrs.iter().map(|t| {
                        let x = &self.tensors[t.0];
                        SavedInfo {
                            name: "ctx.tensors",
                            shape: x.shape.to_vec(),
                            dtype: x.dtype,
                            bytes: x.shape.numel().saturating_mul(x.dtype.size()),
                            storage: Some(x.storage),
                            is_output: false,
                        }
                    }))
                    .collect(),
                held: self.accumulator_holds(n.leaf),
                next: n
                    .inputs
                    .iter()
                    .filter_map(|m| m.edge.map(|e| e.node))
                    .collect(),
            })
            .collect();
        let mut graph_leaf = vec![false; self.storages.id_bound()];
        for &s in walk.leaf_storages() {
            if let Some(x) = graph_leaf.get_mut(s as usize) {
                *x = true;
            }
        }
        let storages = self
            .storages
            .iter()
            .map(|(id, s)| StorageInfo {
                id: StorageId(id),
                device: s.device,
                bytes: s.bytes,
                block: match s.device {
                    DeviceKind::Cuda if s.bytes > 0 => {
                        crate::alloc::rounding::round_size(s.bytes, self.allocator().config())
                    }
                    _ => 0,
                },
                addr: s.addr,
                category: s.category,
                tag: s.tag,
                iteration: s.iteration,
                tensor_refs: s.tensor_refs,
                saved_by: s.slot_refs,
                engine_held: s.engine_refs > 0,
                graph_leaf: graph_leaf.get(id as usize).copied().unwrap_or(false),
            })
            .collect();
        HeldState {
            iteration: self.ctx.iteration,
            roots,
            nodes,
            storages,
            host_graph_nodes: self.nodes.len(),
            allocated: self.allocated_bytes(),
            reserved: self.reserved_bytes(),
            peak_allocated: self.peak_allocated_bytes(),
            spent_reached: self.spent_reached.filter(|n| self.nodes.get(n.0).is_some()),
        }
    }

    /// An `AccumulateGrad`'s leaf and the leaf's `.grad`, as far as only
    /// the accumulator keeps them (`held_walk.rs`).
    fn accumulator_holds(&self, leaf: Option<TensorId>) -> Vec<SavedInfo> {
        let Some(leaf) = leaf else {
            return Vec::new();
        };
        let [own, grad] = self.held_only_by_accumulator(leaf);
        let info = |name: &'static str, t: TensorId, s: u32| {
            let x = &self.tensors[t.0];
            SavedInfo {
                name,
                shape: x.shape.to_vec(),
                dtype: x.dtype,
                bytes: x.shape.numel().saturating_mul(x.dtype.size()),
                storage: Some(StorageId(s)),
                is_output: false,
            }
        };
        let Some(own) = own else {
            return Vec::new();
        };
        let mut v = vec![info("variable", leaf, own)];
        if let (Some(s), Some(g)) = (grad, self.tensors[leaf.0].grad) {
            v.push(info("variable.grad", g, s));
        }
        v
    }

    fn root_info(&self, walk: &mut Walk, kind: RootKind, name: String, t: TensorId) -> RootInfo {
        let x = self.t(t);
        let st = self.storage(x.storage);
        let reach = walk.reach(x.grad_fn.map(|n| n.0));
        let nodes: Vec<NodeId> = reach.nodes.into_iter().map(NodeId).collect();
        let saved: Vec<StorageId> = reach.saved.into_iter().map(StorageId).collect();
        let leaves: Vec<StorageId> = reach.leaves.into_iter().map(StorageId).collect();
        let (oldest, spent) = (reach.oldest, reach.spent);
        let saved_bytes = saved.iter().map(|s| self.storage(*s).bytes).sum();
        let exclusive = saved
            .iter()
            .map(|s| self.storage(*s))
            .filter(|s| s.tensor_refs == 0 && s.engine_refs == 0 && s.device == DeviceKind::Cuda)
            .map(|s| s.bytes)
            .sum();
        RootInfo {
            kind,
            name,
            tensor: t,
            storage: x.storage,
            bytes: st.bytes,
            device: st.device,
            nodes,
            saved_storages: saved,
            saved_bytes,
            exclusive_saved_bytes: exclusive,
            leaf_storages: leaves,
            oldest_node_iteration: oldest,
            spent_nodes: spent,
        }
    }
}
