//! bitsandbytes' layers against its own rules (models.md §13), each
//! expected figure computed here from the rule as bitsandbytes states it:
//! its docstrings' "two 4-bit values a byte" and "one absmax per block",
//! the QLoRA paper's double-quantisation arithmetic, and the Hugging Face
//! configs' shapes.

use super::super::bnb::{QuantLayer, QuantType, Quantization};
use super::super::model_lang::{LangModel, ModelInput, Module};
use super::super::tag::Category;
use super::super::{DType, GpuArch, LossKind, ModelKind, Shape, TensorId};
use super::*;

fn h100() -> EngineConfig {
    EngineConfig {
        gpu_arch: Some(GpuArch::Sm90),
        device_bytes: 80 << 30,
        ..EngineConfig::default()
    }
}

fn linear4bit(input: u64, out: u64, double_quant: bool) -> Module {
    Module::Linear4bit {
        input,
        out,
        bias: false,
        quant_type: QuantType::NF4,
        blocksize: 64,
        double_quant,
        compute_dtype: Some(DType::BF16),
    }
}

fn one_layer(net: Module, input: u64, dtype: DType) -> ModelConfig {
    ModelConfig {
        loss: LossKind::Sum,
        param_dtype: dtype,
        ..ModelConfig::modules(LangModel::new(ModelInput::Features(input), net), 8)
    }
}

/// A [rows, n] input that requires grad and has a history (as a layer's
/// input inside a model does).
fn input(e: &mut Engine, dims: &[u64], dtype: DType) -> TensorId {
    let x = e
        .factory(Shape::new(dims), dtype, Category::Activation)
        .expect("x");
    e.t_mut(x).requires_grad = true;
    e.mul_scalar(x).expect("x * 1")
}

/// What a 4096 × 4096 NF4 weight leaves on the GPU once loaded: the
/// packed weight (4 bits a value), and per block of 64 one fp32 absmax —
/// or, with double quantisation, one uint8 plus one fp32 per 256 blocks,
/// the 16-value fp32 code, the 256-value map's copy and the 0-dim offset,
/// and bitsandbytes' one process-wide dynamic map (bytes requested and
/// not freed by the build).
#[test]
fn a_4bit_weight_costs_half_a_byte_plus_its_block_state() {
    let (o, i) = (4096u64, 4096u64);
    let n = o * i;
    let blocks = n / 64;
    for double_quant in [false, true] {
        let mut e = engine_with(
            one_layer(linear4bit(i, o, double_quant), i, DType::BF16),
            OptimizerConfig::adamw(),
            h100(),
        );
        let held: i64 = requests(&e.take_events()).iter().sum();
        let mut want = n / 2 + 16 * 4;
        if double_quant {
            want += blocks + blocks.div_ceil(256) * 4;
            want += 256 * 4 * 2 + 4;
        } else {
            want += blocks * 4;
        }
        assert_eq!(held as u64, want, "double_quant {double_quant}");
        // The weight counts as the Linear's 16.8 M values (PEFT's ×2).
        assert_eq!(e.num_params(), n);
        // The bf16 original was on the GPU while it was quantised.
        assert!(e.peak_allocated_bytes() >= want + n * 2);
    }
}

/// LLM.int8: one byte a value and one fp32 scale a row.
#[test]
fn an_8bit_weight_costs_a_byte_plus_a_row_scale() {
    let (o, i) = (11_008u64, 4096u64);
    let net = Module::Linear8bitLt {
        input: i,
        out: o,
        bias: false,
    };
    let mut e = engine_with(
        one_layer(net, i, DType::F16),
        OptimizerConfig::adamw(),
        h100(),
    );
    let r = requests(&e.take_events());
    // The fp16 original first, then the scales, the int8 rows; the original goes.
    let (w16, scb, cb) = ((o * i * 2) as i64, (o * 4) as i64, (o * i) as i64);
    assert_eq!(r, vec![w16, scb, cb, -w16]);
}

/// `MatMul4Bit.forward` dequantises the whole weight to the compute dtype
/// for its matmul and frees it before returning; it keeps nothing of the
/// input (bitsandbytes ≥ 0.43.2) unless `bnb_keeps_input` says the older
/// release runs, when the input stays as long as the graph. Backward
/// dequantises again, in the weight's original dtype.
#[test]
fn the_4bit_forward_dequantises_a_temporary_and_keeps_the_input_only_before_0_43_2() {
    let (o, i, rows) = (2048u64, 1024u64, 256u64);
    let w_bf16 = (o * i * 2) as i64;
    for keeps in [false, true] {
        let cfg = EngineConfig {
            bnb_keeps_input: keeps,
            ..h100()
        };
        let mut e = Engine::bare(cfg).expect("engine");
        e.param_dtype = DType::BF16;
        let mut params = Vec::new();
        let l = e
            .new_quant_linear(
                "fc",
                i,
                o,
                false,
                QuantLayer::FourBit(super::super::bnb::Quant4 {
                    quant_type: QuantType::NF4,
                    blocksize: 64,
                    double_quant: true,
                    compute_dtype: Some(DType::BF16),
                }),
                &mut params,
            )
            .expect("linear");
        let x = input(&mut e, &[rows, i], DType::BF16);
        // A first call makes cuBLAS's workspace.
        let warm = e.linear(x, l.w, None).expect("warm-up");
        e.release(warm);
        e.take_events();
        let before = e.allocated_bytes();
        let y = e.linear(x, l.w, None).expect("forward");
        let r = requests(&e.take_events());
        // fp32 absmax twice (dequantised, then + offset), the weight, the output.
        let absmax = (o * i / 64 * 4) as i64;
        let out = (rows * o * 2) as i64;
        assert_eq!(&r[..4], &[absmax, absmax, w_bf16, out], "{r:?}");
        assert!(r.contains(&-w_bf16), "the weight is freed: {r:?}");
        e.keep(y);
        e.release(x);
        // The output came; the input the caller dropped went, unless old
        // bitsandbytes keeps it.
        let x_bytes = round512(rows * i * 2);
        let want = before + round512(out as u64) - if keeps { 0 } else { x_bytes };
        assert_eq!(e.allocated_bytes(), want, "keeps {keeps}");
        let loss = e.sum(y).expect("sum");
        e.take_events();
        e.backward(loss, false).expect("backward");
        let r = requests(&e.take_events());
        assert!(r.contains(&w_bf16) && r.contains(&-w_bf16), "{r:?}");
    }
}

