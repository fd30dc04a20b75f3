//! A gradient penalty (issue 39: WGAN-GP's, on a critic's input gradient):
//! `gp = ((g.norm(2, dim=1) - 1) ** 2).mean() * 10`, with the saves
//! PyTorch 2.11's derivatives.yaml gives each op: `linalg_vector_norm`
//! (LinalgVectorNormBackward0 keeps `self` and `result`; its backward,
//! FunctionsManual's `norm_backward` for p = 2, is `grad * (self /
//! norm).masked_fill_(norm == 0, 0)`), `- 1` (SubBackward0, nothing), `** 2`
//! (PowBackward0, `self`), `.mean()` (MeanBackward0: sizes only from 2.2;
//! its backward `grad.expand(sizes) / numel` makes the input's shape),
//! `* 10` (nothing on the GPU). Under `vramscope trace` of PyTorch 2.11 the
//! same requests, in order (tests/trace/scenario_requests.rs).

use crate::engine::autograd::BwdKind;
use crate::engine::dtype::DType;
use crate::engine::error::{EngineError, Result};
use crate::engine::shape::Shape;
use crate::engine::tensor::TensorId;
use crate::engine::Engine;

impl Engine {
    /// `eps = torch.rand(B, 1); (eps * a + (1 - eps) * b).requires_grad_()`
    /// for `a` and `b` of one [B, …] shape without history: `eps` [B, 1],
    /// `eps * a`, `1 - eps` [B, 1], `(1 - eps) * b` (then `1 - eps` goes),
    /// the sum (then both products go, the left first), a leaf that
    /// requires grad; `eps` stays bound.
    pub fn interpolate(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let shape = self.shape(a);
        if shape != self.shape(b) || shape.rank() < 1 {
            return Err(EngineError::Program(format!(
                "interpolating needs two tensors of one shape: {shape:?} and {:?}",
                self.shape(b)
            )));
        }
        if self.requires_grad(a) || self.requires_grad(b) {
            return Err(EngineError::Runtime(
                "you can only change requires_grad flags of leaf variables. If you want to use a \
                 computed variable in a subgraph that doesn't require differentiation use \
                 var_no_grad = var.detach()."
                    .into(),
            ));
        }
        let dtype = self.dtype(a);
        let column = Shape::new(&[shape.dims()[0], 1]);
        let prev = self.op_begin("rand");
        let eps = self.act(column, dtype);
        self.op_end(prev)?;
        let eps = eps?;
        self.keep(eps);
        self.bind("eps", crate::engine::Value::Tensor(eps));
        let prev = self.op_begin("interpolate");
        let r = (|| {
            let left = self.act(shape, dtype)?;
            let one_minus = self.act(column, dtype)?;
            let right = self.act(shape, dtype)?;
            self.release(one_minus);
            let sum = self.act(shape, dtype)?;
            self.release(left);
            self.release(right);
            Ok(sum)
        })();
        self.op_end(prev)?;
        let x = r?;
        self.t_mut(x).requires_grad = true;
        Ok(x)
    }

    /// `((g.norm(2, dim=1) - 1) ** 2).mean() * 10` for a [B, D] `g`.
    pub fn grad_penalty(&mut self, g: TensorId) -> Result<TensorId> {
        let shape = self.shape(g);
        if shape.rank() != 2 {
            return Err(EngineError::Program(format!(
                "a gradient penalty takes the norm of each row of a [batch, features] \
                 gradient; this one is {shape:?}"
            )));
        }
        let norm = self.row_norm(g)?;
        let prev = self.op_begin("sub");
        let r = self.act(self.shape(norm), self.dtype(norm));
        let r = r.inspect(|&out| {
            self.k_unary(norm, out);
            if self.records(&[norm]) {
                let node = self.new_node("SubBackward0", BwdKind::PassThrough, &[Some(norm)]);
                self.set_grad_fn(out, node, 0);
            }
        });
        self.op_end(prev)?;
        self.release(norm);
        let centred = r?;
        let squared = self.pow2(centred);
        self.release(centred);
        let squared = squared?;
        let mean = self.mean_alloc_backward(squared);
        self.release(squared);
        let mean = mean?;
        let gp = self.mul_scalar(mean);
        self.release(mean);
        gp
    }

    /// `g.norm(2, dim=1)`: [B] in `g`'s dtype; LinalgVectorNormBackward0
    /// keeps `g` and the result.
    fn row_norm(&mut self, g: TensorId) -> Result<TensorId> {
        let rows = self.shape(g).dims()[0];
        let prev = self.op_begin("linalg_vector_norm");
        let r = self.act(Shape::new(&[rows]), self.dtype(g));
        let r = r.inspect(|&out| {
            self.k_sum(g, out);
            if self.records(&[g]) {
                let node = self.new_node("LinalgVectorNormBackward0", BwdKind::Norm, &[Some(g)]);
                self.set_grad_fn(out, node, 0);
                self.save(node, "self", g, false);
                self.save(node, "result", out, true);
            }
        });
        self.op_end(prev)?;
        r
    }

    /// `x.mean()` whose backward makes the input's shape (`grad.expand(
    /// sizes) / numel`, PyTorch 2.11's MeanBackward0).
    fn mean_alloc_backward(&mut self, x: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("mean");
        let out = self.act(Shape::scalar(), self.dtype(x));
        let out = out.and_then(|out| self.reduce_whole_into(x, out));
        let r = out.inspect(|&out| {
            self.k_sum(x, out);
            if self.records(&[x]) {
                let node = self.new_node("MeanBackward0", BwdKind::Alloc, &[Some(x)]);
                self.set_grad_fn(out, node, 0);
                self.save_mean_input(node, x);
            }
        });
        self.op_end(prev)?;
        r
    }

    /// LinalgVectorNormBackward0 for p = 2 over dim 1: `self / norm` (the
    /// input's shape), `norm == 0` (bool [B, 1]), `masked_fill_` in place,
    /// then the product with the gradient; the two temporaries die newest
    /// first as the expression ends.
    pub(crate) fn norm_grad(&mut self, shape: Shape, dtype: DType) -> Result<TensorId> {
        let rows = shape.dims().first().copied().unwrap_or(1);
        let div = self.empty(shape, dtype, crate::engine::tag::Category::Temporary)?;
        let eq = match self.empty(
            Shape::new(&[rows, 1]),
            DType::Bool,
            crate::engine::tag::Category::Temporary,
        ) {
            Ok(t) => t,
            Err(e) => {
                self.release(div);
                return Err(e);
            }
        };
        let out = self.empty(shape, dtype, crate::engine::tag::Category::Gradient);
        self.release(eq);
        self.release(div);
        out
    }
}
