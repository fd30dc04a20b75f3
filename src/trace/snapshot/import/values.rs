//! The small values inside a snapshot's records: its allocator settings,
//! annotations, block states and pool ids, each with the path of a bad field.

use crate::trace::pickle::{Value, ValueRef};
use crate::units::quote_excerpt;

use super::super::field::{Fields, Key, Path, Res};
use super::super::types::{
    Action, AllocatorSettings, Annotation, BlockState, SettingValue, Snapshot,
};

pub(super) fn settings(f: &Fields, v: Value, path: &Path) -> Res<AllocatorSettings> {
    let d = f.dict(v, path)?;
    let mut s = AllocatorSettings {
        conf: String::new(),
        max_split_size: -1,
        garbage_collection_threshold: 0.0,
        expandable_segments: false,
        roundup_power2_divisions: Vec::new(),
        other: Vec::new(),
    };
    for (k, val) in f.doc.pairs(d) {
        let key = f.str(k, &path.key("<key>"))?;
        match &*key {
            "PYTORCH_CUDA_ALLOC_CONF" => {
                s.conf = f
                    .str(val, &path.key("PYTORCH_CUDA_ALLOC_CONF"))?
                    .to_string()
            }
            "max_split_size" => s.max_split_size = f.int(val, &path.key("max_split_size"))?,
            "garbage_collection_threshold" => {
                s.garbage_collection_threshold =
                    f.float(val, &path.key("garbage_collection_threshold"))?
            }
            "expandable_segments" => {
                s.expandable_segments = f.bool(val, &path.key("expandable_segments"))?
            }
            "roundup_power2_divisions" => {
                s.roundup_power2_divisions = roundup(f, val, &path.key("roundup_power2_divisions"))?
            }
            _ => s.other.push((key.clone(), setting_value(f, val))),
        }
    }
    Ok(s)
}

pub(super) fn annotations(f: &Fields, v: Value, path: &Path) -> Res<Vec<Annotation>> {
    let items = f.list(v, path)?;
    let mut out = Vec::with_capacity(items.len());
    for (i, &a) in items.iter().enumerate() {
        let p = path.index(i);
        let d = f.dict(a, &p)?;
        // An annotation without its stage or name marks nothing: left out,
        // as MemoryViz leaves it, instead of refusing the whole file.
        let (Some(stage), Some(name)) = (
            f.opt(d, Key::Stage, &p, Fields::str)?,
            f.opt(d, Key::Name, &p, Fields::str)?,
        ) else {
            continue;
        };
        out.push(Annotation {
            stage,
            name,
            device: f.opt(d, Key::Device, &p, Fields::int)?.unwrap_or(0),
            time_us: f.opt(d, Key::TimeUs, &p, Fields::int)?.unwrap_or(0),
        });
    }
    Ok(out)
}

pub(super) fn block_state(f: &Fields, v: Value, path: &Path) -> Res<BlockState> {
    let s = f.str(v, path)?;
    match &*s {
        "active_allocated" => Ok(BlockState::ActiveAllocated),
        "active_pending_free" | "active_awaiting_free" => Ok(BlockState::ActivePendingFree),
        "inactive" => Ok(BlockState::Inactive),
        other => Err(path.error(format!("unknown block state {}", quote_excerpt(other)))),
    }
}

pub(super) fn pool_id(f: &Fields, v: Value, path: &Path) -> Res<(i64, i64)> {
    match f.sequence(v, path)? {
        &[a, b] => Ok((f.int(a, &path.index(0))?, f.int(b, &path.index(1))?)),
        other => Err(path.error(format!("expected a pair, got {} items", other.len()))),
    }
}

/// `{"1": 0, "2": 0, ..., "32768": 0}` → `[(1, 0), (2, 0), ...]`.
pub(super) fn roundup(f: &Fields, v: Value, path: &Path) -> Res<Vec<(u64, u64)>> {
    let d = f.dict(v, path)?;
    let mut out = Vec::new();
    for (k, val) in f.doc.pairs(d) {
        let key = match f.doc.get(k) {
            ValueRef::Str(s) => s.trim().parse::<u64>().ok(),
            ValueRef::Int(i) => u64::try_from(i).ok(),
            _ => None,
        };
        let Some(key) = key else {
            return Err(path.error(format!("expected a numeric key, got {}", f.repr(k))));
        };
        out.push((key, f.uint(val, &path.key("<value>"))?));
    }
    Ok(out)
}

fn setting_value(f: &Fields, v: Value) -> SettingValue {
    match f.doc.get(v) {
        ValueRef::None => SettingValue::None,
        ValueRef::Bool(b) => SettingValue::Bool(b),
        ValueRef::Int(i) => SettingValue::Int(i),
        ValueRef::Float(x) => SettingValue::Float(x),
        ValueRef::Str(s) => SettingValue::Str(s.clone()),
        _ => SettingValue::Text(f.repr(v)),
    }
}

/// torch 2.4 recorded `record_function` regions as trace entries of action
/// `user_defined` whose one frame is `{name: "START" | "END", filename:
/// region name, line: 0}` (`_initRecordAnnotations`); 2.5 moved them to
/// `external_annotations`. Read as annotations, they mark iterations the same way.
pub(super) fn user_defined_annotations(snap: &Snapshot) -> Vec<Annotation> {
    let mut out = Vec::new();
    for (device, trace) in snap.device_traces.iter().enumerate() {
        for e in trace {
            if e.action != Action::Other || snap.action_name(e) != "user_defined" {
                continue;
            }
            let Some(frame) = snap
                .frames
                .stack(e.frames)
                .first()
                .and_then(|&id| snap.frames.frame(id))
            else {
                continue;
            };
            if matches!(&*frame.name, "START" | "END") {
                out.push(Annotation {
                    stage: frame.name.clone(),
                    name: frame.filename.clone(),
                    device: device as i64,
                    time_us: e.time_us().unwrap_or(0),
                });
            }
        }
    }
    out
}
