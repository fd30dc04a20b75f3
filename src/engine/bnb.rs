//! bitsandbytes' quantized Linear layers as memory (models.md §13):
//! `Linear4bit` (NF4/FP4, blockwise absmax, optional double quantisation)
//! and `Linear8bitLt` (LLM.int8: int8 rows and fp32 row scales), what their
//! weights and quantisation state weigh, and how a model asks for them
//! (`BitsAndBytesConfig`, transformers' `quantization_config`).
//!
//! Figures from bitsandbytes 0.50.2 (the newest release, 2026-08):
//! `backends/cuda/ops.py:384-392` (quantize_4bit: `blocks = -(n // -blocksize)`
//! fp32 absmax, then `((n + 1) // (itemsize * 2), 1)` packed storage),
//! `functional.py:929-960` (quantize_4bit: a 16-value fp32 code per weight,
//! `get_4bit_type` at `functional.py:772-859`; with `compress_statistics` the
//! absmax minus its mean is quantised again in blocks of 256,
//! `functional.py:613-686`: uint8 absmax, fp32 absmax of those blocks, a copy
//! of the 256-value dynamic map, and the 0-dim fp32 offset), and
//! `nn/modules.py:737-748` (`Int8Params._quantize`: int8 `CB` [out, in] and fp32
//! `SCB` [out]). The forward and backward rules are in `ops/bnb_matmul.rs`.

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::dtype::DType;
use super::tensor::TensorId;

/// bitsandbytes' default 4-bit block (`Params4bit.__new__`, nn/modules.py:230-231;
/// `quantize_4bit`, functional.py:917-918).
pub const BLOCKSIZE_4BIT: u64 = 64;
/// The nested (double) quantisation's block (`quantize_blockwise(_absmax -
/// offset, blocksize=256)`, functional.py:940).
pub const NESTED_BLOCKSIZE: u64 = 256;
/// Values in a 4-bit code (`get_4bit_type`: `assert data.numel() == 16`,
/// functional.py:857), fp32.
pub const CODE_4BIT_VALUES: u64 = 16;
/// Values in the 8-bit dynamic map the nested absmax uses
/// (`create_dynamic_map`, `assert len(data) == 2**total_bits`), fp32.
pub const DYNAMIC_MAP_VALUES: u64 = 256;
/// The block sizes `quantize_4bit` takes (functional.py:920-921).
pub const BLOCKSIZES: [u64; 8] = [32, 64, 128, 256, 512, 1024, 2048, 4096];

/// The rows up to which bitsandbytes 0.50's CUDA `gemm_4bit` may take its
/// fused kernel (`_gemm_4bit_custom_max_m`, backends/cuda/ops.py:926).
pub const FUSED_MAX_ROWS: u64 = 1536;

/// Engine switch `bnb_gemm_4bit`: how `MatMul4Bit.forward` multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum BnbGemm4bit {
    /// Dequantise the weight, then `F.linear` (every release before 0.50;
    /// 0.50's fallback past 1,536 rows or where its per-GPU table says so).
    #[default]
    Dequantize,
    /// 0.50's fused kernel at up to 1,536 rows: only the output is made.
    Fused,
}

/// `bnb_4bit_quant_type` / `Linear4bit(quant_type=…)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum QuantType {
    /// NormalFloat4 (QLoRA's type).
    NF4,
    /// 4-bit float, bitsandbytes' own default.
    FP4,
}

impl QuantType {
    pub fn name(self) -> &'static str {
        match self {
            QuantType::NF4 => "nf4",
            QuantType::FP4 => "fp4",
        }
    }
}

/// One 4-bit layer's settings: `Linear4bit(…, compute_dtype, compress_statistics,
/// quant_type)` and the block size of its `Params4bit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quant4 {
    pub quant_type: QuantType,
    pub blocksize: u64,
    /// `compress_statistics` (transformers: `bnb_4bit_use_double_quant`).
    pub double_quant: bool,
    /// `compute_dtype`; None: the first input's dtype when it is fp32 or bf16,
    /// else none (`Linear4bit.set_compute_type`, nn/modules.py:575-590).
    pub compute_dtype: Option<DType>,
}

/// What a model is loaded with (`BitsAndBytesConfig`, transformers'
/// `quantization_config`): every `nn.Linear` but the output head becomes a
/// bitsandbytes layer (`replace_with_bnb_linear`; `lm_head` is in
/// `modules_to_not_convert`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Quantization {
    /// `load_in_4bit=True`. Defaults as `BitsAndBytesConfig`'s: FP4, no
    /// double quantisation, fp32 compute.
    FourBit {
        #[serde(default = "fp4")]
        quant_type: QuantType,
        #[serde(default)]
        double_quant: bool,
        #[serde(default = "fp32")]
        compute_dtype: DType,
    },
    /// `load_in_8bit=True` (`has_fp16_weights=False`).
    EightBit,
}

fn fp4() -> QuantType {
    QuantType::FP4
}

fn fp32() -> DType {
    DType::F32
}

impl Quantization {
    /// The layer a converted `nn.Linear` becomes.
    pub fn layer(&self) -> QuantLayer {
        match self {
            Quantization::FourBit {
                quant_type,
                double_quant,
                compute_dtype,
            } => QuantLayer::FourBit(Quant4 {
                quant_type: *quant_type,
                blocksize: BLOCKSIZE_4BIT,
                double_quant: *double_quant,
                compute_dtype: Some(*compute_dtype),
            }),
            Quantization::EightBit => QuantLayer::EightBit,
        }
    }
}

