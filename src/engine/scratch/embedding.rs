//! What ATen's CUDA embedding backward allocates besides the weight's
//! gradient (`embedding_dense_backward_cuda` in Embedding.cu,
//! `embedding_backward_cuda_kernel` in EmbeddingBackwardKernel.cu).
//!
//! Up to 3,072 lookups a feature kernel writes the zero-filled gradient
//! directly. Past that the indices are radix-sorted (two index buffers, an
//! `arange`, CUB's temporary storage), then grouped into segments of equal
//! index and partial segments of at most ten rows, each step with its own
//! buffers and CUB temporaries; the partial sums go through an fp32 buffer
//! of `numel / 10 + min(numel, V)` rows. Every size follows from the number
//! of lookups, the vocabulary, the width and the dtypes; CUB's temporary
//! sizes are its onesweep and single-pass scan layouts on sm_90, checked
//! against the H100 captures (tests/fixtures/pytorch/captured) and a sweep
//! of int32 and int64 indices, 3,072 to 65,536 lookups, into tables of
//! 1,000 and 50,304 rows (tests/fixtures/embedding/h100_sweep.tsv). PyTorch
//! 2.11 sorts even 65,536 lookups into 1,000 rows: no fused
//! atomic-accumulate kernel for a small vocabulary.
//!
//! Not modelled: `scale_grad_by_freq` (a count buffer and two scans by key).

/// `embedding_dense_backward_cuda` takes the feature kernel up to here.
use crate::engine::autograd::ScratchStep;

const FEATURE_KERNEL_MAX_INDICES: u64 = 3072;
/// Rows one thread sums in `compute_grad_weight` (a partial segment).
const NROWS_PER_THREAD: u64 = 10;
/// A 0-dim int64 tensor (`num_of_segments`, `num_of_partial_segments`).
const SCALAR_I64: u64 = 8;

/// The sort path's buffers, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EmbeddingSort {
    /// One index per lookup: sorted and original indices, the `arange`,
    /// segment offsets and `unique_by_key`'s key output.
    pub per_index: u64,
    /// `DeviceRadixSort::SortPairs` temporary storage.
    pub sort_temp: u64,
    /// `DeviceSelect::UniqueByKey` temporary storage.
    pub unique_temp: u64,
    /// One index per possible segment (`min(numel, V)`): partial-segment
    /// counts and their exclusive sum.
    pub per_segment: u64,
    /// `DeviceScan::ExclusiveSum` temporary storage.
    pub scan_temp: u64,
    /// `partial_segment_offset`: one index per possible partial segment.
    pub partial_offsets: u64,
    /// `grad_weight_per_segment` [partial segments, dim] in the gradient's
    /// accumulate type (fp32 for half and bfloat16).
    pub partial_sums: u64,
    /// The 0-dim segment counters.
    pub scalar: u64,
}

impl EmbeddingSort {
    /// `embedding_dense_backward_cuda` before its gradient: sorted and
    /// original indices (kept to the end), the `arange` and the sort's
    /// temporary (gone with the dispatch lambda). A traced program follows
    /// these steps; `the_steps_make_the_swept_requests` holds them to the
    /// H100's requests, as the engine's `embedding_backward` is held.
    pub(crate) fn steps_before_grad(&self) -> Vec<ScratchStep> {
        use ScratchStep::{Free, Take};
        let i = self.per_index;
        vec![
            Take(i),
            Take(i),
            Take(i),
            Take(self.sort_temp),
            Free(3),
            Free(2),
        ]
    }

    /// After the gradient (buffers numbered on from [`Self::steps_before_grad`]'s):
    /// `embedding_backward_cuda_kernel`'s segments, partial segments and
    /// partial sums, freed as their scopes end, then the two index buffers.
    pub(crate) fn steps_after_grad(&self) -> Vec<ScratchStep> {
        use ScratchStep::{Free, Take};
        let (i, sc) = (self.per_index, self.scalar);
        vec![
            // segment offsets, the segment count; unique_by_key's output and temporary
            Take(i),
            Take(sc),
            Take(i),
            Take(self.unique_temp),
            Free(7),
            Free(6),
            // partial-segment counts, their exclusive sum and its temporary
            Take(self.per_segment),
            Take(self.per_segment),
            Take(self.scan_temp),
            Free(10),
            Take(sc),
            Take(self.partial_offsets),
            Take(self.partial_sums),
            // the lambda's scope, then the kernel's locals, then the caller's
            Free(13),
            Free(12),
            Free(11),
            Free(9),
            Free(8),
            Free(5),
            Free(4),
            Free(1),
            Free(0),
        ]
    }
}

