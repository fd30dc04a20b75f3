//! Unary and binary elementwise ops, in-place variants, dropout, reductions.

use serde::{Deserialize, Serialize};

use super::super::dtype::DType;
use super::super::error::Result;
use super::super::shape::Shape;
use super::super::tensor::TensorId;
use super::super::Engine;
use crate::engine::autograd::BwdKind;

/// Unary ops and what their backward saves (table 2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Unary {
    Relu,
    Gelu,
    Silu,
    Sigmoid,
    Tanh,
    Exp,
    Log,
    Sqrt,
}

impl Unary {
    fn op(self) -> &'static str {
        match self {
            Unary::Relu => "relu",
            Unary::Gelu => "gelu",
            Unary::Silu => "silu",
            Unary::Sigmoid => "sigmoid",
            Unary::Tanh => "tanh",
            Unary::Exp => "exp",
            Unary::Log => "log",
            Unary::Sqrt => "sqrt",
        }
    }

    pub(crate) fn node(self) -> &'static str {
        match self {
            Unary::Relu => "ReluBackward0",
            Unary::Gelu => "GeluBackward0",
            Unary::Silu => "SiluBackward0",
            Unary::Sigmoid => "SigmoidBackward0",
            Unary::Tanh => "TanhBackward0",
            Unary::Exp => "ExpBackward0",
            Unary::Log => "LogBackward0",
            Unary::Sqrt => "SqrtBackward0",
        }
    }

    /// relu, sigmoid, tanh, exp, sqrt save their result; gelu, silu, log their input.
    fn saves_result(self) -> bool {
        matches!(
            self,
            Unary::Relu | Unary::Sigmoid | Unary::Tanh | Unary::Exp | Unary::Sqrt
        )
    }

    /// Autocast's fp32 list (§6.1): exp, log (sqrt runs in the input dtype).
    fn fp32_under_autocast(self) -> bool {
        matches!(self, Unary::Exp | Unary::Log)
    }
}

impl Engine {
    /// A unary op: out of the same shape and dtype (table 1.7).
    pub fn unary(&mut self, op: Unary, x: TensorId) -> Result<TensorId> {
        let prev = self.op_begin(op.op());
        let r = self.unary_inner(op, x);
        self.op_end(prev)?;
        r
    }

    fn unary_inner(&mut self, op: Unary, x: TensorId) -> Result<TensorId> {
        let policy = if op.fp32_under_autocast() {
            super::super::amp::CastPolicy::Fp32
        } else {
            super::super::amp::CastPolicy::None
        };
        let xc = self.autocast_arg(x, policy)?;
        let out = match self.act(self.shape(xc), self.dtype(xc)) {
            Ok(out) => out,
            Err(e) => {
                // The op's own handle goes as the error leaves it; the input
                // then lives only as long as the caller's (Python's) frames.
                self.release(xc);
                return Err(e);
            }
        };
        self.k_unary(xc, out);
        if self.records(&[xc]) {
            // sqrt's backward is `grad / (2 * result)`: the doubled result
            // first, then the gradient (the H100 sweep).
            let kind = if op == Unary::Sqrt {
                BwdKind::AllocWithTemp { temp_first: true }
            } else {
                BwdKind::Alloc
            };
            let node = self.new_node(op.node(), kind, &[Some(xc)]);
            self.set_grad_fn(out, node, 0);
            if op.saves_result() {
                self.save(node, "result", out, true);
            } else {
                self.save(node, "self", xc, false);
            }
        }
        self.release(xc);
        Ok(out)
    }

    /// `relu_` / `ReLU(inplace=True)`: no allocation, a version bump, and a
    /// history rebase saving the modified storage (§1.4.4, table 2.2).
    pub fn relu_(&mut self, x: TensorId) -> Result<()> {
        let prev = self.op_begin("relu_");
        let r = self.check_inplace(x);
        if r.is_ok() {
            self.k_unary(x, x);
            self.bump_version(x);
            if self.records(&[x]) {
                let node = self.new_node("ReluBackward0", BwdKind::Alloc, &[Some(x)]);
                self.set_grad_fn(x, node, 0);
                self.save(node, "result", x, true);
            }
        }
        self.op_end(prev)?;
        r
    }

