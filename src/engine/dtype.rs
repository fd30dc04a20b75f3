//! Element types and their sizes (engine.md §1.1) and type promotion (§1.8).

use serde::{Deserialize, Serialize};

/// Storage dtypes the engine models. fp8 covers e4m3fn/e5m2 (1 B, §1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    F64,
    F32,
    F16,
    BF16,
    F8,
    I64,
    I32,
    I16,
    U8,
    Bool,
}

impl DType {
    /// Bytes per element (engine.md §1.1; bool is one byte, not bit-packed).
    pub const fn size(self) -> u64 {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::F8 | DType::U8 | DType::Bool => 1,
        }
    }

    pub const fn is_floating(self) -> bool {
        matches!(
            self,
            DType::F64 | DType::F32 | DType::F16 | DType::BF16 | DType::F8
        )
    }

    /// Autocast's lower-precision targets (engine.md §6.1).
    pub const fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// The `torch.<name>` of the dtype (`float32`, `int64`).
    pub fn torch_name(self) -> &'static str {
        match self {
            DType::F64 => "float64",
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F8 => "float8_e4m3fn",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::I16 => "int16",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }

    /// PyTorch's tensor type name as used in error messages (`torch.cuda.FloatTensor`).
    pub fn cuda_type_name(self) -> &'static str {
        match self {
            DType::F64 => "torch.cuda.DoubleTensor",
            DType::F32 => "torch.cuda.FloatTensor",
            DType::F16 => "torch.cuda.HalfTensor",
            DType::BF16 => "torch.cuda.BFloat16Tensor",
            DType::F8 => "torch.cuda.Float8_e4m3fnTensor",
            DType::I64 => "torch.cuda.LongTensor",
            DType::I32 => "torch.cuda.IntTensor",
            DType::I16 => "torch.cuda.ShortTensor",
            DType::U8 => "torch.cuda.ByteTensor",
            DType::Bool => "torch.cuda.BoolTensor",
        }
    }

    /// c10's name of the scalar type in error messages (`float`, `long int`).
    pub fn scalar_name(self) -> &'static str {
        match self {
            DType::F64 => "double",
            DType::F32 => "float",
            DType::F16 => "c10::Half",
            DType::BF16 => "c10::BFloat16",
            DType::F8 => "c10::Float8_e4m3fn",
            DType::I64 => "long int",
            DType::I32 => "int",
            DType::I16 => "short int",
            DType::U8 => "unsigned char",
            DType::Bool => "bool",
        }
    }

    /// The name a CUDA kernel's "not implemented for" error gives (`'Float'`).
    pub fn kernel_name(self) -> &'static str {
        match self {
            DType::F64 => "Double",
            DType::F32 => "Float",
            DType::F16 => "Half",
            DType::BF16 => "BFloat16",
            DType::F8 => "Float8_e4m3fn",
            DType::I64 => "Long",
            DType::I32 => "Int",
            DType::I16 => "Short",
            DType::U8 => "Byte",
            DType::Bool => "Bool",
        }
    }

    /// Result dtype of a binary elementwise op on two floating tensors: the wider
    /// one (fp16 + fp32 → fp32, engine.md §1.8).
    pub fn promote(a: DType, b: DType) -> DType {
        if a == b {
            return a;
        }
        let rank = |d: DType| match d {
            DType::F64 => 6,
            DType::F32 => 5,
            DType::BF16 | DType::F16 => 4,
            DType::F8 => 3,
            DType::I64 => 2,
            DType::I32 | DType::I16 => 1,
            DType::U8 | DType::Bool => 0,
        };
        match (a, b) {
            // fp16 + bf16 promotes to fp32 in PyTorch.
            (DType::F16, DType::BF16) | (DType::BF16, DType::F16) => DType::F32,
            _ if rank(a) >= rank(b) => a,
            _ => b,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DType;

    #[test]
    fn sizes_follow_table_1_1() {
        assert_eq!(DType::F32.size(), 4);
        assert_eq!(DType::F16.size(), 2);
        assert_eq!(DType::BF16.size(), 2);
        assert_eq!(DType::F8.size(), 1);
        assert_eq!(DType::I64.size(), 8);
        assert_eq!(DType::I32.size(), 4);
        assert_eq!(DType::Bool.size(), 1);
    }

    #[test]
    fn promotion_widens() {
        assert_eq!(DType::promote(DType::F16, DType::F32), DType::F32);
        assert_eq!(DType::promote(DType::F16, DType::BF16), DType::F32);
        assert_eq!(DType::promote(DType::BF16, DType::BF16), DType::BF16);
    }
}
