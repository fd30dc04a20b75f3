//! BERT's pieces (models.md §8): embeddings with token types and learned
//! positions, and the post-LN encoder layer with SDPA.

use super::super::dtype::DType;
use super::super::error::Result;
use super::super::ops::elementwise::Unary;
use super::super::shape::Shape;
use super::super::tag::Category;
use super::super::tensor::{Layout, TensorId};
use super::super::Engine;
use super::{Embedding, LayerNorm, Linear};

#[derive(Debug)]
pub(crate) struct BertLayer {
    pub module: u32,
    pub attn_module: u32,
    pub query: Linear,
    pub key: Linear,
    pub value: Linear,
    pub attn_dense: Linear,
    pub ln1: LayerNorm,
    pub intermediate: Linear,
    pub gelu: u32,
    pub output: Linear,
    pub ln2: LayerNorm,
    pub heads: u64,
    pub dropout: f64,
}

impl BertLayer {
    /// `BertLayer(config)` at `path`: attention.self (query, key, value),
    /// attention.output (dense, LayerNorm), intermediate.dense, output
    /// (dense, LayerNorm).
    pub(crate) fn build(
        e: &mut Engine,
        l: &str,
        [h, i, heads]: [u64; 3],
        dropout: f64,
        params: &mut Vec<TensorId>,
    ) -> Result<BertLayer> {
        let lin = |e: &mut Engine, name: &str, fin, fout, ps: &mut Vec<TensorId>| {
            e.new_linear(&format!("{l}.{name}"), fin, fout, true, ps)
        };
        let query = lin(e, "attention.self.query", h, h, params)?;
        let key = lin(e, "attention.self.key", h, h, params)?;
        let value = lin(e, "attention.self.value", h, h, params)?;
        let attn_dense = lin(e, "attention.output.dense", h, h, params)?;
        let ln1 = e.new_layer_norm(&format!("{l}.attention.output.LayerNorm"), h, true, params)?;
        let intermediate = lin(e, "intermediate.dense", h, i, params)?;
        let output = lin(e, "output.dense", i, h, params)?;
        let ln2 = e.new_layer_norm(&format!("{l}.output.LayerNorm"), h, true, params)?;
        Ok(BertLayer {
            module: e.tags.module(l),
            attn_module: e.tags.module(&format!("{l}.attention")),
            query,
            key,
            value,
            attn_dense,
            ln1,
            intermediate,
            gelu: e
                .tags
                .module(&format!("{l}.intermediate.intermediate_act_fn")),
            output,
            ln2,
            heads,
            dropout,
        })
    }
}

impl Engine {
    /// `BertLayer.forward` (models.md §8.2), post-LN.
    pub(crate) fn bert_layer(&mut self, l: &BertLayer, x: TensorId) -> Result<TensorId> {
        let ctx = self.in_module(l.attn_module, |e| e.bert_self_attention(l, x))?;
        let d = self.apply_linear(&l.attn_dense, ctx);
        let d = self.rebind(ctx, d)?;
        let dd = self.dropout(d, l.dropout);
        let dd = self.rebind(d, dd)?;
        let res = self.add(dd, x);
        self.release(dd);
        let res = res?;
        let ln1 = self.apply_layer_norm(&l.ln1, res);
        let ln1 = self.rebind(res, ln1)?;
        let inter = self.apply_linear(&l.intermediate, ln1)?;
        let g = self.in_module(l.gelu, |e| e.unary(Unary::Gelu, inter));
        let g = self.rebind(inter, g)?;
        let o = self.apply_linear(&l.output, g);
        let o = self.rebind(g, o)?;
        let od = self.dropout(o, l.dropout);
        let od = self.rebind(o, od)?;
        let res2 = self.add(od, ln1);
        self.release(od);
        self.release(ln1);
        let res2 = res2?;
        let out = self.apply_layer_norm(&l.ln2, res2);
        self.rebind(res2, out)
    }

    /// q, k, v projections viewed [B, h, T, d], SDPA (no mask, not causal,
    /// dropout p in training), output viewed back [B, T, H].
    fn bert_self_attention(&mut self, l: &BertLayer, x: TensorId) -> Result<TensorId> {
        let s = self.shape(x);
        let (b, t, h) = (s.dim(0), s.dim(1), s.dim(2));
        let heads = l.heads;
        let d = h / heads.max(1);
        let mut qkv = Vec::with_capacity(3);
        for lin in [&l.query, &l.key, &l.value] {
            let y = self.apply_linear(lin, x)?;
            let v = self.view_as(y, Shape::new(&[b, t, heads, d]), Layout::Contiguous);
            self.release(y);
            qkv.push(self.transpose(v, 1, 2));
            self.release(v);
        }
        let out = self.sdpa_hf(qkv[0], qkv[1], qkv[2], l.dropout, false);
        for t in qkv {
            self.release(t);
        }
        let out = out?;
        let bthd = Shape::new(&[b, t, heads, d]);
        let c = if self.layout(out) == Layout::Strided {
            self.view_as(out, bthd, Layout::Contiguous)
        } else {
            let tv = self.transpose(out, 1, 2);
            let c = self.contiguous(tv);
            self.release(tv);
            c?
        };
        self.release(out);
        let flat = self.view_as(c, Shape::new(&[b, t, h]), Layout::Contiguous);
        self.release(c);
        Ok(flat)
    }
}

/// What `BertEmbeddings.forward` uses.
#[derive(Clone, Copy)]
pub(crate) struct EmbeddingParts<'a> {
    pub word: &'a Embedding,
    pub position: &'a Embedding,
    pub token_type: &'a Embedding,
    pub ln: &'a LayerNorm,
    pub position_ids: TensorId,
    pub token_type_ids: TensorId,
    pub dropout: f64,
}

/// `BertEmbeddings.forward` (models.md §8.1): token types gathered from
/// the buffer, word + token type, + position, LayerNorm, dropout. The
/// summands are locals until the function returns.
pub(crate) fn embeddings_forward(
    e: &mut Engine,
    b: EmbeddingParts,
    ids: TensorId,
) -> Result<TensorId> {
    let s = e.shape(ids);
    let (bs, t) = (s.dim(0), s.dim(1));
    let gathered = e.factory(Shape::new(&[1, t]), DType::I64, Category::Activation)?;
    e.k_unary(b.token_type_ids, gathered);
    let tt_ids = e.view_as(gathered, Shape::new(&[bs, t]), Layout::Expanded);
    let position_ids = e.view_as(b.position_ids, Shape::new(&[1, t]), Layout::Strided);
    let words = e.in_module(b.word.module, |e| e.embedding(b.word.w, ids))?;
    let types = e.in_module(b.token_type.module, |e| e.embedding(b.token_type.w, tt_ids))?;
    let sum = e.add(words, types)?;
    let pos = e.in_module(b.position.module, |e| {
        e.embedding(b.position.w, position_ids)
    })?;
    let sum2 = e.add(sum, pos);
    let x = e.rebind(sum, sum2)?;
    let y = e.apply_layer_norm(b.ln, x);
    let x = e.rebind(x, y)?;
    let y = e.dropout(x, b.dropout);
    let x = e.rebind(x, y)?;
    for local in [words, types, pos, tt_ids, gathered, position_ids] {
        e.release(local);
    }
    Ok(x)
}
