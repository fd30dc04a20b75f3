//! The global-memory scratch of ATen's CUDA reductions (`sum`, `mean`, and
//! autograd's `sum_to` for a broadcast input such as a Linear's bias).
//!
//! `gpu_reduce_kernel` (ATen/native/cuda/Reduce.cuh) picks a launch with
//! `setReduceConfig`; when it splits each output's inputs across thread
//! blocks (`should_global_reduce`), it takes a staging buffer and a semaphore
//! array from the caching allocator for the launch. Both sizes follow from
//! the reduction's shape and the GPU's SM count, so this mirrors
//! `setReduceConfig` for a contiguous input. Checked against 1,695 reductions
//! on an H100 (`tests/fixtures/reduce/`; `reduce_split` has the 16 too large
//! for 32-bit indexing).

use serde::{Deserialize, Serialize};

/// What `setReduceConfig` reads from `cudaDeviceProp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReduceDevice {
    /// `multiProcessorCount` (H100 SXM: 132; A100: 108).
    pub sm_count: u32,
    /// `maxThreadsPerMultiProcessor` (2,048 on sm80 and sm90).
    pub max_threads_per_sm: u32,
}

/// A reduction over a contiguous input, after TensorIterator has coalesced
/// its dimensions into one reduced and at most one kept dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReduceShape {
    /// Output elements (1 for a full reduction).
    pub outputs: u64,
    /// Inputs summed into each output.
    pub inputs_per_output: u64,
    /// The reduced elements are adjacent in memory (a full reduction, or the
    /// last dimension); otherwise each output's inputs are `outputs` apart.
    pub contiguous_inputs: bool,
    /// Bytes per input element.
    pub element_bytes: u64,
}

/// The staging buffer and semaphore bytes one launch takes, in that order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReduceScratch {
    pub buffer: u64,
    pub semaphores: u64,
}

const WARP_SIZE: u64 = 32;
const MAX_NUM_THREADS: u64 = 512;
const MIN_VALUES_PER_THREAD: u64 = 16;
const MAX_VALUES_PER_THREAD: u64 = 256;
/// `vt0` and `input_vec_size` of the sum and mean kernels.
const INPUT_VEC_SIZE: u64 = 4;
/// `sizeof(arg_t)`: float accumulation for fp32, fp16 and bf16 inputs.
pub(in crate::engine) const ACC_BYTES: u64 = 4;
/// The largest element count and byte offset a 32-bit-indexed launch takes.
pub(in crate::engine) const INDEX_LIMIT: u64 = i32::MAX as u64;

fn last_pow2(n: u64) -> u64 {
    if n == 0 {
        1
    } else {
        1 << (63 - n.leading_zeros())
    }
}

/// `TensorIterator::can_use_32bit_indexing` for a contiguous input: the
/// element count and the last element's byte offset fit an int32.
fn indexes_in_32_bits(numel: u64, element_bytes: u64) -> bool {
    let limit = INDEX_LIMIT;
    numel <= limit
        && numel
            .saturating_mul(element_bytes)
            .saturating_sub(element_bytes)
            .saturating_add(1)
            <= limit
}

/// The scratch of one launch, or None when it needs none (or it needs
/// 64-bit indexing, where ATen splits the reduction: see `reduce_split`).
pub(crate) fn reduce_scratch(shape: ReduceShape, device: ReduceDevice) -> Option<ReduceScratch> {
    let (outputs, inputs) = (shape.outputs.max(1), shape.inputs_per_output);
    if inputs <= 1 || !indexes_in_32_bits(outputs.checked_mul(inputs)?, shape.element_bytes) {
        return None;
    }
    let on_fastest = shape.contiguous_inputs || outputs == 1;
    let (mut dim0, dim1) = if on_fastest {
        (inputs, outputs)
    } else {
        (outputs, inputs)
    };
    let mut output_vec = 1;
    if on_fastest {
        if dim0 >= 128 {
            dim0 /= INPUT_VEC_SIZE;
        }
    } else {
        // get_output_vec_size: the widest of 4, 2, 1 dividing the output
        // count and the reduced dimension's stride (also `outputs`).
        output_vec = 4;
        while !outputs.is_multiple_of(output_vec) {
            output_vec /= 2;
        }
        dim0 /= output_vec;
    }

    // set_block_dimension
    let max_threads = MAX_NUM_THREADS / output_vec;
    let pow2 = |d: u64| {
        if d < max_threads {
            last_pow2(d)
        } else {
            max_threads
        }
    };
    let (dim0_pow2, dim1_pow2) = (pow2(dim0), pow2(dim1));
    let block_height = dim1_pow2.min(max_threads / dim0_pow2.min(WARP_SIZE));
    let block_width = dim0_pow2.min(max_threads / block_height);
    let num_threads = block_width * block_height;

    let mut step_input = 1u64;
    let mut step_output = 1u64;
    let block_x_reduce = on_fastest;
    if block_x_reduce {
        step_input *= block_width;
    } else {
        step_output *= block_width;
    }
    let values_per_thread = |step: u64| inputs.div_ceil(step);
    let split_across_warps =
        values_per_thread(step_input) >= (block_height * 16).min(MAX_VALUES_PER_THREAD);
    if split_across_warps {
        step_input *= block_height;
    } else {
        step_output *= block_height;
    }

    let blocks_per_sm = u64::from(device.max_threads_per_sm) / num_threads;
    let target_grid = u64::from(device.sm_count) * blocks_per_sm;
    let grid = (outputs / output_vec).div_ceil(step_output);
    let vpt = values_per_thread(step_input);
    if !split_across_warps || vpt < MAX_VALUES_PER_THREAD || grid > target_grid {
        return None;
    }
    let ctas = target_grid
        .div_ceil(grid)
        .min(vpt.div_ceil(MIN_VALUES_PER_THREAD))
        .max(vpt.div_ceil(MAX_VALUES_PER_THREAD));
    if ctas <= 1 {
        return None;
    }
    let mut buffer = ACC_BYTES * outputs * ctas;
    if !block_x_reduce {
        buffer *= block_width * output_vec;
    }
    Some(ReduceScratch {
        buffer,
        semaphores: 4 * grid,
    })
}

