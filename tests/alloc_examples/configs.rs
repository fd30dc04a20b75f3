//! allocator.md §16 E11–E19: each allocator setting, and streams.

use super::*;

#[test]
fn e11_max_split_size() {
    let mut a = alloc_with(100 * MIB, "max_split_size_mb:40");
    let pa = m(&mut a, 50 * MIB);
    assert_eq!(
        (
            a.stats().oversize_allocations.current,
            a.stats().oversize_segments.current
        ),
        (1, 1)
    );
    a.free(pa).expect("free");
    assert_eq!(
        (
            a.stats().oversize_allocations.current,
            a.stats().oversize_segments.current
        ),
        (0, 1)
    );
    let pb = m(&mut a, 30 * MIB);
    assert_ne!(
        pb, pa,
        "an oversize block never serves a non-oversize request"
    );
    let pc = m(&mut a, 45 * MIB);
    assert_eq!(pc, pa);
    assert_eq!(a.snapshot()[0].blocks[0].size, 50 * MIB);
    assert_eq!(a.stats().oversize_allocations.current, 1);
    a.free(pc).expect("free");
    m(&mut a, 35 * MIB);
    let snap = a.snapshot();
    assert_eq!(snap.len(), 2);
    assert_eq!(layout(&snap[0]), vec![(30 * MIB, true)]);
    assert_eq!(layout(&snap[1]), vec![(36 * MIB, true)]);
    assert_eq!(snap[1].blocks[0].requested_size, 36_700_160);
    let s = a.stats();
    assert_eq!(cur(&a, Family::ReservedBytes), 66 * MIB as i64);
    assert_eq!(
        (
            s.num_alloc_retries,
            s.num_sync_all_streams,
            s.num_device_free
        ),
        (0, 0, 1)
    );
    assert_eq!(
        (s.oversize_segments.current, s.oversize_segments.peak),
        (0, 1)
    );
    assert_eq!(s.oversize_allocations.current, 0);
}

#[test]
fn e12_empty_cache_releases_only_whole_free_segments() {
    let mut a = default_alloc();
    let s1 = m(&mut a, 100 * KIB);
    let s2 = m(&mut a, 200 * KIB);
    let pa = m(&mut a, 4 * MIB);
    m(&mut a, 4 * MIB);
    let pc = m(&mut a, 30 * MIB);
    for p in [pa, pc, s1, s2] {
        a.free(p).expect("free");
    }
    assert_eq!(cur(&a, Family::ReservedBytes), 54_525_952);
    assert_eq!(
        (
            cur(&a, Family::InactiveSplit),
            cur(&a, Family::InactiveSplitBytes)
        ),
        (2, 16 * MIB as i64)
    );
    a.take_events();
    a.empty_cache();
    assert_eq!(
        actions(&a.take_events()),
        vec![
            (Action::SegmentFree, pc, 31_457_280),
            (Action::SegmentFree, s1, 2_097_152)
        ]
    );
    assert_eq!(a.snapshot().len(), 1);
    assert_eq!(cur(&a, Family::ReservedBytes), 20 * MIB as i64);
    assert_eq!(cur(&a, Family::AllocatedBytes), 4 * MIB as i64);
    assert_eq!(
        (
            cur(&a, Family::InactiveSplit),
            cur(&a, Family::InactiveSplitBytes)
        ),
        (2, 16 * MIB as i64)
    );
    assert_eq!(cur(&a, Family::Segment), 1);
    assert_eq!(
        (a.stats().num_device_free, a.stats().num_sync_all_streams),
        (2, 1)
    );
}

