//! An imported PyTorch snapshot as a [`Source`] that delivers everything at once.
//!
//! PyTorch's trace entries do not record the block a request got, only the
//! request (`AllocEvent::block_size` is ours). The map needs it, so it is
//! rebuilt here from the trace with the allocator's rounding and `should_split`
//! rule (allocator.md §4.1) against the map as it stands before each entry.
//! The recorded trace is mirrored, not replayed: the views show the addresses
//! and segments PyTorch recorded, even where a replay of the model would
//! diverge (`vramscope replay --verify` is where divergences are reported).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::alloc::constants::{LARGE_BUFFER, MIN_BLOCK_SIZE, SMALL_BUFFER, SMALL_SIZE};
use crate::alloc::{round_size, Action, AllocConfig, AllocEvent, BlockState, Pool, Tag};
use crate::trace::replay::{from_snapshot, EntryAction};
use crate::trace::snapshot::{
    import_file, FrameTable, FramesId, PoolKind, Snapshot, SnapshotError,
};
use crate::trace::{Event, MapBlock, MapSegment, MemoryMap};

use super::source::{Source, SourceMsg, TagDescription, TagInfo};

/// Frames shown per block in the detail pane.
const MAX_FRAMES: usize = 12;

/// Events per message while a trace is rebuilt in the background: the UI
/// opens on the first ones while the rest are still being placed (a 1 GB
/// trace takes seconds to rebuild).
const EVENTS_PER_MESSAGE: usize = 1 << 16;

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error("the snapshot has no device {0}")]
    NoDevice(usize),
}

/// Open `path` and turn the trace of `device` (the first traced device when
/// `None`) into a finished source.
pub fn snapshot_source(path: &Path, device: Option<usize>) -> Result<Source, ImportError> {
    let snap = import_file(path)?;
    snapshot_to_source(&snap, device)
}

pub fn snapshot_to_source(snap: &Snapshot, device: Option<usize>) -> Result<Source, ImportError> {
    let traced = from_snapshot::traced_devices(snap);
    let device = match device {
        Some(d) => d,
        None => traced.first().copied().unwrap_or(0),
    };
    let has_segments = snap.segments.iter().any(|s| s.device == device as i64);
    if !traced.contains(&device) && !has_segments {
        return Err(ImportError::NoDevice(device));
    }
    let entries = from_snapshot::entries(snap, device);
    let capacity = from_snapshot::infer_device_total(&entries, LARGE_BUFFER);
    let config = from_snapshot::config(snap);
    let mut entry_frames = Vec::new();
    let mut source = if entries.is_empty() {
        // State-only file: the map is the recorded final state.
        Source::from_messages([
            SourceMsg::Start(Box::new(final_map(snap, device))),
            SourceMsg::Finished,
        ])
    } else {
        let trace = snap
            .device_traces
            .get(device)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        entry_frames = trace.iter().map(|e| e.frames).collect();
        // Only `oom` entries record it: a short list, searched by entry index.
        let device_free: Vec<(usize, u64)> = trace
            .iter()
            .enumerate()
            .filter_map(|(i, e)| snap.extra(e).device_free.map(|f| (i, f)))
            .collect();
        stream_trace_events(entries, device_free, config)
    };
    let tags = SnapshotTags::new(&snap.frames, entry_frames);
    source = source.with_tags(Arc::new(tags));
    source.capacity = capacity;
    Ok(source)
}

