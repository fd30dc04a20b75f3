//! Kernel scratch of the backward functions that allocate more than their
//! gradients: the cuDNN RNN's stand-in zeros, SDPA's scratch, the layer
//! norm's partial sums and the embedding's sort path, each buffer freed
//! where its C++ scope ends.

use crate::engine::autograd::backward::Out;
use crate::engine::autograd::{NodeId, ScratchStep, SdpaScratch};
use crate::engine::dtype::DType;
use crate::engine::error::Result;
use crate::engine::scratch::embedding::EmbeddingSort;
use crate::engine::scratch::layer_norm;
use crate::engine::shape::Shape;
use crate::engine::storage::StorageId;
use crate::engine::tag::Category;
use crate::engine::tensor::TensorId;
use crate::engine::Engine;

impl Engine {
    /// A gradient with a temporary of its size made and freed beside it:
    /// before it (`temp_first`) or after it (`BwdKind::AllocWithTemp`).
    pub(in crate::engine) fn grad_with_temp(
        &mut self,
        shape: Shape,
        dtype: DType,
        temp_first: bool,
    ) -> Result<TensorId> {
        let bytes = shape.numel() * dtype.size();
        if temp_first {
            let tmp = self.transient(bytes, Category::Temporary)?;
            let t = self.empty(shape, dtype, Category::Gradient);
            self.free_transient(tmp);
            return t;
        }
        let t = self.empty(shape, dtype, Category::Gradient)?;
        match self.transient(bytes, Category::Temporary) {
            Ok(tmp) => {
                self.free_transient(tmp);
                Ok(t)
            }
            Err(e) => {
                self.release(t);
                Err(e)
            }
        }
    }

    /// `clamp_backward`'s gradient ([`BwdKind::Clamp`]): the 0-dim zero
    /// (4 B of a float), the masks `self >= min` and `self <= max` (one
    /// byte per element), the gradient; then the masks go, the second
    /// first (temporaries of one C++ expression, newest first), and the
    /// zero (a local, after the expression).
    pub(in crate::engine) fn clamp_grad(&mut self, shape: Shape, dtype: DType) -> Result<TensorId> {
        let mask = shape.numel().saturating_mul(DType::Bool.size());
        self.grad_after([dtype.size(), mask, mask], shape, dtype)
    }

    /// A gradient made after `temps` temporaries of its size, which go once
    /// it exists, newest first ([`BwdKind::AllocAfterTemps`]).
    pub(in crate::engine) fn grad_after_temps(
        &mut self,
        shape: Shape,
        dtype: DType,
        temps: u8,
    ) -> Result<TensorId> {
        let bytes = shape.numel() * dtype.size();
        self.grad_after((0..temps).map(|_| bytes), shape, dtype)
    }

    /// A gradient made after temporaries of these sizes, which go once it
    /// exists (or the allocation failed), newest first.
    fn grad_after(
        &mut self,
        temps: impl IntoIterator<Item = u64>,
        shape: Shape,
        dtype: DType,
    ) -> Result<TensorId> {
        let mut held = Vec::new();
        let mut made = Ok(());
        for bytes in temps {
            match self.transient(bytes, Category::Temporary) {
                Ok(s) => held.push(s),
                Err(e) => {
                    made = Err(e);
                    break;
                }
            }
        }
        let t = made.and_then(|()| self.empty(shape, dtype, Category::Gradient));
        for s in held.into_iter().rev() {
            self.free_transient(s);
        }
        t
    }

    /// `_cudnn_rnn_backward`'s stand-ins for undefined incoming gradients:
    /// `zeros_like(output)`, `zeros_like(hx)`, `zeros_like(cx)`, in that
    /// order, for each of output, hy and cy that received no gradient.
    pub(in crate::engine) fn cudnn_rnn_zero_grads(&mut self, n: NodeId) -> Result<Vec<TensorId>> {
        let output = self.nodes[n.0]
            .saved
            .iter()
            .find(|s| s.name == "result0")
            .map(|s| (s.shape, s.dtype));
        let hidden = |k: usize| {
            let m = self.nodes[n.0].inputs[k];
            (m.shape, m.dtype)
        };
        let likes = [output, Some(hidden(1)), Some(hidden(2))];
        let mut zeros = Vec::new();
        for (k, like) in likes.into_iter().enumerate() {
            let received = self.nodes[n.0].buf.get(k).copied().flatten().is_some();
            if let (false, Some((shape, dtype))) = (received, like) {
                match self.empty(shape, dtype, Category::Temporary) {
                    Ok(z) => {
                        self.k_fill(z, 0.0);
                        zeros.push(z);
                    }
                    Err(e) => {
                        for z in zeros.into_iter().rev() {
                            self.release(z);
                        }
                        return Err(e);
                    }
                }
            }
        }
        Ok(zeros)
    }

    /// What an SDPA backward allocates after its q, k, v gradients.
    pub(in crate::engine) fn sdpa_backward_scratch(&mut self, scratch: SdpaScratch) -> Result<()> {
        let steps = scratch.steps();
        let takes = steps
            .iter()
            .filter(|s| matches!(s, ScratchStep::Take(_)))
            .count();
        // cuDNN's and the fp32 kernel's last buffer is the kernel's workspace.
        let workspace_last = matches!(
            scratch,
            SdpaScratch::Cudnn { .. } | SdpaScratch::EfficientF32 { .. }
        );
        let mut taken: Vec<Option<Option<StorageId>>> = Vec::new();
        for step in steps {
            match step {
                ScratchStep::Take(bytes) => {
                    let category = if workspace_last && taken.len() + 1 == takes {
                        Category::Workspace
                    } else {
                        Category::Temporary
                    };
                    match self.transient(bytes, category) {
                        Ok(s) => taken.push(Some(s)),
                        Err(e) => {
                            for s in taken.into_iter().rev().flatten() {
                                self.free_transient(s);
                            }
                            return Err(e);
                        }
                    }
                }
                ScratchStep::Free(i) => {
                    if let Some(s) = taken.get_mut(i).and_then(Option::take) {
                        self.free_transient(s);
                    }
                }
            }
        }
        Ok(())
    }

