//! `create_graph=True`: each gradient a node computes is itself recorded,
//! as the node's formula runs under grad mode. The formula's ops make the
//! nodes of the double-backward graph, which save what the formula reads
//! (the incoming gradient, the node's own saved tensors) and lead back into
//! the first graph through them: a gradient kept with its graph keeps the
//! forward's saved tensors too.
//!
//! One rule per first-order node, from PyTorch 2.11's
//! `tools/autograd/derivatives.yaml` (the formula each node runs, and the
//! derivative entry of the op that formula calls, quoted by entry: the yaml
//! is not in the wheel) and the SavedVariables of the 2.11.0 wheel's
//! generated `torch/include/torch/csrc/autograd/generated/Functions.h`,
//! cited by line (NllLossBackwardBackward0 at 10705: `target_` 10720,
//! `weight_` 10721; LogSoftmaxBackwardDataBackward0 at 10580: `grad_output_`
//! 10594, `output_` 10595; ThresholdBackwardBackward0 at 11084: `self_`
//! 11096; MmBackward0 at 4323: `mat2_` 4336, `self_` 4340; ExpandBackward0
//! at 2047, sizes only, 2059; SumBackward1 at 6738, `dim`, `keepdim` and
//! `self_sym_sizes` only, 6750-6752; TBackward0 at 6870, nothing saved).
//! Under `vramscope
//! trace` (PyTorch 2.11 itself, on the meta device) the built-ins'
//! programs make the requests these rules make, byte for byte:
//!
//! - NllLossBackward0 runs `nll_loss_backward(grad, self, target, weight,
//!   reduction, ignore_index, total_weight)`; its entry (`grad_output:
//!   nll_loss_symint(grad, target, weight, reduction, ignore_index)`, `self:
//!   zeros_like(grad)`) makes NllLossBackwardBackward0, saving `target` and
//!   `weight`, its inputs the incoming gradient and `self` (the log-probs).
//! - LogSoftmaxBackward0 runs `_log_softmax_backward_data(grad, result, dim,
//!   self.scalar_type())`; its entry reads `grad_output` and `output` (`grad_output:
//!   grad.to(output.dtype()) - (grad.to(output.dtype()) * output.exp()).sum(dim,
//!   true)`, `output: (-grad_output * grad.sum(dim, true) * output.exp())…`):
//!   LogSoftmaxBackwardDataBackward0 saves both, so the incoming gradient
//!   outlives the node that consumed it.
//! - ReluBackward0 runs `threshold_backward(grad, result, 0)`; its entry
//!   (`grad_output: threshold_backward(grad, self, threshold)`, `self:
//!   zeros_like(grad)`) makes ThresholdBackwardBackward0, saving `self` (the
//!   ReLU's result).
//! - AddmmBackward0's `mat1` gradient is `mm_mat1_backward(grad, mat2, …)`,
//!   `grad.mm(mat2.t())`: an MmBackward0 that saves `mat2` (the weight, a
//!   view: no new memory) when `self`, the incoming gradient, requires
//!   grad, and `self` (the incoming gradient, kept alive) when `mat2`, the
//!   weight, does: a trained Linear (a WGAN-GP critic's) keeps every
//!   gradient it received. `mat2.t()` of a trained weight is two views of
//!   it (TBackward0 twice), folded into the edge to its AccumulateGrad as
//!   the forward's `weight.t()` is.
//! - AddmmBackward0's `mat2` gradient (a trained Linear's weight, `mat2 =
//!   weight.t()`, column-major) is `mm_mat2_backward`'s column-major branch
//!   (FunctionsManual.cpp: `grad.t().mm(mat1).t()`): an MmBackward0 whose
//!   `self` is the incoming gradient transposed (saved when `mat1` requires
//!   grad) and whose `mat2` is `mat1` (saved when the gradient does); then
//!   the forward's `weight.t()` runs `grad.t()`, a TBackward0 of its own.
//!   Its bias gradient is the incoming one summed by validate_outputs'
//!   `at::sum_to`: SumBackward1. A Hessian-vector product
//!   (`torch.autograd.grad(loss, model.parameters(), create_graph=True)`,
//!   then the gradient of `g · v`) runs them backward: SumBackward1 an
//!   expanded view, MmBackward0 by the same two GEMMs with the transposed
//!   result on `self`'s side.
//! - SumBackward0 runs `grad.expand_symint(self_sym_sizes)`: a view, whose
//!   ExpandBackward0 saves sizes only; recorded when the incoming gradient
//!   has a history (a seed has none: then nothing).
//!
//! Anything else is refused by name. A backward through the recorded graph
//! (WGAN-GP's penalty, `ops/penalty.rs`; a Hessian-vector product,
//! `engine/hvp.rs`) runs MmBackward0, TBackward0, SumBackward1 and
//! ThresholdBackwardBackward0 by their formulas (`second_order_backward`);
//! a backward that reaches NllLossBackwardBackward0,
//! LogSoftmaxBackwardDataBackward0 or ExpandBackward0 (a penalty on a
//! classifier's loss gradient) stops the run with the node's name.

