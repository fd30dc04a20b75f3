//! Reductions too large for 32-bit indexing (ATen/native/cuda/Reduce.cuh).
//!
//! `gpu_reduce_kernel` cannot index such an iterator with 32 bits, so it
//! walks `iter.with_32bit_indexing()`: the iterator halved along its widest
//! dimension, first half first, until each piece fits. Each piece is one
//! launch with its own scratch (`reduce_scratch`). When the output dtype is
//! narrower than the fp32 accumulator (fp16, bf16), the pieces accumulate
//! in an `AccumulationBuffer` of fp32, one per output element, taken before
//! the first launch and freed after the last.

use crate::engine::autograd::ScratchStep;
use crate::engine::scratch::reduce::{
    reduce_scratch, ReduceDevice, ReduceScratch, ReduceShape, ACC_BYTES, INDEX_LIMIT,
};

/// What one reduction takes from the allocator besides its output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ReducePlan {
    /// The `AccumulationBuffer`'s bytes, if one is made.
    pub accumulation: Option<u64>,
    /// The scratch of each launch that needs one, in launch order; each is
    /// freed as its launch returns.
    pub launches: Vec<ReduceScratch>,
}

/// One dimension of the reduction's iterator, fastest first, with each
/// operand's stride in bytes.
#[derive(Debug, Clone, Copy)]
struct IterDim {
    size: u64,
    input_stride: u64,
    output_stride: u64,
    reduced: bool,
}

/// The iterator TensorIterator builds for `shape` once it has coalesced it.
fn iter_dims(shape: ReduceShape) -> Vec<IterDim> {
    let e = shape.element_bytes;
    let reduced = |size, input_stride| IterDim {
        size,
        input_stride,
        output_stride: 0,
        reduced: true,
    };
    let kept = |size, input_stride| IterDim {
        size,
        input_stride,
        output_stride: e,
        reduced: false,
    };
    let (outputs, inputs) = (shape.outputs, shape.inputs_per_output);
    if outputs <= 1 {
        vec![reduced(inputs, e)]
    } else if shape.contiguous_inputs {
        vec![reduced(inputs, e), kept(outputs, e * inputs)]
    } else {
        vec![kept(outputs, e), reduced(inputs, e * outputs)]
    }
}

/// `TensorIteratorBase::can_use_32bit_indexing`.
fn fits_32_bits(dims: &[IterDim]) -> bool {
    let numel = dims.iter().try_fold(1u64, |n, d| n.checked_mul(d.size));
    let max_offset = |stride: fn(&IterDim) -> u64| {
        dims.iter().try_fold(1u64, |off, d| {
            (d.size.saturating_sub(1))
                .checked_mul(stride(d))
                .and_then(|x| off.checked_add(x))
        })
    };
    numel.is_some_and(|n| n <= INDEX_LIMIT)
        && max_offset(|d| d.input_stride).is_some_and(|o| o <= INDEX_LIMIT)
        && max_offset(|d| d.output_stride).is_some_and(|o| o <= INDEX_LIMIT)
}

/// `TensorIteratorBase::get_dim_to_split`: the dimension with the widest
/// extent over any operand, the later one on a tie.
fn dim_to_split(dims: &[IterDim]) -> usize {
    let mut best = (0u64, 0usize);
    for (d, dim) in dims.iter().enumerate().rev() {
        for stride in [dim.output_stride, dim.input_stride] {
            let extent = dim.size.saturating_sub(1).saturating_mul(stride);
            if extent > best.0 {
                best = (extent, d);
            }
        }
    }
    best.1
}

/// The reduction of one piece of the iterator.
fn piece_shape(dims: &[IterDim], like: ReduceShape) -> ReduceShape {
    let product = |reduced: bool| {
        dims.iter()
            .filter(|d| d.reduced == reduced)
            .map(|d| d.size)
            .product::<u64>()
    };
    ReduceShape {
        outputs: product(false),
        inputs_per_output: product(true),
        ..like
    }
}

