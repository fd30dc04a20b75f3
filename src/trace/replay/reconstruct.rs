//! The allocator state at a trace's first entry, for open traces (recording
//! started late or the ring buffer wrapped): what the first entry that
//! touches each address says of it (a release says it existed before the
//! trace, an allocation that it did not), the final segments for addresses
//! the trace never touches, then what the trace cannot say filled in.
//!
//! The trace is read forward, once, entry by entry ([`StartTracker`]), so
//! the start is known as soon as the last entry has been read, without
//! keeping the entries: a view reads a large file in one pass.
//!
//! Exact: which segments existed, which allocations were live and — for those
//! still live at the end — their block sizes. Estimated: the block size of an
//! allocation made before the trace and freed during it (rounded by the
//! allocator's rules, and widened over a remainder too small to split off).

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::alloc::constants::{SMALL_BUFFER, SMALL_SIZE};
use crate::alloc::{
    round_size, should_split, Action, AdoptBlock, AllocConfig, BlockState, Pool, Tag,
};

use super::{Entry, FinalSegment};

/// A segment to adopt before replaying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialSegment {
    pub addr: u64,
    pub pool: Pool,
    pub stream: u64,
    pub blocks: Vec<AdoptBlock>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconstruction {
    pub segments: Vec<InitialSegment>,
    /// Allocations whose block size had to be estimated.
    pub estimated_blocks: usize,
    /// Why parts of the state could not be placed, in words.
    pub notes: Vec<String>,
    /// The trace uses expandable segments, whose reservations cannot be rebuilt.
    pub expandable: bool,
}

impl Reconstruction {
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }
}

#[derive(Debug, Clone, Copy)]
struct Live {
    size: Option<u64>,
    requested: u64,
    state: BlockState,
}

/// What the entries read so far say of one block address, by its first entry.
#[derive(Debug, Clone, Copy)]
enum First {
    /// First allocated in the trace: not live at the start.
    Allocated,
    /// First freed (or its free completed): live at the start.
    Live(Live),
    /// Only `free_requested` so far, the latest of that run asking for
    /// `requested` bytes: live at the start, the next other entry (or the
    /// final state) says what it held.
    Requested { requested: u64 },
}

/// The state before a trace's first entry, from its entries read in order
/// (any number of [`StartTracker::push`] calls), then
/// [`StartTracker::finish`] with the final segments.
#[derive(Debug, Clone, Default)]
pub struct StartTracker {
    expandable: bool,
    /// Segment address → its first segment entry: a release (the segment
    /// existed before the trace: its size and stream), or `None` for an
    /// allocation.
    segments: FxHashMap<u64, Option<(u64, u64)>>,
    blocks: FxHashMap<u64, First>,
    /// Block entries are recorded only at these addresses (see
    /// [`StartTracker::watching`]); `None`: at every address.
    watch: Option<FxHashSet<u64>>,
    /// An entry so far said memory was in use before the trace began.
    older: bool,
}

impl StartTracker {
    pub fn new() -> StartTracker {
        StartTracker::default()
    }

    /// A tracker that records block entries only at the addresses of the
    /// final state's live blocks (`finals`): enough for a trace in which
    /// every free finds the block an earlier entry allocated at its address
    /// (as a map that took every entry without a misfit shows), where
    /// every other address is first allocated. Every segment entry is
    /// recorded. Much cheaper on a long trace: the set is small.
    pub fn watching(finals: &[FinalSegment]) -> StartTracker {
        StartTracker {
            watch: Some(
                finals
                    .iter()
                    .filter(|s| !s.is_expandable)
                    .flat_map(|s| s.blocks.iter())
                    .filter(|b| b.state.is_active())
                    .map(|b| b.address)
                    .collect(),
            ),
            ..StartTracker::default()
        }
    }

    /// The next entry of the trace.
    pub fn push(&mut self, e: &Entry) {
        use std::collections::hash_map::Entry as Slot;
        if matches!(
            e.action,
            Action::Alloc | Action::FreeRequested | Action::FreeCompleted
        ) && self.watch.as_ref().is_some_and(|w| !w.contains(&e.addr))
        {
            return;
        }
        match e.action {
            Action::SegmentMap | Action::SegmentUnmap => self.expandable = true,
            Action::SegmentAlloc => {
                self.segments.entry(e.addr).or_insert(None);
            }
            Action::SegmentFree => {
                let first = self
                    .segments
                    .entry(e.addr)
                    .or_insert(Some((e.size, e.stream)));
                self.older |= first.is_some();
            }
            Action::Alloc => match self.blocks.entry(e.addr) {
                Slot::Vacant(v) => {
                    v.insert(First::Allocated);
                }
                Slot::Occupied(mut o) => {
                    if let First::Requested { requested } = *o.get() {
                        o.insert(First::Live(Live {
                            size: None,
                            requested,
                            state: BlockState::ActiveAllocated,
                        }));
                    }
                }
            },
            Action::FreeCompleted => match self.blocks.entry(e.addr) {
                Slot::Vacant(v) => {
                    self.older = true;
                    v.insert(First::Live(Live {
                        size: None,
                        requested: e.size,
                        state: BlockState::ActivePendingFree,
                    }));
                }
                Slot::Occupied(mut o) => {
                    if let First::Requested { .. } = o.get() {
                        o.insert(First::Live(Live {
                            size: None,
                            requested: e.size,
                            state: BlockState::ActiveAllocated,
                        }));
                    }
                }
            },
            Action::FreeRequested => match self.blocks.entry(e.addr) {
                Slot::Vacant(v) => {
                    self.older = true;
                    v.insert(First::Requested { requested: e.size });
                }
                Slot::Occupied(mut o) => {
                    if let First::Requested { .. } = o.get() {
                        o.insert(First::Requested { requested: e.size });
                    }
                }
            },
            _ => {}
        }
    }

