//! An EMA copy of the model's parameters, updated each step (issue 39:
//! a second model in the loop): `ema = [p.detach().clone() for p in
//! model.parameters()]` and `e.mul_(d).add_(p, alpha=1 - d)` for each pair.
//! Outside `torch.no_grad()` the in-place add of a parameter (which
//! requires grad) gives every EMA tensor a history, rebased at every
//! update onto the last one: a chain of nodes that grows each step.

use super::bindings::Value;
use super::error::{EngineError, Result};
use super::tag::Category;
use super::tensor::TensorId;
use super::Engine;
use crate::engine::autograd::BwdKind;
use crate::trace::Phase;

impl Engine {
    /// `into = [p.detach().clone() for p in model.parameters()]`.
    pub(crate) fn ema_copy(&mut self, into: &str) -> Result<()> {
        let prev = self.phase_begin(Phase::User);
        let mut copies = Vec::new();
        let mut r = Ok(());
        for p in self.parameters() {
            let op = self.op_begin("clone");
            let c = self.empty(self.shape(p), self.dtype(p), Category::Parameter);
            let end = self.op_end(op);
            match c.and_then(|c| end.map(|()| c)) {
                Ok(c) => {
                    self.k_unary(p, c);
                    copies.push(Value::Tensor(c));
                }
                Err(e) => {
                    r = Err(e);
                    break;
                }
            }
        }
        self.phase_end(Phase::User, prev);
        r?;
        self.bind(into, Value::List(copies));
        Ok(())
    }

    /// `for e, p in zip(ema, model.parameters()): e.mul_(d).add_(p, alpha=1 - d)`,
    /// under `torch.no_grad()` when `no_grad`.
    pub(crate) fn ema_update(&mut self, ema: &str, no_grad: bool) -> Result<()> {
        let Some(Value::List(items)) = self.bindings.vars.get(ema) else {
            return Err(EngineError::Program(format!("`{ema}` is not a list")));
        };
        let es: Vec<TensorId> = items
            .iter()
            .filter_map(|v| match v {
                Value::Tensor(t) => Some(*t),
                _ => None,
            })
            .collect();
        let ps = self.parameters();
        if es.len() != ps.len() {
            return Err(EngineError::Program(format!(
                "`{ema}` holds {} tensors for the model's {} parameters",
                es.len(),
                ps.len()
            )));
        }
        let grad = self.ctx.grad_enabled;
        if no_grad {
            self.ctx.grad_enabled = false;
        }
        let prev = self.phase_begin(Phase::User);
        let mut r = Ok(());
        for (e, p) in es.into_iter().zip(ps) {
            r = self.mul_scalar_(e).and_then(|()| self.add_inplace(e, p));
            if r.is_err() {
                break;
            }
        }
        self.phase_end(Phase::User, prev);
        self.ctx.grad_enabled = grad;
        r
    }

    /// `x.mul_(scalar)`: in place; while recording, the history is rebased
    /// onto a MulBackward1 (it saves the scalar, no tensor).
    fn mul_scalar_(&mut self, x: TensorId) -> Result<()> {
        let prev = self.op_begin("mul_");
        let r = self.check_inplace(x);
        if r.is_ok() {
            self.k_unary(x, x);
            self.bump_version(x);
            if self.records(&[x]) {
                let node = self.new_node("MulBackward1", BwdKind::Alloc, &[Some(x)]);
                self.set_grad_fn(x, node, 0);
            }
        }
        self.op_end(prev)?;
        r
    }
}
