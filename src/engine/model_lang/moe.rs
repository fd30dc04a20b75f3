//! `SparseMoe` (issue 42): a Mixtral / Qwen-MoE style sparse MLP — a
//! router `Linear(hidden, experts)`, softmax, top-k, the weights
//! renormalised (or not), each expert run on the rows routed to it, the
//! results summed back with `index_add` — and `QkvAttention`, the causal
//! self-attention with one fused `qkv` projection and SDPA that small
//! hand-written models use beside it. `kinds.rs` calls what is here, one
//! function per concern.
//!
//! Which rows reach which expert depends on the data: the scenario says it
//! ([`Routing`]): spread evenly (`Balanced`, an assumption the views name),
//! or the counts per expert given (`Counts`, e.g. read from a capture's
//! request sizes). Nothing here guesses a routing.
//!
//! The ops and what each saves for backward are in `engine/ops/moe.rs`
//! (PyTorch 2.11's derivatives.yaml and generated Functions.h, cited by
//! line); their order is the Python's of
//! tests/fixtures/pytorch/moe_small.py (`Dispatch::Loop`) or of
//! transformers' `MixtralSparseMoeBlock.forward` (`Dispatch::Hf`).

use std::cell::Cell;

use serde::{Deserialize, Serialize};

use super::build::{display, LangNet};
use super::check::Problem;
use super::count::{params, Counts};
use super::kinds::{Args, Fault};
use super::shape::{last_dim, ShapeError, Sig};
use super::spec::join;
use crate::engine::config::SdpaBackend;
use crate::engine::error::{EngineError, Result};
use crate::engine::modules::Linear;
use crate::engine::ops::elementwise::Unary;
use crate::engine::shape::Shape;
use crate::engine::tensor::{Layout, TensorId};
use crate::engine::Engine;

/// How the data route rows to experts: data-dependent, so the scenario
/// says it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Routing {
    /// Every expert gets `N·k / E` rows, the first `N·k mod E` one more:
    /// an assumption (a router trained to balance its load comes close).
    Balanced,
    /// The rows each expert gets, one list of `experts` counts per forward
    /// of a `SparseMoe`, in the order the forwards run (layer by layer,
    /// iteration after iteration), used in turn and then again from the
    /// first. Each list sums to `N·k` (every row goes to `top_k` distinct
    /// experts), no count above `N`.
    Counts(Vec<Vec<u64>>),
}

impl Routing {
    /// Whether the routing is the scenario's assumption, not counts given.
    pub fn is_assumed(&self) -> bool {
        matches!(self, Routing::Balanced)
    }

    /// In words, for views and reports.
    pub fn describe(&self) -> String {
        match self {
            Routing::Balanced => {
                "assumed balanced, not measured (each expert the same number of rows; the real routing depends on the data)".into()
            }
            Routing::Counts(c) => format!(
                "as the counts per expert the scenario gives ({} forward{}; the model does not derive them)",
                c.len(),
                if c.len() == 1 { "" } else { "s" }
            ),
        }
    }
}

/// One expert's MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExpertKind {
    /// `down(F.gelu(up(x)))`, `up = Linear(hidden, intermediate)` and
    /// `down` with biases (a hand-written expert).
    Gelu,
    /// `MixtralBlockSparseTop2MLP`: `w2(silu(w1(x)) * w3(x))`, no biases,
    /// registered `w1`, `w2`, `w3`.
    Mixtral,
    /// `Qwen2MoeMLP` / `Qwen3MoeMLP`: `down_proj(silu(gate_proj(x)) *
    /// up_proj(x))`, no biases.
    Qwen,
}

/// How the tokens are dispatched (both loop over the experts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Dispatch {
    /// `token, slot = torch.where(chosen == e)`; `y = expert(
    /// flat.index_select(0, token)) * weights[token, slot].unsqueeze(-1)`;
    /// `out = out.index_add(0, token, y)` (moe_small.py's loop, every expert).
    #[default]
    Loop,
    /// transformers' `MixtralSparseMoeBlock.forward`: `expert_mask =
    /// one_hot(selected, E).permute(2, 1, 0)` kept through the loop; for
    /// each expert some row reaches, `idx, top_x =
    /// torch.where(expert_mask[e])`, `hidden[None, top_x]`,
    /// `routing_weights[top_x, idx, None]`, `final.index_add_(0, top_x, …)`.
    /// Not modelled: `expert_hit`'s few `E`-sized tensors and `one_hot`'s
    /// range checks (tens of bytes), and a half model's fp32 router softmax
    /// and cast back (`hf_config`'s notes say so); the in-place
    /// `routing_weights /=` is modelled out of place.
    Hf,
}

