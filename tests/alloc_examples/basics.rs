//! allocator.md §16 E1–E10: the default allocator.

use super::*;

#[test]
fn e1_one_byte_request() {
    let mut a = default_alloc();
    let p = m(&mut a, 1);
    assert_eq!(p, BASE);
    let snap = a.snapshot();
    assert_eq!(snap.len(), 1);
    assert_eq!(layout(&snap[0]), vec![(512, true), (2_096_640, false)]);
    assert_eq!(snap[0].blocks[0].requested_size, 1);
    assert_eq!(snap[0].blocks[1].requested_size, 0);
    assert_eq!(
        actions(&a.take_events()),
        vec![
            (Action::SegmentAlloc, BASE, 2_097_152),
            (Action::Alloc, BASE, 1)
        ]
    );
    let s = a.stats();
    for level in [Level::All, Level::Small] {
        assert_eq!(s.get(Family::Allocation, level).current, 1);
        assert_eq!(s.get(Family::AllocatedBytes, level).current, 512);
        assert_eq!(s.get(Family::RequestedBytes, level).current, 1);
        assert_eq!(s.get(Family::ReservedBytes, level).current, 2_097_152);
        assert_eq!(s.get(Family::InactiveSplit, level).current, 1);
        assert_eq!(s.get(Family::InactiveSplitBytes, level).current, 2_096_640);
    }
    assert_eq!(s.get(Family::ReservedBytes, Level::Large).current, 0);
    assert_eq!(s.num_device_alloc, 1);
}

#[test]
fn e2_packing_small_requests() {
    let mut a = default_alloc();
    let ptrs: Vec<u64> = [1000, 3000, 716_800, 1_048_576]
        .iter()
        .map(|&s| m(&mut a, s))
        .collect();
    assert_eq!(
        ptrs,
        vec![BASE, BASE + 0x400, BASE + 0x1000, BASE + 0xB0000]
    );
    let snap = a.snapshot();
    assert_eq!(snap.len(), 1);
    assert_eq!(
        layout(&snap[0]),
        vec![
            (1024, true),
            (3072, true),
            (716_800, true),
            (1_048_576, true),
            (327_680, false)
        ]
    );
    assert_eq!(cur(&a, Family::AllocatedBytes), 1_769_472);
    assert_eq!(cur(&a, Family::RequestedBytes), 1_769_376);
    assert_eq!(cur(&a, Family::InactiveSplit), 1);
    assert_eq!(cur(&a, Family::InactiveSplitBytes), 327_680);
    assert_eq!(cur(&a, Family::ReservedBytes), 2 * MIB as i64);
}

#[test]
fn e3_five_mib_gets_twenty_mib_segment() {
    let mut a = default_alloc();
    m(&mut a, 5 * MIB);
    let snap = a.snapshot();
    assert_eq!(layout(&snap[0]), vec![(5 * MIB, true), (15 * MIB, false)]);
    let seg = &snap[0];
    assert_eq!(
        (
            seg.total_size,
            seg.allocated_size,
            seg.active_size,
            seg.requested_size
        ),
        (20_971_520, 5_242_880, 5_242_880, 5_242_880)
    );
    assert_eq!(seg.blocks[1].address, BASE + 0x500000);
    assert!(!seg.is_expandable);
    assert_eq!(
        a.stats()
            .get(Family::InactiveSplitBytes, Level::Large)
            .current,
        15_728_640
    );
}

#[test]
fn e4_remainder_reuse_then_new_segment() {
    let mut a = default_alloc();
    m(&mut a, 5 * MIB);
    m(&mut a, 6 * MIB);
    m(&mut a, 9 * MIB + 1);
    let snap = a.snapshot();
    assert_eq!(
        layout(&snap[0]),
        vec![(5 * MIB, true), (6 * MIB, true), (9 * MIB, false)]
    );
    assert_eq!(
        layout(&snap[1]),
        vec![(9_437_696, true), (11_533_824, false)]
    );
    assert_eq!(snap[1].blocks[0].requested_size, 9_437_185);
    assert_eq!(cur(&a, Family::Allocation), 3);
    assert_eq!(cur(&a, Family::AllocatedBytes), 20_972_032);
    assert_eq!(cur(&a, Family::RequestedBytes), 20_971_521);
    assert_eq!(cur(&a, Family::Segment), 2);
    assert_eq!(cur(&a, Family::ReservedBytes), 41_943_040);
    assert_eq!(cur(&a, Family::InactiveSplit), 2);
    assert_eq!(cur(&a, Family::InactiveSplitBytes), 20_971_008);
    assert_eq!(a.stats().num_device_alloc, 2);
}

