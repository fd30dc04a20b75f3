//! `sign()` and `clamp(min, max)`: the pointwise ops of a sign-gradient
//! step on an input (`x + eps * x.grad.sign()).clamp(0, 1)`).

use super::super::error::Result;
use super::super::tensor::TensorId;
use super::super::Engine;
use crate::engine::autograd::BwdKind;

impl Engine {
    /// `x.sign()`: an output of x's shape and dtype; SignBackward0 saves
    /// nothing (its gradient is `zeros_like(grad)`).
    pub fn sign(&mut self, x: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("sign");
        let out = self.act(self.shape(x), self.dtype(x));
        let r = out.inspect(|&out| {
            self.k_unary(x, out);
            if self.records(&[x]) {
                let node = self.new_node("SignBackward0", BwdKind::Alloc, &[Some(x)]);
                self.set_grad_fn(out, node, 0);
            }
        });
        self.op_end(prev)?;
        r
    }

    /// `x.clamp(min, max)` with both bounds numbers: an output of x's shape;
    /// ClampBackward1 saves its input `self` (derivatives.yaml), whose
    /// backward is `clamp_backward`'s `where((self >= min).logical_and_(self
    /// <= max), grad, zero)` ([`BwdKind::Clamp`]).
    pub fn clamp(&mut self, x: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("clamp");
        let out = self.act(self.shape(x), self.dtype(x));
        let r = out.inspect(|&out| {
            self.k_unary(x, out);
            if self.records(&[x]) {
                let node = self.new_node("ClampBackward1", BwdKind::Clamp, &[Some(x)]);
                self.save(node, "self", x, false);
                self.set_grad_fn(out, node, 0);
            }
        });
        self.op_end(prev)?;
        r
    }
}
