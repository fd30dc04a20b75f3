//! The language's transformer modules (models.md §1–§8): RMSNorm, rotary
//! embeddings, attention with grouped-query heads, MLPs, Llama decoder
//! layers, LM heads, BERT pieces, and PEFT LoRA as a model-level option.
//! Each is built, run, counted and shape-checked here; the other files of
//! the language hand these variants over in one arm each.

use std::cell::Cell;

use super::build::{display, LangNet, Node};
use super::spec::Module;
use crate::engine::config::{RopeScope, SdpaBackend};
use crate::engine::dtype::DType;
use crate::engine::error::{EngineError, Result};
use crate::engine::modules::bert::BertLayer;
use crate::engine::modules::decoder::new_rms_norm;
use crate::engine::modules::decoder::{Attention, DecoderLayer, RmsNorm, Rope, SwiGlu};
use crate::engine::modules::lora::Proj;
use crate::engine::modules::{Embedding, LayerNorm, Linear};
use crate::engine::ops::elementwise::Unary;
use crate::engine::presets_hf::{DecoderLm, LoraSpec};
use crate::engine::shape::Shape;
use crate::engine::tag::Category;
use crate::engine::tensor::{Layout, TensorId};
use crate::engine::Engine;

/// A built transformer module.
#[derive(Debug)]
pub(crate) enum XNode {
    RmsNorm(RmsNorm),
    Rotary,
    Attention {
        attn: Attention,
        rotary: bool,
        sdpa: Option<SdpaBackend>,
    },
    SwiGlu(SwiGlu),
    GeluMlp {
        module: u32,
        fc: Proj,
        act: u32,
        proj: Proj,
    },
    Decoder(DecoderLayer),
    LmHead {
        w: TensorId,
        module: u32,
    },
    BertEmbeddings(BertEmbeddings),
    BertLayer(BertLayer),
    BertPooler {
        dense: Linear,
        act: u32,
    },
    /// A plain `Linear` that LoRA adapted.
    Proj(Proj),
}

#[derive(Debug)]
pub(crate) struct BertEmbeddings {
    pub module: u32,
    pub word: Embedding,
    pub position: Embedding,
    pub token_type: Embedding,
    pub ln: LayerNorm,
    pub position_ids: TensorId,
    pub token_type_ids: TensorId,
    pub dropout: f64,
}

/// The tensors one forward shares between rotary layers: `cache_position`
/// (arange(T), int64), `position_ids` (its [1, T] view) and, at model
/// scope, the cos/sin pair.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RopeCtx {
    cache_position: TensorId,
    position_ids: TensorId,
    tables: Option<(TensorId, TensorId)>,
}

/// What the builder keeps for the transformer modules.
#[derive(Debug, Default)]
pub(crate) struct XState {
    /// The first Embedding's weight (what a tied LM head multiplies by).
    pub tie: Option<TensorId>,
    /// The RotaryEmbedding's buffer.
    pub inv_freq: Option<TensorId>,
    /// Module paths of rotary attentions built (checked against `inv_freq`).
    pub rotary_users: Vec<String>,
}

/// Per-forward state of a built model.
#[derive(Debug, Default)]
pub(crate) struct XRun {
    pub rope: Cell<Option<RopeCtx>>,
}

fn decoder_spec(dims: [u64; 3], kv_heads: Option<u64>, head_dim: Option<u64>) -> DecoderLm {
    let [hidden, intermediate, heads] = dims;
    DecoderLm {
        hidden,
        intermediate,
        layers: 1,
        heads,
        kv_heads: kv_heads.unwrap_or(heads),
        head_dim,
        vocab: 0,
        tied: false,
        qkv_bias: false,
        seq: 0,
        lora: None,
    }
}

