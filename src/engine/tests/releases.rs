//! Older releases (issue 42): PyTorch 2.0–2.1's `mean` keeping its input
//! (pytorch/pytorch #109876, fixed by PR #109935 in 2.2), flash attention's
//! CPU philox state before 2.7 (PR #146372), and transformers' `repeat_kv`
//! before GQA-aware SDPA (modeling_llama.py's `LlamaSdpaAttention` up to
//! 4.47; `sdpa_attention_forward` until PR #39412). Expected bytes are
//! written from those rules and models.md §1.1 / §11.1, not read from the
//! engine.

use super::super::config::TransformersVersion;
use super::super::modules::decoder::AttentionSpec;
use super::super::{DType, Engine, EngineConfig};
use super::requests;
use super::transformer::{decoder_layer_saved, h100, input, leaf, linear_weights, smollm2};

fn under(torch_minor: u32, transformers: Option<&str>) -> EngineConfig {
    EngineConfig {
        torch_minor: Some(torch_minor),
        transformers: transformers.map(|t| t.parse::<TransformersVersion>().expect("a release")),
        ..h100()
    }
}

#[test]
fn mean_keeps_its_input_in_2_0_and_2_1_and_not_from_2_2() {
    let (n, h) = (64u64, 256u64);
    for (minor, kept) in [(0, true), (1, true), (2, false), (11, false)] {
        let mut e = Engine::bare(under(minor, None)).expect("engine");
        let x = input(&mut e, &[n, h], DType::F32);
        let _m = e.mean(x).expect("x.mean()");
        let x2 = input(&mut e, &[n, h], DType::F32);
        let _v = e.mean_last_keepdim(x2).expect("x.mean(-1, keepdim=True)");
        // MeanBackward0 and MeanBackward1 each hold their [n, h] fp32 input.
        let expected = if kept { 2 * n * h * 4 } else { 0 };
        assert_eq!(e.saved_storage_bytes(), expected, "torch 2.{minor}");
    }
}

#[test]
fn hf_rms_norm_in_2_1_keeps_the_square_for_the_mean() {
    // models.md §1.1 regime P, with MeanBackward1 keeping P (the pow output).
    let mut e = Engine::bare(under(1, None)).expect("engine");
    let (n, h) = (64u64, 576u64);
    let w = leaf(&mut e, &[h], DType::BF16);
    let x = input(&mut e, &[n, h], DType::BF16);
    e.take_events();
    let _y = e.rms_norm(x, w).expect("norm");
    let r = requests(&e.take_events());
    let (big, row, half) = ((4 * n * h) as i64, (4 * n) as i64, (2 * n * h) as i64);
    // X32, P (kept: no free after the mean), M, E, R, E dies, Xh32, Xh, Y;
    // at return Xh32 and `variance` go.
    assert_eq!(
        r,
        vec![big, big, row, row, row, -row, big, half, half, -big, -row]
    );
    // §1.1's 6H + 4 per row, the weight, and P's 4H per row.
    assert_eq!(e.saved_storage_bytes(), n * (6 * h + 4) + 2 * h + n * 4 * h);
}

#[test]
fn a_llama_layer_under_2_1_and_transformers_4_40_saves_the_square_and_full_head_kv() {
    // SmolLM2's layer (H 576, I 1536, 9 query / 3 key-value heads, d 64),
    // regime A on the H100, T 256. PyTorch 2.1 tries flash first (cuDNN
    // attention comes first only from 2.11, models.md §4.4).
    let s = smollm2();
    let t = 256;
    let (h, i, d) = (s.hidden, s.intermediate, s.head_dim());
    let (heads, g) = (s.heads, s.kv_heads);
    let (_, saved) = decoder_layer_saved(under(1, Some("4.40")), &s, t, true);
    // §11.1: 26H + 4hd + 4gd + 8I + 4h + 8 per token, where SDPA's k and v
    // (bf16, 4gd) now have every head (4hd: repeat_kv's copies, §4.2), and
    // each of the two norms' MeanBackward1 keeps P, fp32 [N, H] (8H).
    let per_token = 26 * h + 8 * h + 4 * heads * d + 4 * heads * d + 8 * i + 4 * heads + 8;
    // Beside the activations: the fp32 cos/sin, the norm weights, the bf16
    // weight casts; flash's philox state is on the CPU before 2.7.
    let expected = t * per_token + 2 * t * d * 4 + 2 * 4 * h + 2 * linear_weights(&s);
    assert_eq!(saved, expected);
    // Against today's releases (cuDNN's seed and offset, 16 B, beside the
    // same tensors): the two terms, per token.
    let (_, today) = decoder_layer_saved(h100(), &s, t, true);
    let today_per_token = 26 * h + 4 * heads * d + 4 * g * d + 8 * i + 4 * heads + 8;
    assert_eq!(
        today,
        t * today_per_token + 2 * t * d * 4 + 2 * 8 + 2 * 4 * h + 2 * linear_weights(&s)
    );
    assert_eq!(saved + 16 - today, t * (8 * h + 4 * (heads - g) * d));
}