/// A source whose events a worker thread rebuilds from `entries` and sends
/// in chunks, then `Finished`. The snapshot itself stays on this thread (its
/// strings are not `Send`); the worker gets only the plain entries.
fn stream_trace_events(
    entries: Vec<crate::trace::replay::Entry>,
    device_free: Vec<(usize, u64)>,
    config: AllocConfig,
) -> Source {
    let (tx, rx) = flume::unbounded();
    let spawned = std::thread::Builder::new()
        .name("vramscope-snapshot-events".into())
        .spawn(move || {
            let free_at = |i: usize| {
                device_free
                    .binary_search_by_key(&i, |(at, _)| *at)
                    .ok()
                    .map(|k| device_free[k].1)
            };
            let mut mirror = TraceMirror::new(&config);
            for (k, chunk) in entries.chunks(EVENTS_PER_MESSAGE).enumerate() {
                let first = k * EVENTS_PER_MESSAGE;
                let mut events = Vec::with_capacity(chunk.len());
                events.extend(
                    chunk
                        .iter()
                        .enumerate()
                        .filter_map(|(j, e)| mirror.event(first + j, e, free_at(first + j))),
                );
                // A failed send: the UI has gone, and nobody needs the rest.
                if tx.send(SourceMsg::Events(events)).is_err() {
                    return;
                }
            }
            let _ = tx.send(SourceMsg::Finished);
        });
    match spawned {
        Ok(_) => Source::new(rx, None),
        Err(e) => Source::from_messages([SourceMsg::Failed(format!(
            "could not start the thread that rebuilds the trace: {e}"
        ))]),
    }
}

/// Events for one device's trace entries; `Tag(i + 1)` names entry `i`.
/// `device_free(i)`: the free device memory entry `i` recorded (`oom` entries).
pub fn trace_events(
    entries: &[crate::trace::replay::Entry],
    device_free: impl Fn(usize) -> Option<u64>,
    config: &AllocConfig,
) -> Vec<Event> {
    let mut mirror = TraceMirror::new(config);
    let mut out = Vec::with_capacity(entries.len());
    out.extend(
        entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| mirror.event(i, e, device_free(i))),
    );
    out
}

/// The map as the trace has built it so far, which decides the block each
/// later entry got.
struct TraceMirror<'a> {
    map: MemoryMap,
    config: &'a AllocConfig,
}

impl<'a> TraceMirror<'a> {
    fn new(config: &'a AllocConfig) -> Self {
        TraceMirror {
            map: MemoryMap::default(),
            config,
        }
    }

    /// The event for entry `i`, applied to the map; `None` for entries the
    /// views do not show.
    fn event(
        &mut self,
        i: usize,
        e: &crate::trace::replay::Entry,
        device_free: Option<u64>,
    ) -> Option<Event> {
        let tag = Tag(i as u64 + 1);
        let ev = entry_event(e, &self.map, self.config, tag, device_free.unwrap_or(0))?;
        // The mirror only decides later block sizes; misplaced entries are
        // reported by the timeline's own gaps.
        let _ = self.map.apply(&ev);
        Some(Event::Alloc(ev))
    }
}

fn entry_event(
    e: &crate::trace::replay::Entry,
    map: &MemoryMap,
    config: &AllocConfig,
    tag: Tag,
    device_free: u64,
) -> Option<AllocEvent> {
    let mut ev = AllocEvent {
        action: Action::Oom,
        addr: e.addr,
        size: e.size,
        block_size: e.size,
        stream: e.stream,
        pool: Pool::Large,
        device_free: 0,
        tag,
    };
    match e.action {
        EntryAction::Alloc => {
            ev.action = Action::Alloc;
            let rounded = round_size(e.size, config);
            ev.pool = Pool::for_size(rounded);
            ev.block_size = rounded;
            if let Some(b) = map
                .blocks
                .get(&e.addr)
                .filter(|b| b.state == BlockState::Inactive)
            {
                let expandable = map.segment_at(e.addr).is_some_and(|(_, s)| s.expandable);
                ev.pool = map.segment_at(e.addr).map_or(ev.pool, |(_, s)| s.pool);
                if b.size >= rounded
                    && !should_split(ev.pool, expandable, b.size - rounded, rounded, config)
                {
                    ev.block_size = b.size;
                }
            }
        }
        EntryAction::FreeRequested | EntryAction::FreeCompleted => {
            ev.action = if e.action == EntryAction::FreeRequested {
                Action::FreeRequested
            } else {
                Action::FreeCompleted
            };
            if let Some(b) = map.blocks.get(&e.addr) {
                ev.block_size = b.size;
            }
            ev.pool = map.segment_at(e.addr).map_or(Pool::Large, |(_, s)| s.pool);
            ev.tag = map.blocks.get(&e.addr).map_or(tag, |b| b.tag);
        }
        EntryAction::Segment(action) => {
            ev.action = action;
            ev.pool = segment_pool(action, e.size, map, e.addr);
        }
        EntryAction::Oom => {
            ev.addr = 0;
            ev.device_free = device_free;
        }
        EntryAction::Other => return None,
    }
    Some(ev)
}

