//! The Hugging Face building blocks against models.md: §1 RMSNorm request
//! sequences, §11.1 / §11.2 saved bytes per layer, §5.4 loss peaks, §6 LoRA
//! and the presets' parameter counts (from the published configs, by hand).

use super::super::config::{HfRmsNorm, SdpaBackend};
use super::super::model_lang::{count as count_params, ModelInput};
use super::super::modules::bert::BertLayer;
use super::super::modules::decoder::{AttentionSpec, DecoderLayer, Rope};
use super::super::presets_hf::{DecoderLm, LoraSpec};
use super::super::tag::Category;
use super::super::{DType, GpuArch, Shape, TensorId};
use super::*;

pub(super) fn h100() -> EngineConfig {
    EngineConfig {
        gpu_arch: Some(GpuArch::Sm90),
        device_bytes: 80 << 30,
        ..EngineConfig::default()
    }
}

/// A leaf that requires grad.
pub(super) fn leaf(e: &mut Engine, dims: &[u64], dtype: DType) -> TensorId {
    let x = e
        .factory(Shape::new(dims), dtype, Category::Activation)
        .expect("x");
    e.t_mut(x).requires_grad = true;
    x
}

/// A tensor with history, as a layer input in the middle of a model (a
/// leaf would meet autocast's weight-cast cache, engine.md §6.2).
pub(super) fn input(e: &mut Engine, dims: &[u64], dtype: DType) -> TensorId {
    let x = leaf(e, dims, dtype);
    e.mul_scalar(x).expect("x * 1")
}

/// SmolLM2-135M's layer shape (models.md §11.1): H 576, I 1536, 9/3 heads.
pub(super) fn smollm2() -> DecoderLm {
    DecoderLm {
        hidden: 576,
        intermediate: 1536,
        layers: 1,
        heads: 9,
        kv_heads: 3,
        head_dim: None,
        vocab: 49_152,
        tied: true,
        qkv_bias: false,
        seq: 1024,
        lora: None,
        quantization: None,
        kbit_training: false,
    }
}

/// One decoder layer of `spec` on [1, T, H] in `dtype` with model-scope
/// cos/sin; returns the engine and the saved bytes.
pub(super) fn decoder_layer_saved(
    cfg: EngineConfig,
    spec: &DecoderLm,
    t: u64,
    amp: bool,
) -> (Engine, u64) {
    let mut e = Engine::bare(cfg).expect("engine");
    let dtype = if amp { DType::F32 } else { DType::BF16 };
    e.param_dtype = dtype;
    let mut params = Vec::new();
    let attn = AttentionSpec::new(spec.hidden, spec.heads, Some(spec.kv_heads), spec.head_dim);
    let l = DecoderLayer::build(
        &mut e,
        "layer",
        &attn,
        spec.intermediate,
        spec.qkv_bias,
        &mut params,
    )
    .expect("layer");
    let d = spec.head_dim();
    let inv = e
        .factory(Shape::new(&[d / 2]), DType::F32, Category::Buffer)
        .expect("inv_freq");
    let pos = e
        .factory(Shape::new(&[1, t]), DType::I64, Category::Activation)
        .expect("position_ids");
    let x = input(&mut e, &[1, t, spec.hidden], dtype);
    let (cos, sin) = e.rotary_cos_sin(inv, pos, dtype).expect("rotary");
    if amp {
        e.autocast_enter(DType::BF16);
    }
    let y = e
        .decoder_layer(&l, x, Rope::Shared { cos, sin })
        .expect("layer");
    let saved = e.saved_storage_bytes();
    assert!(e.requires_grad(y));
    (e, saved)
}

/// The layer's Linear weights (H·hd + 2·H·gd + hd·H + 3·H·I elements).
pub(super) fn linear_weights(s: &DecoderLm) -> u64 {
    let (h, i, d) = (s.hidden, s.intermediate, s.head_dim());
    2 * h * s.heads * d + 2 * h * s.kv_heads * d + 3 * h * i
}

