//! A Llama-family decoder layer (models.md §1–§4): RMSNorm → attention with
//! rotary embeddings and grouped-query heads → residual, RMSNorm → SwiGLU
//! MLP → residual, as `LlamaDecoderLayer.forward` runs them.

use super::super::autograd::BwdKind;
use super::super::config::KvPath;
use super::super::dtype::DType;
use super::super::error::Result;
use super::super::ops::elementwise::Unary;
use super::super::shape::Shape;
use super::super::tensor::{Layout, TensorId};
use super::super::Engine;
use super::lora::Proj;

/// An RMSNorm's weight [H] and its module.
#[derive(Debug, Clone)]
pub(crate) struct RmsNorm {
    pub w: TensorId,
    pub module: u32,
}

/// Where an attention layer gets cos/sin (models.md §2.1, `hf_rope_scope`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rope {
    /// One pair computed by the model's forward, shared by every layer.
    Shared { cos: TensorId, sin: TensorId },
    /// Each layer runs the rotary module on its own input.
    PerLayer {
        inv_freq: TensorId,
        position_ids: TensorId,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct Attention {
    pub module: u32,
    pub rotary_module: u32,
    pub q: Proj,
    pub k: Proj,
    pub v: Proj,
    pub o: Proj,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub causal: bool,
    /// `attention_dropout` (0.0 in Llama, Mistral, Qwen2 configs).
    pub dropout: f64,
}

#[derive(Debug, Clone)]
pub(crate) struct SwiGlu {
    pub module: u32,
    pub act: u32,
    pub gate: Proj,
    pub up: Proj,
    pub down: Proj,
}

#[derive(Debug, Clone)]
pub(crate) struct DecoderLayer {
    pub module: u32,
    pub input_norm: RmsNorm,
    pub attn: Attention,
    pub post_norm: RmsNorm,
    pub mlp: SwiGlu,
}

/// What an attention's projections are sized by: grouped-query heads
/// (models.md §4; `kv_heads` defaults to `heads`, `head_dim` to
/// `hidden / heads`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AttentionSpec {
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
}

impl AttentionSpec {
    pub(crate) fn new(
        hidden: u64,
        heads: u64,
        kv_heads: Option<u64>,
        head_dim: Option<u64>,
    ) -> AttentionSpec {
        AttentionSpec {
            hidden,
            heads,
            kv_heads: kv_heads.unwrap_or(heads),
            head_dim: head_dim.unwrap_or(hidden / heads.max(1)),
        }
    }
}

impl Attention {
    /// `LlamaAttention` at `path`: q, k, v (with `bias`), o (without), in
    /// registration order; causal, no dropout until told otherwise. The
    /// one place an attention block is built (the language's `Attention`
    /// and every `DecoderLayer`'s `self_attn`).
    pub(crate) fn build(
        e: &mut Engine,
        path: &str,
        s: &AttentionSpec,
        bias: bool,
        params: &mut Vec<TensorId>,
    ) -> Result<Attention> {
        let (h, d) = (s.hidden, s.head_dim);
        let (q, kv) = (s.heads * d, s.kv_heads * d);
        let lin = |e: &mut Engine, name: &str, fin, fout, b, ps: &mut Vec<TensorId>| {
            e.new_linear(&format!("{path}.{name}"), fin, fout, b, ps)
                .map(Proj::plain)
        };
        Ok(Attention {
            module: e.tags.module(path),
            rotary_module: e.tags.module(&format!("{path}.rotary_emb")),
            q: lin(e, "q_proj", h, q, bias, params)?,
            k: lin(e, "k_proj", h, kv, bias, params)?,
            v: lin(e, "v_proj", h, kv, bias, params)?,
            o: lin(e, "o_proj", q, h, false, params)?,
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: d,
            causal: true,
            dropout: 0.0,
        })
    }
}

