//! The scratch of an accumulating `index_put_` on CUDA (IndexBackward0's
//! `index_backward`): ATen's `index_put_with_sort_kernel`
//! (aten/src/ATen/native/cuda/Indexing.cu) linearises the indices and
//! sorts them with their positions before it sums the gradient rows in.
//! The sizes and order are the H100 trace's (moe_small, PyTorch 2.11): for
//! `n` index rows, seven int64 buffers of `n` elements and one byte of
//! cub scratch, in three scopes.

use crate::engine::autograd::ScratchStep;
use crate::engine::dtype::DType;
use crate::engine::error::Result;
use crate::engine::shape::Shape;
use crate::engine::storage::StorageId;
use crate::engine::tag::Category;
use crate::engine::tensor::TensorId;
use crate::engine::Engine;

/// What one step of the kernel does: make a buffer (numbered in making
/// order) or free one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// An int64 buffer of `n` elements.
    Rows,
    /// cub's one byte.
    Byte,
    Free(usize),
}

/// The trace's order: `a b -a`, `c d -c -d`, `e f g 1 -1 -g -f -e -b`.
const STEPS: [Step; 16] = [
    Step::Rows, // 0
    Step::Rows, // 1 (lives to the end)
    Step::Free(0),
    Step::Rows, // 2
    Step::Rows, // 3
    Step::Free(2),
    Step::Free(3),
    Step::Rows, // 4
    Step::Rows, // 5
    Step::Rows, // 6
    Step::Byte, // 7
    Step::Free(7),
    Step::Free(6),
    Step::Free(5),
    Step::Free(4),
    Step::Free(1),
];

/// The kernel's buffers for `rows` index rows, in order: the engine's
/// `index_put_grad` and a traced program's `_index_put_impl_` (planned in
/// `traced::plans`) both follow these steps.
pub(crate) fn index_put_sort_steps(rows: u64) -> Vec<ScratchStep> {
    let row_bytes = rows.saturating_mul(DType::I64.size());
    STEPS
        .iter()
        .map(|step| match *step {
            Step::Rows => ScratchStep::Take(row_bytes),
            Step::Byte => ScratchStep::Take(1),
            Step::Free(i) => ScratchStep::Free(i),
        })
        .collect()
}

impl Engine {
    /// The gradient of an indexed tensor: a zeros of `shape`, then the
    /// sort's buffers for `rows` index rows, freed before it returns.
    pub(in crate::engine) fn index_put_grad(
        &mut self,
        shape: Shape,
        dtype: DType,
        rows: u64,
    ) -> Result<TensorId> {
        let t = self.empty(shape, dtype, Category::Gradient)?;
        let mut made: Vec<Option<Option<StorageId>>> = Vec::new();
        let mut failed = None;
        for step in index_put_sort_steps(rows) {
            match step {
                ScratchStep::Take(bytes) => match self.transient(bytes, Category::Temporary) {
                    Ok(s) => made.push(Some(s)),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                },
                ScratchStep::Free(i) => {
                    if let Some(slot) = made.get_mut(i) {
                        let s = slot.take().flatten();
                        self.free_transient(s);
                    }
                }
            }
        }
        // On a failure, what was made goes, newest first.
        for s in made.into_iter().rev().flatten() {
            self.free_transient(s);
        }
        match failed {
            Some(e) => {
                self.release(t);
                Err(e)
            }
            None => Ok(t),
        }
    }
}