#[test]
fn llama_layer_saves_11_1_regime_a() {
    let s = smollm2();
    let t = 1024;
    let (h, i, d) = (s.hidden, s.intermediate, s.head_dim());
    let (heads, g) = (s.heads, s.kv_heads);
    let (_, saved) = decoder_layer_saved(h100(), &s, t, true);
    // §11.1: 26H + 4hd + 4gd + 8I + 4h + 8 per token (30,380 B for SmolLM2).
    let per_token = 26 * h + 4 * heads * d + 4 * g * d + 8 * i + 4 * heads + 8;
    assert_eq!(per_token, 30_380);
    // Beside the activations: the shared fp32 cos/sin (2.1), cuDNN's seed
    // and offset (one int64 each, 4.5), the two norm weights (fp32, saved
    // by `weight * x̂`) and the bf16 weight casts the matmuls save (10.2).
    let cos_sin = 2 * t * d * 4;
    let expected = t * per_token + cos_sin + 2 * 8 + 2 * 4 * h + 2 * linear_weights(&s);
    assert_eq!(saved, expected);
}

#[test]
fn llama_layer_saves_11_1_regime_p() {
    let s = smollm2();
    let t = 256;
    let (h, i, d) = (s.hidden, s.intermediate, s.head_dim());
    let (heads, g) = (s.heads, s.kv_heads);
    let (_, saved) = decoder_layer_saved(h100(), &s, t, false);
    // §11.1 variant P: 16H + 4hd + 4gd + 8I + 4h + 8 (24,620 B for SmolLM2).
    let per_token = 16 * h + 4 * heads * d + 4 * g * d + 8 * i + 4 * heads + 8;
    assert_eq!(per_token, 24_620);
    // bf16 cos/sin; the weights themselves (bf16) are what the matmuls save.
    let expected = t * per_token + 2 * t * d * 2 + 2 * 8 + 2 * 2 * h + 2 * linear_weights(&s);
    assert_eq!(saved, expected);
}

#[test]
fn fused_rms_norm_saves_only_rstd_11_1_variant() {
    let s = smollm2();
    let t = 128;
    let (h, i, d) = (s.hidden, s.intermediate, s.head_dim());
    let cfg = EngineConfig {
        hf_rmsnorm: HfRmsNorm::TorchFused,
        ..h100()
    };
    let (_, saved) = decoder_layer_saved(cfg, &s, t, true);
    // §11.1: 18H + 4hd + 4gd + 8I + 4h + 8 (25,772 B).
    let per_token = 18 * h + 4 * s.heads * d + 4 * s.kv_heads * d + 8 * i + 4 * s.heads + 8;
    assert_eq!(per_token, 25_772);
    let expected = t * per_token + 2 * t * d * 4 + 2 * 8 + 2 * 4 * h + 2 * linear_weights(&s);
    assert_eq!(saved, expected);
}

#[test]
fn hf_rms_norm_regime_p_allocates_as_1_1_says() {
    let mut e = Engine::bare(h100()).expect("engine");
    let (n, h) = (64u64, 576u64);
    let w = leaf(&mut e, &[h], DType::BF16);
    let x = input(&mut e, &[n, h], DType::BF16);
    e.take_events();
    let y = e.rms_norm(x, w).expect("norm");
    let r = requests(&e.take_events());
    let (big, row) = ((4 * n * h) as i64, (4 * n) as i64);
    let half = (2 * n * h) as i64;
    // X32, P, M, P dies after the mean, E, R, E dies, Xh32, Xh (bf16), Y;
    // at return Xh32 (not saved: the cast saves nothing) and `variance` go.
    assert_eq!(
        r,
        vec![big, big, row, -big, row, row, -row, big, half, half, -big, -row]
    );
    // Saved: X32 (pow, mul), R, Xh (weight multiply), the weight: 6H + 4 per row.
    assert_eq!(e.saved_storage_bytes(), n * (6 * h + 4) + 2 * h);
    assert_eq!(e.dtype(y), DType::BF16);
}

#[test]
fn frozen_norm_weight_leaves_x_hat_unsaved() {
    // §1.1: with the weight frozen, `weight * x̂` saves only the weight.
    let mut e = Engine::bare(h100()).expect("engine");
    let (n, h) = (32u64, 256u64);
    let w = e
        .factory(Shape::new(&[h]), DType::F32, Category::Parameter)
        .expect("w");
    let x = input(&mut e, &[n, h], DType::F32);
    let _y = e.rms_norm(x, w).expect("norm");
    // X (alias, saved by pow and mul), R, the weight.
    assert_eq!(e.saved_storage_bytes(), n * 4 * h + n * 4 + 4 * h);
}