/// Concern 1: `SparseMoe`'s arguments.
#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_args(
    hidden: u64,
    intermediate: u64,
    experts: u64,
    top_k: u64,
    expert: ExpertKind,
    shared_expert: Option<u64>,
) -> Args {
    let per_expert = expert_params(hidden, intermediate, expert);
    let mut n = hidden
        .saturating_mul(experts)
        .saturating_add(experts.saturating_mul(per_expert));
    let mut dims = vec![
        ("hidden", hidden, 1),
        ("intermediate", intermediate, 1),
        ("experts", experts, 1),
        ("top_k", top_k, 1),
    ];
    if let Some(s) = shared_expert {
        dims.push(("shared_expert", s, 1));
        // The shared expert (Qwen's MLP) and its sigmoid gate Linear(hidden, 1).
        n = n
            .saturating_add(expert_params(hidden, s, ExpertKind::Qwen))
            .saturating_add(hidden);
    }
    let modules = experts
        .saturating_mul(if expert == ExpertKind::Gelu { 3 } else { 5 })
        .saturating_add(2);
    Args {
        dims,
        probabilities: Vec::new(),
        counts: params(n),
        modules,
    }
}

fn expert_params(h: u64, i: u64, kind: ExpertKind) -> u64 {
    match kind {
        ExpertKind::Gelu => h
            .saturating_mul(i)
            .saturating_mul(2)
            .saturating_add(i)
            .saturating_add(h),
        ExpertKind::Mixtral | ExpertKind::Qwen => h.saturating_mul(i).saturating_mul(3),
    }
}

/// Concern 2: `SparseMoe`'s rules and shape: `[…, hidden]` in and out;
/// `top_k` at most `experts`; counts that fit the rows.
pub(crate) fn moe_out_shape(
    hidden: u64,
    experts: u64,
    top_k: u64,
    routing: &Routing,
    x: &Sig,
) -> std::result::Result<Sig, Fault> {
    if top_k > experts {
        return Err((Some("top_k"), Problem::MoeTopK { top_k, experts }));
    }
    let s = last_dim("SparseMoe", hidden, x).map_err(|e| (None, Problem::Shape(e)))?;
    let rows = s.dims[..s.dims.len().saturating_sub(1)]
        .iter()
        .fold(1u64, |n, &d| n.saturating_mul(d));
    if let Routing::Counts(lists) = routing {
        if let Err(why) = check_counts(lists, experts, rows, top_k) {
            return Err((
                Some("routing"),
                Problem::MoeRouting(format!(
                    "{why} (counts hold for the batch and sequence they were measured at)"
                )),
            ));
        }
    }
    Ok(s)
}

/// Why `lists` cannot be the routing of `rows` rows to `top_k` of
/// `experts` experts.
fn check_counts(
    lists: &[Vec<u64>],
    experts: u64,
    rows: u64,
    top_k: u64,
) -> std::result::Result<(), String> {
    if lists.is_empty() {
        return Err("Counts needs at least one list of counts".into());
    }
    let want = rows.saturating_mul(top_k);
    for (i, l) in lists.iter().enumerate() {
        if u64::try_from(l.len()).ok() != Some(experts) {
            return Err(format!(
                "list {i} has {} counts for {experts} experts",
                l.len()
            ));
        }
        let sum = l.iter().fold(0u64, |a, &c| a.saturating_add(c));
        if sum != want {
            return Err(format!(
                "list {i} routes {sum} rows; {rows} rows × top_k {top_k} is {want}"
            ));
        }
        if let Some(c) = l.iter().find(|&&c| c > rows) {
            return Err(format!(
                "list {i} sends {c} rows to one expert, more than the {rows} rows there are (each row goes to an expert once)"
            ));
        }
    }
    Ok(())
}

/// The rows each expert gets in this forward.
fn counts_for(routing: &Routing, call: usize, experts: u64, rows: u64, top_k: u64) -> Vec<u64> {
    match routing {
        Routing::Balanced => {
            let total = rows.saturating_mul(top_k);
            let e = experts.max(1);
            (0..e)
                .map(|i| total / e + u64::from(i < total % e))
                .collect()
        }
        Routing::Counts(lists) => lists
            .get(call % lists.len().max(1))
            .cloned()
            .unwrap_or_default(),
    }
}

