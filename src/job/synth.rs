//! Recordings made from a snapshot file: the stream a helper would have sent
//! for the same run (an empty start state, the stacks before their first
//! use, the entries in time order, a step where each `Optimizer.step`
//! annotation begins, then `bye`). Tests and benches use it; it regenerates
//! `tests/fixtures/live/`. Made for closed traces (recorded from the
//! process's start): an open trace's blocks from before it are not in the
//! empty start state.

use std::collections::HashSet;

use serde_json::{json, Value};

use super::frame::write_value;
use super::recording::MAGIC;
use crate::trace::snapshot::{Action, FramesId, Snapshot};

/// Entries per `entries` message.
pub const ENTRIES_PER_MESSAGE: usize = 10_000;

/// Frames of a stream, appended as JSON values.
#[derive(Debug, Default, Clone)]
pub struct StreamWriter {
    pub bytes: Vec<u8>,
}

impl StreamWriter {
    /// A recording: the magic first.
    pub fn recording() -> StreamWriter {
        StreamWriter {
            bytes: MAGIC.to_vec(),
        }
    }

    /// A connection's stream: frames only.
    pub fn stream() -> StreamWriter {
        StreamWriter::default()
    }

    pub fn send(&mut self, v: Value) -> &mut Self {
        // Writing into a Vec fails only for a value over the frame bound,
        // which no caller here makes.
        let _ = write_value(&mut self.bytes, &v);
        self
    }
}

/// A server hello for tests and synthetic streams.
pub fn hello(pid: u64, devices: &[(u8, u64)], conf: &str) -> Value {
    json!({
        "t": "hello", "protocol": 1, "pid": pid, "rank": 0, "world_size": 1,
        "hostname": "synthetic", "argv": ["train.py"], "torch": "2.11.0",
        "mode": "agent", "stacks": true,
        "devices": devices.iter().map(|(d, total)| json!({
            "device": d, "name": "synthetic", "total_memory": total
        })).collect::<Vec<_>>(),
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": conf},
        "started_us": 0,
    })
}

/// The recording of `snap`'s trace, as described in the module docs.
pub fn recording_of(snap: &Snapshot) -> Vec<u8> {
    let mut w = StreamWriter::recording();
    let devices: Vec<usize> = (0..snap.device_traces.len())
        .filter(|d| !snap.device_traces[*d].is_empty())
        .collect();
    let conf = snap
        .allocator_settings
        .as_ref()
        .map_or(String::new(), |s| s.conf.clone());
    let hello_devices: Vec<(u8, u64)> = devices.iter().map(|d| (*d as u8, 0)).collect();
    let mut h = hello(0, &hello_devices, &conf);
    for d in h["devices"].as_array_mut().into_iter().flatten() {
        d["total_memory"] = Value::Null;
    }
    w.send(h);
    w.send(json!({"t": "state", "seq": 0, "reason": "start", "chunks": 0}));
    // All devices' entries in time order (stable: a device's own order is kept).
    let mut order: Vec<(usize, usize)> = devices
        .iter()
        .flat_map(|&d| (0..snap.device_traces[d].len()).map(move |i| (d, i)))
        .collect();
    order.sort_by_key(|&(d, i)| snap.device_traces[d][i].time_us().unwrap_or(i64::MIN));
    let steps = step_entries(snap, &devices);
    let mut defined: HashSet<FramesId> = HashSet::new();
    let mut batch: Vec<Value> = Vec::new();
    let mut first = 0usize;
    let mut step_no = 0u64;
    for (seq, &(d, i)) in order.iter().enumerate() {
        if steps.contains(&(d, i)) {
            flush(&mut w, &mut batch, &mut first, seq);
            step_no += 1;
            let t = snap.device_traces[d][i].time_us();
            w.send(
                json!({"t": "step", "step": step_no, "seq": seq, "time_us": t,
                          "source": "Optimizer.step"}),
            );
        }
        let e = &snap.device_traces[d][i];
        if e.frames != FramesId::EMPTY && defined.insert(e.frames) {
            flush(&mut w, &mut batch, &mut first, seq);
            let frames: Vec<Value> = snap
                .frames
                .resolve(e.frames)
                .map(|f| json!([&*f.filename, f.line, &*f.name]))
                .collect();
            w.send(json!({"t": "stack", "id": e.frames.0, "frames": frames}));
        }
        let addr = match e.action {
            Action::Oom => snap.device_free(e).unwrap_or(0),
            _ => e.addr,
        };
        let stack = (e.frames != FramesId::EMPTY).then_some(e.frames.0);
        batch.push(json!([
            snap.action_name(e),
            d,
            addr,
            e.size,
            e.stream,
            e.time_us(),
            stack
        ]));
        if batch.len() >= ENTRIES_PER_MESSAGE {
            flush(&mut w, &mut batch, &mut first, seq + 1);
        }
    }
    flush(&mut w, &mut batch, &mut first, order.len());
    w.send(json!({"t": "bye", "reason": "the recording ends"}));
    w.bytes
}

fn flush(w: &mut StreamWriter, batch: &mut Vec<Value>, first: &mut usize, next: usize) {
    if batch.is_empty() {
        return;
    }
    w.send(json!({"t": "entries", "first": *first, "entries": std::mem::take(batch)}));
    *first = next;
}

