//! Scenario variables (engine.md §0.3: bindings are strong references).

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::error::{EngineError, Result};
use super::tensor::TensorId;
use super::Engine;

/// A scenario variable (§0.3: bindings are strong references).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Tensor(TensorId),
    Float(f64),
    /// Python's `None` (an unused input's gradient in a tuple).
    None,
    List(Vec<Value>),
    /// An RNN hidden state (h, c).
    Pair(TensorId, TensorId),
    /// A dict, in insertion order; keys as Python prints them (`3`, `'last'`).
    Dict(Vec<(String, Value)>),
    /// A `collections.deque(maxlen=…)`.
    Deque {
        maxlen: u32,
        items: VecDeque<Value>,
    },
    /// `{key: value, "self": itself}`: an object in a reference cycle
    /// (`MakeCycle`). Unbound, it is not freed but left for the collector.
    Cycle {
        key: String,
        value: Box<Value>,
    },
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Bindings {
    pub vars: FxHashMap<String, Value>,
    /// Names in first-binding order (stable live-state output).
    pub order: Vec<String>,
    /// Unreachable reference cycles, oldest first, each with the name it
    /// was bound to: alive until `gc.collect()` (CPython's reference
    /// counting never reaches zero inside a cycle).
    pub garbage: Vec<(String, Value)>,
}

impl Engine {
    /// Bind `name` to `v`; the old value dies after the new one exists (§0.3).
    pub(crate) fn bind(&mut self, name: &str, v: Value) {
        self.keep_value(&v);
        let old = match self.bindings.vars.get_mut(name) {
            Some(slot) => Some(std::mem::replace(slot, v)),
            None => {
                self.bindings.order.push(name.to_string());
                self.bindings.vars.insert(name.to_string(), v);
                None
            }
        };
        if let Some(old) = old {
            self.drop_binding(name, old);
        }
    }

    /// A name's old value, unbound: a reference cycle waits for the
    /// collector, anything else goes now.
    pub(crate) fn drop_binding(&mut self, name: &str, v: Value) {
        match v {
            Value::Cycle { .. } => self.bindings.garbage.push((name.to_string(), v)),
            v => self.drop_value(v),
        }
    }

    /// `gc.collect()`: every unreachable cycle is cleared, oldest first
    /// (the collector's generation list is in creation order).
    pub(crate) fn gc_collect(&mut self) {
        let garbage = std::mem::take(&mut self.bindings.garbage);
        for (_, v) in garbage {
            self.drop_value(v);
        }
    }

    pub(crate) fn keep_value(&mut self, v: &Value) {
        match v {
            Value::Tensor(t) => self.keep(*t),
            Value::Pair(a, b) => {
                self.keep(*a);
                self.keep(*b);
            }
            Value::List(l) => l.iter().for_each(|x| self.keep_value(x)),
            Value::Dict(d) => d.iter().for_each(|(_, x)| self.keep_value(x)),
            Value::Deque { items, .. } => items.iter().for_each(|x| self.keep_value(x)),
            Value::Cycle { value, .. } => self.keep_value(value),
            Value::Float(_) | Value::None => {}
        }
    }

    pub(crate) fn drop_value(&mut self, v: Value) {
        match v {
            Value::Tensor(t) => self.decref(t),
            Value::Pair(a, b) => {
                self.decref(a);
                self.decref(b);
            }
            // CPython's list_dealloc releases from the end; free_keys_object
            // (a dict) and deque_clear from the start.
            Value::List(l) => l.into_iter().rev().for_each(|x| self.drop_value(x)),
            Value::Dict(d) => d.into_iter().for_each(|(_, x)| self.drop_value(x)),
            Value::Deque { items, .. } => items.into_iter().for_each(|x| self.drop_value(x)),
            Value::Cycle { value, .. } => self.drop_value(*value),
            Value::Float(_) | Value::None => {}
        }
    }

    pub fn binding(&self, name: &str) -> Option<&Value> {
        self.bindings.vars.get(name)
    }

    /// The tensor bound to `name`.
    pub fn binding_tensor(&self, name: &str) -> Result<TensorId> {
        match self.bindings.vars.get(name) {
            Some(Value::Tensor(t)) => Ok(*t),
            Some(_) => Err(EngineError::Program(format!("`{name}` is not a tensor"))),
            None => Err(EngineError::Program(format!(
                "name '{name}' is not defined"
            ))),
        }
    }
}
