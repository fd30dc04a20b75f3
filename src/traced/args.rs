//! The fields of a message from the traced program's helper (a JSON array,
//! python/PROTOCOL.md), read where a simulator step needs them, and the
//! plain answer.

use serde_json::{json, Value};

use super::error::TraceError;
use super::rules::dtype_named;
use super::simulator::Reply;
use crate::engine::DType;

pub(super) fn bad(index: u64, why: impl Into<String>) -> TraceError {
    TraceError::Protocol {
        index,
        why: why.into(),
    }
}

pub(super) fn u64_at(v: &Value, i: usize, index: u64) -> Result<u64, TraceError> {
    v.get(i)
        .and_then(Value::as_u64)
        .ok_or_else(|| bad(index, format!("element {i} is not a whole number")))
}

pub(super) fn str_at(v: &Value, i: usize) -> String {
    v.get(i)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

pub(super) fn stack_at(v: &Value, i: usize) -> Option<u32> {
    v.get(i)
        .and_then(Value::as_u64)
        .and_then(|s| u32::try_from(s).ok())
}

/// Argument `i` of an op the helper reported, when it is a tensor: its
/// shape, dtype (None: one the engine does not model) and contiguity.
pub(super) fn tensor_arg(v: &Value, i: usize) -> Option<(Vec<u64>, Option<DType>, bool)> {
    let a = v.get(3)?.get(i)?;
    let shape = a
        .get("shape")?
        .as_array()?
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    let dtype = a.get("dtype").and_then(Value::as_str).and_then(dtype_named);
    let contiguous = a
        .get("contiguous")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Some((shape, dtype, contiguous))
}

/// Argument `i`'s strides, when it is a tensor the helper sent them for.
pub(super) fn strides_at(v: &Value, i: usize) -> Option<Vec<u64>> {
    v.get(3)?
        .get(i)?
        .get("stride")?
        .as_array()?
        .iter()
        .map(Value::as_u64)
        .collect()
}

pub(super) fn ok() -> Reply {
    Some(json!(["ok"]))
}
