//! A PyTorch snapshot as a [`Source`]: its recorded trace mirrored into
//! events (`trace::mirror`), or its requests replayed under another
//! `PYTORCH_CUDA_ALLOC_CONF` (`trace::replay::whatif`), whose allocator's own
//! events are what the views show. Either way a worker thread makes the
//! events and sends them in chunks, so a large trace opens at once.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::alloc::constants::LARGE_BUFFER;
use crate::alloc::{AllocConfig, Tag};
use crate::trace::mirror::{final_map, start_map, TraceMirror};
use crate::trace::replay::from_snapshot::{self, DeviceReplay};
use crate::trace::replay::reconstruct;
use crate::trace::replay::replayed::device_capacity;
use crate::trace::replay::whatif::{self, Requests};
use crate::trace::replay::{tag_entry, Entry};
use crate::trace::snapshot::{import_file, Action, FramesId, Snapshot, SnapshotError};
use crate::trace::stack::{Stack, StackFrame};
use crate::trace::{Event, MemoryMap};

use super::source::{
    BlockStack, EntryDetail, Source, SourceMsg, StackOrigin, TagDescription, TagInfo,
};

/// Events per message while a trace is rebuilt in the background: the UI
/// opens on the first ones while the rest are still being placed (a 1 GB
/// trace takes seconds to rebuild).
const EVENTS_PER_MESSAGE: usize = 1 << 16;

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error("the snapshot has no device {device}; it holds {}", device_list(.holds))]
    NoDevice { device: usize, holds: Vec<usize> },
}