#[test]
fn e13_roundup_power2_divisions() {
    use vramscope::alloc::{round_size, TorchVersion};
    let four = AllocConfig::parse("roundup_power2_divisions:4").expect("conf");
    for (r, s) in [
        (1_200, 1_536),
        (2_048, 2_048),
        (2_049, 2_560),
        (5_000, 5_120),
        (3 * MIB + 1, 3_670_016),
        (6 * MIB, 6 * MIB),
        (100 * MIB + 5, 117_440_512),
        (700 * MIB, 805_306_368),
    ] {
        assert_eq!(round_size(r, &four), s, "R = {r}");
    }
    let list = "roundup_power2_divisions:[256:1,512:2,>:8]";
    let classic = AllocConfig::parse_for(list, TorchVersion(8)).expect("conf");
    let unified = AllocConfig::parse_for(list, TorchVersion(10)).expect("conf");
    for (r, old, new) in [
        (100 * MIB + 1, 104_858_112, 104_858_112),
        (300 * MIB + 1, 314_573_312, 314_573_312),
        (600 * MIB, 671_088_640, 805_306_368),
        (1536 * MIB, 1_610_612_736, 1_610_612_736),
        (1536 * MIB + 1, 1_744_830_464, 1_744_830_464),
        (3 * GIB + 1, 3_489_660_928, 3_489_660_928),
    ] {
        assert_eq!(round_size(r, &classic), old, "2.8, R = {r}");
        assert_eq!(round_size(r, &unified), new, "2.10, R = {r}");
    }
    let mut a = alloc_with(8 * GIB, "roundup_power2_divisions:4");
    m(&mut a, 700 * MIB);
    assert_eq!(a.snapshot()[0].total_size, 768 * MIB);
}

#[test]
fn e14_expandable_large_pool() {
    let mut a = alloc_with(8 * GIB, "expandable_segments:True");
    let pa = m(&mut a, 5 * MIB);
    let v = pa;
    let ev = a.take_events();
    assert_eq!(
        actions(&ev),
        vec![
            (Action::SegmentMap, v, 20_971_520),
            (Action::Alloc, v, 5 * MIB)
        ]
    );
    assert_eq!(cur(&a, Family::ReservedBytes), 20 * MIB as i64);
    assert_eq!(cur(&a, Family::Segment), 0);
    assert_eq!(cur(&a, Family::InactiveSplit), 0);
    assert_eq!(a.stats().num_device_alloc, 1);
    let pb = m(&mut a, 30 * MIB);
    assert_eq!(pb, v + 5 * MIB);
    assert_eq!(
        actions(&a.take_events()),
        vec![
            (Action::SegmentMap, v + 20 * MIB, 20_971_520),
            (Action::Alloc, v + 5 * MIB, 30 * MIB)
        ]
    );
    assert_eq!(
        layout(&a.snapshot()[0]),
        vec![(5 * MIB, true), (30 * MIB, true), (5 * MIB, false)]
    );
    assert_eq!(a.stats().num_device_alloc, 2);
    a.free(pa).expect("free");
    a.empty_cache();
    assert!(a.take_events().iter().all(|e| !e.action.is_segment()));
    assert_eq!(a.stats().num_sync_all_streams, 1);
    let pc = m(&mut a, 3 * MIB);
    assert_eq!(
        pc, v,
        "the free block inside the reservation beats the tail"
    );
    let snap = a.snapshot();
    assert_eq!(
        layout(&snap[0]),
        vec![
            (3 * MIB, true),
            (2 * MIB, false),
            (30 * MIB, true),
            (5 * MIB, false)
        ]
    );
    assert_eq!(snap[0].blocks[1].requested_size, 5 * MIB);
    a.free(pb).expect("free");
    a.free(pc).expect("free");
    let snap = a.snapshot();
    assert_eq!(snap.len(), 1);
    assert!(snap[0].is_expandable);
    assert_eq!(layout(&snap[0]), vec![(40 * MIB, false)]);
    a.take_events();
    a.empty_cache();
    assert_eq!(
        actions(&a.take_events()),
        vec![(Action::SegmentUnmap, v, 41_943_040)]
    );
    assert_eq!(cur(&a, Family::ReservedBytes), 0);
    assert_eq!(
        (a.stats().num_device_free, a.stats().num_sync_all_streams),
        (1, 2)
    );
    assert!(a.snapshot().is_empty());
}

