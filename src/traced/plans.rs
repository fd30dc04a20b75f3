//! What a CUDA kernel takes beside its outputs, stage by stage, for the ops
//! whose buffers sit between their outputs or before them: the helper
//! reports such an op before it runs (`before`), after each output in the
//! order the GPU makes them (`out`), and after it (`op`); a [`KernelPlan`]
//! says which buffers each stage takes and frees. Buffer numbers run across
//! the stages of one call (`ScratchStep::Free(i)` frees the i-th taken).
//! The sizes are the engine's: cuDNN's measured tables and estimates
//! ([`crate::engine::measured`]), the softmax kernels' scratch
//! ([`crate::engine::scratch::softmax`]), `_foreach_norm`'s partial sums,
//! the embedding backward's sort path, cuDNN attention's plan workspace.

use std::collections::BTreeMap;

use serde_json::Value;

use super::args::{str_at, tensor_arg};
use super::simulator::Simulator;
use crate::engine::autograd::ScratchStep::{self, Free, Take};
use crate::engine::measured::{conv_buffers, rnn_buffers, RnnMode, RnnShape};
use crate::engine::model_lang::{counts_for, Routing};
use crate::engine::ops::attention::CUDNN_PLAN_WORKSPACE;
use crate::engine::ops::moe::NONZERO_CUB_SCRATCH;
use crate::engine::optim::FOREACH_CHUNK;
use crate::engine::scratch::embedding::{embedding_sort, EmbeddingSort};
use crate::engine::scratch::index_put::index_put_sort_steps;
use crate::engine::scratch::softmax::{safe_softmax_steps, softmax_backward_steps};
use crate::engine::{DType, Shape};

/// When a plan's steps run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    Before,
    /// Right after output i exists.
    Output(usize),
    After,
}

/// One call's buffers by stage, the outputs vramscope sizes itself (a
/// cuDNN RNN's reserve, which meta makes empty), and what was estimated.
#[derive(Debug, Default)]
pub(super) struct KernelPlan {
    pub(super) stages: Vec<(Stage, Vec<ScratchStep>)>,
    pub(super) sizes: BTreeMap<usize, u64>,
    /// A cuDNN dropout state to create before the call (its bytes).
    pub(super) dropout_state: Option<u64>,
    /// What the plan took from an estimate, not a measurement.
    pub(super) estimated: Vec<(String, u64)>,
    /// The rows of an output whose size depends on the data (`nonzero`'s
    /// `[rows, ndim]`, `bincount`'s bins), and the assumption that gave
    /// them (None: the program's own values did, `known_rows`).
    pub(super) rows: Option<(u64, Option<String>)>,
}

impl KernelPlan {
    fn at(mut self, stage: Stage, steps: Vec<ScratchStep>) -> Self {
        if !steps.is_empty() {
            self.stages.push((stage, steps));
        }
        self
    }

    pub(super) fn steps(&self, stage: Stage) -> Vec<ScratchStep> {
        self.stages
            .iter()
            .filter(|(s, _)| *s == stage)
            .flat_map(|(_, steps)| steps.iter().copied())
            .collect()
    }
}

/// The ops reported before they run (the helper's `before_ops`).
pub const PLANNED_OPS: [&str; 14] = [
    "nonzero",
    "_index_put_impl_",
    "bincount",
    "embedding_dense_backward",
    "mse_loss",
    "binary_cross_entropy_with_logits",
    "convolution",
    "convolution_backward",
    "_cudnn_rnn",
    "_cudnn_rnn_backward",
    "_safe_softmax",
    "_softmax_backward_data",
    "_foreach_norm",
    "_scaled_dot_product_cudnn_attention",
];

/// The planned ops whose outputs are reported one by one (`out`), and in
/// which order the GPU makes them where that is not their order in the
/// result: cuDNN attention's seed and offset first (`_cudnn_attention_forward`).
pub const STAGED_OPS: [(&str, Option<&[usize]>); 7] = [
    ("convolution", None),
    ("convolution_backward", None),
    ("_cudnn_rnn", None),
    ("_cudnn_rnn_backward", None),
    ("_safe_softmax", None),
    ("_softmax_backward_data", None),
    (
        "_scaled_dot_product_cudnn_attention",
        Some(&[6, 7, 0, 1, 2, 3, 4, 5, 8]),
    ),
];

