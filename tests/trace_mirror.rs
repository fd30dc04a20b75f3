//! The map rebuilt from trace events equals the allocator's own snapshot, and
//! seeking to any event through keyframes gives the same map as replaying from
//! the start.

use proptest::prelude::*;
use vramscope::alloc::{AllocConfig, CachingAllocator, SegmentInfo, Tag};
use vramscope::device::SimDevice;
use vramscope::trace::{Event, MemoryMap, Timeline};

fn same(map: &MemoryMap, snap: &[SegmentInfo]) -> Result<(), TestCaseError> {
    prop_assert_eq!(map.segments.len(), snap.len(), "segment count");
    for seg in snap {
        let m = map.segments.get(&seg.address);
        prop_assert!(m.is_some(), "segment {:#x} missing", seg.address);
        let m = m.expect("checked");
        prop_assert_eq!(m.size, seg.total_size);
        prop_assert_eq!(m.expandable, seg.is_expandable);
        prop_assert_eq!(m.pool, seg.pool);
        let blocks: Vec<_> = map
            .blocks_of(seg.address)
            .map(|(a, b)| (a, b.size, b.state, b.requested))
            .collect();
        let want: Vec<_> = seg
            .blocks
            .iter()
            .map(|b| (b.address, b.size, b.state, b.requested_size))
            .collect();
        prop_assert_eq!(blocks, want, "blocks of {:#x}", seg.address);
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Op {
    Malloc(u64),
    Free(usize),
    Pending(usize),
    Complete,
    EmptyCache,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop_oneof![1u64..600_000, 600_000u64..6_000_000, 6_000_000u64..40_000_000].prop_map(Op::Malloc),
        5 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::Pending),
        1 => Just(Op::Complete),
        1 => Just(Op::EmptyCache),
    ]
}

fn run(conf: &str, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut a = CachingAllocator::new(
        SimDevice::new("sim", 512 << 20, 0),
        AllocConfig::parse(conf).expect("conf"),
    );
    let mut t = Timeline::new();
    let mut live = Vec::new();
    let mut checkpoints = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Malloc(size) => {
                if let Ok(p) = a.malloc(size, 0, Tag(i as u64 + 1)) {
                    live.push(p);
                }
            }
            Op::Free(k) | Op::Pending(k) if !live.is_empty() => {
                let p = live.swap_remove(k % live.len());
                if matches!(op, Op::Pending(_)) {
                    a.record_stream(p, 3).expect("live");
                }
                a.free(p).expect("live");
            }
            Op::Free(_) | Op::Pending(_) => {}
            Op::Complete => a.complete_stream(3),
            Op::EmptyCache => a.empty_cache(),
        }
        t.extend(a.take_events().into_iter().map(Event::Alloc));
        same(t.head(), &a.snapshot())?;
        if !t.is_empty() && i % 5 == 0 {
            checkpoints.push((t.len() - 1, a.snapshot()));
        }
    }
    prop_assert!(
        t.gaps().is_empty(),
        "unplaced entries: {:?}",
        t.gaps().first()
    );
    for (index, snap) in checkpoints {
        same(&t.state_at(Some(index)), &snap)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]
    #[test]
    fn map_from_events_equals_allocator_snapshot(expandable in any::<bool>(), ops in prop::collection::vec(op(), 1..400)) {
        run(if expandable { "expandable_segments:True" } else { "" }, &ops)?;
    }
}

#[test]
fn seeking_across_many_keyframes_is_exact() {
    let mut a = CachingAllocator::new(SimDevice::new("sim", 8 << 30, 0), AllocConfig::default());
    let mut t = Timeline::new();
    let mut live = Vec::new();
    let mut snaps = Vec::new();
    for i in 0..30_000u64 {
        if i % 2 == 1 && !live.is_empty() {
            let k = (i as usize * 7919) % live.len();
            a.free(live.swap_remove(k)).expect("live");
        } else {
            live.push(
                a.malloc(1 + (i * 2_654_435_761) % 3_000_000, 0, Tag(i))
                    .expect("fits"),
            );
        }
        t.extend(a.take_events().into_iter().map(Event::Alloc));
        if i % 4999 == 0 {
            snaps.push((t.len() - 1, a.snapshot()));
        }
    }
    assert!(t.len() > 2 * vramscope::trace::timeline::KEYFRAME_EVERY);
    for (index, snap) in snaps {
        same(&t.state_at(Some(index)), &snap).expect("seek is exact");
    }
    let s = t.range_summary(0, t.len()).expect("non-empty");
    assert_eq!(s.max_allocated, t.peak_allocated());
    assert_eq!(s.max_reserved, t.peak_reserved());
}
