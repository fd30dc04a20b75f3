//! `loss.backward()`: the autograd engine's graph task (engine.md §2.3–§2.5, §3.1).

use std::collections::BinaryHeap;

use rustc_hash::FxHashSet;

use crate::engine::autograd::{BwdKind, Edge, NodeId};
use crate::engine::error::{EngineError, Result, BACKWARD_TWICE};
use crate::engine::tag::Category;
use crate::engine::tensor::{Layout, TensorId, VersionCounter};
use crate::engine::Engine;
use crate::trace::Phase;

/// A gradient a node produced for input `i`, before `validate_outputs`.
pub(in crate::engine) enum Out {
    /// A new tensor already shaped like the input.
    Ready(usize, TensorId),
    /// The incoming gradient handed on; fixed up by sum_to / cast if needed.
    Forward(usize, TensorId),
}

impl Engine {
    /// `tensor.backward(retain_graph=…)`. The root is normally a 0-dim loss.
    pub fn backward(&mut self, root: TensorId, retain_graph: bool) -> Result<()> {
        let prev_phase = self.phase_begin(Phase::Backward);
        let prev_op = self.op_begin("backward");
        let r = self.scoped(|e| {
            let mut task = Vec::new();
            let mut seed = None;
            let r = e.run_backward(root, retain_graph, &mut task, &mut seed);
            if r.is_err() {
                e.abandon_task(&task);
                // The seed is Python's `grad_tensors_`: it dies with the
                // frames, after the graph task (tour's OOM on the H100).
                if let Some(s) = seed {
                    e.decref(s);
                }
            }
            r
        });
        let end = self.op_end(prev_op);
        self.phase_end(Phase::Backward, prev_phase);
        r.and(end)
    }

    /// The graph task dies: its pending input buffers are dropped.
    pub(super) fn abandon_task(&mut self, task: &[NodeId]) {
        for n in task {
            if let Some(node) = self.nodes.get_mut(n.0) {
                node.deps = 0;
                let buf = std::mem::take(&mut node.buf);
                for t in buf.into_iter().flatten() {
                    self.decref(t);
                }
            }
        }
    }

    fn run_backward(
        &mut self,
        root: TensorId,
        retain: bool,
        task: &mut Vec<NodeId>,
        seed_held: &mut Option<TensorId>,
    ) -> Result<()> {
        let Some(edge) = self.edge_of(root) else {
            return Err(EngineError::Runtime(
                "element 0 of tensors does not require grad and does not have a grad_fn".into(),
            ));
        };
        // The seed `ones_like(loss)` lives until backward finishes (§2.5, §12 #8/#13).
        let (shape, dtype) = (self.shape(root), self.dtype(root));
        let seed = self.empty(shape, dtype, Category::Gradient)?;
        self.k_fill(seed, 1.0);
        self.retain(seed);
        *seed_held = Some(seed);
        self.traverse(edge, seed, retain, task)?;
        *seed_held = None;
        self.decref(seed);
        Ok(())
    }

    /// A backward from `root` seeded with `grad` (whose reference it takes)
    /// inside another backward: `torch.autograd.backward(root, grad)` in a
    /// reentrant checkpoint. The graph it runs is freed as it goes.
    pub(crate) fn nested_backward(&mut self, root: TensorId, grad: TensorId) -> Result<()> {
        let Some(edge) = self.edge_of(root) else {
            self.decref(grad);
            return Ok(());
        };
        let mut task = Vec::new();
        let r = self.traverse(edge, grad, false, &mut task);
        if r.is_err() {
            self.abandon_task(&task);
        }
        r
    }

