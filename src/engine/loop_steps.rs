//! The loop's own Python: schedules (`if it % n == 0:`), containers (a dict,
//! a bounded deque, a list of buffers and `del xs[::2]`), a metric
//! (`correct += (out.argmax(1) == y).sum()`) and Python numbers. Lifetimes
//! follow CPython's: a container holds strong references, a replaced entry
//! dies after its replacement exists, a full deque drops its oldest element
//! after the append.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::bindings::Value;
use super::dtype::DType;
use super::error::{EngineError, Result};
use super::program::{KeepWhat, Program};
use super::scratch::reduce::ReduceShape;
use super::shape::Shape;
use super::tag::Category;
use super::Engine;
use crate::engine::TensorId;

/// Which elements of the hidden state `(h, c)` a `CarryHidden` detaches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum HiddenPart {
    #[default]
    Both,
    /// `hidden = (hidden[0].detach(), hidden[1])`.
    H,
    /// `hidden = (hidden[0], hidden[1].detach())`.
    C,
}

/// What an `Every` counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum EveryUnit {
    /// Loop iterations (batches), counted from 0 over the whole run.
    #[default]
    Iteration,
    /// Epochs, counted from 0; the steps run after the epoch's last batch's
    /// earlier steps (`Every` at the end of `steps` = after the epoch).
    Epoch,
}

/// A dict key in `SetItem`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DictKey {
    /// The loop counter `it`: a new key every iteration.
    Iteration,
    /// A fixed string key: the entry is replaced each time.
    Name(String),
}

impl Engine {
    /// Whether an `Every(n, offset, unit)` runs in this iteration: `it % n ==
    /// offset` with `it` counted from 0; per epoch, only in an epoch's last
    /// iteration, with `epoch % n == offset`.
    pub(crate) fn every_due(&self, p: &Program, n: u32, offset: u32, unit: EveryUnit) -> bool {
        let n = n.max(1);
        let it = self.ctx.iteration.saturating_sub(1);
        match unit {
            EveryUnit::Iteration => it % n == offset,
            EveryUnit::Epoch => {
                let len = match p.epoch_len {
                    0 => p.iterations.max(1),
                    l => l,
                };
                (it + 1).is_multiple_of(len) && (it / len) % n == offset
            }
        }
    }

    /// `list.append(v)` on a list or a deque; the list is created at the
    /// first append into an unbound name.
    pub(crate) fn append_value(&mut self, list: &str, v: Value) -> Result<()> {
        self.keep_value(&v);
        let dropped = match self.bindings.vars.get_mut(list) {
            Some(Value::List(l)) => {
                l.push(v);
                None
            }
            Some(Value::Deque { maxlen, items }) => {
                items.push_back(v);
                // deque_append: the new item goes in, then the oldest leaves.
                (items.len() > *maxlen as usize)
                    .then(|| items.pop_front())
                    .flatten()
            }
            Some(_) => {
                self.drop_value(v);
                return Err(EngineError::Program(format!(
                    "`{list}` is not a list or a deque: it has no append"
                )));
            }
            None => {
                self.bind(list, Value::List(Vec::new()));
                if let Some(Value::List(l)) = self.bindings.vars.get_mut(list) {
                    l.push(v);
                }
                None
            }
        };
        if let Some(old) = dropped {
            self.drop_value(old);
        }
        Ok(())
    }

    /// `dict[key] = v`: a new key is added at the end; an existing key's
    /// old value dies after the new one is stored.
    pub(crate) fn set_item(&mut self, dict: &str, key: &DictKey, v: Value) -> Result<()> {
        let key = self.key_text(key);
        self.keep_value(&v);
        let old = match self.bindings.vars.get_mut(dict) {
            Some(Value::Dict(entries)) => match entries.iter_mut().find(|(k, _)| *k == key) {
                Some((_, slot)) => Some(std::mem::replace(slot, v)),
                None => {
                    entries.push((key, v));
                    None
                }
            },
            Some(_) => {
                self.drop_value(v);
                return Err(EngineError::Program(format!("`{dict}` is not a dict")));
            }
            None => {
                self.drop_value(v);
                return Err(EngineError::Program(format!(
                    "name '{dict}' is not defined"
                )));
            }
        };
        if let Some(old) = old {
            self.drop_value(old);
        }
        Ok(())
    }

    /// A key as Python prints it inside `d[...]`: `3` for the loop counter,
    /// `'last'` for a string.
    pub(crate) fn key_text(&self, key: &DictKey) -> String {
        match key {
            DictKey::Iteration => self.ctx.iteration.saturating_sub(1).to_string(),
            DictKey::Name(k) => format!("'{k}'"),
        }
    }