    /// The partial-sum path of the layer-norm backward's weight and bias
    /// gradients (`layer_norm_scratch`): `dgamma_blocks` and `dbeta_blocks`,
    /// then per gradient `*dgamma = dgamma_blocks.sum(0)` (the sum's output
    /// and scratch, then the first gradient freed), then the blocks freed,
    /// last made first.
    pub(in crate::engine) fn layer_norm_partial_sums(
        &mut self,
        rows: u64,
        outs: &mut [Out],
    ) -> Result<()> {
        let params: Vec<(usize, TensorId)> = outs
            .iter()
            .filter_map(|o| match *o {
                Out::Ready(i, t) if i > 0 => Some((i, t)),
                _ => None,
            })
            .collect();
        let mut held = Held::default();
        let r = (|| {
            for &(_, t) in &params {
                let bytes = rows * self.nbytes(t);
                held.take(self, bytes, Category::Temporary)?;
            }
            for &(i, old) in &params {
                let (shape, dtype) = (self.shape(old), self.dtype(old));
                let reduction =
                    layer_norm::partial_sum_reduction(rows, shape.numel(), dtype.size());
                let sum = self.empty(shape, dtype, Category::Gradient)?;
                let sum = self.scratch_after(sum, Some(reduction))?;
                self.k_grad_from(Some(old), sum);
                self.release(old);
                if let Some(o) = outs
                    .iter_mut()
                    .find(|o| matches!(o, Out::Ready(j, _) if *j == i))
                {
                    *o = Out::Ready(i, sum);
                }
            }
            Ok(())
        })();
        held.drop_last(self, held.len());
        r
    }

    /// `embedding_dense_backward_cuda`: the zero-filled weight gradient, and
    /// on the sort path the buffers around it, each freed where its C++
    /// scope ends (`embedding_scratch`).
    pub(in crate::engine) fn embedding_backward(
        &mut self,
        shape: crate::engine::shape::Shape,
        dtype: crate::engine::dtype::DType,
        sort: Option<EmbeddingSort>,
    ) -> Result<TensorId> {
        let Some(s) = sort else {
            return self.empty(shape, dtype, Category::Gradient);
        };
        let mut held = Held::default();
        // sorted_indices and orig_indices live to the end; the arange and
        // the sort's temporary die with the dispatch lambda.
        let sorted = (|| {
            held.take(self, s.per_index, Category::Temporary)?;
            held.take(self, s.per_index, Category::Temporary)?;
            held.take(self, s.per_index, Category::Temporary)?;
            held.take(self, s.sort_temp, Category::Workspace)?;
            held.drop_last(self, 2);
            self.empty(shape, dtype, Category::Gradient)
        })();
        let grad = match sorted {
            Ok(t) => t,
            Err(e) => {
                held.drop_last(self, held.len());
                return Err(e);
            }
        };
        let sums = self.embedding_segment_sums(&s, &mut held);
        // The kernel's locals go before the gradient is handed back (or,
        // unwinding, before it), then the caller's two index buffers.
        held.drop_last(self, held.len() - 2);
        if sums.is_err() {
            self.release(grad);
        }
        held.drop_last(self, held.len());
        sums.map(|()| grad)
    }

    /// `embedding_backward_cuda_kernel` after the gradient: segments of equal
    /// index, their partial segments, and the partial sums. Leaves the
    /// function-scope buffers (segment offsets, the segment count) in `held`.
    fn embedding_segment_sums(&mut self, s: &EmbeddingSort, held: &mut Held) -> Result<()> {
        held.take(self, s.per_index, Category::Temporary)?;
        held.take(self, s.scalar, Category::Temporary)?;
        // unique_by_key: its own key output, then CUB's temporary.
        held.take(self, s.per_index, Category::Temporary)?;
        held.take(self, s.unique_temp, Category::Workspace)?;
        held.drop_last(self, 2);
        let lambda_scope = held.len();
        held.take(self, s.per_segment, Category::Temporary)?;
        held.take(self, s.per_segment, Category::Temporary)?;
        held.take(self, s.scan_temp, Category::Workspace)?;
        held.drop_last(self, 1);
        held.take(self, s.scalar, Category::Temporary)?;
        held.take(self, s.partial_offsets, Category::Temporary)?;
        held.take(self, s.partial_sums, Category::Temporary)?;
        held.drop_last(self, held.len() - lambda_scope);
        Ok(())
    }
}

/// Transient buffers a kernel wrapper holds, freed last-made first as their
/// C++ scopes end (an exception unwinds the same way).
#[derive(Default)]
struct Held(Vec<Option<StorageId>>);

impl Held {
    fn take(&mut self, e: &mut Engine, bytes: u64, category: Category) -> Result<()> {
        self.0.push(e.transient(bytes, category)?);
        Ok(())
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn drop_last(&mut self, e: &mut Engine, count: usize) {
        for _ in 0..count {
            if let Some(s) = self.0.pop() {
                e.free_transient(s);
            }
        }
    }
}