fn device_list(devices: &[usize]) -> String {
    match devices {
        [] => "none".to_string(),
        _ => devices
            .iter()
            .map(|d| format!("device {d}"))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// Open `path` and turn the trace of `device` (the first traced device when
/// `None`) into a finished source.
pub fn snapshot_source(path: &Path, device: Option<usize>) -> Result<Source, ImportError> {
    let snap = import_file(path)?;
    snapshot_to_source(&snap, device)
}

/// The devices a snapshot holds memory or a trace for, in order.
pub fn snapshot_devices(snap: &Snapshot) -> Vec<usize> {
    let mut devices: Vec<usize> = from_snapshot::traced_devices(snap);
    devices.extend(
        snap.segments
            .iter()
            .filter_map(|s| usize::try_from(s.device).ok()),
    );
    devices.sort_unstable();
    devices.dedup();
    devices
}

/// The device a source shows: `device`, else the first the snapshot holds.
fn pick_device(snap: &Snapshot, device: Option<usize>) -> Result<usize, ImportError> {
    let devices = snapshot_devices(snap);
    match device {
        Some(d) if devices.contains(&d) => Ok(d),
        Some(d) => Err(ImportError::NoDevice {
            device: d,
            holds: devices,
        }),
        None => Ok(devices.first().copied().unwrap_or(0)),
    }
}

/// The stacks of `device`'s trace entries and final blocks, for tags from
/// `entry_tag` and for blocks without one; `mirrored`: the events are the
/// trace's own, one per allocator entry.
fn entry_tags(snap: &Snapshot, device: usize, mirrored: bool) -> Arc<SnapshotTags> {
    Arc::new(SnapshotTags::new(snap, device, mirrored))
}

pub fn snapshot_to_source(snap: &Snapshot, device: Option<usize>) -> Result<Source, ImportError> {
    let device = pick_device(snap, device)?;
    let entries = from_snapshot::entries(snap, device);
    let capacity = from_snapshot::infer_device_total(&entries, LARGE_BUFFER);
    let config = from_snapshot::config(snap);
    let mirrored = !entries.is_empty();
    let mut source = if entries.is_empty() {
        // State-only file: the map is the recorded final state.
        Source::from_messages([
            SourceMsg::Start(Box::new(final_map(snap, device))),
            SourceMsg::Finished,
        ])
    } else {
        // Only `oom` entries record it: a short list, searched by entry index.
        let device_free: Vec<(usize, u64)> = snap.device_traces[device]
            .iter()
            .enumerate()
            .filter_map(|(i, e)| snap.extra(e).device_free.map(|f| (i, f)))
            .collect();
        let finals = from_snapshot::final_segments(snap, device);
        let start = start_map(&reconstruct::initial_state(&entries, &finals, &config));
        stream_events("vramscope-snapshot-events", move |send| {
            mirror_events(start, &entries, &device_free, &config, send)
        })
    };
    source = source.with_tags(entry_tags(snap, device, mirrored));
    source.capacity = capacity;
    Ok(source)
}

/// The state the trace began in, then the recorded entries as events, a
/// chunk at a time; false once the UI has gone.
fn mirror_events(
    start: MemoryMap,
    entries: &[Entry],
    device_free: &[(usize, u64)],
    config: &AllocConfig,
    send: &mut dyn FnMut(SourceMsg) -> bool,
) -> bool {
    let free_at = |i: usize| {
        device_free
            .binary_search_by_key(&i, |(at, _)| *at)
            .ok()
            .map(|k| device_free[k].1)
    };
    if !start.segments.is_empty() && !send(SourceMsg::Start(Box::new(start.clone()))) {
        return false;
    }
    let mut mirror = TraceMirror::starting_from(start, config);
    for (k, chunk) in entries.chunks(EVENTS_PER_MESSAGE).enumerate() {
        let first = k * EVENTS_PER_MESSAGE;
        let mut events = Vec::with_capacity(chunk.len());
        events.extend(
            chunk
                .iter()
                .enumerate()
                .filter_map(|(j, e)| mirror.event(first + j, e, free_at(first + j))),
        );
        if !send(SourceMsg::Events(events)) {
            return false;
        }
    }
    true
}

/// `device`'s requests of `snap` replayed under `config`: the what-if
/// allocator's own events (its blocks, its segments), from the state the
/// trace started in (an open trace's rebuilt start), on the device size the
/// trace tells or else the recorded run's peak.
pub fn what_if_source(
    snap: &Snapshot,
    device: Option<usize>,
    config: AllocConfig,
) -> Result<Source, ImportError> {
    let device = pick_device(snap, device)?;
    let Some(replay) = from_snapshot::verify_device(snap, device, None) else {
        // Nothing was traced: no request to replay, the recorded state stands.
        return snapshot_to_source(snap, Some(device));
    };
    let capacity = device_capacity(&replay, None);
    let mut source = stream_events("vramscope-what-if", move |send| {
        replayed_events(&replay, config, capacity, send)
    });
    source = source.with_tags(entry_tags(snap, device, false));
    source.capacity = Some(capacity);
    Ok(source)
}

fn replayed_events(
    replay: &DeviceReplay,
    config: AllocConfig,
    capacity: u64,
    send: &mut dyn FnMut(SourceMsg) -> bool,
) -> bool {
    let requests = Requests {
        entries: &replay.entries,
        empty_cache_at: &replay.outcome.empty_cache_at,
        start: Some(&replay.start),
    };
    let mut run = whatif::run(&requests, config, capacity, true);
    if !run.start.is_empty()
        && !send(SourceMsg::Start(Box::new(MemoryMap::from_segments(
            &run.start,
        ))))
    {
        return false;
    }
    let events = run.allocator.take_events();
    events.chunks(EVENTS_PER_MESSAGE).all(|chunk| {
        send(SourceMsg::Events(
            chunk.iter().copied().map(Event::Alloc).collect(),
        ))
    })
}

/// A source fed by `produce` on a worker thread of its own, then
/// `Finished`. The snapshot itself stays on the caller's thread (its strings
/// are not `Send`); `produce` gets only plain data. Its `send` returns false
/// once the UI has gone, and nobody needs the rest.
fn stream_events(
    name: &str,
    produce: impl FnOnce(&mut dyn FnMut(SourceMsg) -> bool) -> bool + Send + 'static,
) -> Source {
    let (tx, rx) = flume::unbounded();
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let mut send = |m: SourceMsg| tx.send(m).is_ok();
            if produce(&mut send) {
                send(SourceMsg::Finished);
            }
        });
    match spawned {
        Ok(_) => Source::new(rx, None),
        Err(e) => Source::from_messages([SourceMsg::Failed(format!(
            "could not start the thread that makes the events: {e}"
        ))]),
    }
}

/// What the views ask of a snapshot's tags, resolved to text up front (the
/// snapshot's strings are not shareable across threads).
struct SnapshotTags {
    /// Every distinct non-empty stack of the trace and of the final blocks.
    stacks: HashMap<FramesId, Arc<Stack>>,
    /// Per trace entry: its stack and its action.
    entry_frames: Vec<FramesId>,
    entry_actions: Vec<Action>,
    /// Per trace entry: µs since the epoch ([`NO_TIME`] where absent);
    /// `None` when no entry records a time.
    entry_times: Option<Vec<i64>>,
    first_time: Option<i64>,
    /// Final-state stacks, by address, of the live blocks the views show
    /// without a tag: allocated before the trace began and never freed in it
    /// (every live block of a file without a trace).
    untagged: HashMap<u64, FramesId>,
    /// The trace has entries: an untagged block missing from `untagged` was
    /// freed within it.
    traced: bool,
    /// For a mirrored trace (one event per allocator entry): the entries
    /// that make no event, ascending. `None` for a what-if replay, whose
    /// events are its allocator's own.
    skipped: Option<Vec<usize>>,
}