/// The 32-bit pieces `with_32bit_indexing()` yields, in order.
fn pieces(shape: ReduceShape) -> Vec<ReduceShape> {
    let mut out = Vec::new();
    let mut stack = vec![iter_dims(shape)];
    while let Some(dims) = stack.pop() {
        let d = dim_to_split(&dims);
        if fits_32_bits(&dims) || dims[d].size < 2 {
            out.push(piece_shape(&dims, shape));
            continue;
        }
        // `split(dim)`: the copy takes the first half (rounded down) and is
        // walked before the rest.
        let (mut first, mut rest) = (dims.clone(), dims);
        first[d].size = rest[d].size / 2;
        rest[d].size -= first[d].size;
        stack.push(rest);
        stack.push(first);
    }
    out
}

impl ReducePlan {
    /// The buffers in order: the accumulation buffer around every launch,
    /// each launch's staging buffer then semaphores, freed as the launch
    /// returns (semaphores first). The engine and a traced program both
    /// follow these steps.
    pub(crate) fn steps(&self) -> Vec<ScratchStep> {
        let mut steps = Vec::new();
        let mut taken = 0;
        let accumulation = self.accumulation.map(|bytes| {
            steps.push(ScratchStep::Take(bytes));
            taken += 1;
            taken - 1
        });
        for l in &self.launches {
            steps.push(ScratchStep::Take(l.buffer));
            steps.push(ScratchStep::Take(l.semaphores));
            steps.push(ScratchStep::Free(taken + 1));
            steps.push(ScratchStep::Free(taken));
            taken += 2;
        }
        if let Some(i) = accumulation {
            steps.push(ScratchStep::Free(i));
        }
        steps
    }
}

/// Everything `gpu_reduce_kernel` allocates for a reduction of `shape`.
pub(crate) fn reduce_plan(shape: ReduceShape, device: ReduceDevice) -> ReducePlan {
    let dims = iter_dims(shape);
    if fits_32_bits(&dims) {
        return ReducePlan {
            accumulation: None,
            launches: reduce_scratch(shape, device).into_iter().collect(),
        };
    }
    ReducePlan {
        accumulation: (shape.element_bytes < ACC_BYTES).then(|| shape.outputs.max(1) * ACC_BYTES),
        launches: pieces(shape)
            .into_iter()
            .filter_map(|p| reduce_scratch(p, device))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(numel: u64, element_bytes: u64) -> ReduceShape {
        ReduceShape {
            outputs: 1,
            inputs_per_output: numel,
            contiguous_inputs: true,
            element_bytes,
        }
    }

    #[test]
    fn a_full_reduction_halves_until_each_piece_fits() {
        let sizes = |s| {
            pieces(s)
                .iter()
                .map(|p| p.inputs_per_output)
                .collect::<Vec<_>>()
        };
        // 823,410,688 fp32 elements span 3.3 GB: two pieces.
        assert_eq!(sizes(full(823_410_688, 4)), vec![411_705_344; 2]);
        // An odd count: the first piece is the smaller half.
        assert_eq!(sizes(full(600_000_001, 4)), vec![300_000_000, 300_000_001]);
        assert_eq!(sizes(full(1_000, 4)), vec![1_000]);
    }

    #[test]
    fn rows_split_along_the_widest_dimension() {
        // sum over dim 0 of [65536, 50257] fp16: the reduced rows are halved.
        let s = ReduceShape {
            outputs: 50_257,
            inputs_per_output: 65_536,
            contiguous_inputs: false,
            element_bytes: 2,
        };
        let p = pieces(s);
        assert_eq!(p.len(), 4);
        assert!(p
            .iter()
            .all(|p| (p.outputs, p.inputs_per_output) == (50_257, 16_384)));
        // sum over dim 1: the kept rows are halved.
        let s = ReduceShape {
            contiguous_inputs: true,
            outputs: 65_536,
            inputs_per_output: 50_257,
            ..s
        };
        assert!(pieces(s)
            .iter()
            .all(|p| (p.outputs, p.inputs_per_output) == (16_384, 50_257)));
    }
}