/// A built expert.
#[derive(Debug)]
pub(crate) struct Expert {
    pub module: u32,
    pub kind: ExpertKind,
    /// `up` (Gelu), `w1` (Mixtral), `gate_proj` (Qwen).
    pub first: Linear,
    /// `w3` / `up_proj` (gated kinds).
    pub gate_up: Option<Linear>,
    pub down: Linear,
}

/// A built `SparseMoe`.
#[derive(Debug)]
pub(crate) struct MoeLeaf {
    pub module: u32,
    pub router: Linear,
    pub experts: Vec<Expert>,
    /// Qwen2-MoE's shared expert and its `shared_expert_gate`.
    pub shared: Option<(Expert, Linear)>,
    pub top_k: u64,
    pub norm_topk_prob: bool,
    pub routing: Routing,
    pub dispatch: Dispatch,
}

/// Per-run state: how many `SparseMoe` forwards have run (which list of
/// `Routing::Counts` is next).
#[derive(Debug, Default)]
pub(crate) struct MoeRun {
    pub calls: Cell<usize>,
}

/// What a `SparseMoe` is built from.
pub(crate) struct MoeBuild<'a> {
    pub hidden: u64,
    pub intermediate: u64,
    pub experts: u64,
    pub top_k: u64,
    pub expert: ExpertKind,
    pub norm_topk_prob: bool,
    pub shared_expert: Option<u64>,
    pub routing: &'a Routing,
    pub dispatch: Dispatch,
    pub router: &'a str,
}

/// Concern 3: the parameters in `named_parameters()` order: the router,
/// then each expert's, then the shared expert's and its gate.
pub(crate) fn build_moe(
    e: &mut Engine,
    path: &str,
    b: &MoeBuild<'_>,
    params: &mut Vec<TensorId>,
) -> Result<MoeLeaf> {
    let module = e.tags.module(path);
    let router = e.new_linear(&join(path, b.router), b.hidden, b.experts, false, params)?;
    let list = join(path, "experts");
    let mut experts = Vec::new();
    for i in 0..b.experts {
        let at = join(&list, &i.to_string());
        experts.push(build_expert(
            e,
            &at,
            b.expert,
            b.hidden,
            b.intermediate,
            params,
        )?);
    }
    let shared = match b.shared_expert {
        Some(s) => {
            let ex = build_expert(
                e,
                &join(path, "shared_expert"),
                ExpertKind::Qwen,
                b.hidden,
                s,
                params,
            )?;
            let gate = e.new_linear(
                &join(path, "shared_expert_gate"),
                b.hidden,
                1,
                false,
                params,
            )?;
            Some((ex, gate))
        }
        None => None,
    };
    Ok(MoeLeaf {
        module,
        router,
        experts,
        shared,
        top_k: b.top_k,
        norm_topk_prob: b.norm_topk_prob,
        routing: b.routing.clone(),
        dispatch: b.dispatch,
    })
}

fn build_expert(
    e: &mut Engine,
    at: &str,
    kind: ExpertKind,
    h: u64,
    i: u64,
    params: &mut Vec<TensorId>,
) -> Result<Expert> {
    let module = e.tags.module(at);
    let lin = |e: &mut Engine, name: &str, fin, fout, bias, ps: &mut Vec<TensorId>| {
        e.new_linear(&join(at, name), fin, fout, bias, ps)
    };
    Ok(match kind {
        ExpertKind::Gelu => Expert {
            module,
            kind,
            first: lin(e, "up", h, i, true, params)?,
            gate_up: None,
            down: lin(e, "down", i, h, true, params)?,
        },
        ExpertKind::Mixtral => {
            let w1 = lin(e, "w1", h, i, false, params)?;
            let w2 = lin(e, "w2", i, h, false, params)?;
            let w3 = lin(e, "w3", h, i, false, params)?;
            Expert {
                module,
                kind,
                first: w1,
                gate_up: Some(w3),
                down: w2,
            }
        }
        ExpertKind::Qwen => Expert {
            module,
            kind,
            first: lin(e, "gate_proj", h, i, false, params)?,
            gate_up: Some(lin(e, "up_proj", h, i, false, params)?),
            down: lin(e, "down_proj", i, h, false, params)?,
        },
    })
}