#[test]
fn bert_layer_saves_11_2_regime_f() {
    let mut e = Engine::bare(h100()).expect("engine");
    let (h, i, heads, t, b) = (768u64, 3072u64, 12u64, 128u64, 2u64);
    let mut params = Vec::new();
    let l = BertLayer::build(&mut e, "layer", [h, i, heads], 0.1, &mut params).expect("layer");
    let x = input(&mut e, &[b, t, h], DType::F32);
    let _y = e.bert_layer(&l, x).expect("layer");
    let per_token = 34 * h + 8 * i + 4 * heads + 16;
    assert_eq!(per_token, 50_752);
    // Beside the activations: every weight (addmm saves mat2; LayerNorm its
    // weight and bias). Efficient attention's philox seed and offset are CPU
    // scalars outside graph capture (`_efficient_attention_forward`; the
    // H100's gpt_dropout trace holds none).
    let weights = 4 * (4 * h * h + 2 * h * i + 4 * h);
    assert_eq!(e.saved_storage_bytes(), b * t * per_token + weights);
}

#[test]
fn bert_layer_under_autocast_takes_flash_and_saves_11_2_amp() {
    let mut e = Engine::bare(h100()).expect("engine");
    let (h, i, heads, t) = (768u64, 3072u64, 12u64, 128u64);
    let mut params = Vec::new();
    let l = BertLayer::build(&mut e, "layer", [h, i, heads], 0.1, &mut params).expect("layer");
    let x = input(&mut e, &[1, t, h], DType::F32);
    e.autocast_enter(DType::BF16);
    let _y = e.bert_layer(&l, x).expect("layer");
    // §11.2 AMP: 26H + 4I + 4h + 16; flash's rng_state [2] and unused (8 B);
    // bf16 casts of the six weights; LayerNorm weights and biases (fp32).
    let per_token = 26 * h + 4 * i + 4 * heads + 16;
    assert_eq!(per_token, 32_320);
    let weights = 2 * (4 * h * h + 2 * h * i) + 4 * 4 * h;
    assert_eq!(e.saved_storage_bytes(), t * per_token + weights + 16 + 8);
}

#[test]
fn fp32_gqa_falls_to_math_with_repeated_heads() {
    // §4.4: fp32 GQA with enable_gqa → math, O(T²) scores.
    let mut e = Engine::bare(h100()).expect("engine");
    let (t, d) = (64u64, 64u64);
    let q = input(&mut e, &[1, 8, t, d], DType::F32);
    let k = input(&mut e, &[1, 2, t, d], DType::F32);
    let v = input(&mut e, &[1, 2, t, d], DType::F32);
    e.take_events();
    let _o = e.sdpa_hf(q, k, v, 0.0, true).expect("sdpa");
    let r = requests(&e.take_events());
    // repeat_interleave copies of k and v to 8 heads come first.
    let rep = (8 * t * d * 4) as i64;
    assert_eq!(&r[..2], &[rep, rep]);
    assert!(r.contains(&((8 * t * t * 4) as i64)), "fp32 scores {r:?}");
}

