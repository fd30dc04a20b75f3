//! The `config.json` families of issue 42 as models in the language:
//! the mixtures of experts `mixtral`, `qwen2_moe`, `qwen3_moe`, and the
//! dense families people now tune, `qwen3`, `phi3`, `gemma2`,
//! `gemma3_text`, with transformers' module names (`model.layers.N.
//! self_attn.q_proj`, `…block_sparse_moe.experts.E.w1`). What a family does
//! that the language does not model is said in the notes the model view
//! prints, never left out silently; a MoE's routing is the language's
//! `Balanced` assumption, named as one.

use super::{Fields, HfConfigError, DEFAULT_SEQ};
use crate::engine::model_lang::hf_layers::GateAct;
use crate::engine::model_lang::moe::{Dispatch, ExpertKind, Routing};
use crate::engine::model_lang::{LangModel, ModelInput, Module};

/// The families this file reads.
pub(super) const FAMILIES: [&str; 7] = [
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "qwen3",
    "phi3",
    "gemma2",
    "gemma3_text",
];

/// A family's model and what of it is not modelled.
pub(super) struct Family {
    pub model: LangModel,
    pub notes: Vec<String>,
}

fn named(name: &str, m: Module) -> (String, Module) {
    (name.to_string(), m)
}

fn rms(dim: u64) -> Module {
    Module::RMSNorm { dim }
}

fn gemma_rms(dim: u64) -> Module {
    Module::GemmaRMSNorm { dim }
}

/// The shapes every family shares.
struct Shape {
    hidden: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    layers: u64,
    vocab: u64,
    tied: bool,
    seq: u64,
}

fn shape(f: &Fields, tied_default: bool) -> Result<Shape, HfConfigError> {
    let hidden = f.count("hidden_size")?;
    let heads = f.count("num_attention_heads")?;
    let kv_heads = f.opt_count("num_key_value_heads")?.unwrap_or(heads);
    let head_dim = match f.opt_count("head_dim")? {
        Some(d) => d,
        None if hidden.is_multiple_of(heads) => hidden / heads,
        None => {
            return Err(f.bad(
                "num_attention_heads",
                format!("{heads} does not divide hidden_size {hidden} (and there is no head_dim)"),
            ))
        }
    };
    if !heads.is_multiple_of(kv_heads) {
        return Err(f.bad(
            "num_key_value_heads",
            format!("{kv_heads} does not divide num_attention_heads {heads}"),
        ));
    }
    if !head_dim.is_multiple_of(2) {
        return Err(f.bad(
            "head_dim",
            format!("{head_dim} is odd: rotary positions split it in two"),
        ));
    }
    f.number("rms_norm_eps")?;
    f.number("rope_theta")?;
    let seq = f
        .opt_count("max_position_embeddings")?
        .map_or(DEFAULT_SEQ, |m| m.min(DEFAULT_SEQ));
    Ok(Shape {
        hidden,
        heads,
        kv_heads,
        head_dim,
        layers: f.layers("num_hidden_layers")?,
        vocab: f.count("vocab_size")?,
        tied: f.flag("tie_word_embeddings", tied_default)?,
        seq,
    })
}

/// A MoE family's experts: every layer sparse (`decoder_sparse_step` 1,
/// no `mlp_only_layers`), or refused.
fn all_sparse(f: &Fields) -> Result<(), HfConfigError> {
    if let Some(step) = f.opt_count("decoder_sparse_step")? {
        if step != 1 {
            return Err(f.bad(
                "decoder_sparse_step",
                format!(
                    "{step}: layers alternating dense and sparse MLPs are not modelled (only 1)"
                ),
            ));
        }
    }
    match f.map.get("mlp_only_layers") {
        None | Some(serde_json::Value::Null) => Ok(()),
        Some(serde_json::Value::Array(a)) if a.is_empty() => Ok(()),
        Some(_) => Err(f.bad(
            "mlp_only_layers",
            "dense layers among the sparse ones are not modelled (only an empty list)",
        )),
    }
}

