//! `SparseMoe`'s forward: route, run each expert on its rows, sum back
//! (`Dispatch::Loop` as the capture's Python does it, `Dispatch::Hf` as
//! transformers' `MixtralSparseMoeBlock.forward`).

use super::{check_counts, counts_for, releasing, Dispatch, Expert, ExpertKind, MoeLeaf};
use crate::engine::error::{EngineError, Result};
use crate::engine::model_lang::build::LangNet;
use crate::engine::modules::Linear;
use crate::engine::ops::elementwise::Unary;
use crate::engine::shape::Shape;
use crate::engine::tensor::{Layout, TensorId};
use crate::engine::Engine;

impl LangNet {
    /// Concern 4: `SparseMoe`'s forward on `x` `[…, hidden]`.
    pub(in crate::engine::model_lang) fn sparse_moe(
        &self,
        e: &mut Engine,
        m: &MoeLeaf,
        x: TensorId,
    ) -> Result<TensorId> {
        let call = self.moe.calls.get();
        self.moe.calls.set(call + 1);
        e.in_module(m.module, |e| moe_forward(e, m, x, call))
    }
}

fn moe_forward(e: &mut Engine, m: &MoeLeaf, x: TensorId, call: usize) -> Result<TensorId> {
    let s = e.shape(x);
    let hidden = s.last();
    let rows = s.leading();
    let experts = m.n_experts;
    let counts = counts_for(&m.routing, call, experts, rows, m.top_k);
    check_counts(std::slice::from_ref(&counts), experts, rows, m.top_k)
        .map_err(|why| EngineError::Program(format!("SparseMoe routing: {why}")))?;
    // flat = x.reshape(-1, D): a view.
    let flat = e.reshape(x, Shape::new(&[rows, hidden]))?;
    let r = releasing(e, &[flat], |e| match m.dispatch {
        Dispatch::GroupedMm => super::grouped::grouped_block(e, m, flat),
        Dispatch::Loop | Dispatch::Hf => route_and_run(e, m, flat, &counts),
    });
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
            Dispatch::GroupedMm => unreachable_grouped()?,
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

/// `route_and_run` is the 4.x blocks' path; a 5.x block never reaches it.
fn unreachable_grouped() -> Result<TensorId> {
    Err(EngineError::Program(
        "SparseMoe: the grouped_mm block runs in moe/grouped.rs".into(),
    ))
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
pub(super) fn run_expert(e: &mut Engine, ex: &Expert, x: TensorId) -> Result<TensorId> {
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
