//! `LlamaForCausalLM` and its copies (Mistral, Qwen2, SmolLM2): embeddings,
//! decoder layers, final RMSNorm, a tied or untied lm_head (models.md §5.1),
//! optionally with PEFT LoRA adapters (§6).

use super::super::config::RopeScope;
use super::super::dtype::DType;
use super::super::error::{EngineError, Result};
use super::super::presets_hf::DecoderLm;
use super::super::shape::Shape;
use super::super::tag::Category;
use super::super::tensor::{Layout, TensorId};
use super::super::Engine;
use super::decoder::{DecoderLayer, RmsNorm, Rope};
use super::lora::Proj;
use super::{Embedding, Linear};

#[derive(Debug)]
pub(crate) struct DecoderModel {
    pub embed: Embedding,
    pub layers: Vec<DecoderLayer>,
    pub norm: RmsNorm,
    /// None: tied to `embed`.
    pub lm_head: Option<Linear>,
    pub head_module: u32,
    pub rotary_module: u32,
    pub inv_freq: TensorId,
}

impl DecoderModel {
    /// Parameters in `.to("cuda")` order: embed_tokens, each layer's
    /// self_attn (q, k, v, o), mlp (gate, up, down), input_layernorm,
    /// post_attention_layernorm; norm; the rotary buffer; lm_head. LoRA
    /// adapters are made afterwards (`get_peft_model` on the loaded model),
    /// and every base parameter is frozen.
    pub fn build(
        e: &mut Engine,
        spec: &DecoderLm,
        params: &mut Vec<TensorId>,
        buffers: &mut Vec<(String, TensorId)>,
    ) -> Result<DecoderModel> {
        check_spec(spec)?;
        let (h, d) = (spec.hidden, spec.head_dim());
        let embed = e.new_embedding("model.embed_tokens", spec.vocab, h, params)?;
        let mut layers = Vec::new();
        for n in 0..spec.layers {
            layers.push(DecoderLayer::build(
                e,
                &format!("model.layers.{n}"),
                spec,
                params,
            )?);
        }
        let norm = new_rms_norm(e, "model.norm", h, params)?;
        let rotary_module = e.tags.module("model.rotary_emb");
        let inv_freq = e.new_inv_freq(rotary_module, d, buffers, "model.rotary_emb.inv_freq")?;
        let lm_head = if spec.tied {
            None
        } else {
            Some(e.new_linear("lm_head", h, spec.vocab, false, params)?)
        };
        let mut m = DecoderModel {
            embed,
            layers,
            norm,
            lm_head,
            head_module: e.tags.module("lm_head"),
            rotary_module,
            inv_freq,
        };
        if let Some(lora) = &spec.lora {
            for p in params.iter() {
                e.t_mut(*p).requires_grad = false;
            }
            m.add_adapters(e, lora, params)?;
        }
        Ok(m)
    }

    fn add_adapters(
        &mut self,
        e: &mut Engine,
        lora: &super::super::presets_hf::LoraSpec,
        params: &mut Vec<TensorId>,
    ) -> Result<()> {
        for (n, l) in self.layers.iter_mut().enumerate() {
            let p = format!("model.layers.{n}");
            let projs: [(&str, &mut Proj); 7] = [
                ("self_attn.q_proj", &mut l.attn.q),
                ("self_attn.k_proj", &mut l.attn.k),
                ("self_attn.v_proj", &mut l.attn.v),
                ("self_attn.o_proj", &mut l.attn.o),
                ("mlp.gate_proj", &mut l.mlp.gate),
                ("mlp.up_proj", &mut l.mlp.up),
                ("mlp.down_proj", &mut l.mlp.down),
            ];
            for (name, proj) in projs {
                let short = name.rsplit('.').next().unwrap_or(name);
                if !lora.targets(short) {
                    continue;
                }
                let ws = e.shape(proj.base.w);
                let (fout, fin) = (ws.dim(0), ws.dim(1));
                let ad = e.new_adapter(&format!("{p}.{name}"), fin, fout, lora, params)?;
                proj.adapter = Some(ad);
            }
        }
        Ok(())
    }

    /// `LlamaForCausalLM.forward(input_ids)` up to the logits [B, T, V].
    pub fn forward(&self, e: &mut Engine, ids: TensorId) -> Result<TensorId> {
        let mark = e.locals.len();
        let r = self.forward_body(e, ids);
        if r.is_err() {
            e.unwind_locals(mark);
        }
        r
    }

    fn forward_body(&self, e: &mut Engine, ids: TensorId) -> Result<TensorId> {
        let t = e.shape(ids).dim(1);
        let embeds = e.in_module(self.embed.module, |e| e.embedding(self.embed.w, ids))?;
        // cache_position = arange(T); position_ids = cache_position.unsqueeze(0).
        let cache_position = e.factory(Shape::new(&[t]), DType::I64, Category::Activation)?;
        let position_ids = e.view_as(cache_position, Shape::new(&[1, t]), Layout::Contiguous);
        let shared = match e.cfg.hf_rope_scope {
            RopeScope::Model => {
                let dtype = e.dtype(embeds);
                Some(e.in_module(self.rotary_module, |e| {
                    e.rotary_cos_sin(self.inv_freq, position_ids, dtype)
                })?)
            }
            RopeScope::Layer => None,
        };
        let rope = match shared {
            Some((cos, sin)) => Rope::Shared { cos, sin },
            None => Rope::PerLayer {
                inv_freq: self.inv_freq,
                position_ids,
            },
        };
        let mut x = e.local_ref(embeds);
        for l in &self.layers {
            let y = e.decoder_layer(l, x, rope);
            x = e.rebind(x, y)?;
        }
        let y = e.apply_rms_norm(&self.norm, x);
        x = e.rebind(x, y)?;
        // LlamaModel.forward's frame goes: position_ids, inputs_embeds,
        // cache_position, then position_embeddings.
        e.release(position_ids);
        e.release(embeds);
        e.release(cache_position);
        if let Some((cos, sin)) = shared {
            e.release(cos);
            e.release(sin);
        }
        let w = self.lm_head.as_ref().map_or(self.embed.w, |l| l.w);
        let logits = e.in_module(self.head_module, |e| e.linear(x, w, None));
        e.rebind(x, logits)
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

pub(crate) fn check_spec(spec: &DecoderLm) -> Result<()> {
    let bad = |m: String| Err(EngineError::Program(m));
    if spec.heads == 0 || spec.kv_heads == 0 || !spec.heads.is_multiple_of(spec.kv_heads) {
        return bad(format!(
            "heads ({}) must be a multiple of kv_heads ({})",
            spec.heads, spec.kv_heads
        ));
    }
    if !spec.head_dim().is_multiple_of(2) || spec.head_dim() == 0 {
        return bad(format!(
            "head_dim ({}) must be even for rotary embeddings",
            spec.head_dim()
        ));
    }
    if let Some(t) = spec.lora.as_ref().and_then(|l| l.unknown_target()) {
        return bad(format!(
            "lora target_modules: `{t}` is not a projection of a decoder layer (one of {})",
            super::super::presets_hf::LORA_TARGETS.join(", ")
        ));
    }
    if spec.lora.as_ref().is_some_and(|l| l.r == 0) {
        return bad("lora r must be at least 1".into());
    }
    Ok(())
}
