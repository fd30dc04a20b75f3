//! The module language's rules for issue 42's Hugging Face families
//! (transformers 5.16.1, `hf_config/families.rs`): `Registered` (parameters
//! in `__init__`'s order, the forward in the tree's), `HfModel` (the
//! model's forward frame), Gemma's `ScaledEmbedding` and `(1 + weight)`
//! RMSNorm, and `HfAttention` under `use_cache`. Each expected sequence is
//! written from the transformers line it cites, not from the engine.

use super::super::model_lang::{ModelInput, Module};
use super::super::{DType, LossKind};
use super::*;

use super::lang::named;

fn lang(net: Module, input: ModelInput, batch: u64, dtype: DType) -> ModelConfig {
    ModelConfig {
        param_dtype: dtype,
        ..super::lang::lang(net, input, batch, LossKind::Sum)
    }
}

/// The requests of building `model` and of one forward (`out = model(x)`).
fn build_and_forward(model: ModelConfig, cfg: EngineConfig) -> (Vec<i64>, Vec<i64>) {
    let mut e = engine_with(model, OptimizerConfig::adamw(), cfg);
    let built = requests(&e.take_events());
    run(&mut e, &program(forward_steps(), 1));
    (built, requests(&e.take_events()))
}

#[test]
fn registered_allocates_in_its_order_and_runs_in_the_trees() {
    // Qwen3DecoderLayer.__init__ registers self_attn and mlp, then the
    // norms (modeling_qwen3.py:283-289); its forward runs the norm first.
    let body = Module::Sequential(vec![
        named("norm", Module::RMSNorm { dim: 8 }),
        named(
            "fc",
            Module::Linear {
                input: 8,
                out: 16,
                bias: true,
            },
        ),
    ]);
    let net = Module::Registered {
        order: vec!["fc".into(), "norm".into()],
        module: Box::new(body.clone()),
    };
    let (built, fwd) = build_and_forward(
        lang(net, ModelInput::Features(8), 2, DType::F32),
        EngineConfig::default(),
    );
    // fc.weight [16, 8], fc.bias [16], then norm.weight [8], fp32.
    assert_eq!(built, vec![512, 64, 32]);
    let (plain_built, plain_fwd) = build_and_forward(
        lang(body, ModelInput::Features(8), 2, DType::F32),
        EngineConfig::default(),
    );
    assert_eq!(plain_built, vec![32, 512, 64]);
    // The forward is the tree's either way.
    assert_eq!(fwd, plain_fwd);
}

#[test]
fn scaled_embedding_keeps_its_scale_buffer_and_multiplies() {
    // Gemma2TextScaledWordEmbedding (modeling_gemma2.py:343-349): the
    // weight, then `embed_scale = nn.Buffer(torch.tensor(embed_scale))`
    // (0-dim, the default dtype: bf16 in a bf16 model); the forward's
    // `super().forward(input_ids) * self.embed_scale.to(self.weight.dtype)`.
    let net = Module::Sequential(vec![named(
        "embed_tokens",
        Module::ScaledEmbedding { num: 100, dim: 8 },
    )]);
    let (built, fwd) = build_and_forward(
        lang(net, ModelInput::Tokens { seq: 4 }, 2, DType::BF16),
        EngineConfig::default(),
    );
    assert_eq!(built, vec![100 * 8 * 2, 2]);
    let t = 2 * 4 * 8 * 2; // [2, 4, 8] bf16
    assert_eq!(
        fwd[..4],
        [
            2 * 4 * 8, // the token ids, int64
            t,         // the embedding's output
            t,         // * embed_scale
            -t,        // the embedding's output, gone as the module returns
        ]
    );
}

#[test]
fn gemma_rms_norm_makes_its_sources_requests() {
    // Gemma2RMSNorm (modeling_gemma2.py:55-63) on a bf16 [2, 4, 8] input,
    // its bf16 weight [8]:
    //   output = self._norm(x.float())
    //     _norm: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
    //   output = output * (1.0 + self.weight.float())
    //   return output.type_as(x)
    let net = Module::Sequential(vec![
        named("emb", Module::Embedding { num: 100, dim: 8 }),
        named("norm", Module::GemmaRMSNorm { dim: 8 }),
    ]);
    let (_, fwd) = build_and_forward(
        lang(net, ModelInput::Tokens { seq: 4 }, 2, DType::BF16),
        EngineConfig::default(),
    );
    let (f32s, bf16s, rows, w) = (2 * 4 * 8 * 4, 2 * 4 * 8 * 2, 2 * 4 * 4, 8 * 4);
    let want = [
        2 * 4 * 8, // token ids
        bf16s,     // the embedding's output (x)
        f32s,      // x.float()
        f32s,      // .pow(2)
        rows,      // .mean(-1, keepdim=True)
        -f32s,     // the square, used
        rows,      // + self.eps
        -rows,     // the mean, used
        rows,      // torch.rsqrt(...)
        -rows,     // the sum, used
        f32s,      // x * rsqrt: `_norm` returns (x and rsqrt saved by the product)
        w,         // self.weight.float()
        w,         // 1.0 + ...
        -w,        // the weight's fp32 copy, used
        f32s,      // output * (1 + weight): saves both factors
        bf16s,     // .type_as(x)
        -f32s,     // the fp32 product, saved by nothing
        -bf16s,    // x = norm(x): the embedding's output, saved by nothing
    ];
    assert_eq!(fwd[..want.len()], want);
}