use crate::engine::autograd::{BwdKind, Edge, InputMeta, NodeId, SavedSlot};
use crate::engine::error::{EngineError, Result};
use crate::engine::tag::Category;
use crate::engine::tensor::{Layout, TensorId};
use crate::engine::Engine;

/// Where an input of the double-backward node leads.
#[derive(Debug, Clone, Copy)]
enum From {
    /// The incoming gradient's own history.
    Grad,
    /// The first-order node's input `k` (a saved input's history).
    Input(usize),
    /// The first-order node's output (a saved result's history).
    Output,
    /// The first-order node's input `k`, a weight: where a trained
    /// Linear's `mat2.t()` leads (two views of the weight, whose TBackward0
    /// nodes the engine folds into the edge to its AccumulateGrad, as it
    /// does in the forward); no edge for a frozen one.
    Weight(usize),
}

/// What the double-backward node saves.
#[derive(Debug, Clone, Copy)]
enum Save {
    /// The incoming gradient.
    Grad,
    /// The first-order node's saved slot of this name.
    Slot(&'static str),
    /// The incoming gradient, only if the rule's input `k` requires grad
    /// (MmBackward0's `self_`, saved for `mat2`'s gradient).
    GradIf(usize),
    /// The slot, only if the rule's input `k` requires grad (MmBackward0's
    /// `mat2_`, saved for `self`'s gradient).
    SlotIf(&'static str, usize),
}

struct Rule {
    name: &'static str,
    inputs: &'static [From],
    saves: &'static [(&'static str, Save)],
    /// An MmBackward0 whose `self` is the incoming gradient transposed.
    self_t: bool,
}

/// The first-order nodes whose gradients can be recorded, for messages.
pub(crate) const MODELLED: &str = "NllLossBackward0, LogSoftmaxBackward0, ReluBackward0, \
     SumBackward0, TBackward0 and AddmmBackward0 (its input, weight and bias)";