/// A bitsandbytes Linear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantLayer {
    FourBit(Quant4),
    EightBit,
}

/// The bytes of one 4-bit weight of `n` values and its quantisation state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bytes4 {
    /// The packed weight: two values a byte, `ceil(n / 2)` (uint8 storage).
    pub packed: u64,
    /// Absmax per block: fp32, or uint8 under double quantisation.
    pub absmax: u64,
    /// The 16-value fp32 code.
    pub code: u64,
    /// Double quantisation only: the fp32 absmax of each 256-block of absmax.
    pub nested_absmax: u64,
    /// Double quantisation only: the state's own copy of the dynamic map.
    pub nested_code: u64,
    /// Double quantisation only: the 0-dim fp32 mean taken out first.
    pub offset: u64,
}

impl Bytes4 {
    pub fn state(&self) -> u64 {
        self.absmax + self.code + self.nested_absmax + self.nested_code + self.offset
    }
}

/// `ceil(a / b)` for b > 0.
pub fn blocks(a: u64, b: u64) -> u64 {
    a.div_ceil(b.max(1))
}

/// The bytes `quantize_4bit` leaves for a weight of `n` values.
pub fn bytes_4bit(n: u64, q: &Quant4) -> Bytes4 {
    let nblocks = blocks(n, q.blocksize);
    let f32b = DType::F32.size();
    let mut b = Bytes4 {
        packed: n.div_ceil(2),
        code: CODE_4BIT_VALUES * f32b,
        ..Bytes4::default()
    };
    if q.double_quant {
        b.absmax = nblocks;
        b.nested_absmax = blocks(nblocks, NESTED_BLOCKSIZE) * f32b;
        b.nested_code = DYNAMIC_MAP_VALUES * f32b;
        b.offset = f32b;
    } else {
        b.absmax = nblocks * f32b;
    }
    b
}

/// The bytes `Int8Params._quantize` leaves for a weight [out, in]: int8
/// `CB` and fp32 `SCB` (one scale per output row).
pub fn bytes_8bit(out: u64, input: u64) -> (u64, u64) {
    (
        out.saturating_mul(input),
        out.saturating_mul(DType::F32.size()),
    )
}

/// A quantised weight the engine holds: what it stands for and its state.
#[derive(Debug, Clone)]
pub(crate) struct QuantWeight {
    pub layer: QuantLayer,
    /// The weight as `nn.Linear` has it: [out, in].
    pub out: u64,
    pub input: u64,
    /// The dtype the weight had when it was quantised (`QuantState.dtype`).
    pub orig_dtype: DType,
    /// The state's tensors (absmax, code, nested absmax and code, offset;
    /// `SCB` for 8-bit), in the order they were made.
    pub state: Vec<TensorId>,
    /// `compute_dtype` once the first call has set it (`compute_type_is_set`).
    pub compute: Option<DType>,
}

impl QuantWeight {
    pub fn numel(&self) -> u64 {
        self.out.saturating_mul(self.input)
    }
}

/// The engine's bitsandbytes bookkeeping.
#[derive(Debug, Default)]
pub(crate) struct BnbState {
    /// Quantised weights by their (packed) parameter.
    pub weights: FxHashMap<TensorId, QuantWeight>,
    /// While a model is built under a `quantization_config`: the layer each
    /// new `nn.Linear` becomes.
    pub loading: Option<QuantLayer>,
    /// bitsandbytes' process-wide `name2qmap["dynamic"]`, made by the first
    /// nested quantisation (functional.py:654-656).
    pub dynamic_map: Option<TensorId>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bitsandbytes' storage rule, written from its docstrings rather than
    /// the code above: "packed 4-bit values" hold two values per byte, and
    /// each block of `blocksize` values has one absmax (fp32), or one uint8
    /// plus, per 256 of those, one fp32 (nested) — QLoRA paper §3 "Double
    /// Quantization": 32/64 + 8/64 + 32/(64·256) bits per parameter.
    #[test]
    fn four_bit_bytes_follow_the_qlora_paper_per_parameter() {
        let n = 4096u64 * 4096;
        let nf4 = |double_quant| Quant4 {
            quant_type: QuantType::NF4,
            blocksize: 64,
            double_quant,
            compute_dtype: None,
        };
        let plain = bytes_4bit(n, &nf4(false));
        let dq = bytes_4bit(n, &nf4(true));
        // 4 bits + 32/64 bits of absmax per parameter: 4.5 bits.
        assert_eq!((plain.packed + plain.absmax) * 8, n * 9 / 2);
        // Double quantisation: 8/64 + 32/(64·256) bits per parameter of
        // absmax state (the paper's 0.127 bits), here exactly.
        assert_eq!(
            (dq.absmax + dq.nested_absmax) * 8 * 64 * 256,
            n * (8 * 256 + 32)
        );
        assert_eq!(dq.code + dq.nested_code + dq.offset, 64 + 1024 + 4);
        // An odd count rounds the last byte and the last block up.
        let odd = bytes_4bit(65, &nf4(false));
        assert_eq!((odd.packed, odd.absmax), (33, 8));
    }

    #[test]
    fn eight_bit_keeps_a_byte_a_value_and_a_row_scale() {
        assert_eq!(bytes_8bit(11_008, 4096), (11_008 * 4096, 11_008 * 4));
    }
}
