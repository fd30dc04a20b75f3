//! The ops transformers 5.x's default experts implementation runs
//! (`grouped_mm_experts_forward`, transformers 5.16.1
//! integrations/moe.py:377-478; model_lang/moe/grouped.rs writes the
//! forward with them): `torch.sort` of the expert ids, the index
//! arithmetic that needs no gradient (`//`, `.int()`, `histc`, `cumsum`,
//! `>=`, `empty_like`, `arange`), in-place `masked_fill_` and `div_`,
//! `torch._grouped_mm`, and `view(...).sum(dim=1)`. What each saves is
//! PyTorch's rule: derivatives.yaml and the node's `SavedVariable`s as
//! generated for PyTorch 2.11.0, cited by line of the wheel's
//! `torch/include/torch/csrc/autograd/generated/Functions.h`
//! ("Functions.h"; `release_variables()` frees them in declaration order).
//! The order of what each allocates is the one `vramscope trace` records
//! for tests/fixtures/hf-trace/train.py on a tiny Mixtral, Qwen2-MoE and
//! Qwen3-MoE (PyTorch's own autograd run on meta tensors).
//!
//! Not modelled, on either side (the trace's meta kernels make only the
//! outputs): CUTLASS's two buffers in `bf16bf16_grouped_mm` on sm90
//! (aten/src/ATen/native/cuda/GroupMM.cu: the pointer/stride/problem
//! arrays, `aligned_groups * 24 + groups * 36` bytes, and
//! `Gemm::get_workspace_size`, both taken and freed inside the call), and
//! cub's scratch when `sort` runs its radix sort (more than 4,096 ids).
//! Nor, on the engine's side, `create_grouped_gemm_output_tensor`'s padding
//! (ATen/native/GroupedMMUtils.h; torch/_meta_registrations.py:8132-8135
//! pads the trace's the same): a row whose bytes are not a multiple of 16
//! (a bf16 width not a multiple of 8) is padded to one, which the
//! families' published widths never need.

use super::super::dtype::DType;
use super::super::error::Result;
use super::super::shape::Shape;
use super::super::tensor::{Layout, TensorId};
use super::super::Engine;
use crate::engine::autograd::BwdKind;

impl Engine {
    /// `torch.sort(ids)` on 1-D int64 ids: the sorted values and the
    /// int64 permutation, both new (integer: no gradient). Returns
    /// (values, indices).
    pub(crate) fn sort_ids(&mut self, ids: TensorId) -> Result<(TensorId, TensorId)> {
        let prev = self.op_begin("sort");
        let shape = self.shape(ids);
        let r = self
            .act(shape, DType::I64)
            .and_then(|values| match self.act(shape, DType::I64) {
                Ok(indices) => Ok((values, indices)),
                Err(e) => {
                    self.release(values);
                    Err(e)
                }
            });
        if let Ok((v, i)) = r {
            self.k_unary(ids, v);
            self.k_unary(ids, i);
        }
        self.op_end(prev)?;
        r
    }

    /// An op on indices or counts that records no gradient (`perm //
    /// top_k`, `.int()`, `histc`, `cumsum`, `ids >= E`, `empty_like`,
    /// `arange`): one new tensor of `shape` and `dtype`.
    pub(crate) fn index_math(
        &mut self,
        name: &'static str,
        shape: Shape,
        dtype: DType,
    ) -> Result<TensorId> {
        let prev = self.op_begin(name);
        let r = self.act(shape, dtype);
        self.op_end(prev)?;
        r
    }

    /// `x.masked_fill_(mask, value)` in place: no allocation.
    /// derivatives.yaml `masked_fill_.Scalar` (as `masked_fill.Scalar`):
    /// `self: grad.masked_fill(mask, 0)`: MaskedFillBackward0 (Functions.h
    /// line 3841) saves `mask_` (3853); the history is rebased onto it.
    pub(crate) fn masked_fill_inplace(&mut self, x: TensorId, mask: TensorId) -> Result<()> {
        let prev = self.op_begin("masked_fill_");
        let r = self.check_inplace(x);
        if r.is_ok() {
            self.k_unary(x, x);
            self.bump_version(x);
            if self.records(&[x]) {
                let node = self.new_node("MaskedFillBackward0", BwdKind::Alloc, &[Some(x)]);
                self.save(node, "mask", mask, false);
                self.set_grad_fn(x, node, 0);
            }
        }
        self.op_end(prev)?;
        r
    }

