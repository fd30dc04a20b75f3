//! A recorded trace turned into the one event model. PyTorch's trace entries
//! do not record the block a request got, only the request
//! (`AllocEvent::block_size` is ours). The map needs it, so it is rebuilt
//! here from the trace with the allocator's rounding and `should_split` rule
//! (allocator.md §4.1) against the map as it stands before each entry. The
//! recorded trace is mirrored, not replayed: the views show the addresses and
//! segments PyTorch recorded, even where a replay of the model would diverge
//! (`vramscope replay --verify` is where divergences are reported).

use crate::alloc::constants::{LARGE_BUFFER, SMALL_BUFFER};
use crate::alloc::{round_size, should_split, Action, AllocConfig, AllocEvent, Pool, Tag};
use crate::trace::memory_map::{MapError, NO_FREE_BLOCK};
use crate::trace::placing_map::PlaceOn;
use crate::trace::replay::reconstruct::Reconstruction;
use crate::trace::replay::{entry_tag, Entry};
use crate::trace::snapshot::{PoolKind, Segment, Snapshot};
use crate::trace::timeline::{keyframe_due, Sample, TimelinePart};
use crate::trace::{Event, MapBlock, MapSegment, Marker, MemoryMap};

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
/// later entry got. Each entry is placed once: deciding its block and
/// applying it are one pass over the map.
pub struct TraceMirror<'a, M = MemoryMap> {
    map: M,
    config: &'a AllocConfig,
    /// Events placed so far, and the index of the last keyframe.
    placed: usize,
    last_keyframe: Option<usize>,
}

impl<'a> TraceMirror<'a> {
    pub fn new(config: &'a AllocConfig) -> Self {
        Self::starting_from(MemoryMap::default(), config)
    }
}

impl<'a, M: PlaceOn> TraceMirror<'a, M> {
    /// A mirror of a trace that began with `map` already in place (an open
    /// trace: see [`start_map`]).
    pub fn starting_from(map: M, config: &'a AllocConfig) -> Self {
        TraceMirror {
            map,
            config,
            placed: 0,
            last_keyframe: None,
        }
    }

    /// A mirror that goes on where another stopped: `progress` is what
    /// [`TraceMirror::progress`] said of it, so that keyframes stay where a
    /// timeline expects them.
    pub fn resume(map: M, config: &'a AllocConfig, progress: (usize, Option<usize>)) -> Self {
        TraceMirror {
            map,
            config,
            placed: progress.0,
            last_keyframe: progress.1,
        }
    }

    /// Events placed so far, and the event index of the last keyframe.
    pub fn progress(&self) -> (usize, Option<usize>) {
        (self.placed, self.last_keyframe)
    }

    /// The event for entry `i`, applied to the map; `None` for entries the
    /// views do not show.
    pub fn event(&mut self, i: usize, e: &Entry, device_free: Option<u64>) -> Option<Event> {
        self.place(i, e, device_free)
            .map(|(ev, _)| Event::Alloc(ev))
    }

    /// Entries `first..first + entries.len()` of the trace into `part` (its
    /// buffers reused), the next part of its timeline: each placed once, with
    /// the curve after it, what the map could not place, and the keyframes due.
    pub fn fill_part(
        &mut self,
        first: usize,
        entries: &[Entry],
        device_free: impl Fn(usize) -> Option<u64>,
        part: &mut TimelinePart,
    ) {
        part.clear();
        part.events.reserve(entries.len());
        part.samples.reserve(entries.len());
        for (j, e) in entries.iter().enumerate() {
            if !e.action.is_allocator() {
                continue;
            }
            if keyframe_due(self.last_keyframe, self.placed, &self.map) {
                part.keyframes.push((self.placed, self.map.freeze()));
                self.last_keyframe = Some(self.placed);
            }
            let i = first + j;
            let Some((ev, placed)) = self.place(i, e, device_free(i)) else {
                continue;
            };
            if let Err(gap) = placed {
                part.gaps.push((self.placed, gap));
            }
            part.samples.push(Sample {
                allocated: self.map.allocated(),
                reserved: self.map.reserved(),
            });
            part.events.push(Event::Alloc(ev));
            self.placed += 1;
        }
    }