#[test]
fn hf_model_keeps_inputs_embeds_until_it_returns() {
    // Qwen3Model.forward binds `inputs_embeds = self.embed_tokens(input_ids)`
    // (modeling_qwen3.py:381) until it returns; a plain Sequential lets the
    // embedding's output go once the next module's output exists.
    let body = Module::Sequential(vec![
        named("emb", Module::Embedding { num: 100, dim: 8 }),
        named("act", Module::ReLU),
        named(
            "fc",
            Module::Linear {
                input: 8,
                out: 8,
                bias: false,
            },
        ),
    ]);
    let t = 2 * 4 * 8 * 4;
    let (_, framed) = build_and_forward(
        lang(
            Module::HfModel(Box::new(body.clone())),
            ModelInput::Tokens { seq: 4 },
            2,
            DType::F32,
        ),
        EngineConfig::default(),
    );
    let (_, plain) = build_and_forward(
        lang(body, ModelInput::Tokens { seq: 4 }, 2, DType::F32),
        EngineConfig::default(),
    );
    // ids, embedding, relu (saves its output), then the embedding goes in
    // the plain Sequential, after fc's output in the model's frame (the
    // cuBLAS workspace of fc's GEMM left out).
    let small = |r: Vec<i64>| -> Vec<i64> { r.into_iter().filter(|x| x.abs() <= t).collect() };
    assert_eq!(small(plain)[..4], [2 * 4 * 8, t, t, -t]);
    assert_eq!(small(framed)[..5], [2 * 4 * 8, t, t, t, -t]);
}

/// An embedding, Qwen3's fp32 rotary table and one `HfAttention` (hidden
/// 64, 4 heads of 16, `kv_heads`), with or without its q/k norms.
fn embedded_attention(kv_heads: u64, qk_norm: bool) -> Module {
    embedded_attention_masked(kv_heads, qk_norm, None)
}

/// [`embedded_attention`] whose rotary module says the model's forward
/// builds an unused sliding-window mask of this window.
fn embedded_attention_masked(kv_heads: u64, qk_norm: bool, window: Option<u64>) -> Module {
    Module::Sequential(vec![
        named("emb", Module::Embedding { num: 100, dim: 64 }),
        named(
            "rotary_emb",
            Module::RotaryEmbedding {
                head_dim: 16,
                float32: true,
                sliding: false,
                unused_sliding_mask: window,
            },
        ),
        named(
            "self_attn",
            Module::HfAttention {
                hidden: 64,
                heads: 4,
                kv_heads,
                head_dim: 16,
                bias: false,
                qk_norm,
                fused_qkv: false,
                sliding: false,
                gemma_qk_norm: false,
            },
        ),
    ])
}

#[test]
fn hf_attention_under_use_cache_copies_k_and_v() {
    // `key_states, value_states = past_key_values.update(...)`:
    // DynamicLayer.update's `torch.cat([self.keys, key_states], dim=-2)` onto
    // an empty tensor (cache_utils.py:144-145): a copy of k, then of v.
    let net = embedded_attention(2, true);
    let model = || lang(net.clone(), ModelInput::Tokens { seq: 8 }, 2, DType::BF16);
    let (_, without) = build_and_forward(model(), EngineConfig::default());
    let cached = EngineConfig {
        hf_use_cache: true,
        ..EngineConfig::default()
    };
    let (_, with) = build_and_forward(model(), cached);
    let kv = 2 * 2 * 8 * 16 * 2; // [B, kv_heads, T, head_dim] bf16
    let count = |r: &[i64], n: i64| r.iter().filter(|&&x| x == n).count();
    assert_eq!(count(&with, kv), count(&without, kv) + 2, "{with:?}");
    assert_eq!(with.len(), without.len() + 4, "two copies, two frees");
}

