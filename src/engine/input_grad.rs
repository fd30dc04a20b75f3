//! An input the loop differentiates: `x.requires_grad_()` and the
//! sign-gradient step of an adversarial example, `x = (x + eps *
//! x.grad.sign()).clamp(0, 1)`. Without `.detach()` the new `x` is the
//! output of a clamp of an add of the old one: each step's graph reaches
//! every earlier step's, and the clamp saves its input (issue 39).

use super::bindings::Value;
use super::error::{EngineError, Result};
use super::Engine;
use crate::trace::Phase;

impl Engine {
    /// `name.requires_grad_()`: PyTorch refuses it on a tensor with a
    /// history and on one that is not floating point.
    pub(crate) fn requires_grad_leaf(&mut self, name: &str) -> Result<()> {
        let t = self.binding_tensor(name)?;
        if self.grad_fn(t).is_some() {
            return Err(EngineError::Runtime(
                "you can only change requires_grad flags of leaf variables. If you want to use \
                 a computed variable in a subgraph that doesn't require differentiation use \
                 var_no_grad = var.detach()."
                    .into(),
            ));
        }
        if !self.dtype(t).is_floating() {
            return Err(EngineError::Runtime(
                "only Tensors of floating point and complex dtype can require gradients".into(),
            ));
        }
        self.t_mut(t).requires_grad = true;
        Ok(())
    }

    /// `input = (input + eps * G.sign())` [`.clamp(0, 1)`]
    /// [`.detach().requires_grad_()`], G being `input.grad` or the tensor
    /// `grad` names. The temporaries die as CPython drops them: the sign
    /// after the product exists, the product after the sum, the sum after
    /// the clamp (unless the clamp saved it), the clamp's output after
    /// `.detach()` returns; the old input when the name is rebound.
    pub(crate) fn grad_sign_step(
        &mut self,
        input: &str,
        grad: Option<&str>,
        clamp: bool,
        detach: bool,
    ) -> Result<()> {
        let x = self.binding_tensor(input)?;
        let g = match grad {
            Some(name) => self.binding_tensor(name)?,
            None => self.grad(x).ok_or_else(|| {
                let why = if self.grad_fn(x).is_some() {
                    format!(
                        " (`{input}` is not a leaf: its .grad is kept only after \
                         `{input}.retain_grad()`)"
                    )
                } else {
                    format!(" (`{input}` has no gradient yet: no backward reached it)")
                };
                EngineError::Program(format!("'NoneType' object has no attribute 'sign'{why}"))
            })?,
        };
        let prev = self.phase_begin(Phase::User);
        let r = self.grad_sign_inner(x, g, clamp, detach);
        self.phase_end(Phase::User, prev);
        let out = r?;
        self.bind(input, Value::Tensor(out));
        Ok(())
    }

    fn grad_sign_inner(
        &mut self,
        x: super::tensor::TensorId,
        g: super::tensor::TensorId,
        clamp: bool,
        detach: bool,
    ) -> Result<super::tensor::TensorId> {
        let s = self.sign(g)?;
        let m = self.mul_scalar(s);
        self.release(s);
        let m = m?;
        let a = self.add(x, m);
        self.release(m);
        let mut out = a?;
        if clamp {
            let c = self.clamp(out);
            self.release(out);
            out = c?;
        }
        if detach {
            let d = self.detach(out);
            self.release(out);
            self.t_mut(d).requires_grad = true;
            out = d;
        }
        Ok(out)
    }
}
