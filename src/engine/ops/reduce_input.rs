//! What a reduction reads: ATen's `make_reduction_from_out_ty`
//! (aten/src/ATen/native/ReduceOpsUtils.h) reduces `self.to(in_dtype)`
//! whenever the input's dtype is not the one the reduction computes in, so
//! a sum of a bool or int32 tensor (int64 out) first copies its input.

use super::super::dtype::DType;
use super::super::error::Result;
use super::super::scratch::reduce::ReduceShape;
use super::super::tag::Category;
use super::super::tensor::TensorId;
use super::super::Engine;

/// The dtype a reduction into `out` reads its `input` as: the output's,
/// except that on the GPU a half-precision input summed into fp32 is read
/// as it is (`gpu_lowp_to_f32`, the one mixed pair ATen templates).
pub(crate) fn reduction_reads_as(input: DType, out: DType) -> DType {
    if input.is_half() && out == DType::F32 {
        input
    } else {
        out
    }
}

impl Engine {
    /// Reduce all of `x` into `out`, already allocated (the structured
    /// kernel's meta step makes the output first): the input's copy in the
    /// reduction's dtype where it differs, held by the TensorIterator until
    /// the kernel returns, and the reduction's scratch meanwhile. If either
    /// does not fit, `out` goes too.
    pub(crate) fn reduce_whole_into(&mut self, x: TensorId, out: TensorId) -> Result<TensorId> {
        let reads_as = reduction_reads_as(self.dtype(x), self.dtype(out));
        if reads_as == self.dtype(x) {
            let shape = self.full_reduction(x);
            return self.scratch_after(out, shape);
        }
        // `self.to(in_dtype)`: a dense copy, whatever the input's strides.
        let copy = match self.empty(self.shape(x), reads_as, Category::Temporary) {
            Ok(c) => c,
            Err(e) => {
                self.release(out);
                return Err(e);
            }
        };
        let shape = ReduceShape {
            outputs: 1,
            inputs_per_output: self.shape(x).numel(),
            contiguous_inputs: true,
            element_bytes: reads_as.size(),
        };
        let r = self.scratch_after(out, Some(shape));
        self.release(copy);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_half_input_into_fp32_is_read_as_it_is() {
        assert_eq!(reduction_reads_as(DType::Bool, DType::I64), DType::I64);
        assert_eq!(reduction_reads_as(DType::I32, DType::I64), DType::I64);
        assert_eq!(reduction_reads_as(DType::F16, DType::F32), DType::F16);
        assert_eq!(reduction_reads_as(DType::BF16, DType::F32), DType::BF16);
        assert_eq!(reduction_reads_as(DType::F32, DType::F32), DType::F32);
        assert_eq!(reduction_reads_as(DType::F16, DType::F16), DType::F16);
    }
}
