//! The primitive ops a hand-written model is made of (issue 42): `a - b`,
//! `a / b`, `x / scalar`, `x.max(dim=-1, keepdim=True)`, `x.sum(-1,
//! keepdim=True)`, `x.masked_fill(mask, value)` and the causal mask
//! `torch.triu(torch.ones(t, t, dtype=torch.bool), 1)`; `exp`, `sigmoid`
//! and `mul` are in `elementwise.rs`. What each saves is PyTorch's own rule:
//! the formula in tools/autograd/derivatives.yaml, and the `SavedVariable`s
//! of its node as generated for PyTorch 2.11.0, cited by line of the wheel's
//! `torch/include/torch/csrc/autograd/generated/Functions.h` ("Functions.h"
//! below; `release_variables()` there frees them in declaration order).
//! What each backward allocates, and in which order, was read from the
//! hand-written Transformer's H100 capture
//! (tests/fixtures/pytorch/captured/handwritten_transformer.pickle).
//!
//! The same header for the ops elementwise.rs has: ExpBackward0 (line 1990)
//! and SigmoidBackward0 (5924) save `result_` (2002, 5936); MulBackward0
//! (4401) saves `other_` (4414) and `self_` (4416).

use super::super::dtype::DType;
use super::super::error::Result;
use super::super::shape::Shape;
use super::super::tag::Category;
use super::super::tensor::TensorId;
use super::super::Engine;
use crate::engine::autograd::BwdKind;

impl Engine {
    /// `a - b` (broadcast). derivatives.yaml `sub.Tensor`: `self: grad`,
    /// `other: -grad * alpha`: SubBackward0 (Functions.h line 6619) saves no
    /// tensor, only the scalar types; its backward makes `-grad` at the
    /// output's shape (then `sum_to` a broadcast `b`).
    pub fn sub(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("sub");
        let r = self.binary_node(a, b, "SubBackward0", BwdKind::Sub);
        self.op_end(prev)?;
        r
    }

    /// `a / b` (broadcast). derivatives.yaml `div.Tensor`: `self:
    /// div_tensor_self_backward(grad, other, self.scalar_type())`, `other:
    /// div_tensor_other_backward(grad, self, other)`: DivBackward0
    /// (Functions.h line 1682) saves `other_` (1695), needed by both, and
    /// `self_` (1696), needed by other's. Its backward computes other's `-grad
    /// * ((self / other) / other)` first (three temporaries), then self's
    /// `grad / other` (the capture).
    pub fn div(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("div");
        let r = self.binary_node(a, b, "DivBackward0", BwdKind::Div);
        if let Ok(out) = r {
            if let Some(node) = self.tensors[out.0].grad_fn {
                self.save(node, "other", b, false);
                if self.requires_grad(b) {
                    self.save(node, "self", a, false);
                }
            }
        }
        self.op_end(prev)?;
        r
    }

    /// `x / scalar`. derivatives.yaml `div.Scalar`: `self:
    /// div_tensor_self_backward(grad, other, self.scalar_type())`, other a
    /// Scalar: DivBackward1 (Functions.h line 1704) saves no tensor.
    pub fn div_scalar(&mut self, x: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("div");
        let out = self.act(self.shape(x), self.dtype(x));
        let r = out.inspect(|&out| {
            self.k_unary(x, out);
            if self.records(&[x]) {
                let node = self.new_node("DivBackward1", BwdKind::Alloc, &[Some(x)]);
                self.set_grad_fn(out, node, 0);
            }
        });
        self.op_end(prev)?;
        r
    }

    fn binary_node(
        &mut self,
        a: TensorId,
        b: TensorId,
        name: &'static str,
        kind: BwdKind,
    ) -> Result<TensorId> {
        let (sa, sb) = (self.shape(a), self.shape(b));
        let shape = if sa.numel() >= sb.numel() { sa } else { sb };
        let out = self.act(shape, DType::promote(self.dtype(a), self.dtype(b)))?;
        self.k_binary(a, b, out);
        if self.records(&[a, b]) {
            let node = self.new_node(name, kind, &[Some(a), Some(b)]);
            self.set_grad_fn(out, node, 0);
        }
        Ok(out)
    }

