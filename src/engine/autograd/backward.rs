//! `loss.backward()`: the autograd engine's graph task (engine.md §2.3–§2.5, §3.1).

use std::collections::BinaryHeap;

use rustc_hash::FxHashSet;

use crate::engine::autograd::{BwdKind, Edge, NodeId};
use crate::engine::dtype::DType;
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
        let mark = self.locals.len();
        let mut task = Vec::new();
        let mut seed = None;
        let r = self.run_backward(root, retain_graph, &mut task, &mut seed);
        if r.is_err() {
            self.abandon_task(&task);
            // The seed is Python's `grad_tensors_`: it dies with the frames,
            // after the graph task (tour's OOM on the H100).
            if let Some(s) = seed {
                self.decref(s);
            }
            self.unwind_locals(mark);
        }
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

    fn exec_node_inner(
        &mut self,
        n: NodeId,
        kind: BwdKind,
        retain: bool,
    ) -> Result<Vec<(usize, TensorId)>> {
        self.unpack_saved(n)?;
        let g0 = self.nodes[n.0].buf.first().copied().flatten();
        let ninputs = self.nodes[n.0].inputs.len();
        let needs = |e: &Engine, i: usize| {
            e.nodes[n.0].inputs[i]
                .edge
                .is_some_and(|edge| e.grad_only_needs(edge.node))
        };
        let mut outs: Vec<Out> = Vec::with_capacity(ninputs);
        match kind {
            BwdKind::AccumulateGrad => {}
            BwdKind::SecondOrder { self_t } => {
                let mut ready = Vec::new();
                let r = self.second_order_backward(n, g0, self_t, &needs, &mut ready);
                outs.extend(ready.into_iter().map(|(i, t)| Out::Ready(i, t)));
                if let Err(e) = r {
                    for o in outs {
                        if let Out::Ready(_, t) = o {
                            self.release(t);
                        }
                    }
                    return Err(e);
                }
            }
            BwdKind::Norm => {
                if needs(self, 0) {
                    let m = self.nodes[n.0].inputs[0];
                    let t = self.norm_grad(m.shape, m.dtype)?;
                    self.k_grad_from(g0, t);
                    outs.push(Out::Ready(0, t));
                }
            }
            BwdKind::Reentrant { start, end, amp } => {
                if let (Some(g), true) = (g0, needs(self, 0)) {
                    let gx = self.reentrant_backward(n, (start, end), amp, g)?;
                    outs.push(Out::Ready(0, gx));
                }
            }
            BwdKind::Alloc
            | BwdKind::Cast
            | BwdKind::AllocWithTemp { .. }
            | BwdKind::AllocAfterTemps { .. }
            | BwdKind::Clamp
            | BwdKind::Mul
            | BwdKind::Conv { .. }
            | BwdKind::Sdpa { .. } => {
                // MulBackward0 computes `other`'s gradient before `self`'s
                // (the generated apply() tests `other_ix` first): seen in the
                // hand-written Transformer's `h * torch.sigmoid(h)` on the
                // H100, where the first product made is the one sigmoid's
                // backward consumes.
                let order: Vec<usize> = if kind == BwdKind::Mul {
                    (0..ninputs).rev().collect()
                } else {
                    (0..ninputs).collect()
                };
                for i in order {
                    if needs(self, i) {
                        let m = self.nodes[n.0].inputs[i];
                        let broadcast = g0
                            .filter(|_| kind == BwdKind::Mul)
                            .filter(|&g| self.shape(g).numel() > m.shape.numel());
                        if let Some(g) = broadcast {
                            let t = self.empty(self.shape(g), m.dtype, Category::Gradient)?;
                            self.k_grad_from(g0, t);
                            outs.push(Out::Forward(i, t));
                            continue;
                        }
                        let t = match kind {
                            BwdKind::AllocWithTemp { temp_first } => {
                                self.grad_with_temp(m.shape, m.dtype, temp_first)?
                            }
                            BwdKind::AllocAfterTemps { temps } => {
                                self.grad_after_temps(m.shape, m.dtype, temps)?
                            }
                            BwdKind::Clamp => self.clamp_grad(m.shape, m.dtype)?,
                            _ => self.empty(m.shape, m.dtype, Category::Gradient)?,
                        };
                        self.k_grad_from(g0, t);
                        self.count_grad_work(n, kind, i, g0);
                        if kind == BwdKind::Cast
                            && g0.is_some_and(|g| self.layout(g) == Layout::Strided)
                        {
                            self.t_mut(t).layout = Layout::Strided;
                        }
                        if let BwdKind::Conv { workspace } = kind {
                            let ws = self.transient(workspace[i], Category::Workspace)?;
                            self.free_transient(ws);
                        }
                        outs.push(Out::Ready(i, t));
                    }
                }
                if kind == BwdKind::Mul {
                    // validate_outputs then goes by input index.
                    outs.reverse();
                }
                if let BwdKind::Sdpa { scratch, .. } = kind {
                    self.sdpa_backward_scratch(scratch)?;
                }
            }
            BwdKind::PassThrough => {
                if let Some(g) = g0 {
                    for i in 0..ninputs {
                        if needs(self, i) {
                            self.retain(g);
                            self.locals.push(g);
                            outs.push(Out::Forward(i, g));
                        }
                    }
                }
            }
            BwdKind::UnsafeView { merge_fails } => {
                if let (Some(g), true) = (g0, needs(self, 0)) {
                    if merge_fails && self.layout(g) == Layout::Strided {
                        let m = self.nodes[n.0].inputs[0];
                        let t = self.empty(m.shape, m.dtype, Category::Gradient)?;
                        self.k_grad_from(g0, t);
                        outs.push(Out::Ready(0, t));
                    } else {
                        self.retain(g);
                        self.locals.push(g);
                        outs.push(Out::Forward(0, g));
                    }
                }
            }
            BwdKind::Slice => {
                if let Some(g) = g0 {
                    for i in 0..ninputs {
                        if needs(self, i) {
                            let m = self.nodes[n.0].inputs[i];
                            let v = self.view_as_plain(g, m.shape, Layout::Strided);
                            outs.push(Out::Ready(i, v));
                        }
                    }
                }
            }
            BwdKind::Expand => {
                if let Some(g) = g0 {
                    for i in 0..ninputs {
                        if needs(self, i) {
                            let m = self.nodes[n.0].inputs[i];
                            let v = self.view_as_plain(g, m.shape, Layout::Expanded);
                            outs.push(Out::Ready(i, v));
                        }
                    }
                }
            }
            BwdKind::Gemm {
                has_bias,
                weight_transposed,
            } => {
                let first = usize::from(has_bias);
                // AddmmBackward0 computes mat1's gradient, then mat2's;
                // MmBackward0 mat2's first. Seen on PyTorch 2.11 (the MLP
                // and lm_head GEMMs of tests/fixtures/pytorch/captured).
                let order: Vec<usize> = if has_bias {
                    (first..ninputs).collect()
                } else {
                    (first..ninputs).rev().collect()
                };
                for i in order {
                    if needs(self, i) {
                        let m = self.nodes[n.0].inputs[i];
                        let t = self.gemm_grad(m.shape, m.dtype, g0)?;
                        self.count_grad_work(n, kind, i, g0);
                        self.k_gemm_grad(n, i == first, g0, t);
                        if weight_transposed && i + 1 == ninputs {
                            self.t_mut(t).is_view = true;
                        }
                        outs.push(Out::Ready(i, t));
                    }
                }
                if has_bias && needs(self, 0) {
                    if let Some(g) = g0 {
                        self.retain(g);
                        self.locals.push(g);
                        outs.insert(0, Out::Forward(0, g));
                    }
                }
            }
            BwdKind::LayerNorm { partial_rows } => {
                for i in 0..ninputs {
                    if needs(self, i) {
                        let m = self.nodes[n.0].inputs[i];
                        let t = self.empty(m.shape, m.dtype, Category::Gradient)?;
                        self.k_grad_from(g0, t);
                        outs.push(Out::Ready(i, t));
                    }
                }
                if let Some(rows) = partial_rows {
                    if let Err(e) = self.layer_norm_partial_sums(rows, &mut outs) {
                        for o in outs {
                            if let Out::Ready(_, t) = o {
                                self.release(t);
                            }
                        }
                        return Err(e);
                    }
                }
            }
            BwdKind::Embedding { sort } => {
                if needs(self, 0) {
                    let m = self.nodes[n.0].inputs[0];
                    let t = self.embedding_backward(m.shape, m.dtype, sort)?;
                    self.k_grad_from(g0, t);
                    outs.push(Out::Ready(0, t));
                }
            }
            BwdKind::Sub | BwdKind::Div => {
                if let Some(g) = g0 {
                    let (gs, dtype) = (self.shape(g), self.dtype(g));
                    if needs(self, 1) {
                        let temps = if kind == BwdKind::Div { 3 } else { 0 };
                        let t = self.grad_after_temps(gs, dtype, temps)?;
                        self.k_grad_from(g0, t);
                        outs.push(Out::Forward(1, t));
                    }
                    if needs(self, 0) {
                        if kind == BwdKind::Div {
                            let t = self.empty(gs, dtype, Category::Gradient)?;
                            self.k_grad_from(g0, t);
                            outs.push(Out::Forward(0, t));
                        } else {
                            self.retain(g);
                            self.locals.push(g);
                            outs.push(Out::Forward(0, g));
                        }
                    }
                }
            }
            BwdKind::IndexAdd => {
                if let (Some(g), true) = (g0, needs(self, 0)) {
                    self.retain(g);
                    self.locals.push(g);
                    outs.push(Out::Forward(0, g));
                }
                if needs(self, 1) {
                    let m = self.nodes[n.0].inputs[1];
                    let t = self.empty(m.shape, m.dtype, Category::Gradient)?;
                    self.k_grad_from(g0, t);
                    outs.push(Out::Ready(1, t));
                }
            }
            BwdKind::IndexPut { rows } => {
                if needs(self, 0) {
                    let m = self.nodes[n.0].inputs[0];
                    let t = self.index_put_grad(m.shape, m.dtype, rows)?;
                    self.k_grad_from(g0, t);
                    outs.push(Out::Ready(0, t));
                }
            }
            BwdKind::Bnb(bnb) => {
                // `grad_bias = grad_output.sum(0)` first, then `grad_A`.
                if ninputs > 1 && needs(self, 1) {
                    let m = self.nodes[n.0].inputs[1];
                    let t = self.empty(m.shape, m.dtype, Category::Gradient)?;
                    self.k_grad_from(g0, t);
                    outs.push(Out::Ready(1, t));
                }
                if needs(self, 0) {
                    let m = self.nodes[n.0].inputs[0];
                    let t = self.bnb_input_grad(bnb, m.shape, m.dtype, g0)?;
                    self.k_grad_from(g0, t);
                    outs.insert(0, Out::Ready(0, t));
                }
            }
            BwdKind::Split => {
                if needs(self, 0) {
                    let m = self.nodes[n.0].inputs[0];
                    let t = self.empty(m.shape, m.dtype, Category::Gradient)?;
                    self.k_grad_from(g0, t);
                    outs.push(Out::Ready(0, t));
                }
            }
            BwdKind::CudnnRnn {
                workspace,
                flat_bytes,
                training,
            } => {
                if !training {
                    return Err(EngineError::Runtime(
                        "cudnn RNN backward can only be called in training mode".into(),
                    ));
                }
                // _cudnn_rnn_backward runs when any gradient is needed: an
                // undefined incoming gradient (output, hy, cy) becomes zeros;
                // then dx, dhx, dcx (always, as it mutates the reserve) and a
                // workspace.
                let any_needed = (0..ninputs).any(|i| needs(self, i));
                // `retain_variables ? result3.clone() : result3`: a kept
                // graph's reserve is copied before the call (which mutates
                // what it is given) and the copy dies as the call returns.
                let reserve_copy = match self.nodes[n.0].saved.iter().find(|s| s.name == "result3")
                {
                    Some(r) if any_needed && retain => {
                        let (shape, dtype) = (r.shape, r.dtype);
                        Some(self.empty(shape, dtype, Category::Temporary)?)
                    }
                    _ => None,
                };
                let zeros = if any_needed {
                    self.cudnn_rnn_zero_grads(n)?
                } else {
                    Vec::new()
                };
                // The result tuple's gradients nobody needs die in order as
                // apply() returns, after the zeros.
                let mut unneeded = Vec::new();
                if any_needed {
                    for i in 0..ninputs.min(3) {
                        let m = self.nodes[n.0].inputs[i];
                        let t = self.empty(m.shape, m.dtype, Category::Gradient)?;
                        self.k_grad_from(g0, t);
                        if needs(self, i) {
                            outs.push(Out::Ready(i, t));
                        } else {
                            unneeded.push(t);
                        }
                    }
                    let ws = self.transient(workspace, Category::Workspace)?;
                    self.free_transient(ws);
                    self.count_rnn_backward(n);
                }
                // _cudnn_rnn_backward_weight: one zero-filled flat dw; the
                // per-parameter grads are views into it (§3.1, §8.2).
                if (3..ninputs).any(|i| needs(self, i)) {
                    let s = self.new_storage(flat_bytes, Category::Gradient)?;
                    let ws = self.transient(workspace, Category::Workspace)?;
                    self.free_transient(ws);
                    self.count_rnn_backward(n);
                    for i in 3..ninputs {
                        if needs(self, i) {
                            let m = self.nodes[n.0].inputs[i];
                            let v =
                                self.wrap_storage(s, m.shape, m.dtype, Layout::Contiguous, true);
                            self.k_fill(v, 0.0);
                            outs.push(Out::Ready(i, v));
                        }
                    }
                    if self.storages[s.0].tensor_refs == 0 {
                        self.storages[s.0].engine_refs += 1;
                        self.release_storage_engine(s);
                    }
                }
                for t in zeros.into_iter().rev().chain(reserve_copy).chain(unneeded) {
                    self.release(t);
                }
            }
        }
        if !retain {
            self.release_unpacked_recomputed(n);
        }
        // validate_outputs: sum_to for broadcast inputs, cast to the input dtype.
        let mut result = Vec::with_capacity(outs.len());
        for o in outs {
            let (i, t) = match o {
                Out::Ready(i, t) => (i, t),
                Out::Forward(i, g) => {
                    let m = self.nodes[n.0].inputs[i];
                    let gs = self.shape(g);
                    if gs.numel() != m.shape.numel() {
                        let dtype = self.dtype(g);
                        // A backward called inside `with torch.autocast(...)`
                        // runs under it (the engine carries the caller's
                        // thread-local state): `sum` is on autocast's
                        // fp32_set_opt_dtype list, so a half gradient sums into
                        // an fp32 result, cast back to the input's dtype
                        // below (autocast_around_loop_bug on the H100).
                        let sum_dtype = match self.amp.active(false) {
                            Some(_) if dtype.is_half() => DType::F32,
                            _ => dtype,
                        };
                        let s = self.empty(m.shape, sum_dtype, Category::Gradient)?;
                        // at::sum_to: a reduction kernel, with its scratch.
                        let reduction = (self.layout(g) != Layout::Expanded)
                            .then(|| {
                                crate::engine::scratch::reduce::sum_to_shape(
                                    gs.dims(),
                                    m.shape.dims(),
                                    dtype.size(),
                                )
                            })
                            .flatten();
                        let s = self.scratch_after(s, reduction)?;
                        // at::sum_to sums with keepdim, then views away the
                        // leading dimensions (a bias's gradient): a view, so
                        // a second gradient into it is summed out of place.
                        if gs.rank() > m.shape.rank() {
                            self.t_mut(s).is_view = true;
                        }
                        self.k_grad_from(Some(g), s);
                        self.release(g);
                        (i, s)
                    } else {
                        (i, g)
                    }
                }
            };
            let m = self.nodes[n.0].inputs[i];
            if self.dtype(t) != m.dtype {
                let c = self.empty(m.shape, m.dtype, Category::Gradient)?;
                self.k_unary(t, c);
                self.release(t);
                result.push((i, c));
            } else {
                result.push((i, t));
            }
        }
        // create_graph=True: the formula's ops recorded the gradients.
        if self.create_graph {
            if let Err(e) = self.record_second_order(n, g0, &result) {
                for (_, t) in result {
                    self.release(t);
                }
                return Err(e);
            }
        }
        // The engine's call_function returns: its incoming gradients go
        // first; then release_variables() frees the saved slots; the outputs
        // reach the next input buffers after both (evaluate_function). Seen
        // in every H100 trace: a Linear's incoming gradient is freed before
        // its saved input (engine.md §2.5 has the opposite order).
        let buf = std::mem::take(&mut self.nodes[n.0].buf);
        for t in buf.into_iter().flatten() {
            self.decref(t);
        }
        if !retain {
            self.release_variables(n);
        }
        Ok(result)
    }

    /// A gradient computed by a GEMM: the output, a contiguous copy of a
    /// broadcast incoming gradient (freed right after), the workspace (§12 #9–11).
    pub(crate) fn gemm_grad(
        &mut self,
        shape: crate::engine::shape::Shape,
        dtype: crate::engine::dtype::DType,
        g: Option<TensorId>,
    ) -> Result<TensorId> {
        let out = self.empty(shape, dtype, Category::Gradient)?;
        let copy = match g {
            Some(g) if self.layout(g) == Layout::Expanded => {
                let b = self.nbytes(g);
                self.transient(b, Category::Temporary)?
            }
            _ => None,
        };
        let ws = self.cublas_workspace()?;
        self.free_transient(ws);
        self.free_transient(copy);
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
    fn unpack_saved(&mut self, n: NodeId) -> Result<()> {
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
