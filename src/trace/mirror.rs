//! A recorded trace turned into the one event model. PyTorch's trace entries
//! do not record the block a request got, only the request
//! (`AllocEvent::block_size` is ours). The map needs it, so it is rebuilt
//! here from the trace with the allocator's rounding and `should_split` rule
//! (allocator.md §4.1) against the map as it stands before each entry. The
//! recorded trace is mirrored, not replayed: the views show the addresses and
//! segments PyTorch recorded, even where a replay of the model would diverge
//! (`vramscope replay --verify` is where divergences are reported).

use crate::alloc::constants::{LARGE_BUFFER, SMALL_BUFFER};
use crate::alloc::{
    round_size, should_split, Action, AllocConfig, AllocEvent, BlockState, Pool, Tag,
};
use crate::trace::replay::reconstruct::Reconstruction;
use crate::trace::replay::{entry_tag, Entry};
use crate::trace::snapshot::{PoolKind, Snapshot};
use crate::trace::{Event, MapBlock, MapSegment, MemoryMap};

/// Events for one device's trace entries, tagged with [`entry_tag`].
/// `device_free(i)`: the free device memory entry `i` recorded (`oom` entries).
pub fn trace_events(
    entries: &[Entry],
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
pub struct TraceMirror<'a> {
    map: MemoryMap,
    config: &'a AllocConfig,
}

impl<'a> TraceMirror<'a> {
    pub fn new(config: &'a AllocConfig) -> Self {
        Self::starting_from(MemoryMap::default(), config)
    }

    /// A mirror of a trace that began with `map` already in place (an open
    /// trace: see [`start_map`]).
    pub fn starting_from(map: MemoryMap, config: &'a AllocConfig) -> Self {
        TraceMirror { map, config }
    }

    /// The event for entry `i`, applied to the map; `None` for entries the
    /// views do not show.
    pub fn event(&mut self, i: usize, e: &Entry, device_free: Option<u64>) -> Option<Event> {
        let tag = entry_tag(i);
        let ev = entry_event(e, &self.map, self.config, tag, device_free.unwrap_or(0))?;
        // The mirror only decides later block sizes; misplaced entries are
        // reported by the timeline's own gaps.
        let _ = self.map.apply(&ev);
        Some(Event::Alloc(ev))
    }
}

fn entry_event(
    e: &Entry,
    map: &MemoryMap,
    config: &AllocConfig,
    tag: Tag,
    device_free: u64,
) -> Option<AllocEvent> {
    if !e.action.is_allocator() {
        return None;
    }
    let mut ev = AllocEvent {
        action: e.action,
        addr: e.addr,
        size: e.size,
        block_size: e.size,
        stream: e.stream,
        pool: Pool::Large,
        device_free: 0,
        tag,
    };
    match e.action {
        Action::Alloc => {
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
        Action::FreeRequested | Action::FreeCompleted => {
            if let Some(b) = map.blocks.get(&e.addr) {
                ev.block_size = b.size;
            }
            ev.pool = map.segment_at(e.addr).map_or(Pool::Large, |(_, s)| s.pool);
            ev.tag = map.blocks.get(&e.addr).map_or(tag, |b| b.tag);
        }
        Action::Oom => {
            ev.addr = 0;
            ev.device_free = device_free;
        }
        segment => ev.pool = segment_pool(segment, e.size, map, e.addr),
    }
    Some(ev)
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

/// The state an open trace's first entry found (recording started late, or
/// the ring buffer wrapped), as `trace::replay::reconstruct` rebuilds it: the map a view
/// of the trace starts from.
pub fn start_map(r: &Reconstruction) -> MemoryMap {
    let mut map = MemoryMap::default();
    for s in &r.segments {
        let segment = MapSegment {
            size: s.blocks.iter().map(|b| b.size).sum(),
            pool: s.pool,
            stream: s.stream,
            expandable: false,
            tag: Tag::NONE,
        };
        let mut at = s.addr;
        let blocks = s.blocks.iter().map(|b| {
            let block = MapBlock {
                size: b.size,
                requested: b.requested,
                state: b.state,
                tag: b.tag,
            };
            let addr = at;
            at += b.size;
            (addr, block)
        });
        map.insert_segment(s.addr, segment, blocks);
    }
    map
}

/// The recorded final state of `device` as a map (state-only snapshots).
pub fn final_map(snap: &Snapshot, device: usize) -> MemoryMap {
    let mut map = MemoryMap::default();
    for s in snap.segments.iter().filter(|s| s.device == device as i64) {
        let pool = match s.segment_type {
            PoolKind::Small => Pool::Small,
            PoolKind::Large => Pool::Large,
        };
        let segment = MapSegment {
            size: s.total_size,
            pool,
            stream: s.stream,
            expandable: s.is_expandable,
            tag: Tag::NONE,
        };
        let blocks = s.blocks.iter().map(|b| {
            let block = MapBlock {
                size: b.size,
                requested: b.requested_size,
                state: b.state,
                tag: Tag::NONE,
            };
            (b.address, block)
        });
        map.insert_segment(s.address, segment, blocks);
    }
    map
}
