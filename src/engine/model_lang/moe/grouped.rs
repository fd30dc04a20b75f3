//! `SparseMoe` as transformers 5.x builds and runs it (`Dispatch::GroupedMm`,
//! and `Dispatch::Hf` under a 5.x `transformers:`), transformers 5.16.1
//! read:
//!
//! - parameters: the router `gate.weight` [E, H] (`MixtralTopKRouter`,
//!   modeling_mixtral.py:89-94; `Qwen2MoeTopKRouter`,
//!   modeling_qwen2_moe.py:318-325), and the experts' `gate_up_proj`
//!   [E, 2·I, H] and `down_proj` [E, H, I] (modeling_mixtral.py:65-66),
//!   registered after the router (Mixtral's and Qwen2-MoE's blocks,
//!   modeling_mixtral.py:104-105, modeling_qwen2_moe.py:342-345) or before
//!   it (Qwen3-MoE, modeling_qwen3_moe.py:273-274); Qwen2-MoE's
//!   `shared_expert` and `shared_expert_gate` last;
//! - the router (modeling_mixtral.py:96-101; modeling_qwen2_moe.py:327-336):
//!   `F.linear` [N, E]; Mixtral `softmax(logits.float())`, Qwen
//!   `softmax(logits, dtype=torch.float)` (on a bf16 or fp32 model the same
//!   copy and softmax; an fp16 model on CUDA takes `_softmax(half_to_float)`
//!   with no copy, not modelled); `topk`; `/=` the sum in place when
//!   normalised (Mixtral always), which saves a clone; Qwen casts the
//!   weights back to the logits' dtype (`.to`), Mixtral keeps them fp32;
//! - the experts (integrations/moe.py:377-478, `grouped_mm_experts_forward`,
//!   what `get_correct_experts_implementation` picks by default,
//!   modeling_utils.py:1964-1986, and `_can_use_grouped_mm` accepts on a
//!   CUDA device of compute capability 8.0 or more): every routed row
//!   (`S = N·top_k`) is sorted by expert and gathered once, whatever the
//!   routing, so nothing here depends on the data; two `_grouped_mm`s, the
//!   gate, the weights, the rows put back in order and summed over
//!   `top_k`;
//! - Qwen2-MoE's block runs its shared expert first, the router and the
//!   experts after (modeling_qwen2_moe.py:347-358).

use super::{releasing, Dispatch, ExpertKind, MoeBuild, MoeLeaf};
use crate::engine::dtype::DType;
use crate::engine::error::Result;
use crate::engine::modules::Linear;
use crate::engine::ops::elementwise::Unary;
use crate::engine::shape::Shape;
use crate::engine::tensor::{Layout, TensorId};
use crate::engine::Engine;

use super::super::spec::join;

/// A layer's experts as 3-D parameters.
#[derive(Debug)]
pub(crate) struct Stacked {
    pub module: u32,
    /// [E, 2·I, H]
    pub gate_up: TensorId,
    /// [E, H, I]
    pub down: TensorId,
}

/// The parameters of a 5.x block, in `named_parameters()` order.
pub(super) fn build_grouped(
    e: &mut Engine,
    path: &str,
    module: u32,
    b: &MoeBuild<'_>,
    params: &mut Vec<TensorId>,
) -> Result<MoeLeaf> {
    let stacked = |e: &mut Engine, params: &mut Vec<TensorId>| -> Result<Stacked> {
        let module = e.tags.module(&join(path, "experts"));
        let (n, h, i) = (b.experts, b.hidden, b.intermediate);
        let gate_up = e.new_param(&[n, i.saturating_mul(2), h], module, params)?;
        let down = e.new_param(&[n, h, i], module, params)?;
        Ok(Stacked {
            module,
            gate_up,
            down,
        })
    };
    let router_path = join(path, b.router);
    let (router, experts) = if b.experts_first {
        let s = stacked(e, params)?;
        (
            e.new_linear(&router_path, b.hidden, b.experts, false, params)?,
            s,
        )
    } else {
        let r = e.new_linear(&router_path, b.hidden, b.experts, false, params)?;
        (r, stacked(e, params)?)
    };
    let shared = super::build_shared(e, path, b, params)?;
    Ok(MoeLeaf {
        module,
        router,
        experts: Vec::new(),
        shared,
        stacked: Some(experts),
        n_experts: b.experts,
        top_k: b.top_k,
        kind: b.expert,
        norm_topk_prob: b.norm_topk_prob,
        routing: b.routing.clone(),
        dispatch: Dispatch::GroupedMm,
    })
}

