//! The ops a mixture-of-experts layer dispatches its tokens with (issue 42):
//! `topk`, `torch.where(mask)` (`nonzero`), `index_select`, advanced
//! indexing `w[rows, cols]`, `index_add` (out of place and in place) and
//! `zeros_like`. What each saves is PyTorch's own rule: the formula in
//! tools/autograd/derivatives.yaml and the `SavedVariable`s of its node as
//! generated for PyTorch 2.11.0, cited by line of the wheel's
//! `torch/include/torch/csrc/autograd/generated/Functions.h` ("Functions.h"
//! below; `release_variables()` frees them in declaration order). What each
//! allocates, and in which order, was read from the H100 capture of
//! tests/fixtures/pytorch/moe_small.py
//! (tests/fixtures/pytorch/captured/moe_small.pickle).

use super::super::dtype::DType;
use super::super::error::Result;
use super::super::shape::Shape;
use super::super::tag::Category;
use super::super::tensor::TensorId;
use super::super::Engine;
use crate::engine::autograd::BwdKind;

/// cub's scratch in `nonzero`'s two device passes (the count, then the
/// selection), as the H100 trace of moe_small shows them for a
/// 4,096-element mask: 1 B, then 1,023 B. cub sizes them from the item
/// count; other counts are assumed to take the same (a few bytes either way).
pub(crate) const NONZERO_CUB_SCRATCH: [u64; 2] = [1, 1023];

impl Engine {
    /// `x.topk(k, dim=-1)`: values (`x`'s dtype) and int64 indices, both
    /// `[.., k]`. derivatives.yaml `topk`: `self:
    /// value_selecting_reduction_backward_symint(grad, dim, indices,
    /// self.sym_sizes(), true)`: TopkBackward0 (Functions.h line 7026)
    /// saves `indices_` (7040) and the sizes (7039); its backward scatters into a
    /// new zeros of the input's shape. Returns (values, indices).
    pub fn topk(&mut self, x: TensorId, k: u64) -> Result<(TensorId, TensorId)> {
        let prev = self.op_begin("topk");
        let r = self.topk_inner(x, k);
        self.op_end(prev)?;
        r
    }

    fn topk_inner(&mut self, x: TensorId, k: u64) -> Result<(TensorId, TensorId)> {
        let shape = self.shape(x).with_last(k);
        let values = self.act(shape, self.dtype(x))?;
        let indices = match self.empty(shape, DType::I64, Category::Activation) {
            Ok(i) => i,
            Err(e) => {
                self.release(values);
                return Err(e);
            }
        };
        self.k_unary(x, values);
        if self.records(&[x]) {
            let node = self.new_node("TopkBackward0", BwdKind::Alloc, &[Some(x)]);
            self.set_grad_fn(values, node, 0);
            self.save(node, "indices", indices, true);
        }
        Ok((values, indices))
    }

    /// `torch.where(chosen == e)` on an int64 `[N, k]` tensor: the bool
    /// mask, then `nonzero`'s device count (an int, 4 B) and cub's scratch
    /// for it, the `[n, 2]` int64 result (`n`, the rows the data route to
    /// expert `e`: the caller says how many), cub's scratch for the
    /// selection; the count and the mask go as the statement ends. The
    /// returned `(row, col)` are the result's `unbind(1)` views (nonzero
    /// has no gradient). `eq` is false for a mask the model already holds
    /// (Hugging Face's `expert_mask[e]`): no comparison is made.
    pub fn where_nonzero(
        &mut self,
        mask_of: TensorId,
        n: u64,
        eq: bool,
    ) -> Result<(TensorId, TensorId)> {
        let prev = self.op_begin("nonzero");
        let r = self.where_inner(mask_of, n, eq);
        self.op_end(prev)?;
        r
    }

    fn where_inner(&mut self, mask_of: TensorId, n: u64, eq: bool) -> Result<(TensorId, TensorId)> {
        let shape = self.shape(mask_of);
        let mask = if eq {
            Some(self.empty(shape, DType::Bool, Category::Temporary)?)
        } else {
            None
        };
        let rank = u64::try_from(shape.dims().len()).unwrap_or(u64::MAX);
        let made = (|| {
            let count = self.transient(DType::I32.size(), Category::Temporary)?;
            let s = self.transient(NONZERO_CUB_SCRATCH[0], Category::Temporary);
            let out = s.and_then(|s| {
                self.free_transient(s);
                self.empty(Shape::new(&[n, rank]), DType::I64, Category::Activation)
            });
            let out = out.and_then(|out| {
                match self.transient(NONZERO_CUB_SCRATCH[1], Category::Temporary) {
                    Ok(s) => {
                        self.free_transient(s);
                        Ok(out)
                    }
                    Err(e) => {
                        self.release(out);
                        Err(e)
                    }
                }
            });
            self.free_transient(count);
            out
        })();
        if let Some(m) = mask {
            self.release(m);
        }
        let out = made?;
        let col = Shape::new(&[n]);
        let row = self.view_as(out, col, crate::engine::tensor::Layout::Strided);
        let slot = self.view_as(out, col, crate::engine::tensor::Layout::Strided);
        self.release(out);
        Ok((row, slot))
    }

