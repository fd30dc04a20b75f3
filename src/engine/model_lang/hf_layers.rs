//! The Hugging Face layers of the dense and mixture-of-experts families
//! people fine-tune now (issue 42), beside the Llama ones of
//! `modules/decoder.rs`: `HfAttention` (Qwen3's and Gemma 3's `q_norm` /
//! `k_norm` on each head, Phi-3's fused `qkv_proj` sliced three ways) and
//! `GatedMlp` (SwiGLU or Gemma's GeGLU, `gelu_pytorch_tanh`; Phi-3's fused
//! `gate_up_proj` chunked in two). `kinds.rs` calls what is here, one
//! function per concern; `hf_families.rs` writes the models with them.

use serde::{Deserialize, Serialize};

use super::build::LangNet;
use super::check::Problem;
use super::count::params;
use super::kinds::{Args, Fault};
use super::shape::{attention_input, Sig};
use super::spec::join;
use crate::engine::autograd::BwdKind;
use crate::engine::dtype::DType;
use crate::engine::error::Result;
use crate::engine::modules::decoder::{new_rms_norm, view_grad_copies, RmsNorm, Rope};
use crate::engine::modules::Linear;
use crate::engine::ops::elementwise::Unary;
use crate::engine::shape::Shape;
use crate::engine::tag::Category;
use crate::engine::tensor::{Layout, TensorId};
use crate::engine::Engine;

/// A gated MLP's activation on the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum GateAct {
    /// `silu` (Llama, Qwen, Mistral, Phi-3).
    #[default]
    Silu,
    /// `gelu_pytorch_tanh` (Gemma's GeGLU): GeluBackward0 saves its input,
    /// as SiLU's does, so the memory is SwiGLU's.
    GeluTanh,
}

/// Concern 1: `HfAttention`'s arguments: q, k, v (biased when `bias`) and
/// o, or one fused `qkv_proj`; `q_norm` and `k_norm` of `head_dim` each.
pub(crate) fn attn_args(
    hidden: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    bias: bool,
    qk_norm: bool,
) -> Args {
    let q = heads.saturating_mul(head_dim);
    let kv = kv_heads.saturating_mul(head_dim);
    let qkv = q.saturating_add(kv.saturating_mul(2));
    let mut n = hidden
        .saturating_mul(qkv)
        .saturating_add(q.saturating_mul(hidden));
    if bias {
        n = n.saturating_add(qkv);
    }
    if qk_norm {
        n = n.saturating_add(head_dim.saturating_mul(2));
    }
    Args {
        dims: vec![
            ("hidden", hidden, 1),
            ("heads", heads, 1),
            ("kv_heads", kv_heads, 1),
            ("head_dim", head_dim, 1),
        ],
        probabilities: Vec::new(),
        counts: params(n),
        modules: 7,
    }
}

/// Concern 2: `[B, T, hidden]` in and out; grouped heads; an even
/// head_dim for the rotary positions.
pub(crate) fn attn_out_shape(
    hidden: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    x: &Sig,
) -> std::result::Result<Sig, Fault> {
    super::check::heads_rule(heads, kv_heads).map_err(|(f, p)| (Some(f), p))?;
    if !head_dim.is_multiple_of(2) {
        return Err((Some("head_dim"), Problem::OddHeadDim(head_dim)));
    }
    attention_input("HfAttention", hidden, x).map_err(|e| (None, Problem::Shape(e)))
}

/// A built `HfAttention`.
#[derive(Debug)]
pub(crate) struct HfAttn {
    pub module: u32,
    /// q, k, v, or the fused `qkv_proj` alone.
    pub proj: Vec<Linear>,
    pub o: Linear,
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    /// A sliding-window layer's cache (`Module::HfAttention::sliding`).
    pub sliding: bool,
    /// q_norm and k_norm are Gemma's `(1 + weight)` norms.
    pub gemma_qk_norm: bool,
}

/// What an `HfAttention` is built from.
pub(crate) struct AttnBuild {
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub bias: bool,
    pub qk_norm: bool,
    pub fused_qkv: bool,
    pub sliding: bool,
    pub gemma_qk_norm: bool,
}

