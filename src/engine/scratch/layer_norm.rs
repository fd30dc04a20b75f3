//! The CUDA layer-norm backward's partial sums for the weight and bias
//! gradients (ATen's `LaunchGammaBetaBackwardCUDAKernel`).
//!
//! Past 65,536 rows, when the features span fewer 32-wide warps than half the
//! GPU's SMs, ATen splits the column sums over the rows: each block of 32 rows
//! writes one row of `dgamma_blocks` and `dbeta_blocks` ([blocks_y, N] in the
//! input's dtype), and `dgamma_blocks.sum(0)` makes the gradient that
//! replaces the one allocated first.

use crate::engine::scratch::reduce::ReduceShape;

const BLOCK_DIM_X: u64 = 32;
const ROWS_PER_BLOCK_Y: u64 = 32;
const MAX_GRID: u64 = 64 * 1024 / 2;

/// The partial sums' shape for `layer_norm` over `m` rows of `n` features on
/// a GPU with `sm_count` SMs: `Some(blocks_y)` rows of `n`, or None when the
/// kernel sums each column in one pass.
pub(crate) fn gamma_beta_partial_rows(m: u64, n: u64, sm_count: u32) -> Option<u64> {
    if n == 0 || m <= 64 * 1024 || n / BLOCK_DIM_X >= u64::from(sm_count / 2) {
        return None;
    }
    let blocks_x = n.div_ceil(BLOCK_DIM_X);
    Some((MAX_GRID / blocks_x).min(m.div_ceil(ROWS_PER_BLOCK_Y)))
}

/// The `sum(0)` that folds the partial sums into one gradient.
pub(crate) fn partial_sum_reduction(rows: u64, n: u64, element_bytes: u64) -> ReduceShape {
    ReduceShape {
        outputs: n,
        inputs_per_output: rows,
        contiguous_inputs: false,
        element_bytes,
    }
}

/// Every backward of `tests/fixtures/layernorm/h100_sweep.tsv` (captured on
/// an H100) against the model: the gradients, the partial sums, each
/// `sum(0)` with its scratch replacing the first gradient, the partial sums
/// freed, then the saved mean and rstd.
#[cfg(test)]
mod h100_sweep {
    use super::*;
    use crate::engine::scratch::reduce::{reduce_scratch, ReduceDevice};
    use crate::engine::tests::{signed_requests, sweep_rows};

    const H100: ReduceDevice = ReduceDevice {
        sm_count: 132,
        max_threads_per_sm: 2048,
    };

    fn modelled(m: u64, n: u64, element_bytes: u64, affine: bool) -> Vec<i64> {
        let size = |elements: u64| (elements * element_bytes) as i64;
        let mut r = vec![size(m * n)];
        if affine {
            r.extend([size(n), size(n)]);
            if let Some(rows) = gamma_beta_partial_rows(m, n, H100.sm_count) {
                r.extend([size(rows * n), size(rows * n)]);
                for _ in 0..2 {
                    r.push(size(n));
                    let shape = partial_sum_reduction(rows, n, element_bytes);
                    if let Some(s) = reduce_scratch(shape, H100) {
                        let (b, sem) = (s.buffer as i64, s.semaphores as i64);
                        r.extend([b, sem, -sem, -b]);
                    }
                    r.push(-size(n));
                }
                r.extend([-size(rows * n), -size(rows * n)]);
            }
        }
        r.extend([-(m as i64 * 4), -(m as i64 * 4)]);
        r
    }

    #[test]
    fn every_swept_layer_norm_backward_makes_the_modelled_requests() {
        let (mut checked, mut partial) = (0, 0);
        for f in sweep_rows("layernorm/h100_sweep.tsv") {
            let element_bytes = match f[0].as_str() {
                "f32" => 4,
                "f16" | "bf16" => 2,
                other => panic!("unknown dtype {other}"),
            };
            let (m, n): (u64, u64) = (f[1].parse().expect("M"), f[2].parse().expect("N"));
            let affine = f[3] == "1";
            let real = signed_requests(&f[4]);
            assert_eq!(modelled(m, n, element_bytes, affine), real, "{f:?}");
            checked += 1;
            partial += usize::from(affine && gamma_beta_partial_rows(m, n, 132).is_some());
        }
        assert_eq!((checked, partial), (183, 51));
    }
}