/// The sort path's buffers for `numel` lookups of `index_bytes`-wide indices
/// into a `[num_weights, dim]` table whose gradient has `grad_bytes`-wide
/// elements; `None` when the feature kernel runs instead.
pub(crate) fn embedding_sort(
    numel: u64,
    index_bytes: u64,
    num_weights: u64,
    dim: u64,
    grad_bytes: u64,
) -> Option<EmbeddingSort> {
    if numel <= FEATURE_KERNEL_MAX_INDICES {
        return None;
    }
    let max_segments = numel.min(num_weights);
    let max_partial_segments = numel / NROWS_PER_THREAD + max_segments;
    // toOpMathType: half and bfloat16 accumulate in float.
    let acc_bytes = grad_bytes.max(4);
    Some(EmbeddingSort {
        per_index: numel * index_bytes,
        sort_temp: cub::radix_sort_pairs_temp(numel, index_bytes),
        unique_temp: cub::unique_by_key_temp(numel, index_bytes),
        per_segment: max_segments * index_bytes,
        scan_temp: cub::exclusive_sum_temp(max_segments, index_bytes),
        partial_offsets: max_partial_segments * index_bytes,
        partial_sums: max_partial_segments * dim * acc_bytes,
        scalar: SCALAR_I64,
    })
}

/// CUB's temporary-storage arithmetic for the three calls above, as CCCL 3.0
/// lays it out on sm_90 (the CUDA 13 build of PyTorch 2.11). PyTorch's
/// `CUB_WRAPPER` asks for exactly these bytes, for int32 and int64 indices
/// alike (the H100 sweep).
mod cub {
    /// `AliasTemporaries` aligns each piece to this and adds `ALIGN - 1`
    /// bytes so that the base can be aligned too.
    const ALIGN: u64 = 256;
    const RADIX_DIGITS: u64 = 256;
    /// `TILE_STATUS_PADDING`: one warp of tile states before the first.
    const TILE_STATUS_PADDING: u64 = 32;

    fn alias_temporaries(sizes: &[u64]) -> u64 {
        sizes.iter().map(|b| b.div_ceil(ALIGN) * ALIGN).sum::<u64>() + ALIGN - 1
    }

    /// `DeviceRadixSort::SortPairs` over every bit of `key_bytes`-wide keys
    /// with values as wide: one tile needs 1 byte; past it, onesweep takes
    /// per-pass digit histograms (64-bit offsets), one 32-bit look-back row
    /// per tile, alternate key and value buffers and per-pass counters.
    pub(in crate::engine) fn radix_sort_pairs_temp(n: u64, key_bytes: u64) -> u64 {
        // (SingleTilePolicy 256 threads x items, onesweep 384 x items).
        let (single_tile, onesweep_tile) = if key_bytes == 8 {
            (256 * 9, 384 * 12)
        } else {
            (256 * 19, 384 * 17)
        };
        if n <= single_tile {
            return 1;
        }
        let passes = key_bytes;
        alias_temporaries(&[
            passes * RADIX_DIGITS * 8,
            n.div_ceil(onesweep_tile) * RADIX_DIGITS * 4,
            n * key_bytes,
            n * key_bytes,
            passes * 4,
        ])
    }

    /// A decoupled look-back scan's `ScanTileState` for `n` items: a status
    /// word per tile plus the padding, aliased once by the tile state and
    /// again by the dispatch.
    fn tile_state_temp(n: u64, tile: u64, word_bytes: u64) -> u64 {
        let state = (n.div_ceil(tile) + TILE_STATUS_PADDING) * word_bytes;
        alias_temporaries(&[alias_temporaries(&[state])])
    }

    /// `DeviceSelect::UniqueByKey` with an `int` counting iterator for
    /// values: 64-bit offsets (16-byte status words); tiles of 640 x 7 items
    /// for int64 keys, 512 x 14 for int32.
    pub(in crate::engine) fn unique_by_key_temp(n: u64, key_bytes: u64) -> u64 {
        let tile = if key_bytes == 8 { 640 * 7 } else { 512 * 14 };
        tile_state_temp(n, tile, 16)
    }