/// Concern 3: in registration order: `q_proj`, `k_proj`, `v_proj`,
/// `o_proj`, `q_norm`, `k_norm` (Qwen3Attention, Gemma3Attention), or
/// `o_proj`, `qkv_proj` (Phi3Attention registers o_proj first).
pub(crate) fn build_attn(
    e: &mut Engine,
    path: &str,
    b: &AttnBuild,
    params: &mut Vec<TensorId>,
) -> Result<HfAttn> {
    let module = e.tags.module(path);
    let q = b.heads.saturating_mul(b.head_dim);
    let kv = b.kv_heads.saturating_mul(b.head_dim);
    let at = |n: &str| join(path, n);
    let (proj, o) = if b.fused_qkv {
        let o = e.new_linear(&at("o_proj"), q, b.hidden, false, params)?;
        let qkv = q.saturating_add(kv.saturating_mul(2));
        let f = e.new_linear(&at("qkv_proj"), b.hidden, qkv, b.bias, params)?;
        (vec![f], o)
    } else {
        let qp = e.new_linear(&at("q_proj"), b.hidden, q, b.bias, params)?;
        let kp = e.new_linear(&at("k_proj"), b.hidden, kv, b.bias, params)?;
        let vp = e.new_linear(&at("v_proj"), b.hidden, kv, b.bias, params)?;
        let o = e.new_linear(&at("o_proj"), q, b.hidden, false, params)?;
        (vec![qp, kp, vp], o)
    };
    let (q_norm, k_norm) = if b.qk_norm {
        (
            Some(new_rms_norm(e, &at("q_norm"), b.head_dim, params)?),
            Some(new_rms_norm(e, &at("k_norm"), b.head_dim, params)?),
        )
    } else {
        (None, None)
    };
    Ok(HfAttn {
        module,
        proj,
        o,
        q_norm,
        k_norm,
        heads: b.heads,
        kv_heads: b.kv_heads,
        head_dim: b.head_dim,
        sliding: b.sliding,
        gemma_qk_norm: b.gemma_qk_norm,
    })
}

impl LangNet {
    /// Concern 4: `HfAttention`'s forward (transformers' `sdpa_attention_forward`).
    pub(super) fn hf_attn(&self, e: &mut Engine, a: &HfAttn, x: TensorId) -> Result<TensorId> {
        let rope = self.rope_for(e, x, a.sliding)?;
        e.in_module(a.module, |e| {
            e.scoped(|e| attn_body(e, a, x, rope, &self.run_state.cache_windows))
        })
    }
}

/// `[B, T, n·d]` → `.view(B, T, n, d)` (its backward a copy when `copies`,
/// `Engine::heads_of`), the norm on the head dimension when given,
/// `.transpose(1, 2)`.
fn heads_of(
    e: &mut Engine,
    y: TensorId,
    n: u64,
    d: u64,
    norm: Option<(&RmsNorm, bool)>,
    copies: bool,
) -> Result<TensorId> {
    let v = e.heads_of(y, n, d, copies);
    let normed = match norm {
        Some((r, gemma)) => {
            let o = if gemma {
                e.in_module(r.module, |e| e.rms_norm_gemma(v, r.w))
            } else {
                e.apply_rms_norm(r, v)
            };
            e.release(v);
            o?
        }
        None => v,
    };
    let t = e.transpose(normed, 1, 2);
    e.release(normed);
    Ok(t)
}

