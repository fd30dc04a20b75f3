//! The placing map must give, entry for entry, what [`MemoryMap`] gives:
//! the same events, curve, gaps and keyframes from a mirror, and the same
//! map at the end, on the allocator's own traces and on hostile ones.

use proptest::prelude::*;

use super::*;
use crate::alloc::{AllocConfig, CachingAllocator};
use crate::device::SimDevice;
use crate::trace::mirror::TraceMirror;
use crate::trace::replay::Entry;
use crate::trace::timeline::TimelinePart;

#[derive(Debug, Clone)]
enum Op {
    Malloc {
        size: u64,
        stream: u64,
    },
    Free {
        pick: usize,
    },
    /// A free whose completion waits (a block used on another stream).
    FreeDeferred {
        pick: usize,
    },
    CompleteDeferred {
        pick: usize,
    },
    EmptyCache,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (prop_oneof![1u64..4_096, 4_096u64..1 << 20, 1u64 << 20..40 << 20], 0u64..2)
            .prop_map(|(size, stream)| Op::Malloc { size, stream }),
        4 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => any::<usize>().prop_map(|pick| Op::FreeDeferred { pick }),
        1 => any::<usize>().prop_map(|pick| Op::CompleteDeferred { pick }),
        1 => Just(Op::EmptyCache),
    ]
}

/// The entries the allocator model records for `ops`.
fn allocator_entries(ops: &[Op], expandable: bool) -> Vec<Entry> {
    let config = AllocConfig {
        expandable_segments: expandable,
        ..AllocConfig::default()
    };
    let mut a = CachingAllocator::new(SimDevice::new("sim", 1 << 30, 0), config);
    a.set_recording(true);
    let (mut live, mut deferred) = (Vec::new(), Vec::new());
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Malloc { size, stream } => {
                if let Ok(p) = a.malloc(size, stream, Tag(i as u64 + 1)) {
                    live.push(p);
                }
            }
            Op::Free { pick } if !live.is_empty() => {
                let p = live.swap_remove(pick % live.len());
                a.free(p).expect("live");
            }
            Op::FreeDeferred { pick } if !live.is_empty() => {
                let p = live.swap_remove(pick % live.len());
                a.free_deferred(p).expect("live");
                deferred.push(p);
            }
            Op::CompleteDeferred { pick } if !deferred.is_empty() => {
                let p = deferred.swap_remove(pick % deferred.len());
                // Gone already where an `empty_cache()` waited for it.
                a.complete_deferred(p).ok();
            }
            Op::EmptyCache => a.empty_cache(),
            _ => {}
        }
    }
    a.take_events()
        .iter()
        .map(|e| Entry {
            action: e.action,
            addr: e.addr,
            size: e.size,
            stream: e.stream,
            in_empty_cache: false,
            before_kernels: false,
        })
        .collect()
}

/// Any entry at all: actions at a few addresses, so that they meet.
fn hostile_entry() -> impl Strategy<Value = Entry> {
    let action = prop_oneof![
        Just(Action::Alloc),
        Just(Action::FreeRequested),
        Just(Action::FreeCompleted),
        Just(Action::SegmentAlloc),
        Just(Action::SegmentFree),
        Just(Action::SegmentMap),
        Just(Action::SegmentUnmap),
        Just(Action::Oom),
    ];
    (action, 0u64..64, 0u64..12, 0u64..2).prop_map(|(action, slot, units, stream)| Entry {
        action,
        addr: slot << 20,
        size: units << 20,
        stream,
        in_empty_cache: false,
        before_kernels: false,
    })
}

