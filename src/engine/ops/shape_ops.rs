//! Views (never allocate), copies, casts, cat/split and embedding (§1.3, table 1.7).

use super::super::dtype::DType;
use super::super::error::Result;
use super::super::shape::Shape;
use super::super::tag::Category;
use super::super::tensor::{Layout, TensorId};
use super::super::Engine;
use crate::engine::autograd::BwdKind;
use crate::engine::scratch::embedding::embedding_sort;

impl Engine {
    /// `view`/`reshape` on a contiguous tensor, `unsqueeze`, `flatten`…: a view.
    /// On a non-contiguous tensor `reshape` copies (§1.3).
    pub fn reshape(&mut self, x: TensorId, shape: Shape) -> Result<TensorId> {
        if self.layout(x) == Layout::Contiguous {
            return Ok(self.view_as(x, shape, Layout::Contiguous));
        }
        let c = self.contiguous(x)?;
        let v = self.view_as(c, shape, Layout::Contiguous);
        self.release(c);
        Ok(v)
    }

    /// A view of `x` with a backward node of its own (`name`, `kind`) where
    /// its gradient needs more than handing on: a reshape that must copy.
    pub(crate) fn view_with_node(
        &mut self,
        x: TensorId,
        shape: Shape,
        layout: Layout,
        name: &'static str,
        kind: BwdKind,
    ) -> TensorId {
        if !self.records(&[x]) {
            return self.view_as(x, shape, layout);
        }
        let b = self.tensors[x.0].clone();
        let v = self.wrap_storage(b.storage, shape, b.dtype, layout, true);
        self.t_mut(v).inference = b.inference;
        let node = self.new_node(name, kind, &[Some(x)]);
        self.set_grad_fn(v, node, 0);
        v
    }

    /// `transpose(a, b)`: a strided view.
    pub fn transpose(&mut self, x: TensorId, a: usize, b: usize) -> TensorId {
        let s = self.shape(x).swapped(a, b);
        self.view_as(x, s, Layout::Strided)
    }

    /// `contiguous()`: the same tensor if already contiguous, else a copy
    /// (CloneBackward0 saves nothing). The gradient of a strided input
    /// reaches its producer strided (its view's backward, e.g.
    /// TransposeBackward0, undoes the permutation); a broadcast input's is
    /// summed by `validate_outputs`.
    pub fn contiguous(&mut self, x: TensorId) -> Result<TensorId> {
        let layout = self.layout(x);
        if layout == Layout::Contiguous {
            return Ok(self.local_ref(x));
        }
        let prev = self.op_begin("contiguous");
        let out = self.act(self.shape(x), self.dtype(x));
        let r = out.inspect(|&out| {
            self.k_unary(x, out);
            if self.records(&[x]) {
                let kind = if layout == Layout::Strided {
                    BwdKind::Slice
                } else {
                    BwdKind::PassThrough
                };
                let node = self.new_node("CloneBackward0", kind, &[Some(x)]);
                self.set_grad_fn(out, node, 0);
            }
        });
        self.op_end(prev)?;
        r
    }

    /// `.to(dtype)`: self when nothing changes, else one storage in the new dtype;
    /// ToCopyBackward0 saves nothing and casts the gradient back (table 2.2).
    pub fn to_dtype(&mut self, x: TensorId, dtype: DType) -> Result<TensorId> {
        self.cast_tagged(x, dtype, Category::Activation)
    }

    pub(crate) fn cast_tagged(
        &mut self,
        x: TensorId,
        dtype: DType,
        category: Category,
    ) -> Result<TensorId> {
        if self.dtype(x) == dtype {
            return Ok(self.local_ref(x));
        }
        let prev = self.op_begin("_to_copy");
        let cat = if category == Category::Activation && self.ckpt.rebuilding() {
            Category::Recompute
        } else {
            category
        };
        let out = self.empty(self.shape(x), dtype, cat);
        let r = out.inspect(|&out| {
            self.k_unary(x, out);
            if self.records(&[x]) {
                let node = self.new_node("ToCopyBackward0", BwdKind::Cast, &[Some(x)]);
                self.set_grad_fn(out, node, 0);
            }
        });
        self.op_end(prev)?;
        r
    }

    /// `split(size, dim)` into `n` equal views along the last dim (SplitBackward0
    /// gathers the gradients into one tensor of the input's shape).
    pub fn split_last(&mut self, x: TensorId, n: u64) -> Vec<TensorId> {
        let shape = self.shape(x);
        let part = shape.with_last(shape.last() / n.max(1));
        let node = if self.records(&[x]) {
            Some(self.new_node("SplitBackward0", BwdKind::Split, &[Some(x)]))
        } else {
            None
        };
        let mut out = Vec::with_capacity(n as usize);
        for i in 0..n {
            let v = self.view_as_plain(x, part, Layout::Strided);
            if let Some(node) = node {
                self.set_grad_fn(v, node, i as u8);
            }
            out.push(v);
        }
        out
    }

    /// `cat(tensors)`: one output of the combined size; nothing saved.
    pub fn cat(&mut self, xs: &[TensorId], shape: Shape) -> Result<TensorId> {
        let prev = self.op_begin("cat");
        let dtype = xs.first().map(|t| self.dtype(*t)).unwrap_or(DType::F32);
        let out = self.act(shape, dtype);
        let r = out.inspect(|&out| {
            for x in xs {
                self.k_unary(*x, out);
            }
            if self.records(xs) {
                let ins: Vec<Option<TensorId>> = xs.iter().map(|t| Some(*t)).collect();
                let node = self.new_node("CatBackward0", BwdKind::Slice, &ins);
                self.set_grad_fn(out, node, 0);
            }
        });
        self.op_end(prev)?;
        r
    }

    /// `embedding(weight [V, dim], indices)`: out [..., dim]; saves the indices
    /// only; backward makes a dense [V, dim] gradient (table 2.2), sorting
    /// the indices first past 3,072 lookups (`scratch::embedding`).
    pub fn embedding(&mut self, w: TensorId, idx: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("embedding");
        let ws = self.shape(w);
        let mut dims = self.shape(idx).to_vec();
        dims.push(ws.last());
        let out = self.act(Shape::new(&dims), self.dtype(w));
        let r = out.inspect(|&out| {
            self.k_unary(w, out);
            if self.records(&[w]) {
                let sort = embedding_sort(
                    self.shape(idx).numel(),
                    self.dtype(idx).size(),
                    ws.dims().first().copied().unwrap_or(1),
                    ws.last(),
                    self.dtype(w).size(),
                );
                let node = self.new_node(
                    "EmbeddingBackward0",
                    BwdKind::Embedding { sort },
                    &[Some(w)],
                );
                self.save(node, "indices", idx, false);
                self.set_grad_fn(out, node, 0);
            }
        });
        self.op_end(prev)?;
        r
    }

    /// `.cpu()`: a host copy; the GPU original stays until released (§1.3).
    pub fn cpu(&mut self, x: TensorId) -> TensorId {
        let (shape, dtype) = (self.shape(x), self.dtype(x));
        self.empty_cpu(shape, dtype, Category::Cpu)
    }
}