/// Read one of [`FAMILIES`].
pub(super) fn read(f: &Fields) -> Result<Family, HfConfigError> {
    let gemma = matches!(f.model_type, "gemma2" | "gemma3_text");
    let s = shape(f, gemma)?;
    let h = s.hidden;
    let mut notes = Vec::new();
    // (bias, qk_norm, fused_qkv): the attention is made per layer below
    // (`sliding` differs between layers).
    let attn = |bias: bool, qk_norm: bool, fused_qkv: bool| (bias, qk_norm, fused_qkv);
    let dense = |f: &Fields, act: GateAct, fused: bool| -> Result<Module, HfConfigError> {
        Ok(Module::GatedMlp {
            hidden: h,
            intermediate: f.count("intermediate_size")?,
            act,
            fused,
        })
    };
    let moe = |f: &Fields,
               expert: ExpertKind,
               experts_field: &'static str,
               width_field: &'static str,
               norm: bool,
               shared: Option<u64>,
               experts_first: bool|
     -> Result<Module, HfConfigError> {
        all_sparse(f)?;
        let experts = f.count(experts_field)?;
        let top_k = f.count("num_experts_per_tok")?;
        if top_k > experts {
            return Err(f.bad(
                "num_experts_per_tok",
                format!("{top_k} is more than the {experts} experts"),
            ));
        }
        Ok(Module::SparseMoe {
            hidden: h,
            intermediate: f.count(width_field)?,
            experts,
            top_k,
            expert,
            norm_topk_prob: norm,
            shared_expert: shared,
            routing: Routing::Balanced,
            dispatch: Dispatch::Hf,
            router: "gate".into(),
            experts_first,
        })
    };
    // (attention, MLP, the MLP's name, Gemma's sandwich norms)
    let (attention, mlp, mlp_name, sandwich) = match f.model_type {
        "mixtral" => (
            attn(false, false, false),
            moe(
                f,
                ExpertKind::Mixtral,
                "num_local_experts",
                "intermediate_size",
                true,
                None,
                false,
            )?,
            "block_sparse_moe",
            false,
        ),
        "qwen2_moe" => {
            let norm = f.flag("norm_topk_prob", false)?;
            let shared = f.opt_count("shared_expert_intermediate_size")?;
            (
                attn(true, false, false),
                moe(
                    f,
                    ExpertKind::Qwen,
                    "num_experts",
                    "moe_intermediate_size",
                    norm,
                    shared,
                    false,
                )?,
                "mlp",
                false,
            )
        }
        "qwen3_moe" => {
            all_sparse(f)?;
            let norm = f.flag("norm_topk_prob", false)?;
            let bias = f.flag("attention_bias", false)?;
            (
                attn(bias, true, false),
                moe(
                    f,
                    ExpertKind::Qwen,
                    "num_experts",
                    "moe_intermediate_size",
                    norm,
                    None,
                    true,
                )?,
                "mlp",
                false,
            )
        }
        "qwen3" => (
            attn(f.flag("attention_bias", false)?, true, false),
            dense(f, GateAct::Silu, false)?,
            "mlp",
            false,
        ),
        "phi3" => (
            attn(false, false, true),
            dense(f, GateAct::Silu, true)?,
            "mlp",
            false,
        ),
        _ => {
            // gemma2, gemma3_text
            let qk = f.model_type == "gemma3_text";
            (
                attn(f.flag("attention_bias", false)?, qk, false),
                dense(f, GateAct::GeluTanh, false)?,
                "mlp",
                true,
            )
        }
    };
    // Gemma's norms are its own `(1 + weight)` ones.
    let norm = if gemma { gemma_rms } else { rms };
    let layer = |sliding: bool| {
        let (bias, qk_norm, fused_qkv) = attention;
        let self_attn = Module::HfAttention {
            hidden: h,
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: s.head_dim,
            bias,
            qk_norm,
            fused_qkv,
            sliding,
            gemma_qk_norm: qk_norm && f.model_type == "gemma3_text",
        };
        // The two residual halves of a decoder layer (no module of their own).
        let mut first = vec![
            named("input_layernorm", norm(h)),
            named("self_attn", self_attn),
        ];
        let mut second = Vec::new();
        if sandwich {
            first.push(named("post_attention_layernorm", norm(h)));
            second.push(named("pre_feedforward_layernorm", norm(h)));
            second.push(named(mlp_name, mlp.clone()));
            second.push(named("post_feedforward_layernorm", norm(h)));
        } else {
            second.push(named("post_attention_layernorm", norm(h)));
            second.push(named(mlp_name, mlp.clone()));
        }
        // `__init__` registers the attention and the MLP before the norms.
        let mut order = vec!["self_attn".to_string(), mlp_name.to_string()];
        order.extend(
            first
                .iter()
                .chain(&second)
                .map(|(n, _)| n.clone())
                .filter(|n| n.ends_with("layernorm")),
        );
        Module::Registered {
            order,
            module: Box::new(Module::Sequential(vec![
                named("", Module::Residual(Box::new(Module::Sequential(first)))),
                named("", Module::Residual(Box::new(Module::Sequential(second)))),
            ])),
        }
    };
    // One block repeated when every layer's cache is alike, else each.
    let sliding = sliding_layers(f, s.layers)?;
    let layers = if sliding.iter().all(|&x| x == sliding[0]) {
        Module::Repeat {
            n: s.layers,
            block: Box::new(layer(sliding.first().copied().unwrap_or(false))),
        }
    } else {
        Module::Sequential(
            sliding
                .iter()
                .enumerate()
                .map(|(i, &sl)| (i.to_string(), layer(sl)))
                .collect(),
        )
    };
    let (num, dim) = (s.vocab, h);
    let mut model = vec![named(
        "embed_tokens",
        if gemma {
            Module::ScaledEmbedding { num, dim }
        } else {
            Module::Embedding { num, dim }
        },
    )];
    // The model's forward makes the positions and the rotary tables before
    // the layers; `__init__` registers `rotary_emb` after the final norm.
    model.extend([
        named(
            "rotary_emb",
            Module::RotaryEmbedding {
                head_dim: s.head_dim,
                float32: true,
                // One table per layer type present (`sorted(set(layer_types))`).
                sliding: f.model_type == "gemma3_text"
                    && sliding.contains(&true)
                    && sliding.contains(&false),
                unused_sliding_mask: unused_sliding_mask(f)?,
            },
        ),
        named("layers", layers),
        named("norm", norm(h)),
    ]);
    let model = Module::Registered {
        order: ["embed_tokens", "layers", "norm", "rotary_emb"]
            .map(String::from)
            .to_vec(),
        module: Box::new(Module::HfModel(Box::new(Module::Sequential(model)))),
    };
    let net = vec![
        named("model", model),
        named(
            "lm_head",
            Module::LmHead {
                hidden: h,
                vocab: s.vocab,
                tied: s.tied,
                softcap: f
                    .map
                    .get("final_logit_softcapping")
                    .is_some_and(|v| v.is_number()),
            },
        ),
    ];
    notes.extend(family_notes(f));
    Ok(Family {
        model: LangModel::new(ModelInput::Tokens { seq: s.seq }, Module::Sequential(net)),
        notes,
    })
}