/// Both mirrors over `entries` from `start`, in parts of `chunk`: every
/// part equal, then both maps.
fn same_placing(start: MemoryMap, entries: &[Entry], chunk: usize) {
    let config = AllocConfig::default();
    let linked = PlacingMap::tiled(start.clone()).expect("a map the rules built tiles");
    let mut tree = TraceMirror::starting_from(start, &config);
    let mut fast = TraceMirror::starting_from(linked, &config);
    let free_at = |i: usize| Some(i as u64);
    for (k, part) in entries.chunks(chunk.max(1)).enumerate() {
        let first = k * chunk.max(1);
        let (mut a, mut b) = (TimelinePart::default(), TimelinePart::default());
        tree.fill_part(first, part, free_at, &mut a);
        fast.fill_part(first, part, free_at, &mut b);
        assert_eq!(a.events, b.events, "events of part {k}");
        assert_eq!(a.samples, b.samples, "curve of part {k}");
        assert_eq!(a.gaps, b.gaps, "gaps of part {k}");
        assert!(a.keyframes == b.keyframes, "keyframes of part {k}");
        assert!(
            tree.map().freeze() == fast.map().freeze(),
            "map after part {k}"
        );
    }
    assert!(tree.into_map() == fast.into_map().into_memory_map());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn places_the_allocators_traces_as_the_memory_map_does(
        ops in prop::collection::vec(op(), 1..400),
        expandable: bool,
        chunk in 1usize..64,
    ) {
        let entries = allocator_entries(&ops, expandable);
        same_placing(MemoryMap::default(), &entries, chunk);
    }

    #[test]
    fn places_any_entries_as_the_memory_map_does(
        entries in prop::collection::vec(hostile_entry(), 1..300),
    ) {
        same_placing(MemoryMap::default(), &entries, 17);
    }

    #[test]
    fn goes_on_from_a_started_map_as_the_memory_map_does(
        before in prop::collection::vec(op(), 1..200),
        after in prop::collection::vec(op(), 1..200),
        expandable: bool,
    ) {
        // The map the first half built is the start the second is placed
        // from (an open trace's rebuilt start is such a map).
        let all: Vec<Op> = before.iter().chain(&after).cloned().collect();
        let entries = allocator_entries(&all, expandable);
        let cut = allocator_entries(&before, expandable).len();
        let config = AllocConfig::default();
        let mut first = TraceMirror::new(&config);
        for (i, e) in entries[..cut].iter().enumerate() {
            first.event(i, e, None);
        }
        same_placing(first.into_map(), &entries[cut..], 31);
    }
}

#[test]
fn a_map_whose_blocks_do_not_tile_its_segments_is_refused() {
    let segment = MapSegment {
        size: 4 << 20,
        pool: Pool::Large,
        stream: 0,
        expandable: false,
        tag: Tag::NONE,
    };
    let block = |size| free_block(size, 0, Pool::Large, false);
    let mut map = MemoryMap::default();
    map.insert_segment(
        0,
        segment.clone(),
        [(0, block(2 << 20)), (2 << 20, block(2 << 20))],
    );
    assert!(PlacingMap::tiled(map.clone()).is_ok());

    let mut gap = MemoryMap::default();
    gap.insert_segment(
        0,
        segment.clone(),
        [(0, block(1 << 20)), (2 << 20, block(2 << 20))],
    );
    assert!(PlacingMap::tiled(gap).is_err(), "a gap between blocks");

    let mut short = MemoryMap::default();
    short.insert_segment(0, segment.clone(), [(0, block(2 << 20))]);
    assert!(
        PlacingMap::tiled(short).is_err(),
        "the segment's end uncovered"
    );

    let mut stray = map;
    stray.blocks.insert(64 << 20, block(1 << 20));
    assert!(PlacingMap::tiled(stray).is_err(), "a block in no segment");
}

#[test]
fn a_free_merges_with_both_neighbours_and_the_walk_stays_in_order() {
    let config = AllocConfig::default();
    let ops: Vec<Op> = [
        Op::Malloc {
            size: 3 << 20,
            stream: 0,
        },
        Op::Malloc {
            size: 3 << 20,
            stream: 0,
        },
        Op::Malloc {
            size: 3 << 20,
            stream: 0,
        },
        Op::Free { pick: 0 },
        Op::Free { pick: 1 },
        Op::Free { pick: 0 },
    ]
    .to_vec();
    let entries = allocator_entries(&ops, false);
    let mut m = TraceMirror::starting_from(PlacingMap::default(), &config);
    for (i, e) in entries.iter().enumerate() {
        m.event(i, e, None);
    }
    let map = m.into_map().into_memory_map();
    // Three 3 MiB blocks carved from one 20 MiB segment, all freed: one
    // free block again.
    assert_eq!(map.segments.len(), 1);
    assert_eq!(map.blocks.len(), 1, "{:?}", map.blocks);
    assert_eq!(map.allocated, 0);
}
