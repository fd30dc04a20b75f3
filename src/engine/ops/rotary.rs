//! Rotary position embeddings as Hugging Face computes and applies them
//! (models.md §2): `LlamaRotaryEmbedding.forward` under `no_grad`, then
//! `apply_rotary_pos_emb` with `rotate_half`'s copies.

use super::super::dtype::DType;
use super::super::error::Result;
use super::super::shape::Shape;
use super::super::tensor::{Layout, TensorId};
use super::super::Engine;
use crate::engine::autograd::BwdKind;

impl Engine {
    /// `LlamaRotaryEmbedding.forward(x, position_ids)` (models.md §2.1):
    /// `position_ids` [Bp, T] int64, `inv_freq` the [d/2] buffer; returns
    /// (cos, sin) [Bp, T, d] in `x_dtype`. No Node is recorded.
    pub fn rotary_cos_sin(
        &mut self,
        inv_freq: TensorId,
        position_ids: TensorId,
        x_dtype: DType,
    ) -> Result<(TensorId, TensorId)> {
        let prev = self.op_begin("LlamaRotaryEmbedding");
        let grad = std::mem::replace(&mut self.ctx.grad_enabled, false);
        let r = self.scoped(|e| e.rotary_inner(inv_freq, position_ids, x_dtype));
        self.ctx.grad_enabled = grad;
        self.op_end(prev)?;
        r
    }

    fn rotary_inner(
        &mut self,
        inv_freq: TensorId,
        position_ids: TensorId,
        x_dtype: DType,
    ) -> Result<(TensorId, TensorId)> {
        let half = self.shape(inv_freq).numel();
        let ps = self.shape(position_ids);
        let (bp, t) = (ps.dim(0), ps.last());
        // `inv_freq[None, :, None].float().expand(...)`: a view unless the
        // model was cast to half precision with its buffers.
        let inv = self.to_dtype(inv_freq, DType::F32)?;
        let pos = self.to_dtype(position_ids, DType::F32)?;
        // `autocast(enabled=False)`: the product stays fp32. It is a bmm
        // ([bp, half, 1] @ [bp, 1, T]): cuBLAS, whose workspace the first
        // GEMM of the handle takes (traced, docs/trace.md QLoRA; the
        // H100 capture llama_lora_finetune has it here too).
        let freqs = self.act(Shape::new(&[bp, half, t]), DType::F32)?;
        let ws = self.cublas_workspace()?;
        self.free_transient(ws);
        self.k_binary(inv, pos, freqs);
        let emb = self.act(Shape::new(&[bp, t, 2 * half]), DType::F32)?;
        self.k_unary(freqs, emb);
        // `emb.cos() * attention_scaling`: the scale is a Python float, the
        // product still a new tensor, and the unscaled one a temporary.
        let mut tables = [emb; 2];
        for table in &mut tables {
            let raw = self.act(self.shape(emb), DType::F32)?;
            self.k_unary(emb, raw);
            let scaled = self.act(self.shape(emb), DType::F32);
            self.release(raw);
            *table = scaled?;
            self.k_unary(emb, *table);
        }
        let [cos32, sin32] = tables;
        let cos = self.to_dtype(cos32, x_dtype)?;
        let sin = self.to_dtype(sin32, x_dtype)?;
        // The frame's locals in co_varnames order.
        for local in [inv, pos, freqs, emb, cos32, sin32] {
            self.release(local);
        }
        Ok((cos, sin))
    }

    /// `apply_rotary_pos_emb(q, k, cos, sin)` (models.md §2.2): q [B, h, T, d]
    /// and k [B, g, T, d] against cos/sin [Bp, T, d]. Each embedded output is
    /// `(x * cos) + (rotate_half(x) * sin)`, where `rotate_half` is
    /// `cat((-x2, x1), -1)` of the two half-width slices.
    pub fn apply_rotary(
        &mut self,
        q: TensorId,
        k: TensorId,
        cos: TensorId,
        sin: TensorId,
    ) -> Result<(TensorId, TensorId)> {
        self.rotate_q_and_k(q, k, cos, sin, Self::rotate_one)
    }

    /// q then k, each by `rotate` against cos/sin with a heads axis, under
    /// one `apply_rotary_pos_emb` op.
    fn rotate_q_and_k(
        &mut self,
        q: TensorId,
        k: TensorId,
        cos: TensorId,
        sin: TensorId,
        rotate: fn(&mut Self, TensorId, TensorId, TensorId) -> Result<TensorId>,
    ) -> Result<(TensorId, TensorId)> {
        self.in_op("apply_rotary_pos_emb", |e| {
            let (cu, su) = (e.unsqueeze_heads(cos), e.unsqueeze_heads(sin));
            let q_embed = rotate(e, q, cu, su)?;
            let k_embed = rotate(e, k, cu, su)?;
            e.release(cu);
            e.release(su);
            Ok((q_embed, k_embed))
        })
    }