/// Which layers' caches are sliding-window ones, as
/// `get_layer_types_and_kwargs` (transformers 5.16.1 cache_utils.py:1706-1714)
/// reads the config: its `layer_types`; else the family's own default
/// (Gemma 2 every other layer from the first, configuration_gemma2.py:95-98;
/// Gemma 3 all but every `sliding_window_pattern`-th, default 6,
/// configuration_gemma3.py:108-115; Qwen only with `use_sliding_window`,
/// not modelled: full); else every layer when `sliding_window` is set
/// (Phi-3, Mixtral).
fn sliding_layers(f: &Fields, n: u64) -> Result<Vec<bool>, HfConfigError> {
    if let Some(v) = f.map.get("layer_types").filter(|v| !v.is_null()) {
        let types = v
            .as_array()
            .ok_or_else(|| f.bad("layer_types", "not a list"))?;
        if types.len() as u64 != n {
            return Err(f.bad(
                "layer_types",
                format!("{} entries for {n} layers", types.len()),
            ));
        }
        return types
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(f.bad(
                    "layer_types",
                    format!("{t}: only \"full_attention\" and \"sliding_attention\" are modelled"),
                )),
            })
            .collect();
    }
    let every = |pattern: u64| (1..=n).map(|i| i % pattern != 0).collect();
    Ok(match f.model_type {
        "gemma2" => every(2),
        "gemma3_text" => every(f.opt_count("sliding_window_pattern")?.unwrap_or(6).max(1)),
        "qwen3" | "qwen2_moe" | "qwen3_moe" => vec![false; n as usize],
        _ => {
            let set = f.map.get("sliding_window").is_some_and(|v| !v.is_null());
            vec![set; n as usize]
        }
    })
}