/// The 5.x block on `flat` [N, H]: returns the [N, H] output.
pub(super) fn grouped_block(e: &mut Engine, m: &MoeLeaf, flat: TensorId) -> Result<TensorId> {
    let Some(st) = &m.stacked else {
        return Err(crate::engine::error::EngineError::Program(
            "SparseMoe: grouped_mm without its 3-D experts".into(),
        ));
    };
    // Qwen2-MoE: `shared_expert_output = self.shared_expert(x)` first.
    let shared_out = match &m.shared {
        Some((ex, _)) => Some(super::forward::run_expert(e, ex, flat)?),
        None => None,
    };
    let held: Vec<TensorId> = shared_out.into_iter().collect();
    releasing(e, &held, |e| {
        let (logits, weights, chosen) = router(e, m, flat)?;
        releasing(e, &[logits, weights, chosen], |e| {
            let out = e.in_module(st.module, |e| experts(e, m, st, flat, chosen, weights))?;
            match (&m.shared, shared_out) {
                (Some((_, gate)), Some(sh)) => {
                    releasing(e, &[out], |e| shared_gate(e, gate, flat, sh, out))
                }
                _ => Ok(out),
            }
        })
    })
}

/// `F.sigmoid(self.shared_expert_gate(x)) * shared_expert_output`, added
/// to the experts' output.
fn shared_gate(
    e: &mut Engine,
    gate: &Linear,
    flat: TensorId,
    shared: TensorId,
    out: TensorId,
) -> Result<TensorId> {
    let g = e.apply_linear(gate, flat)?;
    let s = e.unary(Unary::Sigmoid, g);
    e.release(g);
    let s = s?;
    let gated = releasing(e, &[s], |e| e.mul(s, shared))?;
    releasing(e, &[gated], |e| e.add(out, gated))
}

/// The router: (logits, the top-k weights, the int64 expert ids).
fn router(e: &mut Engine, m: &MoeLeaf, flat: TensorId) -> Result<(TensorId, TensorId, TensorId)> {
    let logits = e.apply_linear(&m.router, flat)?;
    let r = e.in_module(m.router.module, |e| {
        let f = e.to_dtype(logits, DType::F32)?;
        let probs = e.softmax(f, false);
        e.release(f);
        let probs = probs?;
        let top = e.topk(probs, m.top_k);
        e.release(probs);
        let (vals, chosen) = top?;
        let w = (|| {
            if m.norm_topk_prob {
                let sum = e.sum_last_keepdim(vals)?;
                releasing(e, &[sum], |e| e.div_inplace(vals, sum))?;
            }
            // Qwen: `router_top_value.to(router_logits.dtype)`.
            match m.kind {
                ExpertKind::Qwen => e.to_dtype(vals, e.dtype(logits)),
                _ => Ok(e.local_ref(vals)),
            }
        })();
        e.release(vals);
        match w {
            Ok(w) => Ok((w, chosen)),
            Err(err) => {
                e.release(chosen);
                Err(err)
            }
        }
    });
    match r {
        Ok((w, chosen)) => Ok((logits, w, chosen)),
        Err(err) => {
            e.release(logits);
            Err(err)
        }
    }
}

/// `grouped_mm_experts_forward` (integrations/moe.py:377-478), line by line.
fn experts(
    e: &mut Engine,
    m: &MoeLeaf,
    st: &Stacked,
    flat: TensorId,
    chosen: TensorId,
    weights: TensorId,
) -> Result<TensorId> {
    let (n, k) = (e.shape(flat).dim(0), m.top_k);
    let s = n.saturating_mul(k);
    let col = Shape::new(&[s]);
    // sample_weights = top_k_weights.reshape(-1); expert_ids = top_k_index.reshape(-1)
    let sample = e.view_as(weights, col, Layout::Contiguous);
    let ids = e.view_as(chosen, col, Layout::Contiguous);
    // The frame's locals, freed as it returns.
    let mut locals = vec![sample, ids];
    let r = experts_body(e, m, st, flat, sample, ids, &mut locals);
    for t in locals {
        e.release(t);
    }
    r
}

