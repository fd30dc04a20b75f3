//! What CUDA's softmax kernels take beside their results, as the H100
//! sweeps showed them (`tests/fixtures/attention/math_h100_sweep.tsv`):
//! `_safe_softmax` (SDPA's math backend) builds a bool `x == -inf` mask, its
//! per-row `all` and a 0-dim zero after its result and frees them newest
//! first; the softmax backward (`SoftmaxBackward0`, `SafeSoftmaxBackward0`)
//! takes a temporary of the gradient's size after it. The engine's ops and a
//! traced program's both follow these.

use super::super::dtype::DType;
use super::super::shape::Shape;
use crate::engine::autograd::ScratchStep;

/// `_safe_softmax(x)`'s scratch for x of `shape` in `dtype`, in the order
/// it is made: the mask, the rows' `all`, the zero.
pub(crate) fn safe_softmax_scratch(shape: Shape, dtype: DType) -> [(Shape, DType); 3] {
    [
        (shape, DType::Bool),
        (shape.with_last(1), DType::Bool),
        (Shape::scalar(), dtype),
    ]
}

/// The same as steps: taken in order, freed newest first.
pub(crate) fn safe_softmax_steps(shape: Shape, dtype: DType) -> Vec<ScratchStep> {
    use ScratchStep::{Free, Take};
    let mut steps: Vec<ScratchStep> = safe_softmax_scratch(shape, dtype)
        .iter()
        .map(|(s, d)| Take(s.numel() * d.size()))
        .collect();
    steps.extend([Free(2), Free(1), Free(0)]);
    steps
}

/// The softmax backward's temporary after its gradient of `bytes`.
pub(crate) fn softmax_backward_steps(bytes: u64) -> Vec<ScratchStep> {
    use ScratchStep::{Free, Take};
    vec![Take(bytes), Free(0)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use ScratchStep::{Free, Take};

    #[test]
    fn safe_softmax_takes_the_mask_the_rows_and_a_zero_then_frees_them_newest_first() {
        let steps = safe_softmax_steps(Shape::new(&[8, 12, 1024, 1024]), DType::F32);
        assert_eq!(
            steps,
            vec![
                Take(8 * 12 * 1024 * 1024),
                Take(8 * 12 * 1024),
                Take(4),
                Free(2),
                Free(1),
                Free(0)
            ]
        );
    }
}
