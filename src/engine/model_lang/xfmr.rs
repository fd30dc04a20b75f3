//! What the language's transformer modules (models.md §1–§8) share beyond
//! their arms in `kinds.rs`: the tied weight and the rotary buffer the
//! builder keeps, the rotary positions one forward shares, BERT's
//! embeddings, and PEFT LoRA as a model-level option.

use std::cell::Cell;

use super::build::{LangNet, Node};
use crate::engine::bnb::QuantLayer;
use crate::engine::config::RopeScope;
use crate::engine::dtype::DType;
use crate::engine::error::{EngineError, Result};
use crate::engine::modules::decoder::Rope;
use crate::engine::modules::{Embedding, LayerNorm};
use crate::engine::presets_hf::LoraSpec;
use crate::engine::shape::Shape;
use crate::engine::tag::Category;
use crate::engine::tensor::{Layout, TensorId};
use crate::engine::Engine;

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
    /// The sliding layers' pair (Gemma 3), made after the first.
    local: Option<(TensorId, TensorId)>,
    /// Held by checkpoint frames (transformers 5.x, `hf_v5.rs`), not by
    /// this forward: its end drops nothing.
    borrowed: bool,
}

impl RopeCtx {
    /// The handles it owns: position_ids, its storage's owner, cos, sin
    /// (and the sliding layers' cos, sin).
    pub(super) fn handles(&self) -> Vec<TensorId> {
        let mut h = vec![self.position_ids, self.cache_position];
        for (cos, sin) in self.tables.into_iter().chain(self.local) {
            h.extend([cos, sin]);
        }
        h
    }

    /// The context checkpoint frames hold, for a recomputation.
    fn held(h: &[TensorId]) -> Option<RopeCtx> {
        let ctx = |tables, local| {
            Some(RopeCtx {
                cache_position: h[1],
                position_ids: h[0],
                tables,
                local,
                borrowed: true,
            })
        };
        match *h {
            [_, _] => ctx(None, None),
            [_, _, cos, sin] => ctx(Some((cos, sin)), None),
            [_, _, cos, sin, lcos, lsin] => ctx(Some((cos, sin)), Some((lcos, lsin))),
            _ => None,
        }
    }
}

/// What the builder keeps for the transformer modules.
#[derive(Debug, Default)]
pub(crate) struct XState {
    /// The first Embedding's weight (what a tied LM head multiplies by).
    pub tie: Option<TensorId>,
    /// The RotaryEmbedding's buffer.
    pub inv_freq: Option<TensorId>,
    /// Its sliding layers' buffer (Gemma 3's `sliding_attention_inv_freq`).
    pub local_inv_freq: Option<TensorId>,
    /// `RotaryEmbedding`'s `unused_sliding_mask`.
    pub unused_sliding_mask: Option<u64>,
}

/// Per-forward state of a built model.
#[derive(Debug, Default)]
pub(crate) struct XRun {
    pub rope: Cell<Option<RopeCtx>>,
    /// A reentrant checkpoint's Node holds this forward's rotary context
    /// (transformers 5.x, `hf_v5.rs`).
    pub rope_on_graph: Cell<bool>,
    /// The sliding cache layers' window tensors of this forward: the model's
    /// output holds them (`Engine::hold_with`).
    pub cache_windows: std::cell::RefCell<Vec<TensorId>>,
    /// This forward's unused sliding-window mask (`hf_v5.rs`), a local of
    /// the model's forward.
    pub sliding_mask: Cell<Option<TensorId>>,
}

impl LangNet {
    /// The rotary context of this forward: made at the first rotary layer
    /// (after the embeddings, as `LlamaModel.forward` makes it), from that
    /// layer's input dtype.
    pub(super) fn rope(&self, e: &mut Engine, x: TensorId) -> Result<Rope> {
        self.rope_for(e, x, false)
    }