    /// Whether an entry so far showed memory in use before the trace began:
    /// the release of a segment, or the free of a block, that no earlier
    /// entry made. (Memory that no entry touches shows only at the end.)
    pub fn saw_older(&self) -> bool {
        self.older
    }

    /// Whether every segment the entries so far touched was first made in
    /// the trace, and every final segment was: the trace started with
    /// nothing reserved (the start state is empty). Exact once every entry
    /// has been pushed.
    pub fn starts_empty(&self, finals: &[FinalSegment]) -> bool {
        self.segments.values().all(Option::is_none)
            && finals
                .iter()
                .filter(|s| !s.is_expandable)
                .all(|s| self.segments.contains_key(&s.address))
    }

    /// The state the first entry found, once every entry has been pushed.
    pub fn finish(self, finals: &[FinalSegment], config: &AllocConfig) -> Reconstruction {
        let out = Reconstruction {
            expandable: self.expandable || finals.iter().any(|s| s.is_expandable),
            ..Reconstruction::default()
        };
        let mut segs: BTreeMap<u64, (u64, u64)> = finals
            .iter()
            .filter(|s| !s.is_expandable && !self.segments.contains_key(&s.address))
            .map(|s| (s.address, (s.total_size, s.stream)))
            .collect();
        segs.extend(
            self.segments
                .iter()
                .filter_map(|(&addr, first)| first.map(|f| (addr, f))),
        );
        let final_live: FxHashMap<u64, Live> = finals
            .iter()
            .filter(|s| !s.is_expandable)
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state.is_active())
            .map(|b| {
                (
                    b.address,
                    Live {
                        size: Some(b.size),
                        requested: b.requested_size,
                        state: b.state,
                    },
                )
            })
            .collect();
        let mut live: BTreeMap<u64, Live> = final_live
            .iter()
            .filter(|(addr, _)| !self.blocks.contains_key(addr))
            .map(|(&a, &l)| (a, l))
            .collect();
        for (&addr, first) in &self.blocks {
            match *first {
                First::Allocated => {}
                First::Live(l) => {
                    live.insert(addr, l);
                }
                First::Requested { requested } => {
                    let held = match final_live.get(&addr) {
                        Some(f) => Live {
                            state: BlockState::ActiveAllocated,
                            ..*f
                        },
                        None => Live {
                            size: None,
                            requested,
                            state: BlockState::ActiveAllocated,
                        },
                    };
                    live.insert(addr, held);
                }
            }
        }
        place(segs, live, config, out)
    }
}

/// The state at the first of `entries` (see the module doc).
pub fn initial_state(
    entries: impl IntoIterator<Item = Entry>,
    finals: &[FinalSegment],
    config: &AllocConfig,
) -> Reconstruction {
    let mut tracker = StartTracker::new();
    for e in entries {
        tracker.push(&e);
    }
    tracker.finish(finals, config)
}

/// The live blocks tiled into the segments they lie in.
fn place(
    segs: BTreeMap<u64, (u64, u64)>,
    live: BTreeMap<u64, Live>,
    config: &AllocConfig,
    mut out: Reconstruction,
) -> Reconstruction {
    for (&addr, &(size, stream)) in &segs {
        let inside: Vec<(u64, Live)> = live
            .range(addr..addr + size)
            .map(|(a, l)| (*a, *l))
            .collect();
        let pool = if size == SMALL_BUFFER && inside.iter().all(|(_, l)| l.requested <= SMALL_SIZE)
        {
            Pool::Small
        } else {
            Pool::Large
        };
        let blocks = tile(addr, size, pool, &inside, config, &mut out);
        out.segments.push(InitialSegment {
            addr,
            pool,
            stream,
            blocks,
        });
    }
    let placed: usize = out
        .segments
        .iter()
        .map(|s| s.blocks.iter().filter(|b| b.state.is_active()).count())
        .sum();
    if placed < live.len() {
        out.notes.push(format!(
            "{} allocations live at the start lie outside every known segment",
            live.len() - placed
        ));
    }
    out
}