#[test]
fn hf_model_keeps_an_unused_sliding_mask_until_it_returns() {
    // Qwen2MoeModel.forward (transformers 5.16.1 modeling_qwen2_moe.py:
    // 479-499): the positions, then `create_sliding_window_causal_mask` of
    // window 0 into `causal_mask_mapping` (493-496), then the rotary
    // tables; the mask is a local of the forward, freed as it returns
    // before `inputs_embeds` (held by `mask_kwargs`, a later local).
    let net = |mask: Option<u64>| {
        let body = embedded_attention_masked(4, false, mask);
        let model = Module::HfModel(Box::new(body));
        lang(model, ModelInput::Tokens { seq: 16 }, 2, DType::BF16)
    };
    let v5 = EngineConfig {
        transformers: Some(super::super::transformers_release::TransformersVersion::new(5, 16)),
        hf_use_cache: true,
        ..EngineConfig::default()
    };
    let (_, without) = build_and_forward(net(None), v5.clone());
    let (_, with) = build_and_forward(net(Some(0)), v5.clone());
    // B 2, T 16: sdpa_mask's aranges (masking_utils.py:507-510), and_mask's
    // 0-dim, the overlay and its `&`, the causal comparison and its `&`
    // ([1, 1, 16, 16] bool: 256 B), then the aranges go.
    let made = [
        16, 8, 128, 128, -128, 128, 128, -128, 1, 128, 256, -128, 256, -256, -1, 256, 256, -256,
        -256, -16, -8, -128, -128,
    ];
    let at = with
        .windows(made.len())
        .position(|w| w == made)
        .unwrap_or_else(|| panic!("no mask made: {with:?}"));
    // The positions (`arange(T) + 0`, the arange gone) come before it.
    assert_eq!(with[..at], without[..at]);
    assert_eq!(with[at - 3..at], [128, 128, -128]);
    let mut rest = with[..at].to_vec();
    rest.extend_from_slice(&with[at + made.len()..]);
    let freed = rest
        .iter()
        .zip(&without)
        .position(|(a, b)| a != b)
        .expect("the mask is freed");
    assert_eq!(rest[freed], -256, "the mask goes: {rest:?}");
    // … before `position_ids` (`inputs_embeds` between them is saved by
    // the projections: no free).
    assert_eq!(without[freed], -128, "{without:?}");
    rest.remove(freed);
    assert_eq!(rest, without, "nothing else differs");
    // A 5.x rule: under 4.x (not read) the field changes nothing.
    let v4 = EngineConfig::default();
    assert_eq!(
        build_and_forward(net(Some(0)), v4.clone()).1,
        build_and_forward(net(None), v4).1
    );
}

/// The sizes of one training step's `ViewBackward0` allocations of an
/// `HfAttention` (B 2, T 8, 4 heads of 16, bf16) with `kv_heads`.
fn head_view_copies(kv_heads: u64, cfg: EngineConfig) -> Vec<u64> {
    let net = embedded_attention(kv_heads, false);
    let model = lang(net, ModelInput::Tokens { seq: 8 }, 2, DType::BF16);
    let mut e = engine_with(model, OptimizerConfig::adamw(), cfg);
    e.take_events();
    run(&mut e, &program(train_steps(), 1));
    let evs = e.take_events();
    let mut sizes: Vec<u64> = alloc_events(&evs)
        .into_iter()
        .filter(|a| a.action == Action::Alloc)
        .filter(|a| e.tags.info(a.tag).is_some_and(|t| t.op == "ViewBackward0"))
        .map(|a| a.size)
        .collect();
    sizes.sort_unstable();
    sizes
}

#[test]
fn hf_attention_head_views_copy_the_gradients_the_rotation_and_the_cache_lay_out_by_heads() {
    // `q_proj(x).view(B, T, n, d).transpose(1, 2)`: ViewBackward0 reshapes
    // its gradient (derivatives.yaml `view`), a copy when it comes back laid
    // out [B, n, T, d]. q's and k's do after `apply_rotary_pos_emb`'s
    // backward (rotate_half's two SliceBackward0 zeros, contiguous, arrive
    // before `q * cos`'s gradient: autograd runs later nodes first); v's
    // only when the cache's `torch.cat` copied v (the fused kernels give a
    // gradient its input's layout). One head reshapes as a view.
    let q = 2 * 8 * 64 * 2; // [B, T, 4 · 16] bf16
    let kv = 2 * 8 * 2 * 16 * 2; // [B, T, 2 · 16] bf16
    assert_eq!(head_view_copies(2, EngineConfig::default()), [kv, q]);
    let cached = || EngineConfig {
        hf_use_cache: true,
        ..EngineConfig::default()
    };
    assert_eq!(head_view_copies(2, cached()), [kv, kv, q]);
    assert_eq!(head_view_copies(1, cached()), [q]);
}