/// Concern 5: the projections LoRA may adapt: none (an expert's Linears
/// are not offered to PEFT here).
pub(crate) fn moe_projection_names() -> Vec<String> {
    Vec::new()
}

/// Runs `f`, releasing `held` whatever it returns.
fn releasing<T>(
    e: &mut Engine,
    held: &[TensorId],
    f: impl FnOnce(&mut Engine) -> Result<T>,
) -> Result<T> {
    let r = f(e);
    for &t in held {
        e.release(t);
    }
    r
}

impl LangNet {
    /// Concern 4: `SparseMoe`'s forward on `x` `[…, hidden]`.
    pub(super) fn sparse_moe(&self, e: &mut Engine, m: &MoeLeaf, x: TensorId) -> Result<TensorId> {
        let call = self.moe.calls.get();
        self.moe.calls.set(call + 1);
        e.in_module(m.module, |e| moe_forward(e, m, x, call))
    }
}

fn moe_forward(e: &mut Engine, m: &MoeLeaf, x: TensorId, call: usize) -> Result<TensorId> {
    let s = e.shape(x);
    let hidden = s.last();
    let rows = s.leading();
    let experts = u64::try_from(m.experts.len()).unwrap_or(u64::MAX);
    let counts = counts_for(&m.routing, call, experts, rows, m.top_k);
    check_counts(std::slice::from_ref(&counts), experts, rows, m.top_k)
        .map_err(|why| EngineError::Program(format!("SparseMoe routing: {why}")))?;
    // flat = x.reshape(-1, D): a view.
    let flat = e.reshape(x, Shape::new(&[rows, hidden]))?;
    let r = releasing(e, &[flat], |e| route_and_run(e, m, flat, &counts));
    let out = r?;
    let v = e.view_as(out, s, Layout::Contiguous);
    e.release(out);
    Ok(v)
}

/// The router, the experts and (Qwen2-MoE) the shared expert on `flat`;
/// returns the `[N, hidden]` sum.
fn route_and_run(e: &mut Engine, m: &MoeLeaf, flat: TensorId, counts: &[u64]) -> Result<TensorId> {
    // weights, chosen = F.softmax(self.router(flat), dim=-1).topk(k, dim=-1)
    let logits = e.apply_linear(&m.router, flat)?;
    let probs = e.softmax(logits, false);
    // transformers returns the router's logits with the block's output:
    // they live until the decoder layer returns.
    let keep_logits = m.dispatch == Dispatch::Hf;
    if !keep_logits {
        e.release(logits);
    }
    let mut locals: Vec<TensorId> = if keep_logits {
        vec![logits]
    } else {
        Vec::new()
    };
    let r = (|| {
        let probs = probs?;
        let top = e.topk(probs, m.top_k);
        e.release(probs);
        let (vals, chosen) = top?;
        locals.push(chosen);
        // weights = weights / weights.sum(dim=-1, keepdim=True)
        let weights = if m.norm_topk_prob {
            let sum = e.sum_last_keepdim(vals);
            let w = sum.and_then(|sum| {
                let w = e.div(vals, sum);
                e.release(sum);
                w
            });
            e.release(vals);
            w?
        } else {
            vals
        };
        locals.push(weights);
        let out = match m.dispatch {
            Dispatch::Loop => loop_dispatch(e, m, flat, chosen, weights, counts)?,
            Dispatch::Hf => hf_dispatch(e, m, flat, weights, counts)?,
        };
        match &m.shared {
            Some((ex, gate)) => {
                let r = shared_expert(e, ex, gate, flat).and_then(|sh| {
                    let sum = e.add(out, sh);
                    e.release(sh);
                    sum
                });
                e.release(out);
                r
            }
            None => Ok(out),
        }
    })();
    // The frame's locals go as it returns (`weights` dies here: nothing saves it).
    for t in locals {
        e.release(t);
    }
    r
}

