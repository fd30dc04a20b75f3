//! The live stream (python/PROTOCOL.md, mode `trace`) written as the
//! allocator decides: the hello once CUDA starts, an empty start state,
//! stacks before their first use, entries in batches, steps with the
//! allocator's stats, OOMs with PyTorch's own message, the program's holder
//! walks, and `bye`.

use std::io::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::error::TraceError;
use crate::alloc::{Action, AllocEvent, Tag};
use crate::job::write_value;

/// Entries per `entries` message.
const BATCH: usize = 4096;
/// Pending entries go out at least this often, so a view keeps up.
const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// The stack id a request's tag carries (`Tag(id + 1)`; none: `Tag::NONE`).
pub fn tag_of(stack: Option<u32>) -> Tag {
    stack.map_or(Tag::NONE, |s| Tag(u64::from(s) + 1))
}

fn stack_of(tag: Tag) -> Option<u64> {
    (tag != Tag::NONE).then(|| tag.0 - 1)
}

pub struct LiveOut<W: Write> {
    sink: W,
    /// The next entry's `seq`.
    seq: u64,
    batch: Vec<Value>,
    first: u64,
    started: Instant,
    started_us: i64,
    last_flush: Instant,
    steps: u64,
}

impl<W: Write> LiveOut<W> {
    pub fn new(sink: W) -> LiveOut<W> {
        let now = Instant::now();
        let started_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        LiveOut {
            sink,
            seq: 0,
            batch: Vec::new(),
            first: 0,
            started: now,
            started_us,
            last_flush: now,
            steps: 0,
        }
    }

    pub fn started_us(&self) -> i64 {
        self.started_us
    }

    fn now_us(&self) -> i64 {
        self.started_us + i64::try_from(self.started.elapsed().as_micros()).unwrap_or(0)
    }

    /// A message other than entries: the pending entries go first.
    pub fn send(&mut self, v: &Value) -> Result<(), TraceError> {
        self.flush_entries()?;
        write_value(&mut self.sink, v).map_err(TraceError::Sink)
    }

    /// The hello and the empty state the log starts from.
    pub fn open(&mut self, hello: &Value) -> Result<(), TraceError> {
        self.send(hello)?;
        self.send(&json!({"t": "state", "seq": 0, "reason": "start", "chunks": 0}))
    }

    pub fn stack(&mut self, id: u32, frames: &Value) -> Result<(), TraceError> {
        self.send(&json!({"t": "stack", "id": id, "frames": frames}))
    }

    /// The allocator's entries, in order.
    pub fn entries(&mut self, events: &[AllocEvent]) -> Result<(), TraceError> {
        let now = self.now_us();
        for e in events {
            let addr = if e.action == Action::Oom {
                e.device_free
            } else {
                e.addr
            };
            self.batch.push(json!([
                e.action.name(),
                0,
                addr,
                e.size,
                e.stream,
                now,
                stack_of(e.tag)
            ]));
            self.seq += 1;
        }
        if self.batch.len() >= BATCH || self.last_flush.elapsed() >= FLUSH_EVERY {
            self.flush_entries()?;
        }
        Ok(())
    }

    fn flush_entries(&mut self) -> Result<(), TraceError> {
        self.last_flush = Instant::now();
        if self.batch.is_empty() {
            return self.sink.flush().map_err(TraceError::Sink);
        }
        let entries = std::mem::take(&mut self.batch);
        let v = json!({"t": "entries", "first": self.first, "entries": entries});
        self.first = self.seq;
        write_value(&mut self.sink, &v).map_err(TraceError::Sink)?;
        self.sink.flush().map_err(TraceError::Sink)
    }

    /// An optimizer step ended here; `stats` are the allocator's now.
    pub fn step(&mut self, stats: &Value) -> Result<(), TraceError> {
        self.steps += 1;
        let (seq, t) = (self.seq, self.now_us());
        self.send(
            &json!({"t": "step", "step": self.steps, "seq": seq, "time_us": t,
                          "source": "Optimizer.step"}),
        )?;
        self.send(&json!({"t": "stats", "device": 0, "seq": seq, "stats": stats}))
    }

    /// An OOM the allocator just recorded (its `oom` entry is out), with
    /// PyTorch's message: the exception the program gets says the same.
    pub fn oom(
        &mut self,
        message: &str,
        free: u64,
        total: u64,
        size: u64,
        stats: &Value,
    ) -> Result<(), TraceError> {
        let seq = self.seq;
        self.send(
            &json!({"t": "oom", "device": 0, "seq": seq, "message": message,
                          "device_free": free, "device_total": total, "alloc_size": size}),
        )?;
        self.send(&json!({"t": "stats", "device": 0, "seq": seq, "stats": stats}))?;
        self.send(&json!({"t": "oom_message", "seq": seq, "device": 0, "message": message}))
    }

    /// The program's holder walk: its fields, with the stream's `seq`, the
    /// step that just ended (none at an OOM) and the allocator's bytes.
    pub fn holders(
        &mut self,
        fields: &serde_json::Map<String, Value>,
        allocated: Option<u64>,
    ) -> Result<(), TraceError> {
        let mut m = fields.clone();
        let at_oom = m.get("reason").and_then(Value::as_str) == Some("oom");
        m.insert("t".into(), json!("holders"));
        m.insert("seq".into(), json!(self.seq));
        m.insert(
            "step".into(),
            if at_oom {
                Value::Null
            } else {
                json!(self.steps)
            },
        );
        m.insert("allocated".into(), json!(allocated));
        self.send(&Value::Object(m))
    }

    pub fn bye(&mut self, reason: &str) -> Result<(), TraceError> {
        self.send(&json!({"t": "bye", "reason": reason}))?;
        self.sink.flush().map_err(TraceError::Sink)
    }
}