impl DecoderLayer {
    /// `LlamaDecoderLayer(config)` at `path`: self_attn (q, k, v, o), mlp
    /// (gate, up, down), input_layernorm, post_attention_layernorm, in
    /// registration order.
    pub(crate) fn build(
        e: &mut Engine,
        path: &str,
        attn: &AttentionSpec,
        intermediate: u64,
        qkv_bias: bool,
        params: &mut Vec<TensorId>,
    ) -> Result<DecoderLayer> {
        let (h, i) = (attn.hidden, intermediate);
        let lin = |e: &mut Engine, name: &str, fin, fout, bias, ps: &mut Vec<TensorId>| {
            e.new_linear(&format!("{path}.{name}"), fin, fout, bias, ps)
                .map(Proj::plain)
        };
        let attn = Attention::build(e, &format!("{path}.self_attn"), attn, qkv_bias, params)?;
        let mlp = SwiGlu {
            module: e.tags.module(&format!("{path}.mlp")),
            act: e.tags.module(&format!("{path}.mlp.act_fn")),
            gate: lin(e, "mlp.gate_proj", h, i, false, params)?,
            up: lin(e, "mlp.up_proj", h, i, false, params)?,
            down: lin(e, "mlp.down_proj", i, h, false, params)?,
        };
        let input_norm = new_rms_norm(e, &format!("{path}.input_layernorm"), h, params)?;
        let post_norm = new_rms_norm(e, &format!("{path}.post_attention_layernorm"), h, params)?;
        Ok(DecoderLayer {
            module: e.tags.module(path),
            input_norm,
            attn,
            post_norm,
            mlp,
        })
    }
}

impl Engine {
    pub(crate) fn apply_rms_norm(&mut self, n: &RmsNorm, x: TensorId) -> Result<TensorId> {
        self.in_module(n.module, |e| e.rms_norm(x, n.w))
    }

    /// `residual = x; x = input_layernorm(x); x = self_attn(x) ; x = residual + x;
    /// residual = x; x = post_attention_layernorm(x); x = mlp(x); x = residual + x`.
    pub(crate) fn decoder_layer(
        &mut self,
        l: &DecoderLayer,
        x: TensorId,
        rope: Rope,
    ) -> Result<TensorId> {
        self.in_module(l.module, |e| {
            let h = e.apply_rms_norm(&l.input_norm, x)?;
            let a = e.in_module(l.attn.module, |e| e.hf_attention(&l.attn, h, Some(rope)));
            let a = e.rebind(h, a)?;
            let mid = e.add(x, a);
            e.release(a);
            let mid = mid?;
            let out = e.mlp_half(l, mid);
            e.release(mid);
            out
        })
    }

    fn mlp_half(&mut self, l: &DecoderLayer, mid: TensorId) -> Result<TensorId> {
        let h = self.apply_rms_norm(&l.post_norm, mid)?;
        let m = self.in_module(l.mlp.module, |e| e.swiglu(&l.mlp, h));
        let m = self.rebind(h, m)?;
        let out = self.add(mid, m);
        self.release(m);
        out
    }

    /// `down_proj(act_fn(gate_proj(x)) * up_proj(x))` (models.md §3).
    pub(crate) fn swiglu(&mut self, m: &SwiGlu, x: TensorId) -> Result<TensorId> {
        let g = self.apply_proj(&m.gate, x)?;
        let s = self.in_module(m.act, |e| e.unary(Unary::Silu, g));
        let s = self.rebind(g, s)?;
        let u = match self.apply_proj(&m.up, x) {
            Ok(u) => u,
            Err(err) => {
                self.release(s);
                return Err(err);
            }
        };
        let p = self.mul(s, u);
        self.release(s);
        self.release(u);
        let p = p?;
        let o = self.apply_proj(&m.down, p);
        self.rebind(p, o)
    }

    /// `LlamaAttention.forward` with `sdpa_attention_forward` (models.md
    /// §4.1): no padding mask, so k and v keep their heads (`enable_gqa`).
    /// `rope`: None for attention without rotary positions.
    pub(crate) fn hf_attention(
        &mut self,
        a: &Attention,
        x: TensorId,
        rope: Option<Rope>,
    ) -> Result<TensorId> {
        self.scoped(|e| e.hf_attention_body(a, x, rope))
    }