#[test]
fn bf16_gqa_takes_cudnn_with_g_head_gradients() {
    let mut e = Engine::bare(h100()).expect("engine");
    let (t, d) = (128u64, 64u64);
    let q = input(&mut e, &[1, 8, t, d], DType::BF16);
    let k = input(&mut e, &[1, 2, t, d], DType::BF16);
    let v = input(&mut e, &[1, 2, t, d], DType::BF16);
    e.take_events();
    let o = e.sdpa_hf(q, k, v, 0.0, true).expect("sdpa");
    // `_cudnn_attention_forward`: seed and offset first, then out
    // [1, T, 8, d] bf16, stats [1, 8, T] fp32 and the plan's 256 B
    // workspace, as the H100 captures show (captured/llama_lora_finetune).
    let out = (8 * t * d * 2) as i64;
    assert_eq!(
        requests(&e.take_events()),
        vec![8, 8, out, (8 * t * 4) as i64, 256, -256]
    );
    let loss = e.sum(o).expect("sum");
    e.take_events();
    e.backward(loss, false).expect("backward");
    let r = requests(&e.take_events());
    let (dq, dkv) = (out, (2 * t * d * 2) as i64);
    // The frontend's dQ accumulator and softmax sum (fp32), GQA's full-head
    // dK and dV (bf16), the plan's 256 B.
    let ws = (4 * 8 * t * d + 4 * 8 * t + 2 * 8 * t * d * 2 + 256) as i64;
    let at = r
        .windows(5)
        .position(|w| w == [dq, dkv, dkv, ws, -ws])
        .unwrap_or_else(|| panic!("dq, dk, dv (g heads), workspace in {r:?}"));
    assert!(at > 0);
}

#[test]
fn causal_loss_peaks_at_ten_v_per_token_and_twelve_in_backward() {
    // §5.2–5.4 with V = 128,256 on N = 2 × 64 tokens: bf16 logits 2V, their
    // fp32 copy 4V, log-probs 4V.
    let mut e = Engine::bare(h100()).expect("engine");
    let (b, t, v) = (2u64, 64u64, 128_256u64);
    let logits = input(&mut e, &[b, t, v], DType::BF16);
    let labels = e
        .factory(Shape::new(&[b, t]), DType::I64, Category::Input)
        .expect("labels");
    let base = e.allocated_bytes();
    e.alloc.reset_peak_stats();
    let loss = e.hf_causal_lm_loss(logits, labels).expect("loss");
    let n = b * t;
    let peak = e.peak_allocated_bytes() - base;
    // fp32 copy + log-probs (+ the padded and shifted labels and 0-dims).
    assert!(peak.abs_diff(n * 8 * v) < 1 << 20, "{peak}");
    // After the loss: the copy is gone, the log-probs stay saved.
    assert_eq!(e.saved_storage_bytes() - n * 8 - 4, n * 4 * v);
    e.alloc.reset_peak_stats();
    let before = e.allocated_bytes();
    e.backward(loss, false).expect("backward");
    let bwd_peak = e.peak_allocated_bytes() - before;
    // Log-probs (already counted in `before`) + zero-filled nll grad 4V +
    // log_softmax grad 4V, then the bf16 cast of it 2V.
    assert!(bwd_peak.abs_diff(n * 8 * v) < 1 << 20, "{bwd_peak}");
}

/// transformers ≤ 4.48's shift (`ShiftCopy`): at batch 1 `logits[..., :-1, :]`
/// and `labels[..., 1:]` are already contiguous, so `.contiguous()` copies
/// neither; at batch 2 both are copies.
#[test]
fn the_shift_copies_nothing_at_batch_1_and_both_at_batch_2() {
    use crate::engine::config::HfCausalLoss;
    let (t, v) = (64u64, 1000u64);
    for (b, copies) in [(1u64, false), (2, true)] {
        let mut e = Engine::bare(h100()).expect("engine");
        e.cfg.hf_causal_loss = HfCausalLoss::ShiftCopy;
        let logits = input(&mut e, &[b, t, v], DType::BF16);
        let labels = e
            .factory(Shape::new(&[b, t]), DType::I64, Category::Input)
            .expect("labels");
        e.take_events();
        e.hf_causal_lm_loss(logits, labels).expect("loss");
        let r = requests(&e.take_events());
        let logits_copy = (b * (t - 1) * v * 4) as i64;
        let labels_copy = (b * (t - 1) * 8) as i64;
        // the log-probs are as large as the shifted logits: one request of
        // that size is theirs, a second the copy
        let same_size = r.iter().filter(|x| **x == logits_copy).count();
        assert_eq!(same_size, if copies { 2 } else { 1 }, "b {b}: {r:?}");
        assert_eq!(r.contains(&labels_copy), copies, "b {b}: {r:?}");
    }
}

