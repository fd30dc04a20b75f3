//! What each backward node computes and allocates when the graph task runs
//! it (engine.md §3, §12): the per-node formulas of `loss.backward()`,
//! apart from the task that orders them (backward.rs).

use crate::engine::autograd::{BwdKind, NodeId};
use crate::engine::dtype::DType;
use crate::engine::error::{EngineError, Result};
use crate::engine::tag::Category;
use crate::engine::tensor::{Layout, TensorId};
use crate::engine::Engine;

use super::backward::Out;

impl Engine {
    pub(super) fn exec_node_inner(
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
                        // A product of the output's dtype (a bf16 factor times
                        // an fp32 one makes an fp32 gradient): validate_outputs
                        // sums a broadcast input's down and casts it to the
                        // input's dtype (a 5.x Mixtral's `proj_out *
                        // sample_weights_g.unsqueeze(-1)` in the trace).
                        let broadcast = g0.filter(|_| kind == BwdKind::Mul).filter(|&g| {
                            self.shape(g).numel() > m.shape.numel() || self.dtype(g) != m.dtype
                        });
                        if let Some(g) = broadcast {
                            let dtype = if self.shape(g).numel() > m.shape.numel() {
                                m.dtype
                            } else {
                                self.dtype(g)
                            };
                            let t = self.empty(self.shape(g), dtype, Category::Gradient)?;
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
            BwdKind::ViewCopy => {
                if let (Some(g), true) = (g0, needs(self, 0)) {
                    let m = self.nodes[n.0].inputs[0];
                    if self.layout(g) == Layout::Expanded {
                        let t = self.empty(m.shape, m.dtype, Category::Gradient)?;
                        self.k_grad_from(g0, t);
                        outs.push(Out::Ready(0, t));
                    } else {
                        let v = self.view_as_plain(g, m.shape, self.layout(g));
                        outs.push(Out::Ready(0, v));
                    }
                }
            }
            BwdKind::GroupedMm => {
                // The generated apply() computes mat2's gradient first (the
                // trace of a tiny Mixtral's experts, ops/grouped_mm.rs).
                for i in (0..ninputs).rev() {
                    if needs(self, i) {
                        let m = self.nodes[n.0].inputs[i];
                        let t = self.empty(m.shape, m.dtype, Category::Gradient)?;
                        self.k_grad_from(g0, t);
                        outs.push(Out::Ready(i, t));
                    }
                }
                outs.reverse();
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
}