    /// The map as the entries placed so far left it.
    pub fn map(&self) -> &M {
        &self.map
    }

    /// A marker (a live job's step boundary) into `part` after what is
    /// there: an event of the timeline like the entries, with the curve as it stands.
    pub fn push_marker(&mut self, marker: Marker, part: &mut TimelinePart) {
        // A marker may be the timeline's first event (a step before any
        // entry): the state before it is the timeline's first keyframe.
        if keyframe_due(self.last_keyframe, self.placed, &self.map) {
            part.keyframes.push((self.placed, self.map.freeze()));
            self.last_keyframe = Some(self.placed);
        }
        part.samples.push(Sample {
            allocated: self.map.allocated(),
            reserved: self.map.reserved(),
        });
        part.events.push(Event::Marker(marker));
        self.placed += 1;
    }

    /// The map after every entry placed so far.
    pub fn into_map(self) -> M {
        self.map
    }

    /// Entry `i` as an event, decided against the map as it stands and
    /// applied to it; `Err` says why the map could not place it (the event
    /// is shown all the same: a gap in an open trace).
    fn place(
        &mut self,
        i: usize,
        e: &Entry,
        device_free: Option<u64>,
    ) -> Option<(AllocEvent, Result<(), MapError>)> {
        if !e.action.is_allocator() {
            return None;
        }
        let tag = entry_tag(i);
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
        let err = |reason| MapError {
            action: e.action.name(),
            addr: e.addr,
            reason,
        };
        let map = &mut self.map;
        let placed = match e.action {
            Action::Alloc => {
                let config = self.config;
                let rounded = round_size(e.size, config);
                ev.pool = Pool::for_size(rounded);
                ev.block_size = rounded;
                let taken = map.alloc_at(e.addr, e.size, tag, |b| {
                    ev.pool = b.pool;
                    if b.size >= rounded
                        && !should_split(b.pool, b.expandable, b.size - rounded, rounded, config)
                    {
                        ev.block_size = b.size;
                    }
                    ev.block_size
                });
                taken.map(|_| ()).ok_or_else(|| err(NO_FREE_BLOCK))
            }
            Action::FreeRequested | Action::FreeCompleted => {
                let (found, freed) = if e.action == Action::FreeRequested {
                    map.request_free(e.addr)
                } else {
                    map.complete_free(e.addr)
                };
                match found {
                    Some(b) => {
                        ev.block_size = b.size;
                        ev.tag = b.tag;
                        ev.pool = b.pool;
                    }
                    None => {
                        ev.pool = map.segment_pool(e.addr).unwrap_or(Pool::Large);
                    }
                }
                freed.map_err(err)
            }
            Action::Oom => {
                ev.addr = 0;
                ev.device_free = device_free.unwrap_or(0);
                Ok(())
            }
            segment => {
                ev.pool = segment_pool(segment, e.size, map, e.addr);
                map.apply(&ev)
            }
        };
        Some((ev, placed))
    }
}

/// Trace entries carry no pool: small-pool segments are exactly one small
/// buffer (§2.4), small expandable pages are not multiples of the large page.
fn segment_pool(action: Action, size: u64, map: &impl PlaceOn, addr: u64) -> Pool {
    if let Some(pool) = map.segment_pool(addr) {
        return pool;
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
                pool: s.pool,
                expandable: false,
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
    segments_map(snap.segments.iter().filter(|s| s.device == device as i64))
}

/// Recorded segments (one device's) as a map, every block untagged.
pub fn segments_map<'s>(segments: impl Iterator<Item = &'s Segment>) -> MemoryMap {
    let mut map = MemoryMap::default();
    for s in segments {
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
                pool,
                expandable: s.is_expandable,
            };
            (b.address, block)
        });
        map.insert_segment(s.address, segment, blocks);
    }
    map
}
