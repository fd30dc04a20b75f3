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
    let mut msgs = Vec::new();
    let mut entry_frames = Vec::new();
    if entries.is_empty() {
        // State-only file: the map is the recorded final state.
        msgs.push(SourceMsg::Start(Box::new(final_map(snap, device))));
    } else {
        let trace = snap
            .device_traces
            .get(device)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        entry_frames = trace.iter().map(|e| e.frames).collect();
        let device_free = |i: usize| trace.get(i).and_then(|e| snap.extra(e).device_free);
        msgs.push(SourceMsg::Events(trace_events(
            &entries,
            device_free,
            &config,
        )));
    }
    msgs.push(SourceMsg::Finished);
    let tags = SnapshotTags::new(&snap.frames, entry_frames);
    let mut source = Source::from_messages(msgs).with_tags(Arc::new(tags));
    source.capacity = capacity;
    Ok(source)
}

/// Events for one device's trace entries; `Tag(i + 1)` names entry `i`.
/// `device_free(i)`: the free device memory entry `i` recorded (`oom` entries).
pub fn trace_events(
    entries: &[crate::trace::replay::Entry],
    device_free: impl Fn(usize) -> Option<u64>,
    config: &AllocConfig,
) -> Vec<Event> {
    let mut map = MemoryMap::default();
    let mut out = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let tag = Tag(i as u64 + 1);
        let Some(ev) = entry_event(e, &map, config, tag, device_free(i).unwrap_or(0)) else {
            continue;
        };
        // The mirror only decides later block sizes; misplaced entries are
        // reported by the timeline's own gaps.
        let _ = map.apply(&ev);
        out.push(Event::Alloc(ev));
    }
    out
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