#[test]
fn e4_exact_nine_mib_takes_block_whole() {
    let mut a = default_alloc();
    m(&mut a, 5 * MIB);
    m(&mut a, 6 * MIB);
    m(&mut a, 9 * MIB);
    assert_eq!(a.snapshot().len(), 1);
    assert_eq!(cur(&a, Family::InactiveSplit), 0);
}

#[test]
fn e5_requests_of_ten_mib_and_more() {
    let mut a = default_alloc();
    m(&mut a, 10 * MIB);
    m(&mut a, 25_000_001);
    let snap = a.snapshot();
    assert_eq!(layout(&snap[0]), vec![(10 * MIB, true)]);
    assert_eq!(layout(&snap[1]), vec![(25_165_824, true)]);
    assert_eq!(cur(&a, Family::AllocatedBytes), 35_651_584);
    assert_eq!(cur(&a, Family::RequestedBytes), 35_485_761);
    assert_eq!(cur(&a, Family::ReservedBytes), 35_651_584);
    assert_eq!(cur(&a, Family::InactiveSplit), 0);
}

#[test]
fn e6_no_split_at_one_mib_and_stale_requested_size() {
    let mut a = default_alloc();
    let x = m(&mut a, 20_447_232);
    assert_eq!(layout(&a.snapshot()[0]), vec![(20 * MIB, true)]);
    assert_eq!(cur(&a, Family::AllocatedBytes), 20 * MIB as i64);
    a.free(x).expect("free");
    assert_eq!(cur(&a, Family::InactiveSplit), 0);
    let y = m(&mut a, 19 * MIB);
    assert_eq!(cur(&a, Family::AllocatedBytes), 20 * MIB as i64);
    assert_eq!(cur(&a, Family::RequestedBytes), 19_922_944);
    a.free(y).expect("free");
    m(&mut a, 18 * MIB);
    let snap = a.snapshot();
    assert_eq!(layout(&snap[0]), vec![(18 * MIB, true), (2 * MIB, false)]);
    assert_eq!(snap[0].blocks[1].requested_size, 19_922_944);
    assert_eq!(cur(&a, Family::InactiveSplit), 1);
    assert_eq!(cur(&a, Family::InactiveSplitBytes), 2_097_152);
}

#[test]
fn e7_merging_and_inactive_split_bookkeeping() {
    let mut a = default_alloc();
    let p = m(&mut a, 4 * MIB);
    let q = m(&mut a, 4 * MIB);
    let r = m(&mut a, 4 * MIB);
    let split = |a: &CachingAllocator<SimDevice>| {
        (
            cur(a, Family::InactiveSplit),
            cur(a, Family::InactiveSplitBytes) as u64 / MIB,
        )
    };
    assert_eq!(split(&a), (1, 8));
    a.free(q).expect("free");
    assert_eq!(
        layout(&a.snapshot()[0]),
        vec![
            (4 * MIB, true),
            (4 * MIB, false),
            (4 * MIB, true),
            (8 * MIB, false)
        ]
    );
    assert_eq!(split(&a), (2, 12));
    a.free(p).expect("free");
    assert_eq!(
        layout(&a.snapshot()[0]),
        vec![(8 * MIB, false), (4 * MIB, true), (8 * MIB, false)]
    );
    assert_eq!(split(&a), (2, 16));
    a.free(r).expect("free");
    let snap = a.snapshot();
    assert_eq!(layout(&snap[0]), vec![(20 * MIB, false)]);
    assert_eq!(snap[0].blocks[0].requested_size, 4 * MIB);
    assert_eq!(split(&a), (0, 0));
    let s = a.stats();
    assert_eq!(s.get(Family::InactiveSplit, Level::All).allocated, 2);
    assert_eq!(s.get(Family::InactiveSplit, Level::All).freed, 2);
    assert_eq!(
        s.get(Family::InactiveSplitBytes, Level::All).peak,
        16 * MIB as i64
    );
    assert_eq!(cur(&a, Family::ReservedBytes), 20 * MIB as i64);
}