/// The rule for the gradient of input `i` of a node named `node`.
fn rule(node: &str, i: usize) -> Option<Rule> {
    Some(match (node, i) {
        ("NllLossBackward0", 0) => Rule {
            name: "NllLossBackwardBackward0",
            inputs: &[From::Grad, From::Input(0)],
            saves: &[("target", Save::Slot("target"))],
            self_t: false,
        },
        ("LogSoftmaxBackward0", 0) => Rule {
            name: "LogSoftmaxBackwardDataBackward0",
            inputs: &[From::Grad, From::Output],
            saves: &[
                ("grad_output", Save::Grad),
                ("output", Save::Slot("result")),
            ],
            self_t: false,
        },
        ("ReluBackward0", 0) => Rule {
            name: "ThresholdBackwardBackward0",
            inputs: &[From::Grad, From::Output],
            saves: &[("self", Save::Slot("result"))],
            self_t: false,
        },
        // `mm_mat1_backward(grad, mat2, …)` = `grad.mm(mat2.t())`: `mm`'s
        // entry saves `mat2` for `self`'s gradient when `self` (the
        // incoming gradient) requires grad, and `self` for `mat2`'s when
        // `mat2` (the weight) does (Functions.h 4336, 4340).
        ("AddmmBackward0", 1) => Rule {
            name: "MmBackward0",
            inputs: &[From::Grad, From::Weight(2)],
            saves: &[("self", Save::GradIf(1)), ("mat2", Save::SlotIf("mat2", 0))],
            self_t: false,
        },
        // `grad.expand_symint(self_sym_sizes)`: a view; ExpandBackward0
        // saves only sizes.
        ("SumBackward0", 0) => Rule {
            name: "ExpandBackward0",
            inputs: &[From::Grad],
            saves: &[],
            self_t: false,
        },
        // The bias: `maybe_multiply(grad, beta)` hands the incoming
        // gradient on, and validate_outputs' `at::sum_to` sums it to the
        // bias's shape, recorded as SumBackward1 (`sum.dim_IntList`: sizes
        // only).
        ("AddmmBackward0", 0) => Rule {
            name: "SumBackward1",
            inputs: &[From::Grad],
            saves: &[],
            self_t: false,
        },
        // The weight, `mat2 = weight.t()`, column-major: `mm_mat2_backward`
        // takes its column-major branch, `grad.t().mm(mat1).t()`, an
        // MmBackward0 whose `self` is the incoming gradient transposed (a
        // view: saved when `mat1` requires grad) and whose `mat2` is
        // `mat1` (saved when the gradient requires grad); its transposes
        // are views, folded into the edges. The forward's `weight.t()`
        // then runs `grad.t()` (TBackward0, below).
        ("AddmmBackward0", 2) => Rule {
            name: "MmBackward0",
            inputs: &[From::Grad, From::Input(1)],
            saves: &[("self", Save::GradIf(1)), ("mat2", Save::SlotIf("mat1", 0))],
            self_t: true,
        },
        // `grad.t()`: a view; TBackward0 saves nothing.
        ("TBackward0", 0) => Rule {
            name: "TBackward0",
            inputs: &[From::Grad],
            saves: &[],
            self_t: false,
        },
        _ => return None,
    })
}

impl Engine {
    /// Under `create_graph=True`: give each gradient node `n` produced a
    /// history (its rule's node), before the incoming gradient `g0` is let
    /// go. A node without a rule stops the call, named.
    pub(super) fn record_second_order(
        &mut self,
        n: NodeId,
        g0: Option<TensorId>,
        produced: &[(usize, TensorId)],
    ) -> Result<()> {
        let name = self.nodes[n.0].name;
        // A weight's gradient leaves through the forward's `weight.t()`,
        // made a node of its own here (it records `grad.t()` in turn).
        let weight_grad = self.nodes[n.0].kind
            == BwdKind::Gemm {
                has_bias: true,
                weight_transposed: true,
            }
            && produced.iter().any(|(i, _)| *i == 2);
        if weight_grad {
            self.weight_transpose(n, 2, true);
        }
        for &(i, t) in produced {
            let Some(r) = rule(name, i) else {
                return Err(EngineError::Program(format!(
                    "create_graph=True: the gradient {name} computes (input {i}) would be \
                     recorded by its formula's ops, which is not modelled; modelled: {MODELLED}"
                )));
            };
            let mut metas = Vec::with_capacity(r.inputs.len());
            for from in r.inputs {
                let meta = match *from {
                    From::Grad => {
                        let g = g0.ok_or_else(|| {
                            EngineError::Program(format!("{name} ran without a gradient"))
                        })?;
                        let x = self.t(g);
                        let (shape, dtype, fnode, nr) = (x.shape, x.dtype, x.grad_fn, x.output_nr);
                        InputMeta {
                            edge: fnode.map(|node| Edge { node, nr }),
                            shape,
                            dtype,
                        }
                    }
                    From::Input(k) => self.nodes[n.0].inputs[k],
                    From::Output => {
                        let m = self.nodes[n.0].inputs[0];
                        InputMeta {
                            edge: Some(Edge { node: n, nr: 0 }),
                            ..m
                        }
                    }
                    From::Weight(k) => {
                        let delivered = produced.iter().any(|(i, _)| *i == k);
                        self.weight_transpose(n, k, delivered)
                    }
                };
                metas.push(meta);
            }
            // An output that depends on nothing requiring grad records nothing.
            if metas.iter().all(|m| m.edge.is_none()) {
                continue;
            }
            let kind = BwdKind::SecondOrder { self_t: r.self_t };
            let d = self.new_node(r.name, kind, &[]);
            for m in &metas {
                if let Some(e) = m.edge {
                    self.nodes[e.node.0].refs += 1;
                }
            }
            self.nodes[d.0].inputs = metas;
            let requires: Vec<bool> = self.nodes[d.0]
                .inputs
                .iter()
                .map(|m| m.edge.is_some())
                .collect();
            let requires = |k: usize| requires.get(k).copied().unwrap_or(false);
            for &(saved_as, what) in r.saves {
                let (grad, slot) = match what {
                    Save::Grad => (true, None),
                    Save::GradIf(k) => (requires(k), None),
                    Save::Slot(slot) => (false, Some(slot)),
                    Save::SlotIf(slot, k) => (false, Some(slot).filter(|_| requires(k))),
                };
                if let (true, Some(g)) = (grad, g0) {
                    self.save(d, saved_as, g, false);
                }
                if let Some(slot) = slot {
                    self.save_slot_of(d, saved_as, n, slot);
                }
            }
            self.set_grad_fn(t, d, 0);
        }
        Ok(())
    }