    /// [`LangNet::rope`] for a layer of one type: a `sliding` layer takes
    /// the sliding table where the model has one (Gemma 3).
    pub(super) fn rope_for(&self, e: &mut Engine, x: TensorId, sliding: bool) -> Result<Rope> {
        let inv_freq = self.inv_freq.ok_or_else(|| {
            EngineError::Program("a rotary layer needs a RotaryEmbedding module".into())
        })?;
        let held = || {
            Some(&e.ckpt.held)
                .filter(|_| e.ckpt.rebuilding())
                .and_then(|h| RopeCtx::held(h))
        };
        let ctx = match self.run_state.rope.get().or_else(held) {
            Some(c) => {
                self.run_state.rope.set(Some(c));
                c
            }
            None => {
                let t = e.shape(x).dim(1);
                // 5.x: `arange(T) + past_seen_tokens`, then the packed-
                // sequence check (`hf_v5.rs`); 4.x: `cache_position`.
                let cache_position = if e.cfg.hf_v5() {
                    e.v5_position_ids(t)?
                } else {
                    e.factory(Shape::new(&[t]), DType::I64, Category::Activation)?
                };
                e.keep(cache_position);
                let position_ids =
                    e.view_as(cache_position, Shape::new(&[1, t]), Layout::Contiguous);
                e.keep(position_ids);
                if e.cfg.hf_v5() && !e.cfg.hf_use_cache {
                    e.v5_find_packed(e.shape(x).dim(0), t)?;
                }
                // Then `create_sliding_window_causal_mask` where the model's
                // forward builds one no layer takes (`hf_v5.rs`).
                let unused = self.unused_sliding_mask.filter(|_| e.cfg.hf_v5());
                if let Some(window) = unused.filter(|_| !e.ckpt.rebuilding()) {
                    let mask = e.v5_unused_sliding_mask(e.shape(x).dim(0), t, window)?;
                    if let Some(old) = self.run_state.sliding_mask.replace(mask) {
                        e.decref(old);
                    }
                }
                let mut c = RopeCtx {
                    cache_position,
                    position_ids,
                    tables: None,
                    local: None,
                    borrowed: false,
                };
                if e.cfg.hf_rope_scope == RopeScope::Model {
                    // Gemma 3: one pair per layer type, in the order of a
                    // Python `set` of the types (the two are alike in size).
                    let dtype = e.dtype(x);
                    for (inv, slot) in [(Some(inv_freq), 0), (self.local_inv_freq, 1)] {
                        let Some(inv) = inv else { continue };
                        let (cos, sin) = e.rotary_cos_sin(inv, position_ids, dtype)?;
                        e.keep(cos);
                        e.keep(sin);
                        if slot == 0 {
                            c.tables = Some((cos, sin));
                        } else {
                            c.local = Some((cos, sin));
                        }
                    }
                }
                self.run_state.rope.set(Some(c));
                c
            }
        };
        let tables = if sliding && ctx.local.is_some() {
            ctx.local
        } else {
            ctx.tables
        };
        let inv_freq = match self.local_inv_freq {
            Some(local) if sliding => local,
            _ => inv_freq,
        };
        Ok(match tables {
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
        if let Some(c) = self.run_state.rope.take().filter(|c| !c.borrowed) {
            e.decref(c.position_ids);
            e.decref(c.cache_position);
            for (cos, sin) in c.tables.into_iter().chain(c.local) {
                e.decref(cos);
                e.decref(sin);
            }
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
        let mut count = 0usize;
        let named = |e: &Engine, module: u32| {
            let path = e.tags.module_path(module);
            lora.targets(path.rsplit('.').next().unwrap_or(&path))
        };
        for node in &mut self.nodes {
            let Node::Leaf(leaf) = node else {
                continue;
            };
            for proj in leaf.projections(|l| named(e, l.module)) {
                let path = e.tags.module_path(proj.base.module).to_string();
                if !lora.targets(path.rsplit('.').next().unwrap_or(&path)) {
                    continue;
                }
                let (fout, fin) = e.linear_dims(proj.base.w);
                // A bitsandbytes base: PEFT 0.21.2 moves the adapters to
                // the base's `compute_dtype` where it has one (a
                // `Linear4bit`, tuners_utils.py:2163-2164, 2209-2210), to
                // be upcast below; an int8 base's weight is no float, so
                // they stay in `nn.Linear`'s fp32 (lora_bnb.rs).
                let quantized = e.bnb.weights.get(&proj.base.w).map(|q| match q.layer {
                    QuantLayer::FourBit(q4) => q4.compute_dtype,
                    QuantLayer::EightBit => None,
                });
                let model_dtype = e.param_dtype;
                if let Some(compute) = quantized {
                    e.param_dtype = compute.unwrap_or(DType::F32);
                }
                let adapter = e.new_adapter(&path, fin, fout, lora, params);
                e.param_dtype = model_dtype;
                let adapter = adapter?;
                count += 1;
                let half_compute = matches!(quantized, Some(Some(d)) if d.is_half());
                if quantized.is_none() || half_compute {
                    adapters.push(adapter.clone());
                }
                proj.adapter = Some(adapter);
            }
        }
        if e.upcasts_adapters() {
            for a in &adapters {
                e.upcast_adapter(a)?;
            }
        }
        if count == 0 {
            return Err(EngineError::Program(format!(
                "lora: no projection is named {} (target_modules match the last part of a module path, e.g. q_proj)",
                lora.target_modules.join(", ")
            )));
        }
        Ok(())
    }
}

impl Engine {
    /// `BertEmbeddings.forward` (models.md §8.1).
    pub(super) fn bert_embeddings(
        &mut self,
        b: &BertEmbeddings,
        ids: TensorId,
    ) -> Result<TensorId> {
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