/// [`SnapshotTags::entry_times`] of an entry without a time.
const NO_TIME: i64 = i64::MIN;

impl SnapshotTags {
    fn new(snap: &Snapshot, device: usize, mirrored: bool) -> SnapshotTags {
        let trace = snap
            .device_traces
            .get(device)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let entry_frames: Vec<FramesId> = trace.iter().map(|e| e.frames).collect();
        let entry_actions = trace.iter().map(|e| e.action).collect();
        let timed = trace.iter().any(|e| e.time_us().is_some());
        let entry_times = timed.then(|| {
            trace
                .iter()
                .map(|e| e.time_us().unwrap_or(NO_TIME))
                .collect::<Vec<_>>()
        });
        let first_time = entry_times
            .as_ref()
            .and_then(|t| t.iter().copied().filter(|t| *t != NO_TIME).min());
        let mut untagged: HashMap<u64, FramesId> = snap
            .segments
            .iter()
            .filter(|s| s.device == device as i64)
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state.is_active())
            .map(|b| (b.address, b.frames))
            .collect();
        for e in trace {
            // A block allocated in the trace carries that entry's tag; one
            // freed in it is not the block the final state holds there.
            if matches!(
                e.action,
                Action::Alloc | Action::FreeRequested | Action::FreeCompleted
            ) {
                untagged.remove(&e.addr);
            }
        }
        let mut resolved = HashMap::new();
        let mut stacks = HashMap::new();
        for id in entry_frames.iter().chain(untagged.values()) {
            if *id == FramesId::EMPTY || stacks.contains_key(id) {
                continue;
            }
            let frames = snap
                .frames
                .stack(*id)
                .iter()
                .filter_map(|f| {
                    let frame = snap.frames.frame(*f)?;
                    Some(
                        resolved
                            .entry(*f)
                            .or_insert_with(|| Arc::new(StackFrame::from_frame(frame)))
                            .clone(),
                    )
                })
                .collect();
            stacks.insert(*id, Arc::new(Stack::new(frames)));
        }
        let skipped = mirrored.then(|| {
            trace
                .iter()
                .enumerate()
                .filter(|(_, e)| !e.action.is_allocator())
                .map(|(i, _)| i)
                .collect()
        });
        SnapshotTags {
            stacks,
            entry_frames,
            entry_actions,
            entry_times,
            first_time,
            untagged,
            traced: !trace.is_empty(),
            skipped,
        }
    }

    fn time(&self, entry: usize) -> Option<i64> {
        self.entry_times
            .as_ref()
            .and_then(|t| t.get(entry))
            .copied()
            .filter(|t| *t != NO_TIME)
    }

    fn entry_stack(&self, entry: usize) -> Option<Arc<Stack>> {
        self.stacks.get(self.entry_frames.get(entry)?).cloned()
    }
}

impl TagInfo for SnapshotTags {
    fn describe(&self, tag: Tag) -> Option<TagDescription> {
        let entry = tag_entry(tag)?;
        self.entry_frames.get(entry)?;
        let stack = self.entry_stack(entry);
        let stack = stack.as_deref();
        Some(TagDescription {
            op: stack.and_then(|s| Some(s.frames[s.first_user?].name.to_string())),
            frames: stack
                .map(|s| s.frames.iter().map(|f| f.location()).collect())
                .unwrap_or_default(),
            ..TagDescription::default()
        })
    }

    fn stack(&self, tag: Tag, addr: u64) -> Option<BlockStack> {
        if tag == Tag::NONE {
            return Some(match self.untagged.get(&addr) {
                Some(id) => BlockStack {
                    stack: self.stacks.get(id).cloned(),
                    origin: StackOrigin::FinalState,
                },
                None => BlockStack {
                    stack: None,
                    origin: if self.traced {
                        StackOrigin::BeforeTrace
                    } else {
                        StackOrigin::FinalState
                    },
                },
            });
        }
        let entry = tag_entry(tag).filter(|e| *e < self.entry_frames.len())?;
        Some(BlockStack {
            stack: self.entry_stack(entry),
            origin: StackOrigin::Entry(entry),
        })
    }

    fn event_entry(&self, index: usize) -> Option<EntryDetail> {
        let mut entry = index;
        for s in self.skipped.as_ref()? {
            if *s > entry {
                break;
            }
            entry += 1;
        }
        Some(EntryDetail {
            entry,
            action: *self.entry_actions.get(entry)?,
            time_us: self.time(entry),
            first_time_us: self.first_time,
            stack: self.entry_stack(entry),
        })
    }

    fn entry_time(&self, entry: usize) -> Option<i64> {
        self.time(entry)
    }
}