    /// `a + b` (broadcast shape, promoted dtype); AddBackward0 saves nothing.
    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("add");
        let r = self.binary(a, b, "AddBackward0", false);
        self.op_end(prev)?;
        r
    }

    /// `a * b` for two tensors: MulBackward0 saves b if a requires grad and a if b does.
    pub fn mul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("mul");
        let r = self.binary(a, b, "MulBackward0", true);
        self.op_end(prev)?;
        r
    }

    fn binary(
        &mut self,
        a: TensorId,
        b: TensorId,
        node_name: &'static str,
        is_mul: bool,
    ) -> Result<TensorId> {
        let (sa, sb) = (self.shape(a), self.shape(b));
        let shape = broadcast_result(sa, sb);
        let dtype = DType::promote(self.dtype(a), self.dtype(b));
        let out = self.act(shape, dtype)?;
        self.k_binary(a, b, out);
        if self.records(&[a, b]) {
            let kind = if is_mul {
                BwdKind::Mul
            } else {
                BwdKind::PassThrough
            };
            let node = self.new_node(node_name, kind, &[Some(a), Some(b)]);
            if is_mul {
                if self.requires_grad(a) {
                    self.save(node, "other", b, false);
                }
                if self.requires_grad(b) {
                    self.save(node, "self", a, false);
                }
            }
            self.set_grad_fn(out, node, 0);
        }
        Ok(out)
    }

    /// `x * scalar` or `x / scalar`: out, nothing saved (table 2.2).
    pub fn mul_scalar(&mut self, x: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("mul");
        let out = self.act(self.shape(x), self.dtype(x));
        let r = out.inspect(|&out| {
            self.k_unary(x, out);
            if self.records(&[x]) {
                let node = self.new_node("MulBackward1", BwdKind::Alloc, &[Some(x)]);
                self.set_grad_fn(out, node, 0);
            }
        });
        self.op_end(prev)?;
        r
    }

    /// `a += b` / `add_`: no allocation; while recording, the tensor's history
    /// is rebased onto a new AddBackward0 (§1.4.4).
    pub fn add_inplace(&mut self, a: TensorId, b: TensorId) -> Result<()> {
        let prev = self.op_begin("add_");
        let r = self.check_inplace(a);
        if r.is_ok() {
            self.k_binary(a, b, a);
            self.bump_version(a);
            if self.records(&[a, b]) {
                let node = self.new_node("AddBackward0", BwdKind::PassThrough, &[Some(a), Some(b)]);
                self.set_grad_fn(a, node, 0);
            }
        }
        self.op_end(prev)?;
        r
    }

    /// Dropout (table 1.7): in training with 0 < p < 1 an output and a bool mask
    /// (saved); p = 0 or eval returns the input itself, allocating nothing.
    pub fn dropout(&mut self, x: TensorId, p: f64) -> Result<TensorId> {
        if !self.ctx.training || p <= 0.0 || p >= 1.0 {
            return Ok(self.local_ref(x));
        }
        let prev = self.op_begin("dropout");
        let r = self.dropout_inner(x);
        self.op_end(prev)?;
        r
    }

    fn dropout_inner(&mut self, x: TensorId) -> Result<TensorId> {
        let shape = self.shape(x);
        // dropout_cuda makes the mask first, then the output.
        let mask = self.aux(shape, DType::Bool)?;
        let out = match self.act(shape, self.dtype(x)) {
            Ok(out) => out,
            Err(e) => {
                self.release(mask);
                return Err(e);
            }
        };
        self.k_fill(mask, 1.0);
        self.k_unary(x, out);
        if self.records(&[x]) {
            let node = self.new_node("NativeDropoutBackward0", BwdKind::Alloc, &[Some(x)]);
            self.save(node, "result1", mask, true);
            self.set_grad_fn(out, node, 0);
        }
        self.release(mask);
        Ok(out)
    }

    /// `x.sum()`: a 0-dim out (512 B block); backward hands on a broadcast view.
    pub fn sum(&mut self, x: TensorId) -> Result<TensorId> {
        self.reduce(x, "sum", "SumBackward0", BwdKind::Expand)
    }

    /// `x.mean()`: a 0-dim out; backward hands on a broadcast view like `sum`
    /// (table 2.2 lists both as "expanded grad, materialised by the consumer").
    pub fn mean(&mut self, x: TensorId) -> Result<TensorId> {
        self.reduce(x, "mean", "MeanBackward0", BwdKind::Expand)
    }

    fn reduce(
        &mut self,
        x: TensorId,
        op: &'static str,
        node: &'static str,
        kind: BwdKind,
    ) -> Result<TensorId> {
        let prev = self.op_begin(op);
        let out = self.act(Shape::scalar(), self.dtype(x));
        let out = out.and_then(|out| self.reduce_whole_into(x, out));
        let r = out.inspect(|&out| {
            self.k_sum(x, out);
            if self.records(&[x]) {
                let n = self.new_node(node, kind, &[Some(x)]);
                self.set_grad_fn(out, n, 0);
                if op == "mean" {
                    self.save_mean_input(n, x);
                }
            }
        });
        self.op_end(prev)?;
        r
    }
}

impl Engine {
    /// `scalar + x` (e.g. `total_loss = 0; total_loss += loss` on the first
    /// iteration): a new tensor; AddBackward1 saves nothing.
    pub fn add_scalar(&mut self, x: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("add");
        let out = self.act(self.shape(x), self.dtype(x));
        let r = out.inspect(|&out| {
            self.k_unary(x, out);
            if self.records(&[x]) {
                let node = self.new_node("AddBackward1", BwdKind::PassThrough, &[Some(x)]);
                self.set_grad_fn(out, node, 0);
            }
        });
        self.op_end(prev)?;
        r
    }
}

/// The shape of `a ⊙ b` as the engine's programs broadcast: the operand with
/// more elements, and on a tie the one with more dims (`weight [h] *
/// hidden [1, 1, h]` at batch 1 × sequence 1 is `[1, 1, h]`, not `[h]`).
fn broadcast_result(a: Shape, b: Shape) -> Shape {
    match a.numel().cmp(&b.numel()) {
        std::cmp::Ordering::Greater => a,
        std::cmp::Ordering::Less => b,
        std::cmp::Ordering::Equal if b.rank() > a.rank() => b,
        std::cmp::Ordering::Equal => a,
    }
}

#[cfg(test)]
mod tests {
    use super::broadcast_result;
    use crate::engine::shape::Shape;

    #[test]
    fn a_tie_in_elements_keeps_the_operand_with_more_dims() {
        let w = Shape::new(&[64]);
        let h = Shape::new(&[1, 1, 64]);
        assert_eq!(broadcast_result(w, h), h);
        assert_eq!(broadcast_result(h, w), h);
        assert_eq!(
            broadcast_result(Shape::new(&[2, 64]), w),
            Shape::new(&[2, 64])
        );
    }
}