/// Ops whose outputs the GPU makes in another order than the result
/// lists them, with no plan: the fused dropout's mask before its output
/// (`dropout_cuda` in Dropout.cu).
pub const ORDERED_OPS: [(&str, &[usize]); 1] = [("native_dropout", &[1, 0])];

fn bytes_of(shape: &[u64], dtype: Option<DType>) -> u64 {
    shape.iter().product::<u64>() * dtype.map_or(4, DType::size)
}

fn arg(v: &Value, i: usize) -> Option<&Value> {
    v.get(3)?.get(i)
}

fn dims4(s: &[u64]) -> Option<[u64; 4]> {
    <[u64; 4]>::try_from(s).ok()
}

/// A list argument whose entries are all `x` (a square stride or padding).
fn uniform(v: Option<&Value>) -> Option<u64> {
    let a = v?.as_array()?;
    let first = a.first()?.as_u64()?;
    a.iter().all(|x| x.as_u64() == Some(first)).then_some(first)
}

fn flag(v: Option<&Value>) -> bool {
    v.and_then(Value::as_bool).unwrap_or(false)
}

fn mask(v: Option<&Value>, i: usize) -> bool {
    v.and_then(|m| m.get(i))
        .and_then(Value::as_bool)
        .unwrap_or(true)
}

/// What the helper found the tensor of a data-dependent op to be made
/// from (the message's sixth field): a router's top-k choice over
/// `experts` for `tokens` rows, and for a mask `chosen == expert`, which
/// expert.
struct Router {
    experts: u64,
    top_k: u64,
    tokens: u64,
    expert: Option<u64>,
}

/// The rows the helper found running the op on its input's known values
/// (the sixth field `{"known": rows}`): no assumption.
fn known_rows(v: &Value) -> Option<u64> {
    v.get(5)?.get("known")?.as_u64()
}

fn router_of(v: &Value) -> Option<Router> {
    let r = v.get(5)?.get("router")?;
    let n = |k: &str| r.get(k).and_then(Value::as_u64);
    Some(Router {
        experts: n("experts")?.max(1),
        top_k: n("top_k")?,
        tokens: n("tokens")?,
        expert: n("expert"),
    })
}

/// The rows each expert gets under balanced routing, in words.
fn balanced_words(r: &Router) -> String {
    let counts = counts_for(&Routing::Balanced, 0, r.experts, r.tokens, r.top_k);
    let (lo, hi) = (
        counts.iter().min().copied().unwrap_or(0),
        counts.iter().max().copied().unwrap_or(0),
    );
    let each = if lo == hi {
        format!("{lo} rows")
    } else {
        format!("{lo} or {hi} rows")
    };
    format!(
        "balanced top-{} routing over {} experts (the engine's Routing::Balanced): each expert gets {each} of {} tokens × {}; the real routing depends on the data",
        r.top_k, r.experts, r.tokens, r.top_k
    )
}

/// `nonzero` (`torch.where(cond)`, `argwhere`, a boolean mask index,
/// `masked_select`): its `[rows, ndim]` int64 result, whose rows the data
/// decide. A router's mask `chosen == e` takes balanced routing's rows for
/// expert e; any other mask is taken as all true (an upper bound). CUDA's
/// kernel (as the H100 trace of moe_small shows it, the engine's
/// `where_nonzero`): a 4-byte device count and cub's scratch for the
/// count, the result, cub's scratch for the selection, the count freed.
fn nonzero_plan(v: &Value) -> KernelPlan {
    let Some((shape, _, _)) = tensor_arg(v, 0) else {
        return KernelPlan::default();
    };
    let numel: u64 = shape.iter().product();
    let rows = match (known_rows(v), router_of(v)) {
        (Some(n), _) => (n.min(numel), None),
        (None, Some(r)) if r.expert.is_some() => {
            let e = r.expert.unwrap_or(0);
            let counts = counts_for(&Routing::Balanced, 0, r.experts, r.tokens, r.top_k);
            let n = counts.get(usize::try_from(e).unwrap_or(usize::MAX)).copied().unwrap_or(0);
            (n.min(numel), Some(balanced_words(&r)))
        }
        _ => (
            numel,
            Some(format!(
                "every element of the {shape:?} mask true: {numel} rows (an upper bound; the real count depends on the data)"
            )),
        ),
    };
    let [count_scratch, select_scratch] = NONZERO_CUB_SCRATCH;
    let mut plan = KernelPlan::default()
        .at(Stage::Before, vec![Take(4), Take(count_scratch), Free(1)])
        .at(Stage::After, vec![Take(select_scratch), Free(2), Free(0)]);
    plan.rows = Some(rows);
    plan
}