/// Forcing the memory-efficient kernel on grouped-query attention: 2.11's
/// kernel takes no `enable_gqa`, so PyTorch finds no kernel and raises; the
/// engine does too, instead of running with the smaller head count.
#[test]
fn forced_efficient_attention_refuses_grouped_heads() {
    let mut e = Engine::bare(h100()).expect("engine");
    e.cfg.sdpa_backend = Some(SdpaBackend::Efficient);
    let t = 64u64;
    let q = input(&mut e, &[1, 8, t, 64], DType::BF16);
    let k = input(&mut e, &[1, 2, t, 64], DType::BF16);
    let v = input(&mut e, &[1, 2, t, 64], DType::BF16);
    let err = e.sdpa_hf(q, k, v, 0.0, true).expect_err("no kernel");
    assert_eq!(
        err.to_string(),
        "RuntimeError: No available kernel. Aborting execution."
    );
    // the same heads on both sides run
    let k = input(&mut e, &[1, 8, t, 64], DType::BF16);
    let v = input(&mut e, &[1, 8, t, 64], DType::BF16);
    assert!(e.sdpa_hf(q, k, v, 0.0, true).is_ok());
}

#[test]
fn lora_freezes_the_base_and_counts_adapters_as_6_4() {
    // §6.4: Qwen2.5-0.5B, r = 16 on all seven projections: 8,798,208.
    let base = ModelConfig::preset("qwen2.5-0.5b").expect("preset");
    let lora = ModelConfig::preset("qwen2.5-0.5b-lora").expect("preset");
    let small = |mut m: ModelConfig| {
        if let super::super::ModelKind::Modules(lm) = &mut m.kind {
            lm.input = ModelInput::Tokens { seq: 16 };
        }
        m
    };
    let e0 = engine_with(small(base), OptimizerConfig::adamw(), h100());
    let e1 = engine_with(small(lora), OptimizerConfig::adamw(), h100());
    assert_eq!(e1.num_params() - e0.num_params(), 8_798_208);
    let trainable: u64 = e1
        .parameters()
        .iter()
        .filter(|p| e1.requires_grad(**p))
        .map(|p| e1.shape(*p).numel())
        .sum();
    assert_eq!(trainable, 8_798_208);
}

#[test]
fn presets_have_the_published_parameter_counts() {
    // From each config.json: V·H embeddings, per layer 2H (norms) +
    // H·hd + 2·H·gd + hd·H (attention) + 3·H·I (MLP), final norm H, an
    // untied head V·H; Qwen2 adds q/k/v biases.
    let count = |v: u64, h: u64, i: u64, l: u64, heads: u64, g: u64, tied: bool, bias: bool| {
        let d = h / heads;
        let b = if bias { heads * d + 2 * g * d } else { 0 };
        let layer = 2 * h + 2 * h * heads * d + 2 * h * g * d + 3 * h * i + b;
        v * h + l * layer + h + if tied { 0 } else { v * h }
    };
    let rows = [
        (
            "llama-3-8b",
            count(128_256, 4096, 14_336, 32, 32, 8, false, false),
        ),
        (
            "qwen2.5-0.5b",
            count(151_936, 896, 4864, 24, 14, 2, true, true),
        ),
        (
            "tinyllama-1.1b",
            count(32_000, 2048, 5632, 22, 32, 4, false, false),
        ),
        (
            "llama-3.2-1b",
            count(128_256, 2048, 8192, 16, 32, 8, true, false),
        ),
        (
            "mistral-7b",
            count(32_000, 4096, 14_336, 32, 32, 8, false, false),
        ),
    ];
    assert_eq!(rows[0].1, 8_030_261_248);
    assert_eq!(rows[1].1, 494_032_768);
    assert_eq!(rows[2].1, 1_100_048_384);
    assert_eq!(rows[3].1, 1_235_814_400);
    assert_eq!(rows[4].1, 7_241_732_096);
    for (name, n) in rows {
        let m = ModelConfig::preset(name).expect(name);
        let super::super::ModelKind::Modules(lm) = &m.kind else {
            panic!("{name} is not written in the language");
        };
        assert_eq!(count_params(&lm.net).parameters, n, "{name}");
    }
    // The language builds them with those counts too (the small ones).
    for name in ["qwen2.5-0.5b", "tinyllama-1.1b"] {
        let mut m = ModelConfig::preset(name).expect(name);
        if let super::super::ModelKind::Modules(lm) = &mut m.kind {
            lm.input = ModelInput::Tokens { seq: 8 };
        }
        let n = rows.iter().find(|r| r.0 == name).map(|r| r.1);
        assert_eq!(
            Some(engine_with(m, OptimizerConfig::adamw(), h100()).num_params()),
            n
        );
    }
    // BERT-base (§8): 109,482,240 with the pooler, + 1,538 for 2 labels.
    let bert = engine(ModelConfig::preset("bert-base").expect("bert"));
    assert_eq!(bert.num_params(), 109_482_240 + 1_538);
}