    /// `a /= b` in place (`router_top_value /= router_top_value.sum(-1,
    /// keepdim=True)`). DivBackward0 (Functions.h line 1682) saves `other_`
    /// (1695) and `self_` (1696); `self` is overwritten, so the generated
    /// VariableType code saves `original_self = self.clone()` first, when
    /// `other`'s gradient is needed: one copy of `a`, kept for backward.
    pub(crate) fn div_inplace(&mut self, a: TensorId, b: TensorId) -> Result<()> {
        let prev = self.op_begin("div_");
        let r = self.div_inplace_inner(a, b);
        self.op_end(prev)?;
        r
    }

    fn div_inplace_inner(&mut self, a: TensorId, b: TensorId) -> Result<()> {
        self.check_inplace(a)?;
        let records = self.records(&[a, b]);
        let original = if records && self.requires_grad(b) {
            let c = self.aux(self.shape(a), self.dtype(a))?;
            self.k_unary(a, c);
            Some(c)
        } else {
            None
        };
        self.k_binary(a, b, a);
        self.bump_version(a);
        if records {
            let node = self.new_node("DivBackward0", BwdKind::Div, &[Some(a), Some(b)]);
            self.save(node, "other", b, false);
            if let Some(c) = original {
                self.save(node, "self", c, false);
            }
            self.set_grad_fn(a, node, 0);
        }
        if let Some(c) = original {
            self.release(c);
        }
        Ok(())
    }

    /// `torch._grouped_mm(a, b, offs)`: `a` [S, K] (rows sorted by group),
    /// `b` [G, K, N] (a transposed view of a 3-D weight), `offs` the int32
    /// group ends: one new [S, N] in `a`'s dtype. derivatives.yaml
    /// `_grouped_mm`: `self: _grouped_mm_mat1_backward(grad, mat2, …,
    /// offs)`, `mat2: _grouped_mm_mat2_backward(grad, self, …, offs)`:
    /// GroupedMmBackward0 (Functions.h line 4350) saves `mat2_` (4364),
    /// `offs_` (4368) and `self_` (4369); its backward makes mat2's
    /// gradient, then self's (`BwdKind::GroupedMm`).
    pub(crate) fn grouped_mm(
        &mut self,
        a: TensorId,
        b: TensorId,
        offs: TensorId,
    ) -> Result<TensorId> {
        let prev = self.op_begin("_grouped_mm");
        let rows = self.shape(a).dim(0);
        let n = self.shape(b).last();
        let out = self.act(Shape::new(&[rows, n]), self.dtype(a));
        let r = out.inspect(|&out| {
            self.k_binary(a, b, out);
            if self.records(&[a, b]) {
                let node = self.new_node(
                    "GroupedMmBackward0",
                    BwdKind::GroupedMm,
                    &[Some(a), Some(b)],
                );
                self.save(node, "mat2", b, false);
                self.save(node, "offs", offs, false);
                self.save(node, "self", a, false);
                self.set_grad_fn(out, node, 0);
            }
        });
        self.op_end(prev)?;
        r
    }

    /// `x.view(n, k, d).sum(dim=1)` on a contiguous `x` [n·k, d]: one new
    /// [n, d]. SumBackward1 (Functions.h line 6738) saves the sizes only:
    /// its gradient is the incoming one expanded to [n, k, d] (a view);
    /// ViewBackward0's `grad.reshape(self_sym_sizes)` must copy that
    /// broadcast view (`BwdKind::ViewCopy`).
    pub(crate) fn view_sum_dim1(&mut self, x: TensorId, k: u64) -> Result<TensorId> {
        let s = self.shape(x);
        let (rows, d) = (s.dim(0) / k.max(1), s.last());
        let v = self.view_with_node(
            x,
            Shape::new(&[rows, k, d]),
            Layout::Contiguous,
            "ViewBackward0",
            BwdKind::ViewCopy,
        );
        let prev = self.op_begin("sum");
        let out = self.act(Shape::new(&[rows, d]), self.dtype(x));
        let r = out.inspect(|&out| {
            self.k_sum(v, out);
            if self.records(&[v]) {
                let node = self.new_node("SumBackward1", BwdKind::Expand, &[Some(v)]);
                self.set_grad_fn(out, node, 0);
            }
        });
        self.release(v);
        self.op_end(prev)?;
        r
    }
}