/// `_index_put_impl_(self, indices, values, accumulate=True, unsafe)`:
/// CUDA's `index_put_with_sort_kernel` linearises and sorts the index rows
/// (the engine's `index_put_sort_steps`, as the H100 trace of moe_small
/// shows them); the rows are the index tensors' broadcast elements.
fn index_put_plan(v: &Value) -> KernelPlan {
    if !flag(arg(v, 3)) {
        return KernelPlan::default();
    }
    let Some(indices) = arg(v, 1).and_then(Value::as_array) else {
        return KernelPlan::default();
    };
    let rows = indices
        .iter()
        .filter_map(|i| {
            i.get("shape")?
                .as_array()
                .map(|s| s.iter().filter_map(Value::as_u64).product::<u64>())
        })
        .max();
    match rows {
        Some(rows) => KernelPlan::default().at(Stage::Before, index_put_sort_steps(rows)),
        None => KernelPlan::default(),
    }
}

/// `bincount(x, weights, minlength)`: its bins are the largest value + 1
/// (at least `minlength`), which the data decide. Of a router's choice:
/// one per expert (balanced routing reaches every expert); otherwise
/// `minlength` when given (every value below it), else one per element.
fn bincount_plan(v: &Value) -> KernelPlan {
    let Some((shape, _, _)) = tensor_arg(v, 0) else {
        return KernelPlan::default();
    };
    let numel: u64 = shape.iter().product();
    let minlength = arg(v, 2).and_then(Value::as_u64).unwrap_or(0);
    let rows = match (known_rows(v), router_of(v)) {
        (Some(n), _) => (n, None),
        (None, Some(r)) => (
            r.experts.max(minlength),
            Some(format!("a bin for every expert: {}", balanced_words(&r))),
        ),
        (None, None) if minlength > 0 => (
            minlength,
            Some(format!("every value below minlength: {minlength} bins (the real count is the largest value + 1)")),
        ),
        (None, None) => (
            numel.max(1),
            Some(format!("the values 0..{numel}: {numel} bins, one per element (the real count is the largest value + 1)")),
        ),
    };
    KernelPlan {
        rows: Some(rows),
        ..KernelPlan::default()
    }
}

impl<W: std::io::Write> Simulator<W> {
    /// The plan of a call the helper reports before it runs.
    pub(super) fn plan_for(&mut self, v: &Value) -> KernelPlan {
        match str_at(v, 1).as_str() {
            "embedding_dense_backward" => embedding_plan(v),
            "convolution" | "convolution_backward" => self.conv_plan(v),
            "_cudnn_rnn" => self.rnn_plan(v),
            "_cudnn_rnn_backward" => self.rnn_backward_plan(v),
            "_safe_softmax" => safe_softmax_plan(v),
            "_softmax_backward_data" => tensor_arg(v, 0)
                .map(|(s, d, _)| {
                    KernelPlan::default()
                        .at(Stage::Output(0), softmax_backward_steps(bytes_of(&s, d)))
                })
                .unwrap_or_default(),
            "_foreach_norm" => foreach_norm_plan(v),
            "nonzero" => nonzero_plan(v),
            "_index_put_impl_" => index_put_plan(v),
            "bincount" => bincount_plan(v),
            "mse_loss" => self.pointwise_loss_plan(v, 2, 1, true),
            "binary_cross_entropy_with_logits" => self.pointwise_loss_plan(v, 4, 2, false),
            "_scaled_dot_product_cudnn_attention" => KernelPlan::default()
                .at(Stage::Output(1), vec![Take(CUDNN_PLAN_WORKSPACE), Free(0)]),
            _ => KernelPlan::default(),
        }
    }