/// Build one transformer module at `path`.
pub(crate) fn build(
    e: &mut Engine,
    path: &str,
    m: &Module,
    st: &mut XState,
    params: &mut Vec<TensorId>,
    bufs: &mut Vec<(String, TensorId)>,
) -> Result<XNode> {
    let at = |name: &str| super::spec::join(path, name);
    Ok(match m {
        Module::RMSNorm { dim } => XNode::RmsNorm(new_rms_norm(e, path, *dim, params)?),
        Module::RotaryEmbedding { head_dim } => {
            let module = e.tags.module(path);
            let buf = e.new_inv_freq(module, *head_dim, bufs, &at("inv_freq"))?;
            // transformers registers `original_inv_freq` as a buffer of its
            // own (`inv_freq.clone()`, `LlamaRotaryEmbedding.__init__`), moved
            // and cast with the model: two 64 B blocks in the Qwen2.5 capture.
            e.new_inv_freq(module, *head_dim, bufs, &at("original_inv_freq"))?;
            st.inv_freq = Some(buf);
            XNode::Rotary
        }
        Module::Attention {
            hidden,
            heads,
            kv_heads,
            head_dim,
            causal,
            rotary,
            bias,
            dropout,
            sdpa,
        } => {
            let spec = decoder_spec([*hidden, 0, *heads], *kv_heads, *head_dim);
            let mut attn = build_attention(e, path, &spec, *bias, params)?;
            attn.causal = *causal;
            attn.dropout = *dropout;
            if *rotary {
                st.rotary_users.push(display(path).to_string());
            }
            XNode::Attention {
                attn,
                rotary: *rotary,
                sdpa: *sdpa,
            }
        }
        Module::Mlp {
            hidden,
            intermediate,
            gated,
            bias,
        } => {
            let lin = |e: &mut Engine, name: &str, fin, fout, ps: &mut Vec<TensorId>| {
                e.new_linear(&at(name), fin, fout, *bias, ps)
                    .map(Proj::plain)
            };
            let (h, i) = (*hidden, *intermediate);
            if *gated {
                XNode::SwiGlu(SwiGlu {
                    module: e.tags.module(path),
                    act: e.tags.module(&at("act_fn")),
                    gate: lin(e, "gate_proj", h, i, params)?,
                    up: lin(e, "up_proj", h, i, params)?,
                    down: lin(e, "down_proj", i, h, params)?,
                })
            } else {
                XNode::GeluMlp {
                    module: e.tags.module(path),
                    fc: lin(e, "c_fc", h, i, params)?,
                    act: e.tags.module(&at("act")),
                    proj: lin(e, "c_proj", i, h, params)?,
                }
            }
        }
        Module::DecoderLayer {
            hidden,
            intermediate,
            heads,
            kv_heads,
            head_dim,
            qkv_bias,
        } => {
            let mut spec = decoder_spec([*hidden, *intermediate, *heads], *kv_heads, *head_dim);
            spec.qkv_bias = *qkv_bias;
            st.rotary_users.push(display(path).to_string());
            XNode::Decoder(DecoderLayer::build(e, path, &spec, params)?)
        }
        Module::LmHead {
            hidden,
            vocab,
            tied,
        } => {
            let module = e.tags.module(path);
            let w = if *tied {
                st.tie.ok_or_else(|| {
                    EngineError::Program(format!(
                        "{}: a tied LmHead needs an Embedding before it (its weight is the Embedding's)",
                        display(path)
                    ))
                })?
            } else {
                e.new_param(&[*vocab, *hidden], module, params)?
            };
            XNode::LmHead { w, module }
        }
        Module::BertEmbeddings {
            vocab,
            hidden,
            max_positions,
            type_vocab,
            dropout,
        } => {
            let h = *hidden;
            let word = e.new_embedding(&at("word_embeddings"), *vocab, h, params)?;
            let position =
                e.new_embedding(&at("position_embeddings"), *max_positions, h, params)?;
            let token_type =
                e.new_embedding(&at("token_type_embeddings"), *type_vocab, h, params)?;
            let ln = e.new_layer_norm(&at("LayerNorm"), h, true, params)?;
            let module = e.tags.module(path);
            let shape = [1, *max_positions];
            let position_ids =
                e.new_buffer(at("position_ids"), &shape, DType::I64, module, bufs)?;
            let token_type_ids =
                e.new_buffer(at("token_type_ids"), &shape, DType::I64, module, bufs)?;
            st.tie.get_or_insert(word.w);
            XNode::BertEmbeddings(BertEmbeddings {
                module,
                word,
                position,
                token_type,
                ln,
                position_ids,
                token_type_ids,
                dropout: *dropout,
            })
        }
        Module::BertLayer {
            hidden,
            intermediate,
            heads,
            dropout,
        } => XNode::BertLayer(BertLayer::build(
            e,
            path,
            [*hidden, *intermediate, *heads],
            *dropout,
            params,
        )?),
        Module::BertPooler { hidden } => XNode::BertPooler {
            dense: e.new_linear(&at("dense"), *hidden, *hidden, true, params)?,
            act: e.tags.module(&at("activation")),
        },
        other => {
            return Err(EngineError::Program(format!(
                "{}: {other:?} is not a transformer module",
                display(path)
            )))
        }
    })
}