    /// Run the graph from `edge`, delivering `seed` (its reference is taken).
    pub(super) fn traverse(
        &mut self,
        edge: Edge,
        seed: TensorId,
        retain: bool,
        task: &mut Vec<NodeId>,
    ) -> Result<()> {
        // Dependencies: how many edges point at each node reachable from the root.
        let mut seen = FxHashSet::default();
        let mut stack = vec![edge.node];
        seen.insert(edge.node.0);
        while let Some(n) = stack.pop() {
            task.push(n);
            let k = self.nodes[n.0].inputs.len();
            for i in 0..k {
                if let Some(e) = self.nodes[n.0].inputs[i].edge {
                    self.nodes[e.node.0].deps += 1;
                    if seen.insert(e.node.0) {
                        stack.push(e.node);
                    }
                }
            }
        }
        self.deliver(edge, seed)?;
        let mut ready = BinaryHeap::new();
        ready.push((self.nodes[edge.node.0].seq, edge.node.0));
        while let Some((_, id)) = ready.pop() {
            let n = NodeId(id);
            self.run_retain_grad_hooks(n)?;
            if self.grad_only_skips(n) {
                continue;
            }
            let produced = self.exec_node(n, retain)?;
            // A module's full backward hooks run after its output's
            // BackwardHookFunctionBackward (a post-hook on that node).
            if let (false, Some(&(_, g))) = (self.grad_hooks.is_empty(), produced.first()) {
                self.run_backward_hooks(n, g)?;
            }
            for (i, g) in produced {
                let e = self.nodes[n.0].inputs[i].edge;
                match e {
                    Some(e) => {
                        self.deliver(e, g)?;
                        let child = &mut self.nodes[e.node.0];
                        child.deps -= 1;
                        if child.deps == 0 {
                            ready.push((child.seq, e.node.0));
                        }
                    }
                    None => self.release(g),
                }
            }
            // (e) the consumed incoming gradients die last.
            let buf = std::mem::take(&mut self.nodes[n.0].buf);
            for t in buf.into_iter().flatten() {
                self.decref(t);
            }
        }
        Ok(())
    }

    /// `t.retain_grad()` hooks, run as the node's tensor pre-hooks before it
    /// executes: the first gradient is cloned into `t.grad` (a new block of
    /// the tensor's size), later ones summed out of place (§3.3).
    fn run_retain_grad_hooks(&mut self, n: NodeId) -> Result<()> {
        let hooked: Vec<TensorId> = self
            .retaining
            .iter()
            .copied()
            .filter(|t| self.tensors[t.0].grad_fn == Some(n))
            .collect();
        for t in hooked {
            let nr = usize::from(self.tensors[t.0].output_nr);
            let Some(g) = self.nodes[n.0].buf.get(nr).copied().flatten() else {
                continue;
            };
            let (shape, dtype) = (self.shape(g), self.dtype(g));
            let prev = self.op_begin("retain_grad");
            let r = self.empty(shape, dtype, Category::Gradient);
            self.op_end(prev)?;
            let fresh = r?;
            match self.tensors[t.0].grad {
                None => self.k_unary(g, fresh),
                Some(old) => {
                    self.k_binary(old, g, fresh);
                    self.decref(old);
                }
            }
            self.keep(fresh);
            self.tensors[t.0].grad = Some(fresh);
        }
        Ok(())
    }

    /// Put `g` into the target's input buffer, summing with what is there: in
    /// place when the buffered tensor is not shared, else out of place (§2.5).
    fn deliver(&mut self, e: Edge, g: TensorId) -> Result<()> {
        self.keep(g);
        let nout = self.nodes[e.node.0].num_outputs.max(e.nr + 1) as usize;
        let node = &mut self.nodes[e.node.0];
        if node.buf.len() < nout {
            node.buf.resize(nout, None);
        }
        match node.buf[e.nr as usize] {
            None => node.buf[e.nr as usize] = Some(g),
            Some(_) if self.create_graph => {
                return Err(EngineError::Program(
                    "create_graph=True: two gradients summed into one node's input (AddBackward0 \
                     recorded) is not modelled"
                        .into(),
                ));
            }
            Some(old) => {
                // InputBuffer::accumulate: in place only into the last
                // reference to a dense tensor and its storage. A view keeps its
                // base alive (a Linear weight's gradient: a second gradient
                // for a tied weight is summed out of place, as on the H100).
                let o = &self.tensors[old.0];
                let exclusive = o.refs == 1
                    && o.layout == Layout::Contiguous
                    && !o.is_view
                    && self.storages[o.storage.0].tensor_refs == 1;
                if exclusive {
                    self.k_binary(old, g, old);
                    self.bump_version(old);
                    self.decref(g);
                } else {
                    let (shape, dtype) = (o.shape, o.dtype);
                    let sum = self.empty(shape, dtype, Category::Gradient)?;
                    self.k_binary(old, g, sum);
                    self.keep(sum);
                    self.decref(old);
                    self.decref(g);
                    self.nodes[e.node.0].buf[e.nr as usize] = Some(sum);
                }
            }
        }
        Ok(())
    }