    /// A reduced elementwise loss on the GPU (the engine's
    /// `pointwise_loss`, as the H100 makes it: tests/fixtures/loss): its
    /// `temporaries` full-size buffers before the out, then the mean's
    /// scratch, then the temporaries go. `mse_loss`'s 0-dim out lies in a
    /// buffer of the input's size. `reduction_at`: the argument that says
    /// the reduction (none: no plan, the out is the elementwise loss).
    fn pointwise_loss_plan(
        &self,
        v: &Value,
        reduction_at: usize,
        temporaries: usize,
        full_size_out: bool,
    ) -> KernelPlan {
        let Some((shape, Some(dtype), _)) = tensor_arg(v, 0) else {
            return KernelPlan::default();
        };
        // at::Reduction: 0 none, 1 mean (the default), 2 sum.
        if arg(v, reduction_at).and_then(Value::as_u64).unwrap_or(1) == 0 {
            return KernelPlan::default();
        }
        let bytes = bytes_of(&shape, Some(dtype));
        let mut after: Vec<ScratchStep> = Vec::new();
        let device = self.rules.as_ref().and_then(|r| r.engine.reduce_device);
        if let (Some(device), Some(rs)) = (
            device,
            super::rules::reduce_shape(&shape, None, dtype.size()),
        ) {
            after.extend(
                crate::engine::scratch::reduce_split::reduce_plan(rs, device)
                    .steps()
                    .into_iter()
                    .map(|s| match s {
                        Free(i) => Free(i + temporaries),
                        take => take,
                    }),
            );
        }
        after.extend((0..temporaries).rev().map(Free));
        let mut plan = KernelPlan::default()
            .at(Stage::Before, vec![Take(bytes); temporaries])
            .at(Stage::After, after);
        if full_size_out {
            plan.sizes.insert(0, bytes);
        }
        plan
    }

    /// cuDNN's convolutions (`cudnn_convolution`, `…_backward_input`,
    /// `…_backward_weight`): each call takes its workspace right after the
    /// tensor it makes and frees it when the call returns; the bias
    /// gradient is ATen's sum, outside cuDNN. 2-D, ungrouped, undilated,
    /// not transposed (other convolutions take no workspace here).
    fn conv_plan(&mut self, v: &Value) -> KernelPlan {
        let backward = str_at(v, 1) == "convolution_backward";
        let (x_at, w_at, stride_at) = if backward { (1, 2, 4) } else { (0, 1, 3) };
        let (Some((x, dtype, _)), Some((w, _, _))) = (tensor_arg(v, x_at), tensor_arg(v, w_at))
        else {
            return KernelPlan::default();
        };
        let (Some(x4), Some(w4), Some(dtype)) = (dims4(&x), dims4(&w), dtype) else {
            return KernelPlan::default();
        };
        let transposed = flag(arg(v, stride_at + 3));
        let groups = arg(v, stride_at + 5).and_then(Value::as_u64).unwrap_or(1);
        let dilation = uniform(arg(v, stride_at + 2)).unwrap_or(1);
        let (Some(stride), Some(pad)) =
            (uniform(arg(v, stride_at)), uniform(arg(v, stride_at + 1)))
        else {
            return KernelPlan::default();
        };
        if transposed || groups != 1 || dilation != 1 || !dtype.is_floating() {
            return KernelPlan::default();
        }
        let Some(rules) = &self.rules else {
            return KernelPlan::default();
        };
        let table = rules.measured.map_or(&[][..], |m| &m.conv_workspaces[..]);
        let key = (&x4, &w4, stride, pad, dtype);
        let (ws, measured) = conv_buffers(table, &rules.engine, key);
        let mut plan = KernelPlan::default();
        if !measured {
            plan.estimated.push((
                format!(
                    "cuDNN convolution workspaces for x {x:?}, w {w:?}, stride {stride}, padding {pad}, {}",
                    dtype.torch_name()
                ),
                ws.forward,
            ));
        }
        let take = |bytes: u64| vec![Take(bytes), Free(0)];
        if !backward {
            return plan.at(Stage::Output(0), take(ws.forward));
        }
        // `output_mask`: which gradients the call makes.
        let wanted = arg(v, 10);
        if mask(wanted, 0) {
            plan = plan.at(Stage::Output(0), take(ws.backward[0]));
        }
        if mask(wanted, 1) {
            let i = usize::from(mask(wanted, 0));
            plan = plan.at(Stage::Output(1), vec![Take(ws.backward[1]), Free(i)]);
        }
        plan
    }

