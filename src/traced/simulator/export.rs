//! The trace out as a PyTorch snapshot: the program's `_dump_snapshot()`
//! (from its last `_record_memory_history`), `--export`, and the end of the
//! run (the figures into the outcome, `bye` on the stream).

use std::io::Write;
use std::path::Path;

use serde_json::{json, Value};

use super::super::error::TraceError;
use super::super::outcome::TraceOutcome;
use super::Simulator;
use crate::trace::snapshot::from_run::{snapshot_of_run, DeviceRun};
use crate::trace::snapshot::{export_bytes, Snapshot};

impl<W: Write> Simulator<W> {
    /// Everything so far as a PyTorch snapshot (`_dump_snapshot`, `--export`).
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_since(0)
    }

    /// The snapshot with the trace entries from event `from` on.
    fn snapshot_since(&self, from: usize) -> Snapshot {
        let segments = self
            .alloc
            .as_ref()
            .map(|a| a.snapshot())
            .unwrap_or_default();
        let stacks = &self.stacks;
        let frames_of = |_: usize, tag: crate::alloc::Tag| -> Vec<(String, i64, String)> {
            usize::try_from(tag.0)
                .ok()
                .and_then(|t| t.checked_sub(1))
                .and_then(|i| stacks.get(i))
                .cloned()
                .unwrap_or_default()
        };
        let devices = [DeviceRun {
            device: 0,
            segments: &segments,
            events: self.events.get(from..).unwrap_or_default(),
        }];
        snapshot_of_run(&devices, &self.config, &frames_of)
    }

    pub(super) fn dump(&mut self, path: &str) -> Value {
        let from = if self.history_off {
            self.events.len()
        } else {
            self.history_from
        };
        let bytes = export_bytes(&self.snapshot_since(from));
        match crate::files::write_replacing(Path::new(path), &bytes) {
            Ok(()) => json!(["ok"]),
            Err(e) => json!(["error", format!("{path}: {e}")]),
        }
    }

    /// The end: figures into the outcome, `bye` on the stream.
    pub fn finish(
        mut self,
        exit_status: Option<i32>,
    ) -> Result<(TraceOutcome, Snapshot), TraceError> {
        self.emit()?;
        if let Some(a) = &self.alloc {
            let s = a.stats();
            self.outcome.peak_allocated = s.peak_allocated_bytes();
            self.outcome.peak_reserved = s.peak_reserved_bytes();
            self.outcome.allocated = s.allocated_bytes();
            self.outcome.reserved = s.reserved_bytes();
        }
        self.outcome.exit_status = exit_status;
        let reason = match (&self.outcome.ended, exit_status) {
            (Some(r), _) => r.clone(),
            (None, Some(c)) => format!("the program exited with status {c}"),
            (None, None) => "the program was killed".to_string(),
        };
        if self.outcome.ended.is_none() {
            self.outcome.ended = Some(reason.clone());
        }
        if !self.outcome.cuda_started {
            // A stream needs its hello and start state even when nothing ran.
            self.allocator()?;
        }
        self.out.bye(&reason)?;
        let snap = self.snapshot();
        Ok((self.outcome, snap))
    }
}