/// allocator.md §4.1 `should_split`.
fn should_split(
    pool: Pool,
    expandable: bool,
    remaining: u64,
    size: u64,
    config: &AllocConfig,
) -> bool {
    if pool == Pool::Small || expandable {
        remaining >= MIN_BLOCK_SIZE
    } else {
        size < config.max_split_size && remaining > SMALL_SIZE
    }
}

/// Trace entries carry no pool: small-pool segments are exactly one small
/// buffer (§2.4), small expandable pages are not multiples of the large page.
fn segment_pool(action: Action, size: u64, map: &MemoryMap, addr: u64) -> Pool {
    if let Some((_, s)) = map.segment_at(addr) {
        return s.pool;
    }
    match action {
        Action::SegmentMap | Action::SegmentUnmap if !size.is_multiple_of(LARGE_BUFFER) => {
            Pool::Small
        }
        Action::SegmentAlloc | Action::SegmentFree if size == SMALL_BUFFER => Pool::Small,
        _ => Pool::Large,
    }
}

/// The recorded final state of `device` as a map (state-only snapshots).
pub fn final_map(snap: &Snapshot, device: usize) -> MemoryMap {
    let mut map = MemoryMap::default();
    for s in snap.segments.iter().filter(|s| s.device == device as i64) {
        let pool = match s.segment_type {
            PoolKind::Small => Pool::Small,
            PoolKind::Large => Pool::Large,
        };
        map.segments.insert(
            s.address,
            MapSegment {
                size: s.total_size,
                pool,
                stream: s.stream,
                expandable: s.is_expandable,
                tag: Tag::NONE,
            },
        );
        map.reserved += s.total_size;
        for b in &s.blocks {
            map.blocks.insert(
                b.address,
                MapBlock {
                    size: b.size,
                    requested: b.requested_size,
                    state: b.state,
                    tag: Tag::NONE,
                },
            );
            if b.state == BlockState::ActiveAllocated {
                map.allocated += b.size;
            }
            if b.state != BlockState::Inactive {
                map.active += b.size;
            }
        }
    }
    map
}

/// Frames of the trace entry behind each tag, resolved to text up front
/// (the snapshot's strings are not shareable across threads).
struct SnapshotTags {
    /// Per distinct stack: the first user frame's name, and the frames.
    stacks: HashMap<FramesId, (Option<String>, Vec<String>)>,
    entry_frames: Vec<FramesId>,
}

impl SnapshotTags {
    fn new(table: &FrameTable, entry_frames: Vec<FramesId>) -> SnapshotTags {
        let mut stacks = HashMap::new();
        for id in &entry_frames {
            stacks.entry(*id).or_insert_with(|| {
                let frames = table
                    .resolve(*id)
                    .take(MAX_FRAMES)
                    .map(|f| format!("{}:{} {}", f.filename, f.line, f.name))
                    .collect();
                (
                    table.first_user_frame(*id).map(|f| f.name.to_string()),
                    frames,
                )
            });
        }
        SnapshotTags {
            stacks,
            entry_frames,
        }
    }
}

impl TagInfo for SnapshotTags {
    fn describe(&self, tag: Tag) -> Option<TagDescription> {
        let index = usize::try_from(tag.0).ok()?.checked_sub(1)?;
        let id = self.entry_frames.get(index)?;
        let (op, frames) = self.stacks.get(id)?;
        Some(TagDescription {
            op: op.clone(),
            frames: frames.clone(),
            ..TagDescription::default()
        })
    }
}