    /// The RNN call's shape, for `_cudnn_rnn` and its backward (whose
    /// mode, hidden size, layers and flags sit `shift` places later).
    fn rnn_shape(v: &Value, shift: usize, train: bool) -> Option<RnnShape> {
        let (x, dtype, _) = tensor_arg(v, 0)?;
        let n = |i: usize| arg(v, i + shift).and_then(Value::as_u64);
        let batch_first = flag(arg(v, 10 + shift));
        let [a, b, input] = <[u64; 3]>::try_from(x.as_slice()).ok()?;
        let (seq, batch) = if batch_first { (b, a) } else { (a, b) };
        Some(RnnShape {
            mode: RnnMode::from_cudnn(n(6)?)?,
            input,
            hidden: n(7)?,
            layers: n(9)?,
            seq,
            batch,
            bidirectional: flag(arg(v, 13 + shift)),
            dtype: dtype?,
            train,
        })
    }

    /// `_cudnn_rnn` (aten/src/ATen/native/cudnn/RNN.cpp): the dropout
    /// state once (`get_dropout_state`), a contiguous copy of x when it is
    /// not (batch_first), then output, hy, cy, the workspace, the reserve
    /// (training; vramscope sizes it), the workspace freed, the copy freed.
    fn rnn_plan(&mut self, v: &Value) -> KernelPlan {
        let train = flag(arg(v, 12));
        let Some(shape) = Self::rnn_shape(v, 0, train) else {
            return KernelPlan::default();
        };
        let Some(rules) = &self.rules else {
            return KernelPlan::default();
        };
        let buffers = rnn_buffers(rules.measured, &rules.engine, &shape);
        let mut plan = KernelPlan::default();
        let dropout = arg(v, 11).and_then(Value::as_f64).unwrap_or(0.0);
        if train && dropout > 0.0 && self.ws.dropout_state.is_none() {
            let state = rules.measured.and_then(|m| m.dropout_state);
            if state.is_none() {
                plan.estimated.push((
                    "cuDNN's RNN dropout state".into(),
                    rules.engine.cudnn_dropout_state_bytes,
                ));
            }
            plan.dropout_state = Some(state.unwrap_or(rules.engine.cudnn_dropout_state_bytes));
        }
        if !buffers.measured {
            plan.estimated.push((
                format!("cuDNN RNN workspace and reserve for {shape:?}"),
                buffers.workspace + buffers.reserve,
            ));
        }
        let copy = tensor_arg(v, 0).filter(|(_, _, contiguous)| !contiguous || flag(arg(v, 10)));
        let mut next = 0;
        let mut before = Vec::new();
        if let Some((x, d, _)) = &copy {
            before.push(Take(bytes_of(x, *d)));
            next = 1;
        }
        if train {
            plan.sizes.insert(3, buffers.reserve);
        }
        let after = if copy.is_some() {
            vec![Free(0)]
        } else {
            Vec::new()
        };
        plan.at(Stage::Before, before)
            .at(Stage::Output(2), vec![Take(buffers.workspace)])
            .at(Stage::Output(3), vec![Free(next)])
            .at(Stage::After, after)
    }