    /// `x.index_select(0, index)` on `x` `[N, D]`: a new `[n, D]`.
    /// derivatives.yaml `index_select`: `self:
    /// index_select_backward_symint(grad, self.sym_sizes(), dim, index)`:
    /// IndexSelectBackward0 (Functions.h line 3083) saves `index_` (3096)
    /// and the sizes (3097); its backward makes a zeros of `x`'s shape and
    /// `index_add_`s the gradient into it (one allocation).
    pub fn index_select_rows(&mut self, x: TensorId, index: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("index_select");
        let n = self.shape(index).numel();
        let mut dims = self.shape(x).to_vec();
        if let Some(d) = dims.first_mut() {
            *d = n;
        }
        let shape = Shape::new(&dims);
        let out = self.act(shape, self.dtype(x));
        let r = out.inspect(|&out| {
            self.k_unary(x, out);
            if self.records(&[x]) {
                let node = self.new_node("IndexSelectBackward0", BwdKind::Alloc, &[Some(x)]);
                self.set_grad_fn(out, node, 0);
                self.save(node, "index", index, false);
            }
        });
        self.op_end(prev)?;
        r
    }

    /// `w[rows]` or `w[rows, cols]`, advanced indexing with int64 index
    /// tensors of `n` elements: a new `[n, rest…]` (the dimensions the
    /// indices do not cover). derivatives.yaml `index.Tensor`: `self:
    /// index_backward(grad.new_zeros_symint(self.sym_sizes(),
    /// self.options()), indices, grad)`: IndexBackward0 (Functions.h line
    /// 2805) saves `indices_` (2818, a list: each index tensor) and the
    /// sizes (2821); its backward is a zeros of `w`'s shape and an accumulating
    /// `index_put_` (CUDA's sort path: `BwdKind::IndexPut`).
    pub fn index_rows(&mut self, w: TensorId, indices: &[TensorId]) -> Result<TensorId> {
        let prev = self.op_begin("index");
        let n = indices.first().map_or(0, |i| self.shape(*i).numel());
        let ws = self.shape(w);
        let mut dims = vec![n];
        dims.extend(ws.dims().iter().skip(indices.len()));
        let out = self.act(Shape::new(&dims), self.dtype(w));
        let r = out.inspect(|&out| {
            self.k_unary(w, out);
            if self.records(&[w]) {
                let node =
                    self.new_node("IndexBackward0", BwdKind::IndexPut { rows: n }, &[Some(w)]);
                self.set_grad_fn(out, node, 0);
                for &i in indices {
                    self.save(node, "indices", i, false);
                }
            }
        });
        self.op_end(prev)?;
        r
    }

    /// `out.index_add(0, index, source)` (out of place: a copy of `out`
    /// with `source`'s rows added). derivatives.yaml `index_add`: `self:
    /// grad`, `source: maybe_multiply(source.dim() > 0 ?
    /// grad.index_select(dim, index).expand_as(source) : …, alpha)`:
    /// IndexAddBackward0 (Functions.h line 2899) saves `index_` (2914) and,
    /// for `expand_as(source)`, `source_` (2915) whole: each expert's
    /// weighted output lives until backward (the H100 trace).
    pub fn index_add(
        &mut self,
        out: TensorId,
        index: TensorId,
        source: TensorId,
    ) -> Result<TensorId> {
        let prev = self.op_begin("index_add");
        let r = self.act(self.shape(out), self.dtype(out));
        let r = r.inspect(|&res| {
            self.k_binary(out, source, res);
            self.index_add_node(res, out, index, source);
        });
        self.op_end(prev)?;
        r
    }

    /// `out.index_add_(0, index, source)` (in place, Hugging Face's MoE
    /// blocks): no allocation; the history is rebased onto
    /// IndexAddBackward0, which saves what [`Engine::index_add`]'s does.
    pub fn index_add_inplace(
        &mut self,
        out: TensorId,
        index: TensorId,
        source: TensorId,
    ) -> Result<()> {
        let prev = self.op_begin("index_add_");
        let r = self.check_inplace(out);
        if r.is_ok() {
            self.k_binary(out, source, out);
            self.bump_version(out);
            self.index_add_node(out, out, index, source);
        }
        self.op_end(prev)?;
        r
    }

    fn index_add_node(&mut self, res: TensorId, out: TensorId, index: TensorId, source: TensorId) {
        if self.records(&[out, source]) {
            let node = self.new_node(
                "IndexAddBackward0",
                BwdKind::IndexAdd,
                &[Some(out), Some(source)],
            );
            self.save(node, "index", index, false);
            self.save(node, "source", source, false);
            self.set_grad_fn(res, node, 0);
        }
    }

    /// `torch.zeros_like(x)`: one new tensor, no history.
    pub fn zeros_like(&mut self, x: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("zeros_like");
        let r = self.act(self.shape(x), self.dtype(x));
        if let Ok(t) = r {
            self.k_fill(t, 0.0);
        }
        self.op_end(prev)?;
        r
    }
}