#[allow(clippy::too_many_arguments)]
fn experts_body(
    e: &mut Engine,
    m: &MoeLeaf,
    st: &Stacked,
    flat: TensorId,
    sample: TensorId,
    ids: TensorId,
    locals: &mut Vec<TensorId>,
) -> Result<TensorId> {
    let (n, k) = (e.shape(flat).dim(0), m.top_k);
    let s = n.saturating_mul(k);
    let col = Shape::new(&[s]);
    // expert_ids_g, perm = torch.sort(expert_ids)
    let (ids_g, perm) = e.sort_ids(ids)?;
    locals.extend([ids_g, perm]);
    // selected_hidden_states_g = hidden_states[perm // num_top_k]
    let row = e.index_math("floor_divide", col, DType::I64)?;
    let xs = releasing(e, &[row], |e| e.index_rows(flat, &[row]))?;
    locals.push(xs);
    // sample_weights_g = sample_weights[perm]
    let sw = e.index_rows(sample, &[perm])?;
    locals.push(sw);
    // histc(expert_ids_g.int(), bins=E); offsets = cumsum(..., dtype=int32)
    let experts = Shape::new(&[m.n_experts]);
    locals.push(e.index_math("_to_copy", col, DType::I32)?);
    locals.push(e.index_math("histc", experts, DType::I32)?);
    let offs = e.index_math("cumsum", experts, DType::I32)?;
    locals.push(offs);
    // sentinel_mask = (expert_ids_g >= E).unsqueeze(-1); clamp_ in place
    let mask = e.index_math("ge", col, DType::Bool)?;
    locals.push(mask);
    let mask = e.view_as(mask, Shape::new(&[s, 1]), Layout::Contiguous);
    locals.push(mask);
    // selected_hidden_states_g.masked_fill_(sentinel_mask, 0.0)
    e.masked_fill_inplace(xs, mask)?;
    // proj_out = _grouped_mm(x, gate_up_proj.transpose(-2, -1), offs)
    let w1 = e.transpose(st.gate_up, 1, 2);
    let h = releasing(e, &[w1], |e| e.grouped_mm(xs, w1, offs))?;
    // gate, up = proj_out.chunk(2, dim=-1); act_fn(gate) * up
    let parts = e.split_last(h, 2);
    e.release(h);
    let p = releasing(e, &parts, |e| {
        let a = e.unary(Unary::Silu, parts[0])?;
        releasing(e, &[a], |e| e.mul(a, parts[1]))
    })?;
    // proj_out = _grouped_mm(proj_out, down_proj.transpose(-2, -1), offs)
    let w2 = e.transpose(st.down, 1, 2);
    let y = releasing(e, &[w2, p], |e| e.grouped_mm(p, w2, offs))?;
    // weighted_out = proj_out * sample_weights_g.unsqueeze(-1)
    let sw1 = e.view_as(sw, Shape::new(&[s, 1]), Layout::Contiguous);
    let wo = releasing(e, &[y, sw1], |e| e.mul(y, sw1))?;
    let r = (|| {
        // weighted_out.masked_fill_(sentinel_mask, 0.0)
        e.masked_fill_inplace(wo, mask)?;
        // inv_perm = torch.empty_like(perm); inv_perm[perm] = torch.arange(S)
        let inv = e.index_math("empty_like", col, DType::I64)?;
        locals.push(inv);
        let ar = e.index_math("arange", col, DType::I64)?;
        e.release(ar);
        // weighted_out = weighted_out[inv_perm]
        e.index_rows(wo, &[inv])
    })();
    e.release(wo);
    let wo = r?;
    locals.push(wo);
    // .view(N, top_k, H).sum(dim=1).to(hidden_states.dtype)
    // final_hidden_states = ….sum(dim=1), a local like the rest.
    let sum = e.view_sum_dim1(wo, k)?;
    locals.push(sum);
    e.to_dtype(sum, e.dtype(flat))
}