fn attn_body(
    e: &mut Engine,
    a: &HfAttn,
    x: TensorId,
    rope: Rope,
    windows: &std::cell::RefCell<Vec<TensorId>>,
) -> Result<TensorId> {
    let s = e.shape(x);
    let (b, t) = (s.dim(0), s.dim(1));
    let mut fused_out = None;
    // Every family here rotates q and k; v is copied by the cache.
    let copies = view_grad_copies(true, e.cfg.hf_use_cache);
    let (q, k, v) = match a.proj.as_slice() {
        [fused] => {
            // qkv = self.qkv_proj(x); query_states = qkv[..., :query_pos], …:
            // slices whose SliceBackward0 makes a zeros of qkv's shape each
            // (`slice_backward`, derivatives.yaml `slice.Tensor`).
            // The three slices first, then their views (modeling_phi3.py:225-232),
            // the order autograd numbers (and runs backward, last first) their nodes.
            let qkv = e.apply_linear(fused, x)?;
            let heads = [
                (
                    a.heads,
                    a.q_norm.as_ref().map(|r| (r, a.gemma_qk_norm)),
                    copies.q_k,
                ),
                (
                    a.kv_heads,
                    a.k_norm.as_ref().map(|r| (r, a.gemma_qk_norm)),
                    copies.q_k,
                ),
                (a.kv_heads, None, copies.v),
            ];
            let slices: Vec<TensorId> = heads
                .iter()
                .map(|(n, _, _)| {
                    let flat = Shape::new(&[b, t, n.saturating_mul(a.head_dim)]);
                    e.view_with_node(qkv, flat, Layout::Strided, "SliceBackward0", BwdKind::Alloc)
                })
                .collect();
            let mut parts = Vec::with_capacity(3);
            for ((n, norm, copy), sl) in heads.into_iter().zip(slices) {
                let h = heads_of(e, sl, n, a.head_dim, norm, copy);
                e.release(sl);
                parts.push(h?);
            }
            // `qkv` is a local of Phi3Attention.forward: it stays bound (its
            // storage with it) until the layer returns (modeling_phi3.py:228).
            fused_out = Some(qkv);
            (parts[0], parts[1], parts[2])
        }
        [qp, kp, vp] if a.gemma_qk_norm => {
            // Gemma 3 projects all three first, then norms q and k on their
            // transposed views (modeling_gemma3.py:352-357); each norm's
            // output keeps its input's memory order (TensorIterator).
            let mut parts = Vec::with_capacity(3);
            for (p, n, copy) in [
                (qp, a.heads, copies.q_k),
                (kp, a.kv_heads, copies.q_k),
                (vp, a.kv_heads, copies.v),
            ] {
                let y = e.apply_linear(p, x)?;
                let h = heads_of(e, y, n, a.head_dim, None, copy);
                e.release(y);
                parts.push(h?);
            }
            for (i, norm) in [(0, a.q_norm.as_ref()), (1, a.k_norm.as_ref())] {
                if let Some(r) = norm {
                    let h = parts[i];
                    let layout = e.layout(h);
                    let o = e.in_module(r.module, |e| e.rms_norm_gemma(h, r.w));
                    e.release(h);
                    let o = o?;
                    e.t_mut(o).layout = layout;
                    parts[i] = o;
                }
            }
            (parts[0], parts[1], parts[2])
        }
        [qp, kp, vp] => {
            let mut parts = Vec::with_capacity(3);
            for (p, n, norm, copy) in [
                (
                    qp,
                    a.heads,
                    a.q_norm.as_ref().map(|r| (r, a.gemma_qk_norm)),
                    copies.q_k,
                ),
                (
                    kp,
                    a.kv_heads,
                    a.k_norm.as_ref().map(|r| (r, a.gemma_qk_norm)),
                    copies.q_k,
                ),
                (vp, a.kv_heads, None, copies.v),
            ] {
                let y = e.apply_linear(p, x)?;
                let h = heads_of(e, y, n, a.head_dim, norm, copy);
                e.release(y);
                parts.push(h?);
            }
            (parts[0], parts[1], parts[2])
        }
        _ => {
            return Err(crate::engine::error::EngineError::Program(
                "HfAttention: built without its projections".into(),
            ))
        }
    };
    let tables = match rope {
        Rope::Shared { cos, sin } => (e.local_ref(cos), e.local_ref(sin)),
        Rope::PerLayer {
            inv_freq,
            position_ids,
        } => {
            let dtype = e.dtype(x);
            e.rotary_cos_sin(inv_freq, position_ids, dtype)?
        }
    };
    // Phi-3 (the fused projection) slices out the rotary part and cats it
    // back (modeling_phi3.py:195-196); Qwen3 and Gemma rotate q and k whole.
    let (qr, kr) = if a.proj.len() == 1 {
        e.apply_rotary_partial(q, k, tables.0, tables.1)?
    } else {
        e.apply_rotary(q, k, tables.0, tables.1)?
    };
    e.release(q);
    e.release(k);
    // `key_states, value_states = past_key_values.update(...)` under
    // `use_cache` (`hf_use_cache`): `DynamicLayer.update`'s `torch.cat`
    // onto an empty tensor copies both (transformers 5.16.1
    // cache_utils.py:144-145), then the old bindings go.
    let (kr, v) = if e.cfg.hf_use_cache {
        if a.sliding {
            // DynamicSlidingWindowLayer.lazy_initialization:
            // `self._sliding_window_tensor.to(self.device)`, int64, 0-dim
            // (cache_utils.py:215, 227), kept by the cache.
            let w = e.factory(Shape::scalar(), DType::I64, Category::Activation)?;
            e.keep(w);
            windows.borrow_mut().push(w);
        }
        let kc = e.cat(&[kr], e.shape(kr))?;
        let vc = e.cat(&[v], e.shape(v));
        e.release(kr);
        e.release(v);
        (kc, vc?)
    } else {
        (kr, v)
    };
    let out = e.sdpa_hf(qr, kr, v, 0.0, true)?;
    let bthd = Shape::new(&[b, t, a.heads, a.head_dim]);
    let c = if e.layout(out) == Layout::Strided {
        e.view_as(out, bthd, Layout::Contiguous)
    } else {
        let tv = e.transpose(out, 1, 2);
        let c = e.contiguous(tv);
        e.release(tv);
        c?
    };
    e.release(out);
    let flat = e.view_as(
        c,
        Shape::new(&[b, t, a.heads.saturating_mul(a.head_dim)]),
        Layout::Contiguous,
    );
    e.release(c);
    let o = e.apply_linear(&a.o, flat);
    for local in [qr, kr, v, flat, tables.0, tables.1]
        .into_iter()
        .chain(fused_out)
    {
        e.release(local);
    }
    o
}