    /// Where a recorded gradient of `n`'s weight input `k` leads: the
    /// forward's `weight.t()`, a TBackward0 the engine folds into the edge
    /// to the weight's AccumulateGrad until a second gradient reaches it
    /// here. From then on it is a node of its own (a view of what it is
    /// handed, as PyTorch's is), so the two gradients of one forward pass
    /// are summed in its buffer and reach the weight as one transposed
    /// view, as PyTorch sums them.
    fn weight_transpose(&mut self, n: NodeId, k: usize, delivered: bool) -> InputMeta {
        let m = self.nodes[n.0].inputs[k];
        let Some(e) = m.edge else {
            return m;
        };
        if self.nodes[e.node.0].name == "TBackward0" {
            return m;
        }
        let t = self.new_node("TBackward0", BwdKind::SecondOrder { self_t: false }, &[]);
        // n's reference to the AccumulateGrad becomes t's; n refers to t.
        self.nodes[t.0].inputs = vec![m];
        self.nodes[t.0].refs += 1;
        let edge = Some(Edge { node: t, nr: 0 });
        self.nodes[n.0].inputs[k].edge = edge;
        // Made while a graph task runs: the gradient n hands on arrives
        // here (one dependency), and under autograd.grad it runs when the
        // accumulator it leads to is needed.
        if delivered {
            self.nodes[t.0].deps = 1;
            self.grad_only_also_needs(t, e.node);
        }
        InputMeta { edge, ..m }
    }

    /// Save in `d`, as `name`, what `from`'s slot `slot` holds (the same
    /// storage, one more reference).
    fn save_slot_of(&mut self, d: NodeId, name: &'static str, from: NodeId, slot: &str) {
        let Some(s) = self.nodes[from.0]
            .saved
            .iter()
            .find(|s| s.name == slot)
            .cloned()
        else {
            return;
        };
        if let Some(st) = s.storage {
            self.retain_storage_slot(st);
        }
        self.nodes[d.0].saved.push(SavedSlot {
            name,
            is_output: false,
            ..s
        });
    }
}