#[test]
fn e15_expandable_small_pool() {
    let mut a = alloc_with(8 * GIB, "expandable_segments:True");
    let ptrs: Vec<u64> = (0..4).map(|_| m(&mut a, 614_400)).collect();
    let v = ptrs[0];
    assert_eq!(ptrs[3], v + 0x1C2000);
    let snap = a.snapshot();
    assert_eq!(snap.len(), 1);
    assert_eq!(snap[0].total_size, 4 * MIB);
    assert_eq!(
        layout(&snap[0]),
        vec![
            (614_400, true),
            (614_400, true),
            (614_400, true),
            (614_400, true),
            (1_736_704, false)
        ]
    );
    let segs: Vec<_> = a
        .take_events()
        .into_iter()
        .filter(|e| e.action == Action::SegmentMap)
        .map(|e| (e.addr, e.size))
        .collect();
    assert_eq!(segs, vec![(v, 2_097_152), (v + 2 * MIB, 2_097_152)]);
    assert_eq!(
        a.stats().get(Family::ReservedBytes, Level::Small).current,
        4 * MIB as i64
    );
    assert_eq!(cur(&a, Family::Segment), 0);
    assert_eq!(a.stats().num_device_alloc, 2);
}

#[test]
fn e16_garbage_collection_picks_oldest() {
    let mut a = alloc_with(200 * MIB, "garbage_collection_threshold:0.5");
    a.set_memory_fraction(0.5);
    let pa = m(&mut a, 30 * MIB);
    let pb = m(&mut a, 40 * MIB);
    assert_eq!(cur(&a, Family::ReservedBytes), 70 * MIB as i64);
    a.free(pb).expect("free");
    a.free(pa).expect("free");
    for _ in 0..2 {
        let p = m(&mut a, 30 * MIB);
        assert_eq!(p, pa);
        a.free(p).expect("free");
    }
    a.take_events();
    let pc = m(&mut a, 44 * MIB);
    assert_eq!(
        actions(&a.take_events()),
        vec![
            (Action::SegmentFree, pb, 41_943_040),
            (Action::SegmentAlloc, pc, 46_137_344),
            (Action::Alloc, pc, 46_137_344)
        ]
    );
    assert_eq!(cur(&a, Family::ReservedBytes), 74 * MIB as i64);
    let s = a.stats();
    assert_eq!(
        (
            s.num_device_free,
            s.num_sync_all_streams,
            s.num_alloc_retries
        ),
        (1, 0, 0)
    );
}

#[test]
fn e16_without_fraction_gc_does_nothing() {
    let mut a = alloc_with(200 * MIB, "garbage_collection_threshold:0.5");
    let pa = m(&mut a, 30 * MIB);
    let pb = m(&mut a, 40 * MIB);
    a.free(pb).expect("free");
    a.free(pa).expect("free");
    m(&mut a, 44 * MIB);
    assert_eq!(a.stats().num_device_free, 0);
    assert_eq!(cur(&a, Family::ReservedBytes), 114 * MIB as i64);
}

#[test]
fn e17_record_stream_delays_reuse() {
    let mut a = default_alloc();
    let x = m(&mut a, 6 * MIB);
    a.record_stream(x, 7).expect("record");
    a.free(x).expect("free");
    let snap = a.snapshot();
    assert_eq!(snap[0].blocks[0].state, BlockState::ActivePendingFree);
    assert_eq!((snap[0].active_size, snap[0].allocated_size), (6 * MIB, 0));
    assert_eq!(
        (
            cur(&a, Family::AllocatedBytes),
            cur(&a, Family::ActiveBytes),
            cur(&a, Family::Active)
        ),
        (0, 6 * MIB as i64, 1)
    );
    assert_eq!(
        (
            cur(&a, Family::InactiveSplit),
            cur(&a, Family::InactiveSplitBytes)
        ),
        (1, 14 * MIB as i64)
    );
    let y = m(&mut a, 6 * MIB);
    assert_eq!(y, x + 6 * MIB, "x is not reusable yet");
    assert_eq!(
        (
            cur(&a, Family::ActiveBytes),
            cur(&a, Family::RequestedBytes)
        ),
        (12 * MIB as i64, 12 * MIB as i64)
    );
    a.complete_stream(7);
    let z = m(&mut a, 6 * MIB);
    assert_eq!(z, x);
    assert_eq!(
        (
            cur(&a, Family::AllocatedBytes),
            cur(&a, Family::ActiveBytes),
            cur(&a, Family::Active)
        ),
        (12 * MIB as i64, 12 * MIB as i64, 2)
    );
    assert_eq!(
        (
            cur(&a, Family::InactiveSplit),
            cur(&a, Family::InactiveSplitBytes)
        ),
        (1, 8 * MIB as i64)
    );
    assert_eq!(
        a.stats().get(Family::InactiveSplitBytes, Level::All).peak,
        14 * MIB as i64
    );
    let acts: Vec<Action> = a.take_events().iter().map(|e| e.action).collect();
    assert_eq!(
        acts,
        vec![
            Action::SegmentAlloc,
            Action::Alloc,
            Action::FreeRequested,
            Action::Alloc,
            Action::FreeCompleted,
            Action::Alloc
        ]
    );
}

