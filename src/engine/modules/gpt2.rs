//! nanoGPT's GPT (engine.md §10.2): wte, wpe, blocks of
//! ln_1 → c_attn → SDPA → c_proj (+x), ln_2 → c_fc → GELU → c_proj (+x), ln_f,
//! lm_head tied to wte.

use std::ops::Range;

use super::super::config::SdpaBackend;
use super::super::dtype::DType;
use super::super::error::Result;
use super::super::ops::elementwise::Unary;
use super::super::presets::ModelKind;
use super::super::shape::Shape;
use super::super::tag::Category;
use super::super::tensor::{Layout, TensorId};
use super::super::Engine;
use super::{Embedding, LayerNorm, Linear};
use crate::engine::autograd::BwdKind;

#[derive(Debug)]
pub(crate) struct Block {
    pub module: u32,
    pub ln_1: LayerNorm,
    pub attn_module: u32,
    pub c_attn: Linear,
    pub attn_proj: Linear,
    pub ln_2: LayerNorm,
    pub mlp_module: u32,
    pub c_fc: Linear,
    pub gelu: u32,
    pub mlp_proj: Linear,
}

#[derive(Debug)]
pub(crate) struct Gpt2 {
    pub wte: Embedding,
    pub wpe: Embedding,
    pub blocks: Vec<Block>,
    pub ln_f: LayerNorm,
    pub lm_head: u32,
    pub n_head: u64,
    pub n_embd: u64,
    pub dropout: f64,
    /// The blocks in runs, each run checkpointed (one region) or not.
    pub plan: Vec<(Range<usize>, bool)>,
    /// Checkpoint regions are `use_reentrant=True` ones.
    pub reentrant: bool,
    pub sdpa: Option<SdpaBackend>,
}

/// Which runs of blocks are checkpoint regions: every block alone, or
/// `torch.utils.checkpoint.checkpoint_sequential`'s split into `segments`
/// runs of `L // segments` blocks whose last run (with the remainder) is not
/// checkpointed.
pub(crate) fn checkpoint_plan(
    n_layer: usize,
    each_block: bool,
    segments: Option<u64>,
) -> Vec<(Range<usize>, bool)> {
    if each_block {
        return (0..n_layer).map(|i| (i..i + 1, true)).collect();
    }
    let Some(segments) = segments.and_then(|s| usize::try_from(s).ok()) else {
        return vec![(0..n_layer, false)];
    };
    let size = n_layer / segments.max(1);
    if size == 0 {
        return vec![(0..n_layer, false)];
    }
    let mut plan: Vec<(Range<usize>, bool)> = (0..segments - 1)
        .map(|k| (k * size..(k + 1) * size, true))
        .collect();
    plan.push(((segments - 1) * size..n_layer, false));
    plan
}

impl Gpt2 {
    pub fn build(e: &mut Engine, kind: &ModelKind, params: &mut Vec<TensorId>) -> Result<Gpt2> {
        let ModelKind::Gpt2 {
            n_layer,
            n_head,
            n_embd,
            vocab,
            block_size,
            bias,
            dropout,
            checkpoint,
            checkpoint_segments,
            checkpoint_reentrant,
            sdpa,
            ..
        } = kind.clone()
        else {
            return Err(super::super::error::EngineError::Program(
                "not a GPT config".into(),
            ));
        };
        let d = n_embd;
        let wte = e.new_embedding("transformer.wte", vocab, d, params)?;
        let wpe = e.new_embedding("transformer.wpe", block_size, d, params)?;
        let mut blocks = Vec::new();
        for i in 0..n_layer {
            let p = format!("transformer.h.{i}");
            let ln_1 = e.new_layer_norm(&format!("{p}.ln_1"), d, bias, params)?;
            let c_attn = e.new_linear(&format!("{p}.attn.c_attn"), d, 3 * d, bias, params)?;
            let attn_proj = e.new_linear(&format!("{p}.attn.c_proj"), d, d, bias, params)?;
            let ln_2 = e.new_layer_norm(&format!("{p}.ln_2"), d, bias, params)?;
            let c_fc = e.new_linear(&format!("{p}.mlp.c_fc"), d, 4 * d, bias, params)?;
            let mlp_proj = e.new_linear(&format!("{p}.mlp.c_proj"), 4 * d, d, bias, params)?;
            blocks.push(Block {
                module: e.tags.module(&p),
                ln_1,
                attn_module: e.tags.module(&format!("{p}.attn")),
                c_attn,
                attn_proj,
                ln_2,
                mlp_module: e.tags.module(&format!("{p}.mlp")),
                c_fc,
                gelu: e.tags.module(&format!("{p}.mlp.gelu")),
                mlp_proj,
            });
        }
        let ln_f = e.new_layer_norm("transformer.ln_f", d, bias, params)?;
        // lm_head.weight is wte.weight (tied): no new parameter.
        let lm_head = e.tags.module("lm_head");
        Ok(Gpt2 {
            wte,
            wpe,
            blocks,
            ln_f,
            lm_head,
            n_head,
            n_embd,
            dropout,
            plan: checkpoint_plan(n_layer as usize, checkpoint, checkpoint_segments),
            reentrant: checkpoint_reentrant,
            sdpa,
        })
    }