    /// Run one node's backward: returns the gradients for its inputs.
    fn exec_node(&mut self, n: NodeId, retain: bool) -> Result<Vec<(usize, TensorId)>> {
        let kind = self.nodes[n.0].kind;
        if kind == BwdKind::AccumulateGrad {
            self.accumulate_grad(n)?;
            return Ok(Vec::new());
        }
        let name = self.nodes[n.0].name;
        let prev_module = self.enter_module(self.nodes[n.0].module);
        let prev_op = self.op_begin(name);
        let r = self.exec_node_inner(n, kind, retain);
        if r.is_err() {
            // call_function's inputs die as the exception leaves it, before
            // the graph task's other buffers (tour's OOM on the H100).
            let buf = std::mem::take(&mut self.nodes[n.0].buf);
            for t in buf.into_iter().flatten() {
                self.decref(t);
            }
        }
        self.exit_module(prev_module);
        let end = self.op_end(prev_op);
        let out = r?;
        end?;
        Ok(out)
    }

    /// AccumulateGrad (§3.1): steal the first gradient, add later ones in place.
    fn accumulate_grad(&mut self, n: NodeId) -> Result<()> {
        let buf = std::mem::take(&mut self.nodes[n.0].buf);
        let Some(g) = buf.into_iter().flatten().next() else {
            return Ok(());
        };
        let Some(leaf) = self.nodes[n.0].leaf else {
            self.decref(g);
            return Ok(());
        };
        let p = &self.tensors[leaf.0];
        let (pshape, pdtype, existing) = (p.shape, p.dtype, p.grad);
        let leaf_dense = p.layout == Layout::Contiguous;
        match existing {
            None => {
                // The gradient layout contract: a leaf laid out otherwise
                // (a transposed view made a leaf) gets a copy in its strides.
                let gt = &self.tensors[g.0];
                let stealable = gt.refs == 1
                    && gt.layout == Layout::Contiguous
                    && leaf_dense
                    && gt.dtype == pdtype;
                if stealable {
                    self.tensors[leaf.0].grad = Some(g);
                } else {
                    let prev = self.op_begin("AccumulateGrad");
                    let r = self.empty(pshape, pdtype, Category::Gradient);
                    self.op_end(prev)?;
                    let c = r?;
                    self.k_unary(g, c);
                    self.keep(c);
                    self.tensors[leaf.0].grad = Some(c);
                    self.decref(g);
                }
            }
            Some(old) => {
                self.k_binary(old, g, old);
                self.bump_version(old);
                self.decref(g);
            }
        }
        Ok(())
    }

    /// Check saved slots before the formula runs: released → backward twice;
    /// version moved → in-place error; placeholder → checkpoint recompute.
    pub(super) fn unpack_saved(&mut self, n: NodeId) -> Result<()> {
        let node = &self.nodes[n.0];
        if node.saved.is_empty() {
            return Ok(());
        }
        if node.released {
            self.spent_reached = Some(n);
            return Err(EngineError::Runtime(BACKWARD_TWICE.into()));
        }
        if node
            .saved
            .iter()
            .any(|s| s.storage.is_none() && s.pack.is_some())
        {
            self.ckpt_unpack(n)?;
        }
        let node = &self.nodes[n.0];
        for s in &node.saved {
            if let Some(st) = s.storage {
                let v = self.version_of(
                    s.version_cell
                        .map_or(VersionCounter::Storage(st), VersionCounter::Cell),
                );
                if v != s.version {
                    let which = match s.producer {
                        Some((name, nr)) => format!(", which is output {nr} of {name},"),
                        None => String::new(),
                    };
                    return Err(EngineError::Runtime(format!(
                        "one of the variables needed for gradient computation has been modified by an inplace operation: [{} {}]{which} is at version {v}; expected version {} instead. Hint: enable anomaly detection to find the operation that failed to compute its gradient, with torch.autograd.set_detect_anomaly(True).",
                        s.dtype.cuda_type_name(),
                        s.shape,
                        s.version
                    )));
                }
            }
        }
        Ok(())
    }

    /// A plain view (no autograd identity) — gradients are not tracked.
    pub(crate) fn view_as_plain(
        &mut self,
        base: TensorId,
        shape: crate::engine::shape::Shape,
        layout: Layout,
    ) -> TensorId {
        let b = self.tensors[base.0].clone();
        self.wrap_storage(b.storage, shape, b.dtype, layout, true)
    }
}