    /// `x.max(dim=-1, keepdim=True)`: values then int64 indices, [.., 1].
    /// derivatives.yaml `max.dim`: `self:
    /// value_selecting_reduction_backward_symint(grad, dim, indices,
    /// self.sym_sizes(), keepdim)`: MaxBackward0 (Functions.h line 3959)
    /// saves `indices_` (3974), which outlive the returned tuple, and the
    /// sizes; its backward scatters into a new zeros of the input's shape.
    /// Returns the values.
    pub fn max_last_keepdim(&mut self, x: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("max");
        let r = self.max_inner(x);
        self.op_end(prev)?;
        r
    }

    fn max_inner(&mut self, x: TensorId) -> Result<TensorId> {
        let shape = self.shape(x).with_last(1);
        let values = self.act(shape, self.dtype(x))?;
        let indices = match self.aux(shape, DType::I64) {
            Ok(i) => i,
            Err(e) => {
                self.release(values);
                return Err(e);
            }
        };
        self.k_sum(x, values);
        if self.records(&[x]) {
            let node = self.new_node("MaxBackward0", BwdKind::Alloc, &[Some(x)]);
            self.set_grad_fn(values, node, 0);
            self.save(node, "indices", indices, true);
        }
        // `.values` of the returned tuple: the tuple, and its indices handle, go.
        self.release(indices);
        Ok(values)
    }

    /// `x.sum(dim=-1, keepdim=True)`. derivatives.yaml `sum.dim_IntList`:
    /// `self: sum_backward(grad, self.sym_sizes(), dim, keepdim)`:
    /// SumBackward1 (Functions.h line 6738) saves the sizes only (6752); its
    /// gradient is the incoming one expanded (a view). Under
    /// autocast `sum` is on the fp32_set_opt_dtype list: a half input sums
    /// into an fp32 result (§6.1).
    pub fn sum_last_keepdim(&mut self, x: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("sum");
        let dtype = match self.amp.active(self.ctx.inference) {
            Some(_) if self.dtype(x).is_half() => DType::F32,
            _ => self.dtype(x),
        };
        let out = self.act(self.shape(x).with_last(1), dtype);
        let r = out.inspect(|&out| {
            self.k_sum(x, out);
            if self.records(&[x]) {
                let node = self.new_node("SumBackward1", BwdKind::Expand, &[Some(x)]);
                self.set_grad_fn(out, node, 0);
            }
        });
        self.op_end(prev)?;
        r
    }

    /// `x.masked_fill(mask, value)` (out of place, the mask broadcast).
    /// derivatives.yaml `masked_fill.Scalar`: `self: grad.masked_fill(mask,
    /// 0)`: MaskedFillBackward0 (Functions.h line 3841) saves `mask_` (3853);
    /// its backward makes one tensor of the input's shape.
    pub fn masked_fill(&mut self, x: TensorId, mask: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("masked_fill");
        let out = self.act(self.shape(x), self.dtype(x));
        let r = out.inspect(|&out| {
            self.k_unary(x, out);
            if self.records(&[x]) {
                let node = self.new_node("MaskedFillBackward0", BwdKind::Alloc, &[Some(x)]);
                self.set_grad_fn(out, node, 0);
                self.save(node, "mask", mask, false);
            }
        });
        self.op_end(prev)?;
        r
    }

    /// `torch.triu(torch.ones(t, t, dtype=torch.bool), 1)`: the ones, then
    /// the triangle, the ones freed as the statement ends.
    pub fn causal_bool_mask(&mut self, t: u64) -> Result<TensorId> {
        let prev = self.op_begin("triu");
        let square = Shape::new(&[t, t]);
        let ones = self.empty(square, DType::Bool, Category::Activation);
        let mask = ones.and_then(|ones| {
            let mask = self.empty(square, DType::Bool, Category::Activation);
            self.release(ones);
            mask
        });
        self.op_end(prev)?;
        mask
    }
}