/// The window of the sliding-window mask the model's forward builds and no
/// layer takes: Qwen2-MoE's forward calls `create_sliding_window_causal_mask`
/// whatever its layers (transformers 5.16.1 modeling_qwen2_moe.py:493-496),
/// with `sliding_window` 0 when `use_sliding_window` is false
/// (configuration_qwen2_moe.py:111), when every layer is full attention.
fn unused_sliding_mask(f: &Fields) -> Result<Option<u64>, HfConfigError> {
    Ok((f.model_type == "qwen2_moe" && !f.flag("use_sliding_window", false)?).then_some(0))
}

/// Gemma's sliding-window layers (transformers 5.16.1 masking_utils.py
/// `_ignore_causal_mask_sdpa`: no mask while the keys are fewer than the
/// window).
const SLIDING: &str = "the sliding-window layers' mask is not modelled: at a sequence longer than `sliding_window` transformers builds one and SDPA runs with it (k and v repeated to every head); shorter, there is none, as modelled";

/// What transformers does for this config that the model leaves out.
fn family_notes(f: &Fields) -> Vec<String> {
    let mut notes = Vec::new();
    match f.model_type {
        "mixtral" | "qwen2_moe" | "qwen3_moe" => {
            notes.push(format!(
                "routing {} — a scenario's `routing: Counts(...)` gives measured counts",
                Routing::Balanced.describe()
            ));
            notes.push("under a `transformers:` 5.x scenario the experts are 5.x's: two 3-D parameters (`experts.gate_up_proj` [E, 2·I, H], `experts.down_proj` [E, H, I]) run by `grouped_mm` on every routed row, whatever the routing; otherwise 4.x's per-expert Linears (the same bytes), whose fp32 router softmax and cast back are not modelled for a half-precision model and whose `routing_weights /=` is modelled out of place".into());
            notes.push("grouped_mm's CUTLASS buffers (its argument arrays and workspace, taken and freed inside each call) and `torch.sort`'s cub scratch past 4,096 routed rows are not modelled".into());
            if f.model_type == "mixtral" {
                notes.push(
                    "the block is named `block_sparse_moe`, as 4.x names it; 5.x names it `mlp`"
                        .into(),
                );
            }
            if f.model_type == "qwen2_moe" && f.flag("use_sliding_window", false).unwrap_or(true) {
                notes.push("`use_sliding_window`: the sliding-window layers and the mask they take are not modelled (every layer is full attention, with no mask)".into());
            }
        }
        "gemma2" => {
            // transformers 5.16.1 picks SDPA for Gemma 2 (`_supports_sdpa`,
            // modeling_gemma2.py:360), whose path leaves the cap out.
            notes.push("attention logit soft-capping runs only in eager attention (`attn_implementation=\"eager\"`), which is not modelled: transformers' default, SDPA, leaves the cap out, as modelled".into());
            notes.push(SLIDING.into());
        }
        "gemma3_text" => {
            notes.push(SLIDING.into());
        }
        "phi3" if f.map.get("rope_scaling").is_some_and(|v| !v.is_null()) => {
            notes.push(
                "rope_scaling (LongRoPE's factors) is not modelled: the plain rotary table is"
                    .into(),
            );
        }
        _ => {}
    }
    notes
}