#[test]
fn e18_streams_do_not_share_cached_blocks() {
    let mut a = default_alloc();
    let p = a.malloc(8 * MIB, 0, Tag::NONE).expect("malloc");
    a.free(p).expect("free");
    let q = a.malloc(8 * MIB, 0x1234, Tag::NONE).expect("malloc");
    assert_ne!(q, p);
    let snap = a.snapshot();
    assert_eq!(layout(&snap[0]), vec![(20 * MIB, false)]);
    assert_eq!(layout(&snap[1]), vec![(8 * MIB, true), (12 * MIB, false)]);
    assert_eq!(snap[1].stream, 0x1234);
    assert_eq!(cur(&a, Family::ReservedBytes), 40 * MIB as i64);
    assert_eq!(cur(&a, Family::Segment), 2);
    assert_eq!(cur(&a, Family::AllocatedBytes), 8 * MIB as i64);
}

#[test]
fn e19_max_non_split_rounding() {
    for (conf, reserved, oversize_segments, reuses) in [
        ("max_split_size_mb:100", 289_406_976, 2, false),
        (
            "max_split_size_mb:100,max_non_split_rounding_mb:40",
            150 * MIB as i64,
            1,
            true,
        ),
    ] {
        let mut a = default_alloc_conf(conf);
        let pa = m(&mut a, 150 * MIB);
        a.free(pa).expect("free");
        let pb = m(&mut a, 140 * MIB);
        assert_eq!(pb, pa);
        assert_eq!(cur(&a, Family::AllocatedBytes), 150 * MIB as i64);
        assert_eq!(cur(&a, Family::RequestedBytes), 140 * MIB as i64);
        a.free(pb).expect("free");
        let pc = m(&mut a, 125 * MIB);
        assert_eq!(pc == pa, reuses, "{conf}");
        assert_eq!(cur(&a, Family::ReservedBytes), reserved, "{conf}");
        assert_eq!(
            a.stats().oversize_segments.current,
            oversize_segments,
            "{conf}"
        );
        if !reuses {
            assert_eq!(a.stats().oversize_allocations.current, 1);
        }
    }
}

#[test]
fn e20_fraction_limit_in_oom_message() {
    let mut a = alloc_with(GIB, "");
    a.set_memory_fraction(0.25);
    m(&mut a, 200 * MIB);
    let err = a
        .malloc(100 * MIB, 0, Tag::NONE)
        .expect_err("over the fraction");
    let msg = err.to_string();
    assert!(
        msg.starts_with("CUDA out of memory. Tried to allocate 100.00 MiB. GPU 0 has a total capacity of 1024.00 MiB of which 824.00 MiB is free. 256.00 MiB allowed; Of the allocated memory 200.00 MiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved"),
        "{msg}"
    );
    let s = a.stats();
    assert_eq!(
        (s.num_alloc_retries, s.num_ooms, s.num_sync_all_streams),
        (1, 1, 1)
    );
}

/// A device too small for even one page: the reservation cannot hold the
/// request, and the answer is an OOM, not a read past the block arena
/// (`replay --conf expandable_segments:True --capacity 0` once crashed here).
#[test]
fn expandable_on_a_device_without_room_is_an_oom() {
    for total in [0, 1 << 20] {
        let mut a = alloc_with(total, "expandable_segments:True");
        for size in [512, 5 * MIB, 3 * GIB] {
            assert!(a.malloc(size, 0, Tag::NONE).is_err(), "{size} on {total}");
        }
        assert_eq!(cur(&a, Family::ReservedBytes), 0);
    }
}