/// `LlamaAttention`'s projections at `path` (q, k, v with `bias`, o without).
fn build_attention(
    e: &mut Engine,
    path: &str,
    s: &DecoderLm,
    bias: bool,
    params: &mut Vec<TensorId>,
) -> Result<Attention> {
    let (h, d) = (s.hidden, s.head_dim());
    let (q, kv) = (s.heads * d, s.kv_heads * d);
    let lin = |e: &mut Engine, name: &str, fin, fout, b, ps: &mut Vec<TensorId>| {
        e.new_linear(&super::spec::join(path, name), fin, fout, b, ps)
            .map(Proj::plain)
    };
    Ok(Attention {
        module: e.tags.module(path),
        rotary_module: e.tags.module(&super::spec::join(path, "rotary_emb")),
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

impl LangNet {
    /// The rotary context of this forward: made at the first rotary layer
    /// (after the embeddings, as `LlamaModel.forward` makes it), from that
    /// layer's input dtype.
    fn rope(&self, e: &mut Engine, x: TensorId) -> Result<Rope> {
        let inv_freq = self.inv_freq.ok_or_else(|| {
            EngineError::Program("a rotary layer needs a RotaryEmbedding module".into())
        })?;
        let ctx = match self.run_state.rope.get() {
            Some(c) => c,
            None => {
                let t = e.shape(x).dim(1);
                let cache_position =
                    e.factory(Shape::new(&[t]), DType::I64, Category::Activation)?;
                e.keep(cache_position);
                let position_ids =
                    e.view_as(cache_position, Shape::new(&[1, t]), Layout::Contiguous);
                e.keep(position_ids);
                let mut c = RopeCtx {
                    cache_position,
                    position_ids,
                    tables: None,
                };
                if e.cfg.hf_rope_scope == RopeScope::Model {
                    let dtype = e.dtype(x);
                    let (cos, sin) = e.rotary_cos_sin(inv_freq, position_ids, dtype)?;
                    e.keep(cos);
                    e.keep(sin);
                    c.tables = Some((cos, sin));
                }
                self.run_state.rope.set(Some(c));
                c
            }
        };
        Ok(match ctx.tables {
            Some((cos, sin)) => Rope::Shared { cos, sin },
            None => Rope::PerLayer {
                inv_freq,
                position_ids: ctx.position_ids,
            },
        })
    }

    /// The end of a forward (or a recomputation): `position_ids`,
    /// `cache_position`, then `position_embeddings` go.
    pub(crate) fn end_rope(&self, e: &mut Engine) {
        if let Some(c) = self.run_state.rope.take() {
            e.decref(c.position_ids);
            e.decref(c.cache_position);
            if let Some((cos, sin)) = c.tables {
                e.decref(cos);
                e.decref(sin);
            }
        }
    }

    pub(crate) fn run_x(&self, e: &mut Engine, n: &XNode, x: TensorId) -> Result<TensorId> {
        match n {
            XNode::RmsNorm(r) => e.apply_rms_norm(r, x),
            XNode::Rotary => Ok(e.local_ref(x)),
            XNode::Attention { attn, rotary, sdpa } => {
                let rope = if *rotary {
                    Some(self.rope(e, x)?)
                } else {
                    None
                };
                let saved = e.cfg.sdpa_backend;
                if sdpa.is_some() {
                    e.cfg.sdpa_backend = *sdpa;
                }
                let r = e.in_module(attn.module, |e| e.hf_attention(attn, x, rope));
                e.cfg.sdpa_backend = saved;
                r
            }
            XNode::SwiGlu(m) => e.in_module(m.module, |e| e.swiglu(m, x)),
            XNode::GeluMlp {
                module,
                fc,
                act,
                proj,
            } => e.in_module(*module, |e| {
                let f = e.apply_proj(fc, x)?;
                let g = e.in_module(*act, |e| e.unary(Unary::Gelu, f));
                let g = e.rebind(f, g)?;
                let o = e.apply_proj(proj, g);
                e.rebind(g, o)
            }),
            XNode::Decoder(l) => {
                let rope = self.rope(e, x)?;
                e.decoder_layer(l, x, rope)
            }
            XNode::LmHead { w, module } => e.in_module(*module, |e| e.linear(x, *w, None)),
            XNode::BertEmbeddings(b) => e.in_module(b.module, |e| e.bert_embeddings(b, x)),
            XNode::BertLayer(l) => e.in_module(l.module, |e| e.bert_layer(l, x)),
            XNode::BertPooler { dense, act } => {
                // `hidden_states[:, 0]`: a 2-D view addmm takes as it is.
                let s = e.shape(x);
                let first = e.view_as(x, Shape::new(&[s.dim(0), s.last()]), Layout::Contiguous);
                let p = e.apply_linear(dense, first);
                e.release(first);
                let p = p?;
                let t = e.in_module(*act, |e| e.unary(Unary::Tanh, p));
                e.rebind(p, t)
            }
            XNode::Proj(p) => e.apply_proj(p, x),
        }
    }

    /// `get_peft_model`: freeze every parameter, then give each projection
    /// whose name is a target its adapters, in module order.
    pub(crate) fn add_lora(
        &mut self,
        e: &mut Engine,
        lora: &LoraSpec,
        params: &mut Vec<TensorId>,
    ) -> Result<()> {
        if lora.r == 0 {
            return Err(EngineError::Program("lora: r must be at least 1".into()));
        }
        for p in params.iter() {
            e.t_mut(*p).requires_grad = false;
        }
        let mut adapters = Vec::new();
        for i in 0..self.nodes.len() {
            if let Node::Linear(l) = &self.nodes[i] {
                let name = e.tags.module_path(l.module);
                if lora.targets(name.rsplit('.').next().unwrap_or(&name)) {
                    self.nodes[i] = Node::Xfmr(Box::new(XNode::Proj(Proj::plain(l.clone()))));
                }
            }
            let Node::Xfmr(x) = &mut self.nodes[i] else {
                continue;
            };
            for proj in projections(x) {
                let path = e.tags.module_path(proj.base.module).to_string();
                if !lora.targets(path.rsplit('.').next().unwrap_or(&path)) {
                    continue;
                }
                let ws = e.shape(proj.base.w);
                let adapter = e.new_adapter(&path, ws.dim(1), ws.dim(0), lora, params)?;
                adapters.push(adapter.clone());
                proj.adapter = Some(adapter);
            }
        }
        if e.upcasts_adapters() {
            for a in &adapters {
                e.upcast_adapter(a)?;
            }
        }
        if adapters.is_empty() {
            return Err(EngineError::Program(format!(
                "lora: no projection is named {} (target_modules match the last part of a module path, e.g. q_proj)",
                lora.target_modules.join(", ")
            )));
        }
        Ok(())
    }
}

/// The projections inside a transformer node, in module order.
fn projections(x: &mut XNode) -> Vec<&mut Proj> {
    match x {
        XNode::Attention { attn, .. } => {
            vec![&mut attn.q, &mut attn.k, &mut attn.v, &mut attn.o]
        }
        XNode::SwiGlu(m) => vec![&mut m.gate, &mut m.up, &mut m.down],
        XNode::GeluMlp { fc, proj, .. } => vec![fc, proj],
        XNode::Decoder(l) => vec![
            &mut l.attn.q,
            &mut l.attn.k,
            &mut l.attn.v,
            &mut l.attn.o,
            &mut l.mlp.gate,
            &mut l.mlp.up,
            &mut l.mlp.down,
        ],
        XNode::Proj(p) => vec![p],
        _ => Vec::new(),
    }
}

impl Engine {
    /// `BertEmbeddings.forward` (models.md §8.1).
    fn bert_embeddings(&mut self, b: &BertEmbeddings, ids: TensorId) -> Result<TensorId> {
        crate::engine::modules::bert::embeddings_forward(
            self,
            crate::engine::modules::bert::EmbeddingParts {
                word: &b.word,
                position: &b.position,
                token_type: &b.token_type,
                ln: &b.ln,
                position_ids: b.position_ids,
                token_type_ids: b.token_type_ids,
                dropout: b.dropout,
            },
            ids,
        )
    }
}