    /// `_cudnn_rnn_backward`: zeros for the incoming gradients that are
    /// undefined (output's, hy's, cy's), dx, dhx and dcx with a workspace,
    /// then the flat zeroed dw with another, the zeros freed newest first
    /// (`Engine`'s `CudnnRnn` backward, engine.md §8.2).
    fn rnn_backward_plan(&mut self, v: &Value) -> KernelPlan {
        let train = flag(arg(v, 16));
        let grads = [7, 8, 9].map(|i| arg(v, i).is_some_and(|a| !a.is_null()));
        if !train || grads.iter().all(|g| !g) {
            return KernelPlan::default();
        }
        let Some(shape) = Self::rnn_shape(v, 4, true) else {
            return KernelPlan::default();
        };
        let Some(rules) = &self.rules else {
            return KernelPlan::default();
        };
        let buffers = rnn_buffers(rules.measured, &rules.engine, &shape);
        let mut zeros = Vec::new();
        // grad_output ~ output (6), grad_hy ~ hx (4), grad_cy ~ cx (5).
        for (g, like) in [(0, 6), (1, 4), (2, 5)] {
            if !grads[g] {
                if let Some((s, d, _)) = tensor_arg(v, like) {
                    zeros.push(Take(bytes_of(&s, d)));
                }
            }
        }
        let z = zeros.len();
        let free_zeros = (0..z).rev().map(Free).collect();
        let mut plan = KernelPlan::default()
            .at(Stage::Before, zeros)
            .at(Stage::Output(2), vec![Take(buffers.workspace), Free(z)]);
        if mask(arg(v, 21), 3) {
            plan = plan.at(Stage::Output(3), vec![Take(buffers.workspace), Free(z + 1)]);
        }
        plan.at(Stage::After, free_zeros)
    }
}

/// The embedding backward's sort path around its gradient.
fn embedding_plan(v: &Value) -> KernelPlan {
    let Some(sort) = embedding_scratch(v) else {
        return KernelPlan::default();
    };
    KernelPlan::default()
        .at(Stage::Before, sort.steps_before_grad())
        .at(Stage::After, sort.steps_after_grad())
}

/// `embedding_dense_backward(grad, indices, num_weights, …)`'s sort path,
/// or None when the feature kernel runs.
fn embedding_scratch(v: &Value) -> Option<EmbeddingSort> {
    let (grad, Some(gdt), _) = tensor_arg(v, 0)? else {
        return None;
    };
    let (idx, Some(idt), _) = tensor_arg(v, 1)? else {
        return None;
    };
    let num_weights = arg(v, 2)?.as_u64()?;
    let dim = *grad.last()?;
    embedding_sort(
        idx.iter().product(),
        idt.size(),
        num_weights,
        dim,
        gdt.size(),
    )
}

fn safe_softmax_plan(v: &Value) -> KernelPlan {
    let Some((s, Some(d), _)) = tensor_arg(v, 0) else {
        return KernelPlan::default();
    };
    if s.is_empty() {
        return KernelPlan::default();
    }
    KernelPlan::default().at(Stage::Output(0), safe_softmax_steps(Shape::new(&s), d))
}

/// `_foreach_norm(tensors)`: a zeroed fp32 partial sum per 65,536-element
/// chunk of the largest tensor, per tensor, before the norms; freed after
/// them (`Engine::clip_grad_norm`'s `foreach_norms`).
fn foreach_norm_plan(v: &Value) -> KernelPlan {
    let Some(list) = arg(v, 0).and_then(Value::as_array) else {
        return KernelPlan::default();
    };
    let chunks = list
        .iter()
        .filter_map(|t| t.get("shape")?.as_array())
        .map(|s| {
            s.iter()
                .filter_map(Value::as_u64)
                .product::<u64>()
                .div_ceil(FOREACH_CHUNK)
        })
        .max()
        .unwrap_or(0);
    let bytes = list.len() as u64 * chunks * DType::F32.size();
    KernelPlan::default()
        .at(Stage::Before, vec![Take(bytes)])
        .at(Stage::After, vec![Free(0)])
}