/// `MatMul8bitLt` keeps its input on `ctx` in every release.
#[test]
fn the_8bit_forward_keeps_its_input() {
    let (o, i, rows) = (1024u64, 512u64, 128u64);
    let mut e = Engine::bare(h100()).expect("engine");
    e.param_dtype = DType::F16;
    let mut params = Vec::new();
    let l = e
        .new_quant_linear("fc", i, o, false, QuantLayer::EightBit, &mut params)
        .expect("linear");
    let x = input(&mut e, &[rows, i], DType::F16);
    let before = e.allocated_bytes();
    let y = e.linear(x, l.w, None).expect("forward");
    e.keep(y);
    e.release(x);
    // The output came and the dropped input stayed.
    assert_eq!(e.allocated_bytes() - before, round512(rows * o * 2));
}

/// The Hugging Face reference counts of Qwen2.5-0.5B (494,032,768, its
/// config's shapes) plus models.md §6.4's 8,798,208 adapter parameters;
/// the packed bytes are half the seven projections' weights, from the
/// config: q [896, 896] + bias, k and v [128, 896] + bias, o [896, 896],
/// gate and up [4864, 896], down [896, 4864], 24 layers.
#[test]
fn qwen_qlora_counts_as_transformers_and_peft_count_it() {
    let m = ModelConfig::preset("qwen2.5-0.5b-qlora").expect("preset");
    let mut small = m.clone();
    if let ModelKind::Modules(lm) = &mut small.kind {
        lm.input = ModelInput::Tokens { seq: 16 };
    }
    let e = engine_with(small, OptimizerConfig::adamw(), h100());
    assert_eq!(e.num_params(), 494_032_768 + 8_798_208);
    let trainable: u64 = e
        .parameters()
        .iter()
        .filter(|p| e.requires_grad(**p))
        .map(|p| e.shape(*p).numel())
        .sum();
    assert_eq!(trainable, 8_798_208);
    let (h, kv, i) = (896u64, 128u64, 4864u64);
    let weights = h * h + kv * h * 2 + h * h + i * h * 3;
    let packed: u64 = e
        .parameters()
        .iter()
        .filter(|p| e.dtype(**p) == DType::U8)
        .map(|p| e.nbytes(*p))
        .sum();
    assert_eq!(packed, 24 * weights / 2);
    // prepare_model_for_kbit_training: nothing but the packed weights is
    // half precision before the first forward (which casts the biases back
    // to bf16, the compute dtype).
    assert!(e
        .parameters()
        .iter()
        .all(|p| matches!(e.dtype(*p), DType::U8 | DType::F32)));
}

/// A model-level `quantization` converts every Linear but the head.
#[test]
fn eight_bit_loading_spares_the_head() {
    let mut m = ModelConfig::preset("qwen2.5-0.5b").expect("preset");
    if let ModelKind::Modules(lm) = &mut m.kind {
        lm.input = ModelInput::Tokens { seq: 16 };
        lm.quantization = Some(Quantization::EightBit);
    }
    m.param_dtype = DType::F16;
    let e = engine_with(m, OptimizerConfig::adamw(), h100());
    let int8 = e
        .parameters()
        .iter()
        .filter(|p| e.dtype(**p) == DType::U8)
        .count();
    assert_eq!(int8, 24 * 7);
    assert_eq!(e.num_params(), 494_032_768);
}

/// bitsandbytes 0.50's fused 4-bit GEMM (`bnb_gemm_4bit: Fused`) at up to
/// 1,536 rows makes only the output; past that it dequantises as before.
#[test]
fn the_fused_4bit_gemm_makes_no_weight_temporary_up_to_1536_rows() {
    use super::super::bnb::BnbGemm4bit;
    let (o, i) = (2048u64, 1024u64);
    for (rows, fused) in [(1536u64, true), (1537, false)] {
        let cfg = EngineConfig {
            bnb_gemm_4bit: BnbGemm4bit::Fused,
            ..h100()
        };
        let mut e = Engine::bare(cfg).expect("engine");
        e.param_dtype = DType::BF16;
        let mut params = Vec::new();
        let q = super::super::bnb::Quant4 {
            quant_type: QuantType::NF4,
            blocksize: 64,
            double_quant: false,
            compute_dtype: Some(DType::BF16),
        };
        let l = e
            .new_quant_linear("fc", i, o, false, QuantLayer::FourBit(q), &mut params)
            .expect("linear");
        let x = input(&mut e, &[rows, i], DType::BF16);
        e.take_events();
        let y = e.linear(x, l.w, None).expect("forward");
        let r = requests(&e.take_events());
        let out = (rows * o * 2) as i64;
        if fused {
            assert_eq!(r, vec![out], "{rows} rows");
        } else {
            assert_eq!(&r[..2], &[(o * i * 2) as i64, out], "{rows} rows");
        }
        e.keep(y);
    }
}