    fn hf_attention_body(
        &mut self,
        a: &Attention,
        x: TensorId,
        rope: Option<Rope>,
    ) -> Result<TensorId> {
        let s = self.shape(x);
        let (b, t) = (s.dim(0), s.dim(1));
        let grouped = a.kv_heads != a.heads;
        let repeats = grouped && self.cfg.hf_kv_path() != KvPath::EnableGqa;
        let copies = view_grad_copies(rope.is_some(), self.cfg.hf_use_cache || repeats);
        let q = self.heads_view(&a.q, x, a.heads, a.head_dim, copies.q_k)?;
        let k = self.heads_view(&a.k, x, a.kv_heads, a.head_dim, copies.q_k)?;
        let v = self.heads_view(&a.v, x, a.kv_heads, a.head_dim, copies.v)?;
        let tables = match rope {
            None => None,
            Some(Rope::Shared { cos, sin }) => Some((self.local_ref(cos), self.local_ref(sin))),
            Some(Rope::PerLayer {
                inv_freq,
                position_ids,
            }) => {
                let dtype = self.dtype(x);
                Some(self.in_module(a.rotary_module, |e| {
                    e.rotary_cos_sin(inv_freq, position_ids, dtype)
                })?)
            }
        };
        let (qr, kr) = match tables {
            Some((cos, sin)) => {
                let r = self.apply_rotary(q, k, cos, sin)?;
                self.release(q);
                self.release(k);
                r
            }
            None => (q, k),
        };
        // `key_states, value_states = past_key_values.update(...)`: the
        // cache's copies, then the old bindings go.
        let (mut kr, mut v) = if self.cfg.hf_use_cache {
            let kc = self.cat(&[kr], self.shape(kr))?;
            let vc = self.cat(&[v], self.shape(v))?;
            self.release(kr);
            self.release(v);
            (kc, vc)
        } else {
            (kr, v)
        };
        let p = if self.ctx.training { a.dropout } else { 0.0 };
        let out = match self.cfg.hf_kv_path() {
            KvPath::RepeatInModule if grouped => {
                // `key_states = repeat_kv(key_states, n_rep)`, then values:
                // each rebinding lets the un-repeated tensor go.
                let kx = self.repeat_kv(kr, a.heads);
                let kx = self.rebind(kr, kx)?;
                let vx = self.repeat_kv(v, a.heads);
                let vx = self.rebind(v, vx)?;
                (kr, v) = (kx, vx);
                self.sdpa_hf(qr, kr, v, p, a.causal)?
            }
            KvPath::RepeatInIntegration if grouped => {
                // `sdpa_attention_forward`'s own `key = repeat_kv(key, …)`:
                // the copies go when it returns, the layer keeps its k, v.
                let kx = self.repeat_kv(kr, a.heads)?;
                let vx = self.repeat_kv(v, a.heads)?;
                let out = self.sdpa_hf(qr, kx, vx, p, a.causal);
                self.release(kx);
                self.release(vx);
                out?
            }
            _ => self.sdpa_hf(qr, kr, v, p, a.causal)?,
        };
        // `attn_output.transpose(1, 2).contiguous()`: the fused backends lay
        // their output out [B, T, h, d] already; math's is copied.
        let bthd = Shape::new(&[b, t, a.heads, a.head_dim]);
        let c = if self.layout(out) == Layout::Strided {
            self.view_as(out, bthd, Layout::Contiguous)
        } else {
            let tv = self.transpose(out, 1, 2);
            let c = self.contiguous(tv);
            self.release(tv);
            c?
        };
        self.release(out);
        let flat = self.view_as(
            c,
            Shape::new(&[b, t, a.heads * a.head_dim]),
            Layout::Contiguous,
        );
        self.release(c);
        let o = self.apply_proj(&a.o, flat);
        // The frame's locals at return: q_rot, k_rot, v, the flat output, cos/sin.
        for local in [qr, kr, v, flat] {
            self.release(local);
        }
        if let Some((cos, sin)) = tables {
            self.release(cos);
            self.release(sin);
        }
        o
    }