    /// `DeviceScan::ExclusiveScan` with PyTorch's own sum functor (the
    /// default policy, 128 threads, 15 four-byte items scaled by width).
    pub(in crate::engine) fn exclusive_sum_temp(n: u64, index_bytes: u64) -> u64 {
        if index_bytes == 8 {
            tile_state_temp(n, 128 * 7, 16)
        } else {
            tile_state_temp(n, 128 * 15, 8)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{cub, embedding_sort, ScratchStep};
    use crate::engine::tests::{signed_requests, sweep_rows};

    /// CUB's temporaries as the H100 captures recorded them (int64 indices):
    /// the sort's at 3,328 to 8,192 lookups, the scans' at every size seen.
    #[test]
    fn cub_temporaries_are_the_h100_s() {
        for (n, sort) in [
            (3328, 71_167),
            (3584, 75_263),
            (3840, 79_359),
            (4096, 83_455),
            (8192, 150_015),
        ] {
            assert_eq!(cub::radix_sort_pairs_temp(n, 8), sort, "sort of {n}");
            assert_eq!(cub::unique_by_key_temp(n, 8), 1279, "unique of {n}");
            assert_eq!(cub::exclusive_sum_temp(n, 8), 1279, "scan of {n}");
        }
    }

    #[test]
    fn the_scans_grow_a_tile_state_block_at_a_time() {
        // 16 tiles of 896 fit the first 768-byte block; the 17th does not.
        assert_eq!(cub::exclusive_sum_temp(16 * 896, 8), 1279);
        assert_eq!(cub::exclusive_sum_temp(16 * 896 + 1, 8), 1535);
        assert_eq!(cub::unique_by_key_temp(16 * 4480, 8), 1279);
        assert_eq!(cub::unique_by_key_temp(16 * 4480 + 1, 8), 1535);
    }

    /// The sort path's requests in ATen's order, as the engine makes them
    /// (`Engine::embedding_backward`): + allocation, - free.
    fn sort_path_requests(s: &super::EmbeddingSort, grad: u64) -> Vec<i64> {
        let [i, st, g, sc, ut, seg, sct, po, ps] = [
            s.per_index,
            s.sort_temp,
            grad,
            s.scalar,
            s.unique_temp,
            s.per_segment,
            s.scan_temp,
            s.partial_offsets,
            s.partial_sums,
        ]
        .map(|b| b as i64);
        vec![
            i, i, i, st, -st, -i, g, i, sc, i, ut, -ut, -i, seg, seg, sct, -sct, sc, po, ps, -ps,
            -po, -sc, -seg, -seg, -sc, -i, -i, -i,
        ]
    }

    /// Every backward of tests/fixtures/embedding/h100_sweep.tsv (an H100,
    /// fp32 tables): int32 and int64 indices, on both sides of every tile
    /// boundary the model names.
    #[test]
    fn every_swept_embedding_backward_makes_the_modelled_requests() {
        let mut checked = [0usize; 2];
        for f in sweep_rows("embedding/h100_sweep.tsv") {
            let n: Vec<u64> = f[..4]
                .iter()
                .map(|v| v.parse().expect("a number"))
                .collect();
            let (index_bytes, v, d, n) = (n[0], n[1], n[2], n[3]);
            let real = signed_requests(&f[4]);
            let grad = v * d * 4;
            let modelled = match embedding_sort(n, index_bytes, v, d, 4) {
                Some(s) => sort_path_requests(&s, grad),
                None => vec![grad as i64],
            };
            assert_eq!(modelled, real, "{f:?}");
            checked[usize::from(index_bytes == 8)] += 1;
        }
        assert_eq!(checked, [32, 32]);
    }

    /// The steps a traced program follows make the same requests as the
    /// H100 did, on every sort-path row of the sweep.
    #[test]
    fn the_steps_make_the_swept_requests() {
        let mut checked = 0;
        for f in sweep_rows("embedding/h100_sweep.tsv") {
            let n: Vec<u64> = f[..4]
                .iter()
                .map(|v| v.parse().expect("a number"))
                .collect();
            let Some(s) = embedding_sort(n[3], n[0], n[1], n[2], 4) else {
                continue;
            };
            let grad = n[1] * n[2] * 4;
            let mut taken: Vec<i64> = Vec::new();
            let mut seq: Vec<i64> = Vec::new();
            let steps = s.steps_before_grad().into_iter().map(Some);
            let steps = steps
                .chain([None])
                .chain(s.steps_after_grad().into_iter().map(Some));
            for st in steps {
                match st {
                    Some(ScratchStep::Take(b)) => {
                        taken.push(b as i64);
                        seq.push(b as i64);
                    }
                    Some(ScratchStep::Free(k)) => seq.push(-taken[k]),
                    None => seq.push(grad as i64),
                }
            }
            assert_eq!(seq, sort_path_requests(&s, grad), "{f:?}");
            checked += 1;
        }
        assert!(checked > 0);
    }

    /// The amp-fp16 capture's EmbeddingBackward0: 4,096 int64 lookups into
    /// an fp32 [8,192, 512] table.
    #[test]
    fn the_sort_path_of_a_gpt_batch() {
        let s = embedding_sort(4096, 8, 8192, 512, 4).expect("sorts past 3,072");
        assert_eq!(s.per_index, 32_768);
        assert_eq!(s.per_segment, 32_768);
        assert_eq!(s.partial_offsets, 36_040);
        assert_eq!(s.partial_sums, 9_226_240);
        // A half gradient still sums its partial segments in fp32.
        let half = embedding_sort(4096, 8, 8192, 512, 2).expect("sorts");
        assert_eq!(half.partial_sums, s.partial_sums);
        assert_eq!(embedding_sort(3072, 8, 8192, 512, 4), None);
    }
}