/// moe_small.py's loop over every expert.
fn loop_dispatch(
    e: &mut Engine,
    m: &MoeLeaf,
    flat: TensorId,
    chosen: TensorId,
    weights: TensorId,
    counts: &[u64],
) -> Result<TensorId> {
    // out = torch.zeros_like(flat)
    let mut out = e.zeros_like(flat)?;
    let mut held: Vec<TensorId> = Vec::new();
    let mut y: Option<TensorId> = None;
    let r = (|| {
        for (ex, &n) in m.experts.iter().zip(counts) {
            // token, slot = torch.where(chosen == e)
            let (token, slot) = e.where_nonzero(chosen, n, true)?;
            for t in held.drain(..) {
                e.release(t);
            }
            held.extend([token, slot]);
            if n == 0 {
                continue;
            }
            let xs = e.index_select_rows(flat, token)?;
            let h = releasing(e, &[xs], |e| run_expert(e, ex, xs))?;
            let yy = releasing(e, &[h], |e| weighted(e, h, weights, &[token, slot]))?;
            if let Some(old) = y.replace(yy) {
                e.release(old);
            }
            // out = out.index_add(0, token, y)
            let next = e.index_add(out, token, yy)?;
            e.release(std::mem::replace(&mut out, next));
        }
        Ok(())
    })();
    for t in held.into_iter().chain(y) {
        e.release(t);
    }
    match r {
        Ok(()) => Ok(out),
        Err(err) => {
            e.release(out);
            Err(err)
        }
    }
}

/// transformers' `MixtralSparseMoeBlock` loop.
fn hf_dispatch(
    e: &mut Engine,
    m: &MoeLeaf,
    flat: TensorId,
    weights: TensorId,
    counts: &[u64],
) -> Result<TensorId> {
    let rows = e.shape(flat).dim(0);
    let k = m.top_k;
    let experts = u64::try_from(m.experts.len()).unwrap_or(u64::MAX);
    // final_hidden_states = torch.zeros((N, D))
    let out = e.zeros_like(flat)?;
    // expert_mask = one_hot(selected_experts, E).permute(2, 1, 0): [E, k, N] int64
    let mask = e.factory(
        Shape::new(&[rows, k, experts]),
        crate::engine::dtype::DType::I64,
        crate::engine::tag::Category::Activation,
    );
    let mask = match mask {
        Ok(t) => t,
        Err(err) => {
            e.release(out);
            return Err(err);
        }
    };
    let r = (|| {
        for (ex, &n) in m.experts.iter().zip(counts) {
            if n == 0 {
                // not in expert_hit
                continue;
            }
            // idx, top_x = torch.where(expert_mask[expert_idx]): the
            // indexing copies the expert's [k, N] slice.
            let slice = e.factory(
                Shape::new(&[k, rows]),
                crate::engine::dtype::DType::I64,
                crate::engine::tag::Category::Activation,
            )?;
            let found = e.where_nonzero(slice, n, false);
            e.release(slice);
            let (idx, top_x) = found?;
            let r = releasing(e, &[idx, top_x], |e| {
                // current_state = hidden_states[None, top_x].reshape(-1, D)
                let xs = e.index_rows(flat, &[top_x])?;
                let h = releasing(e, &[xs], |e| run_expert(e, ex, xs))?;
                // * routing_weights[top_x, idx, None]
                let y = releasing(e, &[h], |e| weighted(e, h, weights, &[top_x, idx]))?;
                // final_hidden_states.index_add_(0, top_x, y)
                releasing(e, &[y], |e| e.index_add_inplace(out, top_x, y))
            });
            r?;
        }
        Ok(())
    })();
    e.release(mask);
    match r {
        Ok(()) => Ok(out),
        Err(err) => {
            e.release(out);
            Err(err)
        }
    }
}

/// `expert_out * weights[rows, slots].unsqueeze(-1)`.
fn weighted(e: &mut Engine, h: TensorId, weights: TensorId, at: &[TensorId]) -> Result<TensorId> {
    let w = e.index_rows(weights, at)?;
    let n = e.shape(w).numel();
    let col = e.view_as(w, Shape::new(&[n, 1]), Layout::Contiguous);
    e.release(w);
    releasing(e, &[col], |e| e.mul(h, col))
}