#[test]
fn a_small_llama_trains_end_to_end_and_frees_its_graph() {
    let mut lm = smollm2();
    lm.layers = 2;
    lm.seq = 64;
    lm.vocab = 1000;
    lm.lora = Some(LoraSpec {
        r: 8,
        alpha: 16.0,
        dropout: 0.1,
        target_modules: vec!["q_proj".into(), "v_proj".into()],
    });
    let m = ModelConfig {
        batch: 2,
        param_dtype: DType::BF16,
        ..ModelConfig::causal_lm(&lm)
    };
    let mut e = engine_with(m, OptimizerConfig::adamw(), h100());
    run(&mut e, &program(train_steps(), 2));
    assert_eq!(e.saved_storage_bytes(), 0);
    // Only adapters have grads: r·(H + hd) + r·(H + gd) per layer, fp32.
    let grads: u64 = e
        .parameters()
        .iter()
        .filter_map(|p| e.grad(*p))
        .map(|g| e.nbytes(g))
        .sum();
    assert_eq!(grads, 2 * 8 * (576 + 576 + 576 + 192) * 4);
}

#[test]
fn forcing_sdpa_math_still_runs_a_decoder_layer() {
    let cfg = EngineConfig {
        sdpa_backend: Some(SdpaBackend::Math),
        ..h100()
    };
    let (_, saved) = decoder_layer_saved(cfg, &smollm2(), 32, true);
    assert!(saved > 0);
}

#[test]
fn hf_config_fixtures_build_with_the_published_counts() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf");
    let read = |name: &str| {
        let path = std::path::PathBuf::from(format!("{dir}/{name}/config.json"));
        super::super::hf_config::read(&path).unwrap_or_else(|e| panic!("{e}"))
    };
    let params = |m: &ModelConfig| match &m.kind {
        super::super::ModelKind::Modules(lm) => count_params(&lm.net).parameters,
        _ => engine(m.clone()).num_params(),
    };
    // The same figures as the presets (Llama-3-8B and Qwen2.5-0.5B as the
    // brief gives them; the others from their configs by the §0.3 formula).
    assert_eq!(params(&read("llama-3-8b")), 8_030_261_248);
    assert_eq!(params(&read("qwen2.5-0.5b")), 494_032_768);
    assert_eq!(params(&read("mistral-7b")), 7_241_732_096);
    assert_eq!(params(&read("tinyllama-1.1b")), 1_100_048_384);
    // GPT-2 small: 12 blocks of 12d² + 13d, wte, wpe, ln_f (engine.md §10.2).
    assert_eq!(params(&read("gpt2")), 124_439_808);
    // The training sequence: max_position_embeddings, at most 2,048.
    let super::super::ModelKind::Modules(lm) = read("qwen2.5-0.5b").kind else {
        panic!("qwen2 is a language model");
    };
    assert_eq!(lm.input, ModelInput::Tokens { seq: 2048 });
}

