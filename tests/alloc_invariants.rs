//! Property tests over long random request sequences (allocator.md §15).

use std::collections::BTreeMap;

use proptest::prelude::*;
use vramscope::alloc::{AllocConfig, BlockState, CachingAllocator, Family, Level, Pool, Tag};
use vramscope::device::{Device, SimDevice};

#[derive(Debug, Clone)]
enum Op {
    Malloc { size: u64, stream: u64 },
    Free(usize),
    RecordStreamAndFree(usize),
    CompleteStream,
    EmptyCache,
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![
        4 => 1u64..4096,
        4 => 4096u64..1_048_577,
        3 => 1_048_577u64..12_000_000,
        1 => 12_000_000u64..80_000_000,
    ];
    prop_oneof![
        8 => (size, prop_oneof![5 => Just(0u64), 1 => Just(7u64)]).prop_map(|(size, stream)| Op::Malloc { size, stream }),
        6 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::RecordStreamAndFree),
        1 => Just(Op::CompleteStream),
        1 => Just(Op::EmptyCache),
    ]
}

const CONFIGS: [&str; 6] = [
    "",
    "max_split_size_mb:40",
    "expandable_segments:True",
    "roundup_power2_divisions:4",
    "garbage_collection_threshold:0.6",
    "max_split_size_mb:64,roundup_power2_divisions:[1:2,64:4,>:8]",
];

/// Recount every stat from the segments and compare with `memory_stats()`.
fn check_invariants(
    a: &CachingAllocator<SimDevice>,
    live: &BTreeMap<u64, u64>,
) -> Result<(), TestCaseError> {
    let snap = a.snapshot();
    let mut recount: BTreeMap<(&str, Level), i64> = BTreeMap::new();
    let mut add = |k: &'static str, pool: Pool, v: i64| {
        *recount.entry((k, Level::All)).or_default() += v;
        *recount.entry((k, Level::of(pool))).or_default() += v;
    };
    let mut last_end = 0u64;
    for seg in &snap {
        prop_assert!(seg.address >= last_end, "segments overlap");
        last_end = seg.address + seg.total_size;
        let mut at = seg.address;
        let mut prev_free = false;
        let split = seg.blocks.len() > 1;
        for b in &seg.blocks {
            prop_assert_eq!(b.address, at, "blocks tile the segment");
            prop_assert!(b.size > 0 && b.size % 512 == 0);
            at += b.size;
            let free = b.state == BlockState::Inactive;
            prop_assert!(
                !(free && prev_free),
                "two adjacent free blocks at {:#x}",
                b.address
            );
            prev_free = free;
            match b.state {
                BlockState::ActiveAllocated => {
                    add("allocation", seg.pool, 1);
                    add("allocated_bytes", seg.pool, b.size as i64);
                }
                BlockState::ActivePendingFree => {}
                BlockState::Inactive => {
                    add("free_bytes", seg.pool, b.size as i64);
                    if split && !seg.is_expandable {
                        add("inactive_split", seg.pool, 1);
                        add("inactive_split_bytes", seg.pool, b.size as i64);
                    }
                }
            }
            if b.state != BlockState::Inactive {
                add("active", seg.pool, 1);
                add("active_bytes", seg.pool, b.size as i64);
                add("requested_bytes", seg.pool, b.requested_size as i64);
            }
        }
        prop_assert_eq!(
            at,
            seg.address + seg.total_size,
            "blocks sum to the segment size"
        );
        add("reserved_bytes", seg.pool, seg.total_size as i64);
        if !seg.is_expandable {
            add("segment", seg.pool, 1);
            let expect = if seg.pool == Pool::Small { 2 << 20 } else { 0 };
            if expect > 0 {
                prop_assert_eq!(seg.total_size, expect);
            } else {
                prop_assert!(seg.total_size % (2 << 20) == 0 && seg.total_size >= 10 << 20);
            }
        }
    }
    let s = a.stats();
    for (family, key) in [
        (Family::Allocation, "allocation"),
        (Family::AllocatedBytes, "allocated_bytes"),
        (Family::Active, "active"),
        (Family::ActiveBytes, "active_bytes"),
        (Family::RequestedBytes, "requested_bytes"),
        (Family::ReservedBytes, "reserved_bytes"),
        (Family::Segment, "segment"),
        (Family::InactiveSplit, "inactive_split"),
        (Family::InactiveSplitBytes, "inactive_split_bytes"),
    ] {
        for level in Level::ALL {
            let want = recount.get(&(key, level)).copied().unwrap_or(0);
            prop_assert_eq!(s.get(family, level).current, want, "{} {:?}", key, level);
        }
    }
    let free = recount
        .get(&("free_bytes", Level::All))
        .copied()
        .unwrap_or(0);
    prop_assert_eq!(
        s.get(Family::ReservedBytes, Level::All).current,
        s.get(Family::ActiveBytes, Level::All).current + free,
        "reserved = active (allocated + pending) + cached free"
    );
    prop_assert_eq!(a.device().used(), a.reserved_total());
    prop_assert_eq!(
        a.reserved_total() as i64,
        s.get(Family::ReservedBytes, Level::All).current
    );
    // Live allocations never overlap: no block is handed out twice.
    let mut end = 0u64;
    for (&addr, &size) in live {
        prop_assert!(addr >= end, "block {:#x} handed out twice", addr);
        end = addr + size;
    }
    Ok(())
}