/// The reduction `sum_to(grad, target)` runs: leading dimensions of a
/// contiguous `grad` summed away, the trailing ones kept (a bias gradient),
/// or everything summed. None for other patterns (not modelled).
pub(crate) fn sum_to_shape(
    grad: &[u64],
    target: &[u64],
    element_bytes: u64,
) -> Option<ReduceShape> {
    let pad = grad.len().checked_sub(target.len())?;
    let kept_from = (0..grad.len())
        .rev()
        .find(|&d| d < pad || target[d - pad] != grad[d])
        .map_or(0, |d| d + 1);
    // Everything from `kept_from` on is kept as is; before it, only size-1
    // target dimensions (summed) or size-1 grad dimensions may appear.
    let reduced_ok = (0..kept_from).all(|d| d < pad || target[d - pad] == 1 || grad[d] == 1);
    if !reduced_ok {
        return None;
    }
    let outputs: u64 = grad[kept_from..].iter().product();
    let inputs: u64 = grad[..kept_from].iter().product();
    Some(ReduceShape {
        outputs,
        inputs_per_output: inputs,
        contiguous_inputs: outputs == 1,
        element_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: ReduceDevice = ReduceDevice {
        sm_count: 132,
        max_threads_per_sm: 2048,
    };

    fn rows(outputs: u64, inputs: u64) -> ReduceShape {
        ReduceShape {
            outputs,
            inputs_per_output: inputs,
            contiguous_inputs: false,
            element_bytes: 4,
        }
    }

    #[test]
    fn a_bias_gradient_of_1024_rows_takes_the_h100s_buffers() {
        // adam_first_step_sgd's c_proj and c_fc bias gradients on the H100.
        let s = reduce_scratch(rows(768, 1024), H100).expect("global reduce");
        assert_eq!((s.buffer, s.semaphores), (6_291_456, 24));
        let s = reduce_scratch(rows(3072, 1024), H100).expect("global reduce");
        assert_eq!((s.buffer, s.semaphores), (25_165_824, 96));
    }

    #[test]
    fn few_rows_need_no_global_reduce() {
        assert_eq!(reduce_scratch(rows(768, 64), H100), None);
    }

    #[test]
    fn sum_to_keeps_trailing_dimensions() {
        let s = sum_to_shape(&[8, 512, 768], &[768], 4).expect("a bias pattern");
        assert_eq!((s.outputs, s.inputs_per_output), (768, 4096));
        let s = sum_to_shape(&[8, 512, 768], &[1], 4).expect("everything summed");
        assert_eq!(
            (s.outputs, s.inputs_per_output, s.contiguous_inputs),
            (1, 8 * 512 * 768, true)
        );
        assert_eq!(sum_to_shape(&[8, 512, 768], &[8, 1, 768], 4), None);
    }
}

/// Every reduction of `tests/fixtures/reduce/h100_sweep.tsv` (captured on an
/// H100) against the model: the buffer and semaphore sizes, or none.
#[cfg(test)]
mod h100_sweep {
    use super::*;
    use crate::engine::tests::sweep_rows;

    fn model(op: &str, shape: &[u64], element_bytes: u64) -> Option<ReduceShape> {
        let numel: u64 = shape.iter().product();
        match op {
            "sum_all" | "mean_all" => Some(ReduceShape {
                outputs: 1,
                inputs_per_output: numel,
                contiguous_inputs: true,
                element_bytes,
            }),
            "sum0" | "sum01" => sum_to_shape(shape, &shape[shape.len() - 1..], element_bytes),
            "sum1" => Some(ReduceShape {
                outputs: shape[0],
                inputs_per_output: shape[1],
                contiguous_inputs: true,
                element_bytes,
            }),
            other => panic!("unknown op {other}"),
        }
    }

    /// Each row lists the output, then what `reduce_plan` makes: the
    /// accumulation buffer of a split half-precision reduction, then each
    /// launch's staging buffer and semaphores.
    #[test]
    fn every_captured_reduction_takes_the_modelled_scratch() {
        let h100 = ReduceDevice {
            sm_count: 132,
            max_threads_per_sm: 2048,
        };
        let (mut matched, mut split, mut global) = (0, 0, 0);
        for f in sweep_rows("reduce/h100_sweep.tsv") {
            let shape: Vec<u64> = f[2].split('x').map(|d| d.parse().expect("a dim")).collect();
            let allocs: Vec<u64> = f[3]
                .split(' ')
                .map(|a| a.parse().expect("a size"))
                .collect();
            let element_bytes = if f[1] == "f32" { 4 } else { 2 };
            let numel: u64 = shape.iter().product();
            let plan = model(&f[0], &shape, element_bytes)
                .map(|s| crate::engine::scratch::reduce_split::reduce_plan(s, h100))
                .unwrap_or_default();
            let mut got: Vec<u64> = plan.accumulation.into_iter().collect();
            for s in &plan.launches {
                got.extend([s.buffer, s.semaphores]);
            }
            assert_eq!(got, allocs[1..], "{f:?}");
            matched += 1;
            split += usize::from(!indexes_in_32_bits(numel, element_bytes));
            global += usize::from(!plan.launches.is_empty());
        }
        assert_eq!((matched, split), (1695, 16));
        assert!(global > 500, "{global} global reductions");
    }
}