    pub fn forward(&self, e: &mut Engine, idx: TensorId) -> Result<TensorId> {
        let t = e.shape(idx).dim(1);
        // pos = torch.arange(0, t, dtype=long): saved by wpe's EmbeddingBackward.
        let pos = e.in_module(self.wpe.module, |e| {
            e.factory(Shape::new(&[t]), DType::I64, Category::Activation)
        })?;
        let logits = self.forward_from(e, idx, pos);
        // `pos` is a local of forward(): it lives until forward returns (under
        // no_grad nothing else holds it; seen on PyTorch 2.11, eval_no_grad_fixed).
        e.release(pos);
        logits
    }

    fn forward_from(&self, e: &mut Engine, idx: TensorId, pos: TensorId) -> Result<TensorId> {
        let tok = e.in_module(self.wte.module, |e| e.embedding(self.wte.w, idx));
        let pe = e.in_module(self.wpe.module, |e| e.embedding(self.wpe.w, pos));
        let (tok, pe) = match (tok, pe) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(x), _) | (_, Err(x)) => return Err(x),
        };
        let x = e.add(tok, pe);
        e.release(tok);
        e.release(pe);
        let mut x = x?;
        let y = e.dropout(x, self.dropout);
        x = e.rebind(x, y)?;
        let saved_backend = e.cfg.sdpa_backend;
        if self.sdpa.is_some() {
            e.cfg.sdpa_backend = self.sdpa;
        }
        let blocks = self.run_plan(e, x);
        e.cfg.sdpa_backend = saved_backend;
        x = blocks?;
        let y = e.apply_layer_norm(&self.ln_f, x);
        x = e.rebind(x, y)?;
        let logits = e.in_module(self.lm_head, |e| e.linear(x, self.wte.w, None));
        e.rebind(x, logits)
    }

    /// Every block from `x`, run by run as the checkpoint plan says.
    fn run_plan(&self, e: &mut Engine, mut x: TensorId) -> Result<TensorId> {
        for (blocks, checkpointed) in &self.plan {
            x = match (*checkpointed, self.reentrant) {
                (true, true) => {
                    let y = e.reentrant_region(blocks.clone(), x, |e, x| {
                        self.run_blocks(e, blocks.clone(), x)
                    });
                    e.rebind(x, y)?
                }
                (true, false) => {
                    e.ckpt_begin(blocks.clone(), x);
                    let y = self.rebind_through(e, blocks.clone(), x);
                    e.ckpt_end();
                    y?
                }
                (false, _) => self.rebind_through(e, blocks.clone(), x)?,
            };
        }
        Ok(x)
    }

    /// `for block in blocks: x = block(x)`: each input dies as soon as the
    /// next block's output replaces it.
    fn rebind_through(
        &self,
        e: &mut Engine,
        blocks: Range<usize>,
        mut x: TensorId,
    ) -> Result<TensorId> {
        for i in blocks {
            let y = self.block(e, i, x);
            x = e.rebind(x, y)?;
        }
        Ok(x)
    }

    /// Checkpoint recomputation: `blocks` in order from `x` (not released;
    /// every later intermediate is).
    pub fn run_blocks(
        &self,
        e: &mut Engine,
        blocks: Range<usize>,
        x: TensorId,
    ) -> Result<TensorId> {
        let mut cur: Option<TensorId> = None;
        for i in blocks {
            let y = self.block(e, i, cur.unwrap_or(x));
            if let Some(prev) = cur {
                e.release(prev);
            }
            cur = Some(y?);
        }
        Ok(cur.unwrap_or_else(|| e.local_ref(x)))
    }

    /// One block: x + attn(ln_1(x)), then + mlp(ln_2(·)).
    pub fn block(&self, e: &mut Engine, i: usize, x: TensorId) -> Result<TensorId> {
        let b = &self.blocks[i];
        e.in_module(b.module, |e| {
            let h = e.apply_layer_norm(&b.ln_1, x)?;
            let a = e.in_module(b.attn_module, |e| self.attention(e, b, h));
            e.release(h);
            let a = a?;
            let x_mid = e.add(x, a);
            e.release(a);
            let x_mid = x_mid?;
            let h2 = e.apply_layer_norm(&b.ln_2, x_mid);
            let h2 = match h2 {
                Ok(v) => v,
                Err(err) => {
                    e.release(x_mid);
                    return Err(err);
                }
            };
            let m = e.in_module(b.mlp_module, |e| self.mlp(e, b, h2));
            e.release(h2);
            let m = match m {
                Ok(v) => v,
                Err(err) => {
                    e.release(x_mid);
                    return Err(err);
                }
            };
            let out = e.add(x_mid, m);
            e.release(m);
            e.release(x_mid);
            out
        })
    }

    fn attention(&self, e: &mut Engine, b: &Block, h: TensorId) -> Result<TensorId> {
        let qkv = e.apply_linear(&b.c_attn, h)?;
        let mut y = None;
        let r = self.attention_from(e, b, qkv, &mut y);
        // q, k, v are locals of forward(), views of c_attn's output: it lives
        // until forward returns or unwinds, after c_proj (under no_grad
        // nothing else holds it; seen on PyTorch 2.11, eval_no_grad_fixed).
        // The frame drops its locals in co_varnames order: q, k, v, then y.
        e.release(qkv);
        if let Some(y) = y {
            e.release(y);
        }
        r
    }

    /// The rest of `CausalSelfAttention.forward` from c_attn's output; the
    /// local `y` (c_proj's input) is left in `y_local` for the frame to drop.
    fn attention_from(
        &self,
        e: &mut Engine,
        b: &Block,
        qkv: TensorId,
        y_local: &mut Option<TensorId>,
    ) -> Result<TensorId> {
        let s = e.shape(qkv);
        let (bs, t) = (s.dim(0), s.dim(1));
        let (d, hd) = (self.n_embd, self.n_embd / self.n_head);
        let parts = e.split_last(qkv, 3);
        // q/k/v.view(B, T, h, hd).transpose(1, 2): views of the split (no copy).
        // The math backend hands q's and v's gradients back laid out
        // [B, h, T, hd] (k's as kᵀ's), so view()'s backward must copy them
        // to reshape them to [B, T, d] unless h or T is 1.
        let math = e.cfg.sdpa_backend == Some(SdpaBackend::Math);
        let relayout = math && self.n_head > 1 && t > 1;
        let shape = Shape::new(&[bs, t, self.n_head, hd]);
        let mut heads = Vec::with_capacity(3);
        for (i, p) in parts.into_iter().enumerate() {
            let v = if relayout && i != 1 {
                e.view_with_node(p, shape, Layout::Strided, "ViewBackward0", BwdKind::Alloc)
            } else {
                e.view_as(p, shape, Layout::Strided)
            };
            e.release(p);
            heads.push(e.transpose(v, 1, 2));
            e.release(v);
        }
        let y = e.sdpa(heads[0], heads[1], heads[2], self.dropout, true);
        for hh in heads {
            e.release(hh);
        }
        let y = y?;
        // y.transpose(1, 2).contiguous().view(B, T, d): the fused kernels lay
        // their output out [B, T, h, hd] already, so contiguous() does not
        // copy (§10.2 row 5); the math backend's [B, h, T, hd] output is
        // copied unless h or T is 1.
        let yt = if relayout {
            let tv = e.transpose(y, 1, 2);
            let c = e.contiguous(tv);
            e.release(tv);
            c
        } else {
            Ok(e.view_as(y, Shape::new(&[bs, t, self.n_head, hd]), Layout::Contiguous))
        };
        e.release(y);
        let yt = yt?;
        let yv = e.view_as(yt, Shape::new(&[bs, t, d]), Layout::Contiguous);
        e.release(yt);
        *y_local = Some(yv);
        let o = e.apply_linear(&b.attn_proj, yv)?;
        let r = e.dropout(o, self.dropout);
        e.rebind(o, r)
    }

    fn mlp(&self, e: &mut Engine, b: &Block, h: TensorId) -> Result<TensorId> {
        let f = e.apply_linear(&b.c_fc, h)?;
        let g = e.in_module(b.gelu, |e| e.unary(Unary::Gelu, f));
        let g = e.rebind(f, g)?;
        let m = e.apply_linear(&b.mlp_proj, g);
        let m = e.rebind(g, m)?;
        let r = e.dropout(m, self.dropout);
        e.rebind(m, r)
    }
}

#[cfg(test)]
mod tests {
    use super::checkpoint_plan;

    #[test]
    fn plans_split_blocks_as_checkpoint_sequential_does() {
        assert_eq!(checkpoint_plan(3, false, None), vec![(0..3, false)]);
        assert_eq!(
            checkpoint_plan(3, true, None),
            vec![(0..1, true), (1..2, true), (2..3, true)]
        );
        // 10 blocks, 3 segments: size 10 // 3 = 3; the last segment takes the rest.
        assert_eq!(
            checkpoint_plan(10, false, Some(3)),
            vec![(0..3, true), (3..6, true), (6..10, false)]
        );
        assert_eq!(checkpoint_plan(4, false, Some(1)), vec![(0..4, false)]);
        assert_eq!(
            checkpoint_plan(4, false, Some(4)),
            vec![(0..1, true), (1..2, true), (2..3, true), (3..4, false)]
        );
    }
}
