//! Field-by-field decoding of a message, for the errors that name the
//! message and the field (`segments[2].blocks[0].size`) and the bounds.

use serde_json::{Map, Value};

use super::{
    kind_of, DeviceStats, HelloDevice, LostMark, Message, OomMark, ServerHello, StateHeader,
    StateReason, StepMark, WireBlock, WireEntry, WireFrame, WireSegment, MAX_DEVICE,
    MAX_STACK_FRAMES, MAX_STRING, PROTOCOL, STACK_ID_LIMIT,
};
use crate::alloc::{Action, BlockState};
use crate::device::PciAddress;
use crate::job::error::LiveError;
use crate::trace::snapshot::PoolKind;

/// Field access for one message, with errors that name it.
pub(super) struct Fields<'a> {
    pub(super) at: &'a str,
    pub(super) index: u64,
    pub(super) kind: &'a str,
}

type Res<T> = Result<T, LiveError>;

impl Fields<'_> {
    fn err(&self, path: &str, problem: String) -> LiveError {
        LiveError::field(self.at, self.index, self.kind, path, problem)
    }

    fn bound(&self, problem: String) -> LiveError {
        LiveError::protocol(self.at, self.index, self.kind, problem)
    }

    fn get<'v>(&self, obj: &'v Map<String, Value>, path: &str, key: &str) -> Res<&'v Value> {
        obj.get(key)
            .ok_or_else(|| self.err(&join(path, key), "missing".into()))
    }

    fn expected(&self, path: &str, what: &str, v: &Value) -> LiveError {
        self.err(path, format!("expected {what}, found {}", describe(v)))
    }

    fn u64_of(&self, path: &str, v: &Value) -> Res<u64> {
        v.as_u64()
            .ok_or_else(|| self.expected(path, "a non-negative integer", v))
    }

    fn i64_of(&self, path: &str, v: &Value) -> Res<i64> {
        v.as_i64()
            .ok_or_else(|| self.expected(path, "an integer", v))
    }

    fn str_of(&self, path: &str, v: &Value) -> Res<String> {
        let s = v
            .as_str()
            .ok_or_else(|| self.expected(path, "a string", v))?;
        if s.len() > MAX_STRING {
            return Err(self.bound(format!(
                "`{path}`: a string of {} bytes is over the 64 KiB bound",
                s.len()
            )));
        }
        Ok(s.to_string())
    }

    fn u64(&self, o: &Map<String, Value>, path: &str, key: &str) -> Res<u64> {
        self.u64_of(&join(path, key), self.get(o, path, key)?)
    }

    fn str(&self, o: &Map<String, Value>, path: &str, key: &str) -> Res<String> {
        self.str_of(&join(path, key), self.get(o, path, key)?)
    }

    fn bool(&self, o: &Map<String, Value>, path: &str, key: &str) -> Res<bool> {
        let v = self.get(o, path, key)?;
        v.as_bool()
            .ok_or_else(|| self.expected(&join(path, key), "true or false", v))
    }

    /// An optional field: absent and `null` are both `None`.
    fn opt<'v, T>(
        &self,
        o: &'v Map<String, Value>,
        path: &str,
        key: &str,
        read: impl FnOnce(&str, &'v Value) -> Res<T>,
    ) -> Res<Option<T>> {
        match o.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => read(&join(path, key), v).map(Some),
        }
    }

    fn array<'v>(&self, o: &'v Map<String, Value>, path: &str, key: &str) -> Res<&'v [Value]> {
        let v = self.get(o, path, key)?;
        v.as_array()
            .map(Vec::as_slice)
            .ok_or_else(|| self.expected(&join(path, key), "an array", v))
    }

    fn object<'v>(&self, path: &str, v: &'v Value) -> Res<&'v Map<String, Value>> {
        v.as_object()
            .ok_or_else(|| self.expected(path, "an object", v))
    }

    fn device_of(&self, path: &str, v: &Value) -> Res<u8> {
        let d = self.u64_of(path, v)?;
        if d > MAX_DEVICE {
            return Err(self.bound(format!("`{path}`: device {d} is outside 0..=255")));
        }
        Ok(d as u8)
    }

    fn device(&self, o: &Map<String, Value>, path: &str, key: &str) -> Res<u8> {
        self.device_of(&join(path, key), self.get(o, path, key)?)
    }

    fn stack_id_of(&self, path: &str, v: &Value) -> Res<Option<u32>> {
        if v.is_null() {
            return Ok(None);
        }
        let id = self.u64_of(path, v)?;
        if id >= STACK_ID_LIMIT {
            return Err(self.bound(format!("`{path}`: stack id {id} is not below 2^24")));
        }
        Ok(Some(id as u32))
    }

    pub(super) fn message(&self, o: &Map<String, Value>) -> Res<Option<Message>> {
        Ok(Some(match self.kind {
            "hello" => Message::Hello(Box::new(self.hello(o)?)),
            "refused" => Message::Refused {
                reason: self.str(o, "", "reason")?,
            },
            "state" => Message::State(StateHeader {
                seq: self.u64(o, "", "seq")?,
                reason: StateReason::parse(&self.str(o, "", "reason")?),
                chunks: self.u64(o, "", "chunks")?,
            }),
            "segments" => Message::Segments(
                self.array(o, "", "segments")?
                    .iter()
                    .enumerate()
                    .map(|(i, s)| self.segment(&format!("segments[{i}]"), s))
                    .collect::<Res<_>>()?,
            ),
            "stack" => self.stack(o)?,
            "entries" => Message::Entries {
                first: self.u64(o, "", "first")?,
                entries: self
                    .array(o, "", "entries")?
                    .iter()
                    .enumerate()
                    .map(|(i, e)| self.entry(&format!("entries[{i}]"), e))
                    .collect::<Res<_>>()?,
            },
            "step" => Message::Step(StepMark {
                step: self.u64(o, "", "step")?,
                seq: self.u64(o, "", "seq")?,
                time_us: self.opt(o, "", "time_us", |p, v| self.i64_of(p, v))?,
                source: self.str(o, "", "source")?,
            }),
            "stats" => self.stats(o)?,
            "oom" => Message::Oom(OomMark {
                device: self.device(o, "", "device")?,
                seq: self.u64(o, "", "seq")?,
                message: self.str(o, "", "message")?,
                device_free: self.opt(o, "", "device_free", |p, v| self.u64_of(p, v))?,
                device_total: self.opt(o, "", "device_total", |p, v| self.u64_of(p, v))?,
                alloc_size: self.opt(o, "", "alloc_size", |p, v| self.u64_of(p, v))?,
                pytorch_message: None,
            }),
            "oom_message" => Message::OomMessage {
                seq: self.u64(o, "", "seq")?,
                device: match o.get("device") {
                    None | Some(Value::Null) => None,
                    Some(_) => Some(self.device(o, "", "device")?),
                },
                message: self.str(o, "", "message")?,
            },
            "lost" => Message::Lost(LostMark {
                seq: self.u64(o, "", "seq")?,
                count: self.opt(o, "", "count", |p, v| self.u64_of(p, v))?,
                why: self
                    .opt(o, "", "why", |p, v| self.str_of(p, v))?
                    .unwrap_or_else(|| "the helper did not say why".into()),
            }),
            "holders" => self.holders(o)?,
            "bye" => Message::Bye {
                reason: self.opt(o, "", "reason", |p, v| self.str_of(p, v))?,
            },
            _ => return Ok(None),
        }))
    }

    fn hello(&self, o: &Map<String, Value>) -> Res<ServerHello> {
        let protocol = self.u64(o, "", "protocol")?;
        if protocol != PROTOCOL {
            return Err(self.bound(format!(
                "protocol {protocol} is not supported; this vramscope speaks {PROTOCOL}"
            )));
        }
        let u = |k: &str| self.opt(o, "", k, |p, v| self.u64_of(p, v));
        let s = |k: &str| self.opt(o, "", k, |p, v| self.str_of(p, v));
        let argv = match o.get("argv") {
            None | Some(Value::Null) => Vec::new(),
            Some(_) => self
                .array(o, "", "argv")?
                .iter()
                .enumerate()
                .map(|(i, a)| self.str_of(&format!("argv[{i}]"), a))
                .collect::<Res<_>>()?,
        };
        let devices = self
            .array(o, "", "devices")?
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let p = format!("devices[{i}]");
                let d = self.object(&p, d)?;
                Ok(HelloDevice {
                    device: self.device(d, &p, "device")?,
                    name: self.opt(d, &p, "name", |p, v| self.str_of(p, v))?,
                    total_memory: self.opt(d, &p, "total_memory", |p, v| self.u64_of(p, v))?,
                    pci_bus_id: self.opt(d, &p, "pci_bus_id", |p, v| {
                        let text = self.str_of(p, v)?;
                        PciAddress::parse(&text).ok_or_else(|| {
                            self.err(
                                p,
                                format!("{text:?} is not a PCI bus id (DOMAIN:BUS:DEVICE.FUNCTION in hex)"),
                            )
                        })
                    })?,
                    uuid: self.opt(d, &p, "uuid", |p, v| self.str_of(p, v))?,
                })
            })
            .collect::<Res<_>>()?;
        let allocator_settings = match o.get("allocator_settings") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => self
                .object("allocator_settings", v)?
                .iter()
                .map(|(k, v)| {
                    let p = join("allocator_settings", k);
                    let text = match v {
                        Value::String(_) => self.str_of(&p, v)?,
                        other => other.to_string(),
                    };
                    Ok((k.clone(), text))
                })
                .collect::<Res<_>>()?,
        };
        Ok(ServerHello {
            protocol,
            pid: self.u64(o, "", "pid")?,
            rank: u("rank")?,
            world_size: u("world_size")?,
            hostname: s("hostname")?,
            argv,
            torch: s("torch")?,
            mode: self.str(o, "", "mode")?,
            stacks: self
                .opt(o, "", "stacks", |p, v| {
                    v.as_bool()
                        .ok_or_else(|| self.expected(p, "true or false", v))
                })?
                .unwrap_or(false),
            devices,
            allocator_settings,
            started_us: self.opt(o, "", "started_us", |p, v| self.i64_of(p, v))?,
            poll_interval_s: self.opt(o, "", "poll_interval_s", |p, v| {
                v.as_f64().ok_or_else(|| self.expected(p, "a number", v))
            })?,
        })
    }

    fn segment(&self, path: &str, v: &Value) -> Res<WireSegment> {
        let o = self.object(path, v)?;
        let segment_type = match self.str(o, path, "segment_type")?.as_str() {
            "small" => PoolKind::Small,
            "large" => PoolKind::Large,
            other => {
                return Err(self.err(
                    &join(path, "segment_type"),
                    format!("expected \"small\" or \"large\", found {other:?}"),
                ))
            }
        };
        let pool_id = match o.get("segment_pool_id") {
            None | Some(Value::Null) => (0, 0),
            Some(v) => {
                let p = join(path, "segment_pool_id");
                match v.as_array().map(Vec::as_slice) {
                    Some([a, b]) => (self.i64_of(&p, a)?, self.i64_of(&p, b)?),
                    _ => return Err(self.expected(&p, "a pair of integers", v)),
                }
            }
        };
        let blocks = self
            .array(o, path, "blocks")?
            .iter()
            .enumerate()
            .map(|(i, b)| self.block(&format!("{path}.blocks[{i}]"), b))
            .collect::<Res<_>>()?;
        Ok(WireSegment {
            device: self.device(o, path, "device")?,
            address: self.u64(o, path, "address")?,
            total_size: self.u64(o, path, "total_size")?,
            stream: self.u64(o, path, "stream")?,
            segment_type,
            pool_id,
            is_expandable: self.bool(o, path, "is_expandable")?,
            blocks,
        })
    }

    fn block(&self, path: &str, v: &Value) -> Res<WireBlock> {
        let o = self.object(path, v)?;
        let state = match self.str(o, path, "state")?.as_str() {
            "active_allocated" => BlockState::ActiveAllocated,
            "active_pending_free" => BlockState::ActivePendingFree,
            "inactive" => BlockState::Inactive,
            other => {
                return Err(self.err(
                    &join(path, "state"),
                    format!(
                    "expected active_allocated, active_pending_free or inactive, found {other:?}"
                ),
                ))
            }
        };
        let size = self.u64(o, path, "size")?;
        Ok(WireBlock {
            address: self.u64(o, path, "address")?,
            size,
            requested_size: self
                .opt(o, path, "requested_size", |p, v| self.u64_of(p, v))?
                .unwrap_or(size),
            state,
            stack: match o.get("stack") {
                None => None,
                Some(v) => self.stack_id_of(&join(path, "stack"), v)?,
            },
        })
    }

    fn stack(&self, o: &Map<String, Value>) -> Res<Message> {
        let id_value = self.get(o, "", "id")?;
        let id = self
            .stack_id_of("id", id_value)?
            .ok_or_else(|| self.expected("id", "a stack id", id_value))?;
        let frames = self.array(o, "", "frames")?;
        if frames.len() > MAX_STACK_FRAMES {
            return Err(self.bound(format!(
                "stack {id} has {} frames, over the bound of {MAX_STACK_FRAMES}",
                frames.len()
            )));
        }
        let frames = frames
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let p = format!("frames[{i}]");
                match f.as_array().map(Vec::as_slice) {
                    Some([file, line, name]) => Ok(WireFrame {
                        filename: self.str_of(&format!("{p}[0]"), file)?,
                        line: self.i64_of(&format!("{p}[1]"), line)?,
                        name: self.str_of(&format!("{p}[2]"), name)?,
                    }),
                    _ => Err(self.expected(&p, "[filename, line, name]", f)),
                }
            })
            .collect::<Res<_>>()?;
        Ok(Message::Stack { id, frames })
    }

    fn entry(&self, path: &str, v: &Value) -> Res<WireEntry> {
        let Some([action, device, addr, size, stream, time_us, stack]) =
            v.as_array().map(Vec::as_slice)
        else {
            return Err(self.expected(
                path,
                "[action, device, addr, size, stream, time_us, stack]",
                v,
            ));
        };
        let name = self.str_of(&format!("{path}[0] (action)"), action)?;
        let parsed = Action::parse(&name);
        Ok(WireEntry {
            action: parsed,
            other: (parsed == Action::Other).then_some(name),
            device: self.device_of(&format!("{path}[1] (device)"), device)?,
            addr: self.u64_of(&format!("{path}[2] (addr)"), addr)?,
            size: self.u64_of(&format!("{path}[3] (size)"), size)?,
            stream: self.u64_of(&format!("{path}[4] (stream)"), stream)?,
            time_us: match time_us {
                Value::Null => None,
                t => Some(self.i64_of(&format!("{path}[5] (time_us)"), t)?),
            },
            stack: self.stack_id_of(&format!("{path}[6] (stack)"), stack)?,
        })
    }

    fn stats(&self, o: &Map<String, Value>) -> Res<Message> {
        let v = self.get(o, "", "stats")?;
        let stats = self
            .object("stats", v)?
            .iter()
            .map(|(k, v)| {
                if k.len() > MAX_STRING {
                    return Err(self.bound("a stats key is over the 64 KiB bound".into()));
                }
                Ok((k.clone(), self.i64_of(&join("stats", k), v)?))
            })
            .collect::<Res<_>>()?;
        Ok(Message::Stats(DeviceStats {
            device: self.device(o, "", "device")?,
            seq: self.u64(o, "", "seq")?,
            stats,
        }))
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// A value for an error: its kind and, when short, itself.
fn describe(v: &Value) -> String {
    let text = v.to_string();
    if text.len() <= 40 {
        format!("{} {text}", kind_of(v))
    } else {
        kind_of(v).to_string()
    }
}

mod holders;
