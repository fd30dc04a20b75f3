//! Small text helpers shared by the analyses and the renderers.

use crate::engine::DType;

pub use crate::units::signed_size;

/// PyTorch-ish short dtype names (`fp32`, `int64`).
pub fn dtype(d: DType) -> &'static str {
    match d {
        DType::F64 => "fp64",
        DType::F32 => "fp32",
        DType::F16 => "fp16",
        DType::BF16 => "bf16",
        DType::F8 => "fp8",
        DType::I64 => "int64",
        DType::I32 => "int32",
        DType::I16 => "int16",
        DType::U8 => "uint8",
        DType::Bool => "bool",
    }
}

/// `256×1024`.
pub fn shape(s: &[u64]) -> String {
    if s.is_empty() {
        return "0-dim".into();
    }
    s.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("×")
}