/// Concern 1: `GatedMlp`'s arguments: gate, up and down without biases.
pub(crate) fn mlp_args(hidden: u64, intermediate: u64) -> Args {
    Args {
        dims: vec![("hidden", hidden, 1), ("intermediate", intermediate, 1)],
        probabilities: Vec::new(),
        counts: params(hidden.saturating_mul(intermediate).saturating_mul(3)),
        modules: 5,
    }
}

/// A built `GatedMlp`.
#[derive(Debug)]
pub(crate) struct GatedMlp {
    pub module: u32,
    pub act_module: u32,
    /// gate_proj and up_proj, or the fused gate_up_proj alone.
    pub up: Vec<Linear>,
    pub down: Linear,
    pub act: GateAct,
}

/// Concern 3: `gate_proj`, `up_proj`, `down_proj` (Llama, Qwen, Gemma), or
/// `gate_up_proj`, `down_proj` (Phi3MLP).
pub(crate) fn build_mlp(
    e: &mut Engine,
    path: &str,
    [h, i]: [u64; 2],
    act: GateAct,
    fused: bool,
    params: &mut Vec<TensorId>,
) -> Result<GatedMlp> {
    let module = e.tags.module(path);
    let at = |n: &str| join(path, n);
    let up = if fused {
        vec![e.new_linear(&at("gate_up_proj"), h, i.saturating_mul(2), false, params)?]
    } else {
        vec![
            e.new_linear(&at("gate_proj"), h, i, false, params)?,
            e.new_linear(&at("up_proj"), h, i, false, params)?,
        ]
    };
    let down = e.new_linear(&at("down_proj"), i, h, false, params)?;
    let act_module = e
        .tags
        .module(&at(if fused { "activation_fn" } else { "act_fn" }));
    Ok(GatedMlp {
        module,
        act_module,
        up,
        down,
        act,
    })
}

/// Concern 4: `down_proj(act(gate_proj(x)) * up_proj(x))`, or Phi-3's
/// `gate, up = gate_up_proj(x).chunk(2, dim=-1); down_proj(up * act(gate))`.
pub(crate) fn gated_mlp(e: &mut Engine, m: &GatedMlp, x: TensorId) -> Result<TensorId> {
    let op = match m.act {
        GateAct::Silu => Unary::Silu,
        GateAct::GeluTanh => Unary::Gelu,
    };
    e.in_module(m.module, |e| match m.up.as_slice() {
        [fused] => {
            let gu = e.apply_linear(fused, x)?;
            // chunk(2): SplitBackward0 cats the two gradients (BwdKind::Split).
            let parts = e.split_last(gu, 2);
            e.release(gu);
            let (gate, up) = (parts[0], parts[1]);
            let a = e.in_module(m.act_module, |e| e.unary(op, gate));
            e.release(gate);
            let p = a.and_then(|a| {
                let p = e.mul(up, a);
                e.release(a);
                p
            });
            e.release(up);
            let p = p?;
            let o = e.apply_linear(&m.down, p);
            e.release(p);
            o
        }
        [gate, up] => {
            let g = e.apply_linear(gate, x)?;
            let a = e.in_module(m.act_module, |e| e.unary(op, g));
            e.release(g);
            let a = a?;
            let u = match e.apply_linear(up, x) {
                Ok(u) => u,
                Err(err) => {
                    e.release(a);
                    return Err(err);
                }
            };
            let p = e.mul(a, u);
            e.release(a);
            e.release(u);
            let p = p?;
            let o = e.apply_linear(&m.down, p);
            e.release(p);
            o
        }
        _ => Err(crate::engine::error::EngineError::Program(
            "GatedMlp: built without its projections".into(),
        )),
    })
}