    /// `list = [torch.empty(shape, dtype) for _ in range(count)]`: the
    /// comprehension fills a new list, then the name is rebound. If one
    /// allocation fails, the partial list dies with the exception.
    pub(crate) fn allocate_buffers(
        &mut self,
        list: &str,
        count: u32,
        shape: &[u64],
        dtype: DType,
    ) -> Result<()> {
        // Room grows with the list: a count the allocator refuses part-way
        // must not first reserve room for every item (a billion was 40 GB).
        let mut items = Vec::with_capacity((count as usize).min(4096));
        for _ in 0..count {
            match self.factory(Shape::new(shape), dtype, Category::Activation) {
                Ok(t) => {
                    self.keep(t);
                    items.push(Value::Tensor(t));
                }
                Err(e) => {
                    self.drop_value(Value::List(items));
                    return Err(e);
                }
            }
        }
        self.bind(list, Value::List(items));
        Ok(())
    }

    /// `del list[offset::step]`: CPython collects the removed items and
    /// releases them in index order.
    pub(crate) fn delete_every(&mut self, list: &str, step: u32, offset: u32) -> Result<()> {
        let step = step.max(1) as usize;
        let removed = match self.bindings.vars.get_mut(list) {
            Some(Value::List(l)) => {
                let mut kept = Vec::with_capacity(l.len());
                let mut removed = Vec::new();
                for (i, x) in std::mem::take(l).into_iter().enumerate() {
                    if i >= offset as usize && (i - offset as usize).is_multiple_of(step) {
                        removed.push(x);
                    } else {
                        kept.push(x);
                    }
                }
                *l = kept;
                removed
            }
            Some(_) => {
                return Err(EngineError::Program(format!(
                    "`{list}` is not a list: it cannot be sliced"
                )))
            }
            None => {
                return Err(EngineError::Program(format!(
                    "name '{list}' is not defined"
                )))
            }
        };
        for x in removed {
            self.drop_value(x);
        }
        Ok(())
    }

    /// `into += (output.argmax(1) == target).sum()` (`.item()` with `Item`).
    /// `argmax` makes int64 [output without dim 1], `==` a bool of the
    /// broadcast shape, `.sum()` an int64 0-dim, reading the comparison as
    /// an int64 copy while it runs (`reduce_whole_into`); none records a
    /// graph (argmax is not differentiable). Each temporary dies as CPython
    /// drops it: the argmax after the comparison, the comparison after the sum.
    /// `out.argmax(1)`: an int64 tensor without the class dimension (not
    /// differentiable), with the reduction's scratch.
    pub(crate) fn argmax_1(&mut self, out: TensorId) -> Result<TensorId> {
        let shape = self.shape(out);
        if shape.rank() < 2 {
            return Err(EngineError::Runtime(format!(
                "Dimension out of range (expected to be in range of [-{r}, {r}], but got 1)",
                r = shape.rank().max(1)
            )));
        }
        let mut dims = shape.dims().to_vec();
        let classes = dims.remove(1);
        let inner: u64 = dims[1..].iter().product();
        let argmax_shape = Shape::new(&dims);
        let prev = self.op_begin("argmax");
        let r = self.act(argmax_shape, DType::I64).and_then(|a| {
            let reduce = ReduceShape {
                outputs: argmax_shape.numel(),
                inputs_per_output: classes,
                contiguous_inputs: inner == 1,
                element_bytes: self.dtype(out).size(),
            };
            self.scratch_after(a, Some(reduce))
        });
        self.op_end(prev)?;
        r
    }

    pub(crate) fn count_correct(
        &mut self,
        output: &str,
        target: &str,
        into: &str,
        what: KeepWhat,
    ) -> Result<()> {
        let out = self.binding_tensor(output)?;
        let tgt = self.binding_tensor(target)?;
        let argmax = self.argmax_1(out)?;
        let argmax_shape = self.shape(argmax);
        let eq_shape = match broadcast(&argmax_shape, &self.shape(tgt)) {
            Ok(s) => s,
            Err(e) => {
                self.release(argmax);
                return Err(e);
            }
        };

        let prev = self.op_begin("eq");
        let r = self.act(eq_shape, DType::Bool);
        self.op_end(prev)?;
        let eq = r?;
        self.release(argmax);

        let prev = self.op_begin("sum");
        let r = self
            .act(Shape::scalar(), DType::I64)
            .and_then(|s| self.reduce_whole_into(eq, s));
        self.op_end(prev)?;
        let sum = r?;
        self.release(eq);

        if what != KeepWhat::Tensor {
            // `.item()`: a host sync; the sum dies, `into` stays a number.
            self.release(sum);
            return self.add_into(into, None);
        }
        self.add_into(into, Some(sum))
    }
}

/// Broadcast two shapes as PyTorch does, with its error when they cannot be.
fn broadcast(a: &Shape, b: &Shape) -> Result<Shape> {
    let (a, b) = (a.dims(), b.dims());
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let x = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let y = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            (x, y) => {
                return Err(EngineError::Runtime(format!(
                    "The size of tensor a ({x}) must match the size of tensor b ({y}) at \
                     non-singleton dimension {i}"
                )))
            }
        };
    }
    Ok(Shape::new(&out))
}

/// A deque value, empty.
pub(crate) fn new_deque(maxlen: u32) -> Value {
    Value::Deque {
        maxlen,
        items: VecDeque::new(),
    }
}
