//! Per-file facts from SOURCES.md and the invariants of SCHEMA.md §3, §7 on every real snapshot.

use super::*;

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn adam_step() {
    let s = load("adam-step_closed-trace_annotations");
    assert_eq!(s.layout, Layout::CurrentDict);
    assert_eq!(s.segments.len(), 7);
    assert_eq!(large_small(&s), (6, 1));
    assert!(s.segments.iter().all(|g| g.device == 0));
    assert_gib(reserved(&s), 0.22, 2, "reserved");
    assert_eq!(trace_lens(&s), [35]);
    assert_eq!(
        actions(&s),
        counts(&[
            ("segment_alloc", 7),
            ("alloc", 18),
            ("free_requested", 5),
            ("free_completed", 5)
        ])
    );
    assert_eq!(count_state(&s, BlockState::ActiveAllocated), 13);
    assert!(s.allocator_settings.is_some());
    let ann: Vec<_> = s
        .external_annotations
        .iter()
        .map(|a| (&*a.stage, &*a.name))
        .collect();
    assert_eq!(
        ann,
        [
            ("START", "Optimizer.step#AdamW.step"),
            ("END", "Optimizer.step#AdamW.step")
        ]
    );
    // Python and C++ frames.
    let all: Vec<&Frame> = s
        .device_traces
        .iter()
        .flatten()
        .flat_map(|e| s.frames.resolve(e.frames))
        .collect();
    assert!(all.iter().any(|f| f.is_user_code()));
    assert!(all
        .iter()
        .any(|f| &*f.filename == "??" || f.filename.ends_with(".cpp")));
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn cs336_silmont() {
    let s = load("cs336-silmont_tiny-closed-trace_cpp-frames");
    assert_eq!(s.segments.len(), 9);
    assert_eq!(large_small(&s), (8, 1));
    assert_gib(reserved(&s), 3.5, 1, "reserved");
    assert_eq!(trace_lens(&s), [97]);
    assert_eq!(
        actions(&s),
        counts(&[
            ("segment_alloc", 9),
            ("alloc", 36),
            ("free_requested", 26),
            ("free_completed", 26)
        ])
    );
    assert_eq!(count_state(&s, BlockState::ActiveAllocated), 10);
    // Segments carry their own cudaMalloc stacks, with C++ frames.
    assert!(s.segments.iter().any(|g| g.frames != FramesId::EMPTY));
    assert!(s
        .segments
        .iter()
        .flat_map(|g| s.frames.resolve(g.frames))
        .any(|f| &*f.filename == "??" || f.filename.ends_with(".cpp")));
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn code_location_expandable_oom() {
    let s = load("code-location_expandable_3gpu_oom");
    let conf = s.allocator_settings.as_ref().map(|a| a.conf.as_str());
    assert_eq!(conf, Some("expandable_segments:True"));
    assert_eq!(s.segments.len(), 12);
    assert!(s.segments.iter().all(|g| g.is_expandable));
    let per_device: Vec<usize> = (0..3)
        .map(|d| s.segments.iter().filter(|g| g.device == d).count())
        .collect();
    assert_eq!(per_device, [2, 8, 2]);
    assert_gib(reserved(&s), 106.8, 1, "reserved");
    assert_eq!(trace_lens(&s), [6445, 596, 882, 0]);
    assert_eq!(
        actions(&s),
        counts(&[
            ("segment_map", 293),
            ("segment_unmap", 6),
            ("alloc", 3025),
            ("free_requested", 2299),
            ("free_completed", 2299),
            ("oom", 1),
        ])
    );
    // Live allocations equal the final active blocks per device.
    let active: Vec<usize> = (0..3)
        .map(|d| {
            s.segments
                .iter()
                .filter(|g| g.device == d)
                .flat_map(|g| &g.blocks)
                .filter(|b| b.state == BlockState::ActiveAllocated)
                .count()
        })
        .collect();
    assert_eq!(active, [516, 24, 186]);
    // Device 1: unmaps at entries 413–418, the oom at 421 (5.3 GB asked,
    // 95.7 MB free), with no addr.
    let d1 = &s.device_traces[1];
    assert!(d1[413..=418]
        .iter()
        .all(|e| e.action == Action::SegmentUnmap));
    let oom = &d1[421];
    assert_eq!(oom.action, Action::Oom);
    assert_eq!(oom.addr, 0);
    assert!((oom.size as f64 / 1e9 - 5.3).abs() < 0.05, "{}", oom.size);
    let free = s.device_free(oom).expect("oom has device_free");
    assert!((free as f64 / 1e6 - 95.7).abs() < 0.05, "{free}");
    for e in s.device_traces.iter().flatten() {
        assert_eq!(s.device_free(e).is_some(), e.action == Action::Oom);
    }
    // Map/unmap sizes are multiples of 2 MiB.
    assert!(s
        .device_traces
        .iter()
        .flatten()
        .filter(|e| matches!(e.action, Action::SegmentMap | Action::SegmentUnmap))
        .all(|e| e.size % (2 << 20) == 0));
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn verl_pools_and_pending_free() {
    let s = load("verl_private-pools_pending-free_state-only");
    assert_eq!(s.segments.len(), 127);
    let mut pools: BTreeMap<(i64, i64), usize> = BTreeMap::new();
    for g in &s.segments {
        *pools.entry(g.pool_id).or_insert(0) += 1;
    }
    assert_eq!(
        pools.into_iter().collect::<Vec<_>>(),
        [((0, 0), 59), ((0, 1), 44), ((0, 2), 24)]
    );
    assert_gib(reserved(&s), 24.4, 1, "reserved");
    assert_eq!(count_state(&s, BlockState::ActiveAllocated), 534);
    assert_eq!(count_state(&s, BlockState::Inactive), 95);
    assert_eq!(count_state(&s, BlockState::ActivePendingFree), 9);
    assert_eq!(trace_lens(&s), [0]);
    assert!(blocks(&s).any(|b| b.frames != FramesId::EMPTY));
    assert!(s.segments.iter().any(|g| g.frames != FramesId::EMPTY));
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn cs336_kk_1457_segments() {
    let s = load("cs336-kk_1457-segments_state-only");
    assert_eq!(s.segments.len(), 1457);
    assert_eq!(large_small(&s), (1437, 20));
    assert_gib(reserved(&s), 70.7, 1, "reserved");
    assert_gib(allocated(&s), 51.3, 1, "allocated");
    assert_eq!(blocks(&s).count(), 1912);
    assert!(s.device_traces.iter().all(Vec::is_empty));
    let with_stacks = s
        .segments
        .iter()
        .filter(|g| g.frames != FramesId::EMPTY)
        .count();
    assert_eq!(with_stacks, 28);
    assert!(blocks(&s).all(|b| b.frames == FramesId::EMPTY));
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn cs336_kk_forward_segment_free() {
    let s = load("cs336-kk_2.7b-forward_segment-free");
    assert_eq!(s.segments.len(), 961);
    assert_gib(reserved(&s), 32.5, 1, "reserved");
    assert_eq!(trace_lens(&s), [8694]);
    assert_eq!(
        actions(&s),
        counts(&[
            ("segment_free", 742),
            ("segment_alloc", 178),
            ("alloc", 3020),
            ("free_requested", 2377),
            ("free_completed", 2377),
        ])
    );
    assert_eq!(s.external_annotations.len(), 1802);
    assert!(s
        .external_annotations
        .iter()
        .any(|a| a.name.ends_with("(dynamo_timed)")));
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn cs336_magma_windows_metadata() {
    let s = load("cs336-magma_windows_user-metadata");
    assert_eq!(s.segments.len(), 216);
    assert_gib(reserved(&s), 13.2, 1, "reserved");
    assert_gib(allocated(&s), 1.3, 1, "allocated");
    assert_eq!(trace_lens(&s), [5163]);
    assert_eq!(
        actions(&s),
        counts(&[
            ("alloc", 1721),
            ("free_requested", 1721),
            ("free_completed", 1721)
        ])
    );
    for e in s.device_traces.iter().flatten() {
        assert_eq!(s.extra(e).compile_context.as_deref(), Some("N/A"));
        assert_eq!(s.extra(e).user_metadata.as_deref(), Some(""));
    }
    // Windows paths, and grouping finds user code in them.
    let user = s
        .device_traces
        .iter()
        .flatten()
        .find_map(|e| s.first_user_frame(e.frames))
        .expect("a user frame");
    assert!(user.filename.contains('\\'), "{}", user.filename);
    assert!(!user.filename.contains("\\torch\\"));
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn eor_nn_snapshot_actions() {
    let s = load("eor-nn_snapshot-actions");
    assert_eq!(s.layout, Layout::OlderDict);
    assert!(s.allocator_settings.is_none());
    assert!(s.external_annotations.is_empty());
    assert_eq!(s.segments.len(), 10);
    assert_gib(reserved(&s), 0.12, 2, "reserved");
    assert_eq!(trace_lens(&s), [5803]);
    assert_eq!(
        actions(&s),
        counts(&[
            ("alloc", 1935),
            ("free_requested", 1926),
            ("free_completed", 1926),
            ("segment_alloc", 7),
            ("snapshot", 9),
        ])
    );
    for e in s.device_traces.iter().flatten() {
        assert!(e.time_us().is_some());
        if e.action == Action::Snapshot {
            assert_eq!((e.addr, e.frames), (0, FramesId::EMPTY));
        }
    }
    // time_us never decreases within a device list (SCHEMA §5).
    let t: Vec<i64> = s.device_traces[0]
        .iter()
        .filter_map(|e| e.time_us())
        .collect();
    assert!(t.windows(2).all(|w| w[0] <= w[1]));
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn sqattn_segment_churn() {
    let s = load("sqattn_segment-churn");
    assert_eq!(s.segments.len(), 4);
    assert_gib(reserved(&s), 0.21, 2, "reserved");
    assert_eq!(trace_lens(&s), [9576, 0, 0, 0]);
    let a = actions(&s);
    assert_eq!(a.get("segment_alloc"), Some(&420));
    assert_eq!(a.get("segment_free"), Some(&420));
    assert_eq!(a.get("alloc"), Some(&2912));
    assert_eq!(a.get("free_completed"), Some(&2912));
    assert_eq!(count_state(&s, BlockState::ActiveAllocated), 5);
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn flexgen_legacy_history_blocks() {
    let s = load("flexgen_legacy-history-blocks");
    assert_eq!(s.layout, Layout::OlderDict);
    assert_eq!(s.segments.len(), 266);
    assert_gib(reserved(&s), 6.2, 1, "reserved");
    // Addresses were computed: contiguous from each segment's address.
    for g in &s.segments {
        assert_eq!(g.pool_id, (0, 0));
        assert!(!g.is_expandable);
        let mut next = g.address;
        for b in &g.blocks {
            assert_eq!(b.address, next);
            next += b.size;
        }
    }
    // Stacks come from history[0].
    assert!(blocks(&s).any(|b| s
        .frames
        .resolve(b.frames)
        .any(|f| f.filename.ends_with("flexgen/compression.py"))));
    // One free_completed entry without frames or time.
    assert_eq!(trace_lens(&s), [1]);
    let e = &s.device_traces[0][0];
    assert_eq!(e.action, Action::FreeCompleted);
    assert_eq!((e.time_us(), e.frames), (None, FramesId::EMPTY));
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn layout_editing_legacy_list() {
    let s = load("layout-editing_legacy-segment-list_device1");
    assert_eq!(s.layout, Layout::LegacyList);
    assert!(s.device_traces.is_empty());
    assert!(s.allocator_settings.is_none());
    assert_eq!(s.segments.len(), 255);
    assert!(s.segments.iter().all(|g| g.device == 1));
    assert_gib(reserved(&s), 3.4, 1, "reserved");
    assert_eq!(blocks(&s).count(), 2140);
    assert!(blocks(&s).any(|b| s.first_user_frame(b.frames).is_some()));
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn text_to_sql_tiny_expandable() {
    let s = load("text-to-sql_expandable_2gpu_state-only");
    let st = s.allocator_settings.as_ref().expect("settings");
    assert_eq!(st.conf, "expandable_segments:True,max_split_size_mb:128");
    assert_eq!(st.max_split_size, 134_217_728);
    assert_eq!(s.segments.len(), 3);
    assert!(s.segments.iter().all(|g| g.is_expandable));
    let small: Vec<i64> = s
        .segments
        .iter()
        .filter(|g| g.segment_type == PoolKind::Small)
        .map(|g| g.device)
        .collect();
    assert_eq!(small, [0]);
    let mut devices: Vec<i64> = s.segments.iter().map(|g| g.device).collect();
    devices.dedup();
    assert_eq!(devices, [0, 1]);
    assert_eq!(blocks(&s).count(), 10);
    assert_eq!(trace_lens(&s), [0, 0]);
    assert_eq!(s.frames.stack_count(), 1, "no frames anywhere");
}

// ---- invariants on every file (SCHEMA.md §3, §7) ----

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn segment_invariants_hold_everywhere() {
    for (name, bytes) in real_files() {
        let s = import_bytes(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let keys: Vec<(i64, u64)> = s.segments.iter().map(|g| (g.device, g.address)).collect();
        assert!(
            keys.windows(2).all(|w| w[0] < w[1]),
            "{name}: segments sorted"
        );
        for (i, g) in s.segments.iter().enumerate() {
            let at = format!("{name} segments[{i}]");
            let mut next = g.address;
            for b in &g.blocks {
                assert_eq!(b.address, next, "{at}: contiguous");
                assert_eq!(b.size % 512, 0, "{at}: size multiple of 512");
                next += b.size;
            }
            assert_eq!(next - g.address, g.total_size, "{at}: sizes sum to total");
            let sum = |f: fn(&Block) -> u64, keep: fn(&Block) -> bool| {
                g.blocks.iter().filter(|b| keep(b)).map(f).sum::<u64>()
            };
            assert_eq!(
                g.allocated_size,
                sum(|b| b.size, |b| b.state == BlockState::ActiveAllocated),
                "{at}: allocated_size"
            );
            assert_eq!(
                g.active_size,
                sum(|b| b.size, |b| b.state.is_active()),
                "{at}: active"
            );
            assert_eq!(
                g.requested_size,
                sum(|b| b.requested_size, |b| b.state.is_active()),
                "{at}: requested_size"
            );
            assert!(
                g.blocks
                    .windows(2)
                    .all(|w| w[0].state.is_active() || w[1].state.is_active()),
                "{at}: no adjacent inactive blocks"
            );
        }
        if let Some(st) = &s.allocator_settings {
            let keys: Vec<u64> = st.roundup_power2_divisions.iter().map(|p| p.0).collect();
            let want: Vec<u64> = (0..16).map(|i| 1u64 << i).collect();
            assert_eq!(keys, want, "{name}: roundup keys");
        }
    }
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn shared_frame_lists_become_one_id() {
    let s = load("code-location_expandable_3gpu_oom");
    // Alloc and its free share a frames list in the file (SCHEMA §1), so far
    // fewer stacks than entries.
    let entries: usize = s.device_traces.iter().map(Vec::len).sum();
    assert!(
        s.frames.stack_count() * 2 < entries,
        "{} stacks",
        s.frames.stack_count()
    );
    let mut seen = std::collections::HashSet::new();
    for id in 0..s.frames.stack_count() as u32 {
        assert!(
            seen.insert(s.frames.stack(FramesId(id)).to_vec()),
            "duplicate stack"
        );
    }
}
