//! A Hessian-vector product's statements (issue 39): the gradients with
//! respect to the model's parameters as a tuple (`torch.autograd.grad(loss,
//! model.parameters(), create_graph=True)`), one probe vector per parameter,
//! and the dot product `g · v` whose gradient is `H v`.

use super::bindings::Value;
use super::error::{EngineError, Result};
use super::tag::Category;
use super::tensor::TensorId;
use super::Engine;
use crate::trace::Phase;

impl Engine {
    /// `into = torch.autograd.grad(output, model.parameters(), …)`.
    pub(crate) fn autograd_grad_params(
        &mut self,
        output: &str,
        into: &str,
        retain_graph: bool,
        create_graph: bool,
        allow_unused: bool,
    ) -> Result<()> {
        let o = self.binding_tensor(output)?;
        let params = self.parameters();
        self.create_graph = create_graph;
        // retain_graph defaults to create_graph (torch.autograd.grad).
        let r = self.autograd_grad_all(o, &params, retain_graph || create_graph, allow_unused);
        self.create_graph = false;
        let gs = r?;
        let tuple = gs
            .into_iter()
            .map(|g| g.map_or(Value::None, Value::Tensor))
            .collect();
        self.bind(into, Value::List(tuple));
        Ok(())
    }

    /// `into = [torch.randn_like(p) for p in model.parameters()]`.
    pub(crate) fn probe_vectors(&mut self, into: &str) -> Result<()> {
        let prev = self.phase_begin(Phase::User);
        let mut v = Vec::new();
        let mut r = Ok(());
        for p in self.parameters() {
            let (shape, dtype) = (self.shape(p), self.dtype(p));
            match self.factory(shape, dtype, Category::Input) {
                Ok(t) => {
                    self.k_fill(t, 1.0);
                    v.push(Value::Tensor(t));
                }
                Err(e) => {
                    r = Err(e);
                    break;
                }
            }
        }
        self.phase_end(Phase::User, prev);
        r?;
        self.bind(into, Value::List(v));
        Ok(())
    }

    /// `into = sum((x * y).sum() for x, y in zip(a, b) if x is not None)`:
    /// each product lives until its sum exists; Python's `sum` starts at
    /// `0`, so the first term is `0 + s` (a new tensor), the later ones
    /// `acc + s` (the old `acc` and `s` then go).
    pub(crate) fn grad_dot(&mut self, a: &str, b: &str, into: &str) -> Result<()> {
        let (xs, ys) = (self.tuple(a)?, self.tuple(b)?);
        let prev = self.phase_begin(Phase::User);
        let r = self.grad_dot_inner(&xs, &ys);
        self.phase_end(Phase::User, prev);
        match r? {
            Some(t) => self.bind(into, Value::Tensor(t)),
            None => self.bind(into, Value::Float(0.0)),
        }
        Ok(())
    }

    fn grad_dot_inner(
        &mut self,
        xs: &[Option<TensorId>],
        ys: &[Option<TensorId>],
    ) -> Result<Option<TensorId>> {
        let mut acc: Option<TensorId> = None;
        for (x, y) in xs.iter().zip(ys) {
            let (Some(x), Some(y)) = (*x, *y) else {
                continue;
            };
            let prod = self.mul(x, y)?;
            let s = self.sum(prod);
            self.release(prod);
            let s = s?;
            let next = match acc {
                None => self.add_scalar(s),
                Some(a) => self.add(a, s),
            };
            if let Some(a) = acc {
                self.release(a);
            }
            self.release(s);
            acc = Some(next?);
        }
        Ok(acc)
    }

    /// The tensors of a tuple bound to `name` (`None` where it holds None).
    fn tuple(&self, name: &str) -> Result<Vec<Option<TensorId>>> {
        match self.binding(name) {
            Some(Value::List(l)) => Ok(l
                .iter()
                .map(|v| match v {
                    Value::Tensor(t) => Some(*t),
                    _ => None,
                })
                .collect()),
            _ => Err(EngineError::Program(format!(
                "`{name}` is not a tuple of tensors"
            ))),
        }
    }
}