    /// `cos.unsqueeze(1)`: [Bp, 1, T, d], a view.
    fn unsqueeze_heads(&mut self, t: TensorId) -> TensorId {
        let s = self.shape(t);
        let shape = Shape::new(&[s.dim(0), 1, s.dim(1), s.dim(2)]);
        self.view_as(t, shape, Layout::Contiguous)
    }

    /// Phi-3's `apply_rotary_pos_emb` (transformers 5.16.1
    /// modeling_phi3.py:187-197): `q_rot, q_pass = q[..., :rotary_dim],
    /// q[..., rotary_dim:]` (two slice views, each SliceBackward0 a zeros of
    /// q's size in backward, the empty one's too; `q_rot` is q itself when
    /// the rotation is the whole head), then `q_embed =
    /// torch.cat([(q_rot * cos) + (rotate_half(q_rot) * sin), q_pass],
    /// dim=-1)`: Llama's rotation and one more copy, of q then of k.
    pub fn apply_rotary_partial(
        &mut self,
        q: TensorId,
        k: TensorId,
        cos: TensorId,
        sin: TensorId,
    ) -> Result<(TensorId, TensorId)> {
        self.in_op("apply_rotary_pos_emb", |e| {
            let (cu, su) = (e.unsqueeze_heads(cos), e.unsqueeze_heads(sin));
            // All four slices first (q's, then k's), then q's rotation and
            // cat, then k's: the order autograd numbers their nodes in.
            let d = e.shape(cu).last();
            let qs = e.rotary_split(q, d);
            let ks = e.rotary_split(k, d);
            let q_embed = e.rotate_then_cat(qs, cu, su, e.shape(q))?;
            let k_embed = e.rotate_then_cat(ks, cu, su, e.shape(k))?;
            e.release(cu);
            e.release(su);
            Ok((q_embed, k_embed))
        })
    }

    /// `x[..., :d], x[..., d:]`.
    fn rotary_split(&mut self, x: TensorId, d: u64) -> (TensorId, TensorId) {
        let s = self.shape(x);
        let d = d.min(s.last());
        let layout = self.layout(x);
        // `q[..., :rotary_dim]` over the whole last dimension is q itself:
        // Python indexing skips a slice from 0 to the end with step 1
        // (TensorIndexing.h `applySlice`), so no SliceBackward0 is recorded.
        let rot = if d == s.last() {
            self.local_ref(x)
        } else {
            self.view_with_node(x, s.with_last(d), layout, "SliceBackward0", BwdKind::Alloc)
        };
        let pass = self.view_with_node(
            x,
            s.with_last(s.last() - d),
            Layout::Strided,
            "SliceBackward0",
            BwdKind::Alloc,
        );
        (rot, pass)
    }

    /// `torch.cat([(x_rot * cos) + (rotate_half(x_rot) * sin), x_pass], dim=-1)`.
    fn rotate_then_cat(
        &mut self,
        (rot, pass): (TensorId, TensorId),
        cos: TensorId,
        sin: TensorId,
        s: Shape,
    ) -> Result<TensorId> {
        let r = self.rotate_one(rot, cos, sin);
        self.release(rot);
        let out = r.and_then(|r| {
            let o = self.cat(&[r, pass], s);
            self.release(r);
            o
        });
        self.release(pass);
        out
    }

    fn rotate_one(&mut self, x: TensorId, cos: TensorId, sin: TensorId) -> Result<TensorId> {
        let t1 = self.mul(x, cos)?;
        let rot = match self.rotate_half(x) {
            Ok(r) => r,
            Err(e) => {
                self.release(t1);
                return Err(e);
            }
        };
        let t2 = self.mul(rot, sin);
        self.release(rot);
        let t2 = match t2 {
            Ok(t) => t,
            Err(e) => {
                self.release(t1);
                return Err(e);
            }
        };
        let out = self.add(t1, t2);
        self.release(t1);
        self.release(t2);
        // TensorIterator lays `x * cos` out in x's memory order and the sum
        // in its first operand's: a rotated transposed view stays
        // [B, T, h, d] in memory (strided), which SDPA's fused kernels then
        // give their output (`attention.rs`).
        let layout = self.layout(x);
        out.inspect(|&o| self.t_mut(o).layout = layout)
    }

    /// `rotate_half(x)`: two slice views (each SliceBackward0 makes a
    /// zero-filled gradient of x's full size), `-x2`, then `cat`.
    fn rotate_half(&mut self, x: TensorId) -> Result<TensorId> {
        let s = self.shape(x);
        let half = s.with_last(s.last() / 2);
        let mut slice =
            || self.view_with_node(x, half, Layout::Strided, "SliceBackward0", BwdKind::Alloc);
        let x1 = slice();
        let x2 = slice();
        let neg = self.neg(x2);
        let rot = neg.and_then(|n| {
            let r = self.cat(&[n, x1], s);
            self.release(n);
            r
        });
        self.release(x1);
        self.release(x2);
        rot
    }
}