impl Engine {
    /// Backward through a node of the recorded graph (a gradient
    /// penalty's second backward), by the node's formula in PyTorch 2.11
    /// (derivatives.yaml; the order its generated apply() computes them,
    /// seen under `vramscope trace`):
    /// - MmBackward0: `mat2`'s gradient first, `self.t().mm(grad)` (a
    ///   contiguous copy of a broadcast `self`, the seed a SumBackward0
    ///   expanded, made after it and freed at once), then `self`'s,
    ///   `grad.mm(mat2.t())`. `mat2`'s reaches the weight through two
    ///   transposes: a view, summed out of place with the weight's other
    ///   gradients.
    /// - ThresholdBackwardBackward0: `threshold_backward(grad, self, 0)`
    ///   for the incoming gradient, `zeros_like(grad)` for the ReLU's result.
    /// - TBackward0, a forward pass's `weight.t()` once a recorded gradient
    ///   reaches it (`weight_transpose`): a view.
    ///
    /// Any other recorded node is refused by name.
    pub(super) fn second_order_backward(
        &mut self,
        n: NodeId,
        g0: Option<TensorId>,
        self_t: bool,
        needs: &dyn Fn(&Engine, usize) -> bool,
        ready: &mut Vec<(usize, TensorId)>,
    ) -> Result<()> {
        let name = self.nodes[n.0].name;
        match name {
            "MmBackward0" => {
                for i in [1, 0] {
                    if !needs(self, i) {
                        continue;
                    }
                    let m = self.nodes[n.0].inputs[i];
                    let t = if i == 1 {
                        let broadcast = self.nodes[n.0]
                            .saved
                            .iter()
                            .find(|s| s.name == "self")
                            .and_then(|s| {
                                let st = s.storage?;
                                (self.storages[st.0].bytes < s.bytes()).then(|| s.bytes())
                            });
                        let out = self.empty(m.shape, m.dtype, Category::Gradient)?;
                        let copy = match broadcast.map(|b| self.transient(b, Category::Temporary)) {
                            Some(Err(e)) => {
                                self.release(out);
                                return Err(e);
                            }
                            Some(Ok(c)) => c,
                            None => None,
                        };
                        let ws = self.cublas_workspace();
                        self.free_transient(copy);
                        match ws {
                            Ok(ws) => self.free_transient(ws),
                            Err(e) => {
                                self.release(out);
                                return Err(e);
                            }
                        }
                        // Transposed back (a view) where `mat2` was
                        // column-major (a weight's `W.t()`).
                        self.t_mut(out).is_view = !self_t;
                        out
                    } else {
                        let t = self.gemm_grad(m.shape, m.dtype, g0)?;
                        // `self` a transposed gradient: `mm_mat1_backward`'s
                        // column-major branch, `mat2.mm(grad.t()).t()`.
                        self.t_mut(t).is_view = self_t;
                        t
                    };
                    self.k_grad_from(g0, t);
                    ready.push((i, t));
                }
                ready.sort_by_key(|(i, _)| *i);
            }
            // The forward's `weight.t()` (`weight_transpose`): the gradients
            // arrive in the weight's orientation here, so the transpose
            // hands on a view of the same layout.
            "TBackward0" => {
                if let (Some(g), true) = (g0, needs(self, 0)) {
                    let m = self.nodes[n.0].inputs[0];
                    let layout = self.layout(g);
                    let v = self.view_as_plain(g, m.shape, layout);
                    ready.push((0, v));
                }
            }
            // `sum_backward`: the gradient unsqueezed and expanded back to
            // the summed input's sizes, a view.
            "SumBackward1" => {
                if let (Some(g), true) = (g0, needs(self, 0)) {
                    let m = self.nodes[n.0].inputs[0];
                    let v = self.view_as_plain(g, m.shape, Layout::Expanded);
                    ready.push((0, v));
                }
            }
            "ThresholdBackwardBackward0" => {
                for i in 0..self.nodes[n.0].inputs.len() {
                    if needs(self, i) {
                        let m = self.nodes[n.0].inputs[i];
                        let t = self.empty(m.shape, m.dtype, Category::Gradient)?;
                        self.k_grad_from(g0, t);
                        ready.push((i, t));
                    }
                }
            }
            _ => {
                return Err(EngineError::Program(format!(
                    "a backward through {name}, a node of the graph create_graph=True recorded, \
                     is not modelled; modelled: MmBackward0, TBackward0, SumBackward1 and \
                     ThresholdBackwardBackward0 (Linears and ReLUs: a gradient penalty, a \
                     Hessian-vector product)"
                )))
            }
        }
        Ok(())
    }
}
