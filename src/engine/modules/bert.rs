//! `BertForSequenceClassification` (models.md §8): embeddings with token
//! types and learned positions, post-LN encoder layers with SDPA, pooler,
//! dropout and classifier.

use super::super::dtype::DType;
use super::super::error::Result;
use super::super::ops::elementwise::Unary;
use super::super::presets_hf::BertSpec;
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

#[derive(Debug)]
pub(crate) struct Bert {
    pub spec: BertSpec,
    pub module: u32,
    pub word: Embedding,
    pub position: Embedding,
    pub token_type: Embedding,
    pub emb_ln: LayerNorm,
    pub position_ids: TensorId,
    pub token_type_ids: TensorId,
    pub layers: Vec<BertLayer>,
    pub pooler: Linear,
    pub pooler_act: u32,
    pub classifier: Linear,
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

impl Bert {
    /// Parameters in `.to("cuda")` order; the embeddings' `position_ids`
    /// and `token_type_ids` [1, max_positions] int64 buffers after their
    /// module's parameters.
    pub fn build(
        e: &mut Engine,
        spec: &BertSpec,
        params: &mut Vec<TensorId>,
        buffers: &mut Vec<(String, TensorId)>,
    ) -> Result<Bert> {
        let (h, i) = (spec.hidden, spec.intermediate);
        let p = "bert.embeddings";
        let word = e.new_embedding(&format!("{p}.word_embeddings"), spec.vocab, h, params)?;
        let position = e.new_embedding(
            &format!("{p}.position_embeddings"),
            spec.max_positions,
            h,
            params,
        )?;
        let token_type = e.new_embedding(
            &format!("{p}.token_type_embeddings"),
            spec.type_vocab,
            h,
            params,
        )?;
        let emb_ln = e.new_layer_norm(&format!("{p}.LayerNorm"), h, true, params)?;
        let emb_module = e.tags.module(p);
        let pos_shape = [1, spec.max_positions];
        let position_ids = e.new_buffer(
            format!("{p}.position_ids"),
            &pos_shape,
            DType::I64,
            emb_module,
            buffers,
        )?;
        let token_type_ids = e.new_buffer(
            format!("{p}.token_type_ids"),
            &pos_shape,
            DType::I64,
            emb_module,
            buffers,
        )?;
        let mut layers = Vec::new();
        for n in 0..spec.layers {
            let path = format!("bert.encoder.layer.{n}");
            let dims = [h, i, spec.heads];
            layers.push(BertLayer::build(e, &path, dims, spec.dropout, params)?);
        }
        let pooler = e.new_linear("bert.pooler.dense", h, h, true, params)?;
        let classifier = e.new_linear("classifier", h, spec.num_labels, true, params)?;
        Ok(Bert {
            spec: spec.clone(),
            module: emb_module,
            word,
            position,
            token_type,
            emb_ln,
            position_ids,
            token_type_ids,
            layers,
            pooler,
            pooler_act: e.tags.module("bert.pooler.activation"),
            classifier,
        })
    }

    /// `model(input_ids)` → logits [B, num_labels].
    pub fn forward(&self, e: &mut Engine, ids: TensorId) -> Result<TensorId> {
        let mark = e.locals.len();
        let r = self.forward_body(e, ids);
        if r.is_err() {
            e.unwind_locals(mark);
        }
        r
    }

    fn forward_body(&self, e: &mut Engine, ids: TensorId) -> Result<TensorId> {
        let mut x = e.in_module(self.module, |e| self.embeddings(e, ids))?;
        for l in &self.layers {
            let y = e.in_module(l.module, |e| e.bert_layer(l, x));
            x = e.rebind(x, y)?;
        }
        // Pooler: `hidden_states[:, 0]`, a 2-D view (addmm takes it as it is
        // and saves it, keeping the whole last output alive), then tanh.
        let s = e.shape(x);
        let first = e.view_as(x, Shape::new(&[s.dim(0), s.dim(2)]), Layout::Contiguous);
        let pooled = e.apply_linear(&self.pooler, first);
        e.release(first);
        let pooled = pooled?;
        let act = e.in_module(self.pooler_act, |e| e.unary(Unary::Tanh, pooled));
        let act = e.rebind(pooled, act)?;
        e.release(x);
        let dropped = e.dropout(act, self.spec.dropout);
        let dropped = e.rebind(act, dropped)?;
        let logits = e.apply_linear(&self.classifier, dropped);
        e.rebind(dropped, logits)
    }

    /// `BertEmbeddings.forward` (models.md §8.1): token types gathered from
    /// the buffer, word + token type, + position, LayerNorm, dropout. The
    /// summands are locals until the function returns.
    fn embeddings(&self, e: &mut Engine, ids: TensorId) -> Result<TensorId> {
        let s = e.shape(ids);
        let (b, t) = (s.dim(0), s.dim(1));
        let gathered = e.factory(Shape::new(&[1, t]), DType::I64, Category::Activation)?;
        e.k_unary(self.token_type_ids, gathered);
        let tt_ids = e.view_as(gathered, Shape::new(&[b, t]), Layout::Expanded);
        let position_ids = e.view_as(self.position_ids, Shape::new(&[1, t]), Layout::Strided);
        let words = e.in_module(self.word.module, |e| e.embedding(self.word.w, ids))?;
        let types = e.in_module(self.token_type.module, |e| {
            e.embedding(self.token_type.w, tt_ids)
        })?;
        let sum = e.add(words, types)?;
        let pos = e.in_module(self.position.module, |e| {
            e.embedding(self.position.w, position_ids)
        })?;
        let sum2 = e.add(sum, pos);
        let x = e.rebind(sum, sum2)?;
        let y = e.apply_layer_norm(&self.emb_ln, x);
        let x = e.rebind(x, y)?;
        let y = e.dropout(x, self.spec.dropout);
        let x = e.rebind(x, y)?;
        for local in [words, types, pos, tt_ids, gathered, position_ids] {
            e.release(local);
        }
        Ok(x)
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
