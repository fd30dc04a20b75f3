//! What a loop keeps of a value (`loss`, `loss.item()`, `.detach()`,
//! `.cpu()`; a hidden state's `(h, c)` element by element) and Python's
//! `+=` into an accumulator, tensor or number.

use super::bindings::Value;
use super::error::{EngineError, Result};
use super::program::KeepWhat;
use super::tensor::TensorId;
use super::Engine;

impl Engine {
    /// `from` as `what` keeps it; a hidden state `(h, c)` is kept, detached
    /// (`repackage_hidden`) or copied to the host element by element.
    pub(super) fn derive(&mut self, from: &str, what: KeepWhat) -> Result<Value> {
        if let Some(Value::Pair(h, c)) = self.bindings.vars.get(from).cloned() {
            return match what {
                KeepWhat::Tensor => Ok(Value::Pair(self.local_ref(h), self.local_ref(c))),
                KeepWhat::Detach => Ok(Value::Pair(self.detach(h), self.detach(c))),
                KeepWhat::Cpu => Ok(Value::Pair(self.cpu(h), self.cpu(c))),
                KeepWhat::Item => Err(EngineError::Program(format!(
                    "`{from}` is a tuple (h, c): it has no .item()"
                ))),
            };
        }
        // A tuple of tensors (`torch.autograd.grad`'s): each element as
        // the statement keeps it, in a new list (`[t.detach() for t in g]`).
        if let Some(Value::List(l)) = self.bindings.vars.get(from).cloned() {
            if what == KeepWhat::Item {
                return Err(EngineError::Program(format!(
                    "`{from}` is a tuple: it has no .item()"
                )));
            }
            let mut kept = Vec::with_capacity(l.len());
            for v in l {
                kept.push(match (v, what) {
                    (Value::Tensor(t), KeepWhat::Tensor) => Value::Tensor(self.local_ref(t)),
                    (Value::Tensor(t), KeepWhat::Detach) => Value::Tensor(self.detach(t)),
                    (Value::Tensor(t), _) => Value::Tensor(self.cpu(t)),
                    _ => Value::None,
                });
            }
            return Ok(Value::List(kept));
        }
        let t = self.binding_tensor(from)?;
        Ok(match what {
            KeepWhat::Tensor => Value::Tensor(self.local_ref(t)),
            KeepWhat::Item => Value::Float(0.0),
            KeepWhat::Detach => Value::Tensor(self.detach(t)),
            KeepWhat::Cpu => Value::Tensor(self.cpu(t)),
        })
    }

    /// `into += from` (§9 pitfall 1): a Python number stays a number; a tensor
    /// accumulator is created as `0 + loss` and then updated in place, its
    /// history rebased each time (so it chains every iteration's graph).
    pub(super) fn accumulate(&mut self, from: &str, into: &str, what: KeepWhat) -> Result<()> {
        let src = match self.derive(from, what)? {
            Value::Tensor(t) => Some(t),
            _ => None,
        };
        self.add_into(into, src)
    }

    /// `into += src`, Python's way: a number (`None`) leaves `into` as it is
    /// if it holds a tensor (an in-place add of a scalar) and makes it a
    /// number otherwise; a tensor adds in place into a tensor accumulator,
    /// or makes one as `0 + t` (int.__add__ gives way to Tensor.__radd__, a
    /// new tensor). `src` is released.
    pub(crate) fn add_into(&mut self, into: &str, src: Option<TensorId>) -> Result<()> {
        let Some(src) = src else {
            if !matches!(self.bindings.vars.get(into), Some(Value::Tensor(_))) {
                self.bind(into, Value::Float(0.0));
            }
            return Ok(());
        };
        match self.bindings.vars.get(into) {
            Some(Value::Tensor(acc)) => {
                let acc = *acc;
                self.add_inplace(acc, src)?;
            }
            _ => {
                let t = self.add_scalar(src)?;
                self.bind(into, Value::Tensor(t));
            }
        }
        self.release(src);
        Ok(())
    }
}