/// Live blocks of one segment with free gaps between them.
fn tile(
    addr: u64,
    size: u64,
    pool: Pool,
    inside: &[(u64, Live)],
    config: &AllocConfig,
    out: &mut Reconstruction,
) -> Vec<AdoptBlock> {
    let end = addr + size;
    let mut blocks = Vec::new();
    let mut at = addr;
    for (k, &(a, l)) in inside.iter().enumerate() {
        if a < at {
            out.notes
                .push(format!("allocation {a:#x} overlaps the one before it"));
            continue;
        }
        if a > at {
            blocks.push(free(a - at));
        }
        let next = inside.get(k + 1).map_or(end, |(n, _)| *n);
        let block = l.size.unwrap_or_else(|| {
            out.estimated_blocks += 1;
            estimate(l.requested, next - a, pool, config)
        });
        let block = block.min(next - a);
        blocks.push(AdoptBlock {
            size: block,
            requested: l.requested,
            state: l.state,
            tag: Tag::NONE,
        });
        at = a + block;
    }
    if at < end {
        blocks.push(free(end - at));
    }
    blocks
}

/// §4.1: a block takes its whole remainder when that is too small to split off.
fn estimate(requested: u64, room: u64, pool: Pool, config: &AllocConfig) -> u64 {
    let rounded = round_size(requested, config);
    let remainder = room.saturating_sub(rounded);
    if should_split(pool, false, remainder, rounded, config) {
        rounded
    } else {
        room
    }
}