    /// `proj(x).view(B, T, -1, d).transpose(1, 2)`: views of the projection;
    /// the view's backward copies when `copies` ([`view_grad_copies`]).
    fn heads_view(
        &mut self,
        p: &Proj,
        x: TensorId,
        heads: u64,
        d: u64,
        copies: bool,
    ) -> Result<TensorId> {
        let y = self.apply_proj(p, x)?;
        let v = self.heads_of(y, heads, d, copies);
        self.release(y);
        let t = self.transpose(v, 1, 2);
        self.release(v);
        Ok(t)
    }

    /// `y.view(B, T, heads, d)` of a projection's [B, T, heads·d] output.
    /// With `copies` its ViewBackward0 (`grad.reshape_symint(self_sym_sizes)`,
    /// derivatives.yaml `view`) meets a gradient laid out [B, heads, T, d]
    /// (the transpose's backward of a contiguous one), which no view can
    /// reshape: a copy of the projection's size (`_reshape_copy`, then the
    /// matmul's `_unsafe_view` on it).
    /// One head, or one position, and that layout is the view's own: the
    /// reshape is a view (`computeStride` skips size-1 dimensions).
    pub(crate) fn heads_of(&mut self, y: TensorId, heads: u64, d: u64, copies: bool) -> TensorId {
        let s = self.shape(y);
        let shape = Shape::new(&[s.dim(0), s.dim(1), heads, d]);
        let layout = self.layout(y);
        if copies && heads > 1 && s.dim(1) > 1 {
            self.view_with_node(y, shape, layout, "ViewBackward0", BwdKind::Alloc)
        } else {
            self.view_as(y, shape, layout)
        }
    }

    /// The rotary module's `inv_freq` buffer [d/2] fp32 (cast with the
    /// model's floating buffers).
    pub(crate) fn new_inv_freq(
        &mut self,
        module: u32,
        head_dim: u64,
        buffers: &mut Vec<(String, TensorId)>,
        name: &str,
    ) -> Result<TensorId> {
        // transformers 5.x's `from_pretrained` moves the fp32 buffer as it
        // was made (`hf_load.rs`).
        let dtype = if self.on_meta() {
            DType::F32
        } else if self.param_dtype.is_floating() {
            self.param_dtype
        } else {
            DType::F32
        };
        self.new_buffer(name.into(), &[head_dim / 2], dtype, module, buffers)
    }
}

pub(crate) fn new_rms_norm(
    e: &mut Engine,
    path: &str,
    h: u64,
    params: &mut Vec<TensorId>,
) -> Result<RmsNorm> {
    let module = e.tags.module(path);
    let w = e.new_param(&[h], module, params)?;
    Ok(RmsNorm { w, module })
}

/// Which of an attention layer's `view(B, T, n, d)` views copy their
/// gradient in backward ([`Engine::heads_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ViewGradCopies {
    pub q_k: bool,
    pub v: bool,
}

/// Where a Hugging Face attention's head views meet a gradient laid out
/// [B, n, T, d] (PyTorch 2.11, transformers' `apply_rotary_pos_emb`; the
/// H100 capture `llama_lora_finetune` makes one copy of q's size and two of
/// k's a layer that a view would not, and the trace of every family does):
/// - q and k, when `rotary`: `q * cos + rotate_half(q) * sin`'s backward
///   hands q three gradients, and autograd runs the later nodes first
///   (engine.cpp `ReadyQueue` by sequence number): the two SliceBackward0
///   of `rotate_half` (`slice_backward`'s zeros, contiguous) before
///   `q * cos`'s MulBackward0, so their sum (`InputBuffer::accumulate`, out
///   of place in the first one's layout or in place into it) is contiguous
///   [B, h, T, d];
/// - v, when it reached attention as a copy (`DynamicCache.update`'s
///   `torch.cat`, or `repeat_kv`'s expand-and-reshape): the fused kernels
///   give each input's gradient that input's layout (`empty_like`,
///   `alloc_with_matching_layout`), contiguous for a copy. A v handed over
///   as the projection's transposed view gets its gradient in that layout,
///   which the transpose's backward makes [B, T, n, d] again: no copy.
pub(crate) fn view_grad_copies(rotary: bool, v_copied: bool) -> ViewGradCopies {
    ViewGradCopies {
        q_k: rotary,
        v: v_copied,
    }
}