#[test]
fn todays_transformers_on_torch_2_4_repeats_inside_sdpa_attention_forward() {
    // `use_gqa_in_sdpa` needs torch ≥ 2.5: on 2.4 today's transformers
    // repeats too, so SDPA saves the same full-head k and v as 4.40 does.
    let s = smollm2();
    let t = 128;
    let (h, i, d, heads) = (s.hidden, s.intermediate, s.head_dim(), s.heads);
    let (_, saved) = decoder_layer_saved(under(4, None), &s, t, true);
    let per_token = 26 * h + 4 * heads * d + 4 * heads * d + 8 * i + 4 * heads + 8;
    assert_eq!(
        saved,
        t * per_token + 2 * t * d * 4 + 2 * 4 * h + 2 * linear_weights(&s)
    );
    // 2.5 passes `enable_gqa=True`: k and v keep their 3 heads.
    let (_, gqa) = decoder_layer_saved(under(5, None), &s, t, true);
    assert_eq!(saved - gqa, t * 4 * (heads - s.kv_heads) * d);
}

/// The requests of one attention layer (no rotary positions) under
/// autocast bf16: k and v are bf16 [1, g, T, d] views of their projections,
/// their copies [1, h, T, d].
fn kv_requests(cfg: EngineConfig) -> Vec<i64> {
    let (t, hidden, heads, g, d) = (64u64, 256u64, 8u64, 2u64, 32u64);
    let mut e = Engine::bare(cfg).expect("engine");
    e.param_dtype = DType::F32;
    let mut params = Vec::new();
    let attn = AttentionSpec::new(hidden, heads, Some(g), Some(d));
    let a =
        super::super::modules::decoder::Attention::build(&mut e, "attn", &attn, false, &mut params)
            .expect("attention");
    let x = input(&mut e, &[1, t, hidden], DType::F32);
    e.autocast_enter(DType::BF16);
    e.take_events();
    let _y = e.hf_attention(&a, x, None).expect("attention");
    requests(&e.take_events())
}

#[test]
fn the_old_module_lets_each_unrepeated_tensor_go_at_its_rebinding() {
    let (t, hidden, heads, g, d) = (64i64, 256i64, 8i64, 2i64, 32i64);
    let (copy, grouped) = (heads * t * d * 2, g * t * d * 2);
    // After the repeats: flash's output (bf16 [1, T, h, d]) and logsumexp
    // (fp32 [1, h, T]), o_proj's bf16 weight cast and its output.
    let after = [copy, heads * t * 4, hidden * hidden * 2, t * hidden * 2];
    // What follows v_proj's output, the last [1, T, g·d] bf16 allocation.
    let tail = |r: &[i64]| -> Vec<i64> {
        let v = r
            .iter()
            .rposition(|&x| x == grouped)
            .expect("v's projection");
        r[v + 1..].to_vec()
    };
    // 4.40's `key_states = repeat_kv(key_states, …)`: the copy, then the
    // projection's output that k viewed goes; the same for v.
    let old = kv_requests(under(1, Some("4.40")));
    let expected: Vec<i64> = [copy, -grouped, copy, -grouped]
        .into_iter()
        .chain(after)
        .collect();
    assert_eq!(tail(&old), expected, "{old:?}");
    // 4.50's `sdpa_attention_forward` repeats its own arguments: the layer
    // holds k and v until it returns (the copies stay saved by SDPA).
    let integration = kv_requests(under(1, Some("4.50")));
    let expected: Vec<i64> = [copy, copy]
        .into_iter()
        .chain(after)
        .chain([-grouped, -grouped])
        .collect();
    assert_eq!(tail(&integration), expected, "{integration:?}");
}