#[test]
fn e8_best_fit_ties_and_one_mib_rule() {
    let mut a = default_alloc();
    let pa = m(&mut a, 10 * MIB);
    let pb = m(&mut a, 10 * MIB);
    m(&mut a, 6 * MIB);
    a.free(pb).expect("free");
    a.free(pa).expect("free");
    let d = m(&mut a, 7 * MIB);
    assert_eq!(d, pa, "ties go to the lowest address");
    let e = m(&mut a, 10 * MIB);
    assert_eq!(e, pb);
    m(&mut a, 13 * MIB);
    let snap = a.snapshot();
    assert_eq!(snap.len(), 3);
    assert_eq!(layout(&snap[0]), vec![(7 * MIB, true), (3 * MIB, false)]);
    assert_eq!(snap[0].blocks[1].requested_size, 10 * MIB);
    assert_eq!(layout(&snap[2]), vec![(6 * MIB, true), (14 * MIB, true)]);
    assert_eq!(cur(&a, Family::AllocatedBytes), 38_797_312);
    assert_eq!(cur(&a, Family::RequestedBytes), 37_748_736);
    assert_eq!(cur(&a, Family::ReservedBytes), 40 * MIB as i64);
    assert_eq!(
        (
            cur(&a, Family::InactiveSplit),
            cur(&a, Family::InactiveSplitBytes)
        ),
        (1, 3 * MIB as i64)
    );
}

#[test]
fn e9_fragmentation_oom_message_and_counters() {
    let (mut a, err) = e9_state();
    let oom = err.oom().expect("an OOM");
    assert_eq!(
        oom.message,
        "CUDA out of memory. Tried to allocate 16.00 MiB. GPU 0 has a total capacity of 100.00 MiB of which 0 bytes is free. Of the allocated memory 40.00 MiB is allocated by PyTorch, and 60.00 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    );
    // PyTorch 2.11 (the H100 captures' release) words the hint as 2.12 does.
    let (_, err) = e9_state_in(TorchVersion(11));
    assert!(
        err.oom().expect("an OOM").message.ends_with("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"),
        "{err}"
    );
    let last = *a.take_events().last().expect("events");
    assert_eq!(
        (last.action, last.device_free, last.size),
        (Action::Oom, 0, 16 * MIB)
    );
    let s = a.stats();
    assert_eq!(
        (s.num_alloc_retries, s.num_ooms, s.num_sync_all_streams),
        (1, 1, 1)
    );
    // Continuing in the same state.
    let e = a
        .malloc(1000, 0, Tag::NONE)
        .expect_err("needs a new small segment");
    assert!(e.to_string().contains("Tried to allocate 2.00 MiB"));
    m(&mut a, 12 * MIB);
    let e = a.malloc(13 * MIB, 0, Tag::NONE).expect_err("OOM");
    let msg = e.to_string();
    assert!(msg.contains("Tried to allocate 14.00 MiB"), "{msg}");
    assert!(
        msg.contains("52.00 MiB is allocated by PyTorch, and 48.00 MiB is reserved"),
        "{msg}"
    );
    let s = a.stats();
    assert_eq!(
        (s.num_alloc_retries, s.num_ooms, s.num_sync_all_streams),
        (3, 3, 3)
    );
}

#[test]
fn e9_memory_summary_text_matches_spec() {
    let (a, _) = e9_state();
    let expected = include_str!("../fixtures/e9_memory_summary.txt");
    assert_eq!(memory_summary(a.stats(), 0, false), expected);
}

#[test]
fn e10_retry_succeeds_by_releasing_cache() {
    let mut a = alloc_with(100 * MIB, "");
    let pa = m(&mut a, 30 * MIB);
    let pb = m(&mut a, 30 * MIB);
    m(&mut a, 30 * MIB);
    a.free(pa).expect("free");
    a.free(pb).expect("free");
    a.take_events();
    let p = m(&mut a, 50 * MIB);
    let s4 = BASE + 90 * MIB;
    assert_eq!(p, s4);
    assert_eq!(
        actions(&a.take_events()),
        vec![
            (Action::SegmentFree, BASE, 31_457_280),
            (Action::SegmentFree, BASE + 30 * MIB, 31_457_280),
            (Action::SegmentAlloc, s4, 52_428_800),
            (Action::Alloc, s4, 52_428_800),
        ]
    );
    let s = a.stats();
    assert_eq!(cur(&a, Family::Segment), 2);
    assert_eq!(cur(&a, Family::ReservedBytes), 80 * MIB as i64);
    assert_eq!(
        (s.num_alloc_retries, s.num_ooms, s.num_sync_all_streams),
        (1, 0, 1)
    );
    assert_eq!((s.num_device_alloc, s.num_device_free), (4, 2));
}