/// One expert's MLP on its rows.
fn run_expert(e: &mut Engine, ex: &Expert, x: TensorId) -> Result<TensorId> {
    e.in_module(ex.module, |e| match (ex.kind, &ex.gate_up) {
        (ExpertKind::Gelu, _) | (_, None) => {
            // self.down(F.gelu(self.up(x)))
            let u = e.apply_linear(&ex.first, x)?;
            let g = e.unary(Unary::Gelu, u);
            e.release(u);
            let g = g?;
            releasing(e, &[g], |e| e.apply_linear(&ex.down, g))
        }
        (ExpertKind::Mixtral | ExpertKind::Qwen, Some(up)) => {
            // down(act(gate(x)) * up(x))
            let a = e.apply_linear(&ex.first, x)?;
            let s = e.unary(Unary::Silu, a);
            e.release(a);
            let s = s?;
            let p = releasing(e, &[s], |e| {
                let u = e.apply_linear(up, x)?;
                releasing(e, &[u], |e| e.mul(s, u))
            })?;
            releasing(e, &[p], |e| e.apply_linear(&ex.down, p))
        }
    })
}

/// `F.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)`.
fn shared_expert(e: &mut Engine, ex: &Expert, gate: &Linear, x: TensorId) -> Result<TensorId> {
    let out = run_expert(e, ex, x)?;
    releasing(e, &[out], |e| {
        let g = e.apply_linear(gate, x)?;
        let s = e.unary(Unary::Sigmoid, g);
        e.release(g);
        let s = s?;
        releasing(e, &[s], |e| e.mul(s, out))
    })
}

/// A built `QkvAttention`.
#[derive(Debug)]
pub(crate) struct QkvAttn {
    pub module: u32,
    pub qkv: Linear,
    pub proj: Linear,
    pub heads: u64,
}

/// Concern 1: `QkvAttention`'s arguments: `qkv` and `proj` with biases.
pub(crate) fn qkv_args(hidden: u64, heads: u64) -> Args {
    let n = hidden
        .saturating_mul(hidden)
        .saturating_mul(4)
        .saturating_add(hidden.saturating_mul(4));
    Args {
        dims: vec![("hidden", hidden, 1), ("heads", heads, 1)],
        probabilities: Vec::new(),
        counts: params(n),
        modules: 3,
    }
}

/// Concern 3: `qkv`, then `proj`.
pub(crate) fn build_qkv(
    e: &mut Engine,
    path: &str,
    hidden: u64,
    heads: u64,
    params: &mut Vec<TensorId>,
) -> Result<QkvAttn> {
    let module = e.tags.module(path);
    let qkv = e.new_linear(
        &join(path, "qkv"),
        hidden,
        hidden.saturating_mul(3),
        true,
        params,
    )?;
    let proj = e.new_linear(&join(path, "proj"), hidden, hidden, true, params)?;
    if heads == 0 {
        return Err(EngineError::Program(format!(
            "{}: QkvAttention needs at least one head",
            display(path)
        )));
    }
    Ok(QkvAttn {
        module,
        qkv,
        proj,
        heads,
    })
}

/// Concern 4: `q, k, v = self.qkv(x).split(D, dim=-1)`, each
/// `.view(b, t, H, D // H).transpose(1, 2)`, `F.scaled_dot_product_attention(
/// q, k, v, is_causal=True)`, `self.proj(att.transpose(1, 2).reshape(b, t, D))`
/// (nanoGPT's `CausalSelfAttention` without dropout, as `modules/gpt2.rs`
/// runs it).
pub(crate) fn qkv_attention(e: &mut Engine, a: &QkvAttn, x: TensorId) -> Result<TensorId> {
    e.in_module(a.module, |e| {
        let s = e.shape(x);
        let (b, t, d) = (s.dim(0), s.dim(1), s.last());
        let hd = d / a.heads.max(1);
        let qkv = e.apply_linear(&a.qkv, x)?;
        let parts = e.split_last(qkv, 3);
        // The math backend hands q's and v's gradients back laid out
        // [B, h, T, hd], so view()'s backward copies them (modules/gpt2.rs).
        let math = e.cfg.sdpa_backend == Some(SdpaBackend::Math);
        let relayout = math && a.heads > 1 && t > 1;
        let heads_shape = Shape::new(&[b, t, a.heads, hd]);
        let mut heads = Vec::with_capacity(3);
        for (i, p) in parts.into_iter().enumerate() {
            let v = if relayout && i != 1 {
                e.view_with_node(
                    p,
                    heads_shape,
                    Layout::Strided,
                    "ViewBackward0",
                    crate::engine::autograd::BwdKind::Alloc,
                )
            } else {
                e.view_as(p, heads_shape, Layout::Strided)
            };
            e.release(p);
            heads.push(e.transpose(v, 1, 2));
            e.release(v);
        }
        let y = e.sdpa(heads[0], heads[1], heads[2], 0.0, true);
        for h in heads {
            e.release(h);
        }
        let y = match y {
            Ok(y) => y,
            Err(err) => {
                e.release(qkv);
                return Err(err);
            }
        };
        let yt = if relayout {
            let tv = e.transpose(y, 1, 2);
            let c = e.contiguous(tv);
            e.release(tv);
            c
        } else {
            Ok(e.view_as(y, heads_shape, Layout::Contiguous))
        };
        e.release(y);
        let r = yt.and_then(|yt| {
            let yv = e.view_as(yt, Shape::new(&[b, t, d]), Layout::Contiguous);
            e.release(yt);
            let o = e.apply_linear(&a.proj, yv);
            e.release(yv);
            o
        });
        // q, k, v (views of qkv's output) are the forward's locals until it returns.
        e.release(qkv);
        r
    })
}