fn free(size: u64) -> AdoptBlock {
    AdoptBlock {
        size,
        requested: 0,
        state: BlockState::Inactive,
        tag: Tag::NONE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::replay::FinalBlock;
    use proptest::prelude::*;

    /// The start as it was first rebuilt: the trace undone backwards from
    /// the final state (the last write for an address is its earliest
    /// entry). Kept here as an independent statement of the rule.
    fn undone_backwards(
        entries: &[Entry],
        finals: &[FinalSegment],
        config: &AllocConfig,
    ) -> Reconstruction {
        let out = Reconstruction {
            expandable: finals.iter().any(|s| s.is_expandable)
                || entries
                    .iter()
                    .any(|e| matches!(e.action, Action::SegmentMap | Action::SegmentUnmap)),
            ..Reconstruction::default()
        };
        let mut segs: BTreeMap<u64, (u64, u64)> = finals
            .iter()
            .filter(|s| !s.is_expandable)
            .map(|s| (s.address, (s.total_size, s.stream)))
            .collect();
        let mut live: BTreeMap<u64, Live> = finals
            .iter()
            .filter(|s| !s.is_expandable)
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state.is_active())
            .map(|b| {
                let l = Live {
                    size: Some(b.size),
                    requested: b.requested_size,
                    state: b.state,
                };
                (b.address, l)
            })
            .collect();
        for e in entries.iter().rev() {
            let freed = |state| Live {
                size: None,
                requested: e.size,
                state,
            };
            match e.action {
                Action::SegmentAlloc => {
                    segs.remove(&e.addr);
                }
                Action::SegmentFree => {
                    segs.insert(e.addr, (e.size, e.stream));
                }
                Action::Alloc => {
                    live.remove(&e.addr);
                }
                Action::FreeCompleted => {
                    live.insert(e.addr, freed(BlockState::ActivePendingFree));
                }
                Action::FreeRequested => {
                    live.entry(e.addr)
                        .and_modify(|l| l.state = BlockState::ActiveAllocated)
                        .or_insert(freed(BlockState::ActiveAllocated));
                }
                _ => {}
            }
        }
        place(segs, live, config, out)
    }

    const MIB: u64 = 1 << 20;

    fn entry(action: Action, addr: u64, size: u64) -> Entry {
        Entry {
            action,
            addr,
            size,
            stream: 0,
            in_empty_cache: false,
            before_kernels: false,
        }
    }

    /// Entries over two segment addresses and a few block addresses inside
    /// them, in any order (consistent or not: both readings must agree on
    /// anything a file holds).
    fn arb_entries() -> impl Strategy<Value = Vec<Entry>> {
        let action = prop::sample::select(vec![
            Action::SegmentAlloc,
            Action::SegmentFree,
            Action::Alloc,
            Action::FreeRequested,
            Action::FreeCompleted,
            Action::Snapshot,
        ]);
        prop::collection::vec((action, 0u64..2, 0u64..6, 1u64..(3 * MIB)), 0..40).prop_map(|v| {
            v.into_iter()
                .map(|(action, seg, block, size)| match action {
                    Action::SegmentAlloc | Action::SegmentFree => {
                        entry(action, 0x1000_0000 + seg * 20 * MIB, 20 * MIB)
                    }
                    _ => entry(action, 0x1000_0000 + seg * 20 * MIB + block * 3 * MIB, size),
                })
                .collect()
        })
    }

    /// A final state holding segment 0 (and maybe 1), with some of the
    /// block addresses live.
    fn arb_finals() -> impl Strategy<Value = Vec<FinalSegment>> {
        (any::<bool>(), prop::collection::vec(any::<bool>(), 6)).prop_map(|(two, live)| {
            (0..if two { 2 } else { 1 })
                .map(|seg: u64| {
                    let base = 0x1000_0000 + seg * 20 * MIB;
                    let blocks = (0..6u64)
                        .filter(|b| live[*b as usize])
                        .map(|b| FinalBlock {
                            address: base + b * 3 * MIB,
                            size: 2 * MIB,
                            requested_size: 2 * MIB - 7,
                            state: BlockState::ActiveAllocated,
                        })
                        .collect();
                    FinalSegment {
                        address: base,
                        total_size: 20 * MIB,
                        stream: 0,
                        is_expandable: false,
                        blocks,
                    }
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn read_forward_the_start_is_the_one_the_trace_undone_backwards_gives(
            entries in arb_entries(),
            finals in arb_finals(),
        ) {
            let config = AllocConfig::default();
            let forward = initial_state(entries.iter().copied(), &finals, &config);
            prop_assert_eq!(&forward, &undone_backwards(&entries, &finals, &config));
            // Fed in pieces, the tracker says the same.
            let mut t = StartTracker::new();
            for chunk in entries.chunks(3) {
                chunk.iter().for_each(|e| t.push(e));
            }
            let empty = t.starts_empty(&finals);
            prop_assert_eq!(t.finish(&finals, &config), forward.clone());
            prop_assert_eq!(empty, forward.segments.is_empty());
        }
    }

    /// A trace whose every free finds the block an earlier entry allocated
    /// at its address: `n` allocations over a few addresses, each freed
    /// (requested, completed) before its address is used again, some left.
    fn arb_consistent() -> impl Strategy<Value = Vec<Entry>> {
        prop::collection::vec((0u64..6, 1u64..(3 * MIB), any::<bool>()), 0..40).prop_map(|v| {
            let mut live = [false; 6];
            let mut out = vec![entry(Action::SegmentAlloc, 0x1000_0000, 20 * MIB)];
            for (block, size, free) in v {
                let addr = 0x1000_0000 + block * 3 * MIB;
                if live[block as usize] {
                    if free {
                        out.push(entry(Action::FreeRequested, addr, size));
                        out.push(entry(Action::FreeCompleted, addr, size));
                        live[block as usize] = false;
                    }
                } else {
                    out.push(entry(Action::Alloc, addr, size));
                    live[block as usize] = true;
                }
            }
            out
        })
    }

    proptest! {
        #[test]
        fn watching_the_final_blocks_is_enough_when_every_free_finds_its_block(
            entries in arb_consistent(),
            finals in arb_finals(),
        ) {
            let config = AllocConfig::default();
            let mut light = StartTracker::watching(&finals);
            entries.iter().for_each(|e| light.push(e));
            prop_assert_eq!(
                light.finish(&finals, &config),
                initial_state(entries.iter().copied(), &finals, &config)
            );
        }
    }

    #[test]
    fn a_closed_trace_starts_empty_and_an_untouched_final_segment_does_not() {
        let seg = 0x2000_0000;
        let finals = vec![FinalSegment {
            address: seg,
            total_size: 20 * MIB,
            stream: 0,
            is_expandable: false,
            blocks: vec![FinalBlock {
                address: seg,
                size: 2 * MIB,
                requested_size: 2 * MIB,
                state: BlockState::ActiveAllocated,
            }],
        }];
        let mut t = StartTracker::new();
        assert!(
            !t.starts_empty(&finals),
            "the final segment is not made in the trace yet"
        );
        t.push(&entry(Action::SegmentAlloc, seg, 20 * MIB));
        t.push(&entry(Action::Alloc, seg, 2 * MIB));
        assert!(t.starts_empty(&finals));
        assert!(t.finish(&finals, &AllocConfig::default()).is_empty());
        // A release of a segment the trace never made: it was there before.
        let mut t = StartTracker::new();
        t.push(&entry(Action::SegmentAlloc, seg, 20 * MIB));
        t.push(&entry(Action::SegmentFree, seg + 40 * MIB, 2 * MIB));
        assert!(!t.starts_empty(&finals));
        let start = t.finish(&finals, &AllocConfig::default());
        assert_eq!(
            start.segments.iter().map(|s| s.addr).collect::<Vec<_>>(),
            vec![seg + 40 * MIB]
        );
    }
}