#[test]
fn a_two_layer_llama_in_the_language_saves_11_1_per_layer_plus_the_head() {
    // SmolLM2's layer shape, 2 layers, V = 1,000, tied; autocast bf16 on
    // fp32 weights (regime A), T = 256, on the H100 (cuDNN attention).
    let mut lm = smollm2();
    lm.layers = 2;
    lm.vocab = 1000;
    lm.seq = 256;
    let (h, i, d, t, v) = (lm.hidden, lm.intermediate, lm.head_dim(), 256u64, 1000u64);
    let mut e = engine_with(
        ModelConfig::causal_lm(&lm),
        OptimizerConfig::adamw(),
        h100(),
    );
    let ids = e
        .factory(Shape::new(&[1, t]), DType::I64, Category::Input)
        .expect("ids");
    e.autocast_enter(DType::BF16);
    let model = e.model.take().expect("model");
    let out = model.forward(&mut e, ids, None).expect("forward");
    e.model = Some(model);
    assert_eq!(e.shape(out.0).dims(), &[1, t, v]);
    let layer = 26 * h + 4 * 9 * d + 4 * 3 * d + 8 * i + 4 * 9 + 8;
    // §11.1's head: the final norm's X, x̂ and rstd, and lm_head's bf16 cast.
    let head = 10 * h + 4;
    let per_token = 8 + 2 * layer + head;
    let constants = 2 * t * d * 4 // the shared fp32 cos/sin (2.1)
        + 2 * 2 * 8 // cuDNN seed and offset per layer
        + 2 * (2 * 4 * h + 2 * linear_weights(&lm)) // norm weights, weight casts
        + 4 * h // the final norm's weight
        + 2 * v * h; // the tied head's cached bf16 [V, H] (10.2)
    assert_eq!(e.saved_storage_bytes(), t * per_token + constants);
}

#[test]
fn every_gemm_gradient_costs_its_forward_even_through_head_views() {
    // fp32 with GQA takes the math backend (§4.4): attention is bmm GEMMs.
    // The embedding trains, so every GEMM operand needs its gradient, and
    // backward's GEMMs are exactly twice the forward's, although the q/k/v
    // projections' gradients arrive shaped [B, h, T, d].
    let mut lm = smollm2();
    lm.layers = 2;
    lm.vocab = 1000;
    lm.seq = 64;
    let m = ModelConfig {
        batch: 2,
        ..ModelConfig::causal_lm(&lm)
    };
    let mut e = engine_with(m, OptimizerConfig::adamw(), h100());
    run(&mut e, &program(train_steps(), 1));
    let w = e.work();
    use super::super::work::{MathUnit, WorkPart};
    let forward = w.flops(WorkPart::Forward, MathUnit::Fp32);
    // Per layer and token: q, o 2·H², k, v 2·H·(H/3), gate, up, down 3·H·I;
    // the head V·H; attention's two bmm T·H each.
    let (h, i, v, t, tokens) = (576u64, 1536u64, 1000u64, 64u64, 128u64);
    let per_token = 2 * (2 * h * h + 2 * h * h / 3 + 3 * h * i + 2 * t * h) + v * h;
    assert_eq!(forward, 2 * tokens * per_token);
    assert_eq!(w.flops(WorkPart::Backward, MathUnit::Fp32), 2 * forward);
}

/// The same forcing, written in a model, is refused by the analysis at the
/// `sdpa` field of the attention that has grouped heads (before anything
/// runs); with as many key/value heads as query heads it is accepted.
#[test]
fn forced_efficient_attention_on_grouped_heads_is_refused_where_it_is_written() {
    use super::super::model_lang::check::Problem;
    use super::super::model_lang::{LangModel, Module};
    let model = |kv_heads| {
        LangModel::new(
            ModelInput::Tokens { seq: 16 },
            Module::Sequential(vec![
                ("emb".into(), Module::Embedding { num: 100, dim: 256 }),
                (
                    "rot".into(),
                    Module::RotaryEmbedding {
                        head_dim: 64,
                        float32: false,
                        sliding: false,
                        unused_sliding_mask: None,
                    },
                ),
                (
                    "attn".into(),
                    Module::Attention {
                        hidden: 256,
                        heads: 4,
                        kv_heads: Some(kv_heads),
                        head_dim: None,
                        causal: true,
                        rotary: true,
                        bias: false,
                        dropout: 0.0,
                        sdpa: Some(SdpaBackend::Efficient),
                    },
                ),
            ]),
        )
    };
    let err = model(2).check(2, None).expect_err("grouped heads");
    assert_eq!((err.module.as_str(), err.field), ("attn", Some("sdpa")));
    assert_eq!(
        err.problem,
        Problem::EfficientGqa {
            heads: 4,
            kv_heads: 2
        }
    );
    assert!(model(4).check(2, None).is_ok());
}