fn run(conf: &str, ops: &[Op], check_every: usize) -> Result<(), TestCaseError> {
    let device = SimDevice::new("sim", 2 << 30, 0);
    let mut a = CachingAllocator::new(device, AllocConfig::parse(conf).expect("valid conf"));
    if conf.contains("garbage") {
        a.set_memory_fraction(0.8);
    }
    a.set_recording(false);
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    let mut order: Vec<u64> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Malloc { size, stream } => match a.malloc(size, stream, Tag(i as u64)) {
                Ok(addr) => {
                    prop_assert!(!live.contains_key(&addr), "address handed out twice");
                    live.insert(addr, size);
                    order.push(addr);
                }
                Err(e) => prop_assert!(e.oom().is_some(), "only OOM may fail: {}", e),
            },
            Op::Free(k) | Op::RecordStreamAndFree(k) if !order.is_empty() => {
                let addr = order.swap_remove(k % order.len());
                live.remove(&addr);
                if matches!(op, Op::RecordStreamAndFree(_)) {
                    a.record_stream(addr, 7).expect("live block");
                }
                a.free(addr).expect("live block");
                prop_assert!(a.free(addr).is_err(), "a double free is refused");
            }
            Op::Free(_) | Op::RecordStreamAndFree(_) => {}
            Op::CompleteStream => a.complete_stream(7),
            Op::EmptyCache => a.empty_cache(),
        }
        if i % check_every == 0 {
            check_invariants(&a, &live)?;
        }
    }
    check_invariants(&a, &live)?;
    // Freeing everything and emptying the cache gives every byte back.
    for addr in order {
        a.free(addr).expect("live block");
    }
    a.empty_cache();
    prop_assert_eq!(a.stats().reserved_bytes(), 0);
    prop_assert!(a.snapshot().is_empty());
    prop_assert_eq!(a.device().mem_get_info().0, 2 << 30);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_for_every_config(conf in 0usize..CONFIGS.len(), ops in prop::collection::vec(op(), 1..600)) {
        run(CONFIGS[conf], &ops, 7)?;
    }
}

#[test]
fn long_sequence_every_config() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let ops = prop::collection::vec(op(), 6000)
        .new_tree(&mut runner)
        .expect("tree")
        .current();
    for conf in CONFIGS {
        if let Err(e) = run(conf, &ops, 97) {
            panic!("{conf}: {e}");
        }
    }
}

#[test]
fn bad_input_is_a_typed_error_and_state_stays_consistent() {
    let mut a = CachingAllocator::new(SimDevice::new("sim", 1 << 30, 0), AllocConfig::default());
    assert_eq!(
        a.malloc(0, 0, Tag::NONE).expect_err("zero"),
        vramscope::alloc::AllocError::ZeroSize
    );
    let huge = a.malloc(1 << 61, 0, Tag::NONE).expect_err("absurd");
    assert_eq!(
        huge.to_string(),
        "CUDA out of memory. Tried to allocate more than 1EB memory."
    );
    assert!(a.malloc(u64::MAX, 0, Tag::NONE).is_err());
    let p = a.malloc(4096, 0, Tag::NONE).expect("malloc");
    assert!(matches!(
        a.free(p + 512),
        Err(vramscope::alloc::AllocError::UnknownAddress { .. })
    ));
    a.free(p).expect("free");
    assert!(matches!(
        a.free(p),
        Err(vramscope::alloc::AllocError::DoubleFree { .. })
    ));
    assert!(matches!(
        a.free(0xdead),
        Err(vramscope::alloc::AllocError::UnknownAddress { .. })
    ));
    let big = a
        .malloc(2 << 30, 0, Tag::NONE)
        .expect_err("bigger than the device");
    assert!(big.oom().is_some());
    assert_eq!(a.stats().num_ooms, 1);
    check_invariants(&a, &BTreeMap::new()).expect("consistent");
    assert_eq!(a.stats().allocated_bytes(), 0);
}