/// `(device, entry)` of the first entry at or after each `Optimizer.step`
/// START annotation: where `open` puts its boundaries for the same file.
fn step_entries(snap: &Snapshot, devices: &[usize]) -> HashSet<(usize, usize)> {
    let mut out = HashSet::new();
    for a in &snap.external_annotations {
        if &*a.stage != "START" || !a.name.starts_with("Optimizer.step") {
            continue;
        }
        let Some(d) = usize::try_from(a.device)
            .ok()
            .filter(|d| devices.contains(d))
        else {
            continue;
        };
        let trace = &snap.device_traces[d];
        let i = trace.partition_point(|e| e.time_us().is_some_and(|x| x < a.time_us));
        if i < trace.len() {
            out.insert((d, i));
        }
    }
    out
}

/// Where [`training_job`] puts its one segment.
pub const JOB_BASE: u64 = 0x7f00_0000_0000;

/// A training job's stream (no magic): one 4 GiB segment, then `steps`
/// steps each allocating and freeing `temps` temporaries of 4 MiB from
/// `/home/u/model.py:12 in forward` and keeping `leak` bytes from
/// `/home/u/train.py:41 in train_step`, a step marker after each; then one
/// more step's entries (the job is mid-step) and `bye`. Addresses are the
/// caching allocator's: each request splits the segment's one free block
/// from its start, and freed temporaries merge back into it, so the views
/// place every entry (no gaps).
pub fn training_job(steps: u64, leak: u64, temps: usize) -> StreamWriter {
    const TEMP: u64 = 4 << 20;
    let mut w = StreamWriter::stream();
    w.send(hello(7, &[(0, 80 << 30)], ""));
    w.send(json!({"t": "state", "seq": 0, "reason": "start", "chunks": 0}));
    w.send(json!({"t": "stack", "id": 1,
        "frames": [["/home/u/train.py", 41, "train_step"], ["/home/u/train.py", 90, "<module>"]]}));
    w.send(json!({"t": "stack", "id": 2, "frames": [["/home/u/model.py", 12, "forward"]]}));
    let segment = 4u64 << 30;
    w.send(json!({"t": "entries", "first": 0,
        "entries": [["segment_alloc", 0, JOB_BASE, segment, 0, 0, null]]}));
    let mut seq = 1u64;
    let mut kept = 0u64;
    for k in 0..=steps {
        let mut entries = Vec::with_capacity(temps * 3 + 1);
        // The free block starts after what is kept.
        let free_from = JOB_BASE + kept;
        for t in 0..temps as u64 {
            let a = free_from + t * TEMP;
            let time = (seq + t) as i64;
            entries.push(json!(["alloc", 0, a, TEMP, 0, time, 2]));
        }
        for t in 0..temps as u64 {
            let a = free_from + t * TEMP;
            entries.push(json!(["free_requested", 0, a, TEMP, 0, null, 2]));
            entries.push(json!(["free_completed", 0, a, TEMP, 0, null, 2]));
        }
        if leak > 0 && kept + leak + temps as u64 * TEMP <= segment {
            entries.push(json!(["alloc", 0, JOB_BASE + kept, leak, 0, null, 1]));
            kept += leak;
        }
        for chunk in entries.chunks(ENTRIES_PER_MESSAGE) {
            w.send(json!({"t": "entries", "first": seq, "entries": chunk}));
            seq += chunk.len() as u64;
        }
        if k < steps {
            w.send(json!({"t": "step", "step": k, "seq": seq, "time_us": null,
                          "source": "Optimizer.step"}));
        }
    }
    w.send(json!({"t": "bye", "reason": "the process is exiting"}));
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::AllocConfig;
    use crate::job::frame::FrameReader;
    use crate::job::{decode, Session};
    use crate::trace::mirror::TraceMirror;
    use crate::trace::replay::Entry;
    use crate::trace::timeline::TimelinePart;

    /// Every entry of the synthetic job lands where the caching allocator
    /// would have put it: mirrored onto the map, none is a gap.
    #[test]
    fn a_training_job_is_one_the_allocator_could_have_made() {
        let job = training_job(30, 2 << 20, 5);
        let mut frames = FrameReader::new(job.bytes.as_slice(), "job");
        let mut session = Session::new("job");
        while let Ok(Some((i, bytes))) = frames.next_frame() {
            if let Ok(Some(m)) = decode("job", i, bytes) {
                session.apply(i, m).expect("applies");
            }
        }
        let entries: Vec<Entry> = session.trace(0).iter().map(Entry::recorded).collect();
        assert!(entries.len() > 30 * 16, "{}", entries.len());
        let config = AllocConfig::default();
        let mut mirror = TraceMirror::new(&config);
        let mut part = TimelinePart::with_capacity(entries.len());
        mirror.fill_part(0, &entries, |_| None, &mut part);
        assert_eq!(part.gaps, Vec::new());
        // 31 steps' worth of 2 MiB is what stays allocated.
        assert_eq!(mirror.into_map().allocated, 31 * (2 << 20));
    }
}