/// Concern 2: `QkvAttention` takes `[B, T, hidden]`, `hidden` a multiple of `heads`.
pub(crate) fn qkv_out_shape(hidden: u64, heads: u64, x: &Sig) -> std::result::Result<Sig, Fault> {
    if !hidden.is_multiple_of(heads.max(1)) {
        return Err((
            Some("heads"),
            Problem::HiddenNotMultipleOfHeads { hidden, heads },
        ));
    }
    let s = last_dim("QkvAttention", hidden, x).map_err(|e| (None, Problem::Shape(e)))?;
    if s.dims.len() != 3 {
        return Err((
            None,
            Problem::Shape(ShapeError::AttentionInput {
                hidden,
                got: s.dims,
            }),
        ));
    }
    Ok(s)
}

/// What `m`'s modules assume where the data decide, each after the module
/// path it is written at (a `Repeat`'s copies as `N`, with their range), in
/// words.
pub fn assumptions(m: &super::Module) -> Vec<String> {
    let mut out = Vec::new();
    walk_assumptions(m, "", "", &mut out);
    out
}

fn walk_assumptions(m: &super::Module, path: &str, copies: &str, out: &mut Vec<String>) {
    use super::Module;
    match m {
        Module::Sequential(children) => {
            for (name, c) in children {
                walk_assumptions(c, &join(path, name), copies, out);
            }
        }
        Module::Repeat { n, block } => {
            let range = format!("{copies} (N = 0…{})", n.saturating_sub(1));
            walk_assumptions(block, &join(path, "N"), &range, out);
        }
        Module::Residual(inner) | Module::Frame(inner) => {
            walk_assumptions(inner, path, copies, out)
        }
        Module::Checkpoint { module, .. } => walk_assumptions(module, path, copies, out),
        leaf => {
            if let Some(a) = leaf.assumption() {
                out.push(format!("{}{copies}: {a}", display(path)));
            }
        }
    }
}

/// The counts of an expert layer, for tests and views.
pub fn expert_layer_counts(
    hidden: u64,
    intermediate: u64,
    experts: u64,
    expert: ExpertKind,
    shared: Option<u64>,
) -> Counts {
    moe_args(hidden, intermediate, experts, 1, expert, shared).counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_routing_spreads_every_row_k_times() {
        let c = counts_for(&Routing::Balanced, 0, 8, 2049, 2);
        assert_eq!(c.iter().sum::<u64>(), 4098);
        assert_eq!(c[0], 513);
        assert_eq!(c[1], 513);
        assert_eq!(c[2], 512);
        assert!(Routing::Balanced.is_assumed());
    }

    #[test]
    fn counts_are_used_in_turn_and_checked() {
        let r = Routing::Counts(vec![vec![3, 1], vec![2, 2]]);
        assert_eq!(counts_for(&r, 0, 2, 2, 2), vec![3, 1]);
        assert_eq!(counts_for(&r, 3, 2, 2, 2), vec![2, 2]);
        // 3 rows to one expert of 2 rows: refused.
        assert!(check_counts(&[vec![3, 1]], 2, 2, 2).is_err());
        assert!(check_counts(&[vec![2, 2]], 2, 2, 2).is_ok());
        assert!(check_counts(&[vec![2, 1]], 2, 2, 2)
            .err()
            .is_some_and(|w| w.contains("routes 3 rows")));
        assert!(check_counts(&[vec![4]], 2, 2, 2)
            .err()
            .is_some_and(|w| w.contains("1 counts for 2 experts")));
    }
}
