//! Replaying the closed real traces through the allocator: every alloc address,
//! every segment event and the final segments must be PyTorch's (SOURCES.md
//! lists these three as closed; allocator.md §17).

use vramscope::alloc::constants::LARGE_BUFFER;
use vramscope::trace::replay::{from_snapshot, ReplayOutcome, Replayer};
use vramscope::trace::snapshot::import_file;

mod common;

use common::real;

fn replay(name: &str) -> Vec<(usize, ReplayOutcome)> {
    let snap = import_file(&real(name)).expect("imports");
    let config = from_snapshot::config(&snap);
    from_snapshot::traced_devices(&snap)
        .into_iter()
        .map(|device| {
            let entries = from_snapshot::entries(&snap, device);
            let total = from_snapshot::infer_device_total(entries.iter().copied(), LARGE_BUFFER)
                .unwrap_or(from_snapshot::DEFAULT_DEVICE_TOTAL);
            let finals = from_snapshot::final_segments(&snap, device);
            (
                device,
                Replayer::new(config.clone(), total).run(&entries, Some(&finals)),
            )
        })
        .collect()
}

fn assert_all_match(name: &str, outcomes: &[(usize, ReplayOutcome)]) {
    for (device, o) in outcomes {
        assert_eq!(
            o.final_state_match,
            Some(true),
            "{name} device {device}: {:?}",
            o.differences
        );
        assert!(
            o.differences.is_empty(),
            "{name} device {device}: {:?}",
            o.differences
        );
        assert!(
            o.all_matched(),
            "{name} device {device}: allocs {}/{}, segment events {}/{}, ooms {}/{}, final {:?}\n{}",
            o.alloc_addr_match,
            o.allocs,
            o.segment_event_match,
            o.segment_events,
            o.oom_match,
            o.ooms,
            o.final_state_match,
            o.differences.join("\n")
        );
    }
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn adam_step_replays_address_for_address() {
    let out = replay("adam-step_closed-trace_annotations.pickle");
    assert_eq!(out.len(), 1);
    let o = &out[0].1;
    // SOURCES.md: trace [35] with segment_alloc 7, alloc 18.
    assert_eq!((o.entries, o.allocs, o.segment_events), (35, 18, 7));
    assert_all_match("adam-step", &out);
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn silmont_replays_address_for_address() {
    let out = replay("cs336-silmont_tiny-closed-trace_cpp-frames.pickle");
    let o = &out[0].1;
    // SOURCES.md: trace [97] with segment_alloc 9, alloc 36.
    assert_eq!((o.entries, o.allocs, o.segment_events), (97, 36, 9));
    assert_all_match("silmont", &out);
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn code_location_expandable_three_devices_with_oom() {
    let out = replay("code-location_expandable_3gpu_oom.pickle");
    let devices: Vec<usize> = out.iter().map(|(d, _)| *d).collect();
    assert_eq!(devices, vec![0, 1, 2]);
    let entries: Vec<usize> = out.iter().map(|(_, o)| o.entries).collect();
    assert_eq!(entries, vec![6445, 596, 882]);
    // SOURCES.md: segment_map 293 + segment_unmap 6 in all, one oom (device 1).
    assert_eq!(
        out.iter().map(|(_, o)| o.segment_events).sum::<usize>(),
        299
    );
    assert_eq!(out.iter().map(|(_, o)| o.ooms).sum::<usize>(), 1);
    assert_all_match("code-location", &out);
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn device_size_is_read_from_the_reservation_spacing() {
    let snap = import_file(&real("code-location_expandable_3gpu_oom.pickle")).expect("imports");
    for device in 0..3 {
        let total =
            from_snapshot::infer_device_total(from_snapshot::entries(&snap, device), LARGE_BUFFER)
                .expect("two reservations");
        // allocator.md §17: totalGlobalMem of about 85.0 GB, a reservation of 4,560 pages of 20 MiB.
        assert_eq!(
            (total + total / 8).div_ceil(LARGE_BUFFER),
            4560,
            "device {device}: {total}"
        );
        assert!(
            (84_980_000_000..=85_010_000_000).contains(&total),
            "device {device}: {total}"
        );
    }
}

/// Open traces: rebuild the state at the first entry, then replay.
fn replay_open(name: &str) -> Vec<(usize, ReplayOutcome)> {
    use vramscope::trace::replay::reconstruct::initial_state;
    let snap = import_file(&real(name)).expect("imports");
    let config = from_snapshot::config(&snap);
    from_snapshot::traced_devices(&snap)
        .into_iter()
        .map(|device| {
            let entries = from_snapshot::entries(&snap, device);
            let finals = from_snapshot::final_segments(&snap, device);
            let start = initial_state(entries.iter().copied(), &finals, &config);
            (
                device,
                Replayer::seeded(config.clone(), from_snapshot::DEFAULT_DEVICE_TOTAL, &start)
                    .run(&entries, Some(&finals)),
            )
        })
        .collect()
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn open_traces_replay_from_the_rebuilt_start() {
    // SOURCES.md: open traces (allocations and segments that predate recording).
    for (name, allocs, segment_events) in [
        ("cs336-kk_2.7b-forward_segment-free.pickle", 3020, 742 + 178),
        ("cs336-magma_windows_user-metadata.pickle", 1721, 0),
        ("eor-nn_snapshot-actions.pickle", 1935, 7),
        ("sqattn_segment-churn.pickle", 2912, 840),
        ("flexgen_legacy-history-blocks.pickle", 0, 0),
    ] {
        let out = replay_open(name);
        assert_eq!(out.len(), 1, "{name}");
        let o = &out[0].1;
        assert_eq!(
            (o.allocs, o.segment_events),
            (allocs, segment_events),
            "{name}"
        );
        assert_eq!(
            o.final_state_match,
            Some(true),
            "{name}: {:?}",
            o.differences
        );
        assert_all_match(name, &out);
    }
}

/// sqattn's trace began late and its run freed cached segments over and
/// over: the what-if table's first column is that recorded run, so its peak
/// reserved is the trace's own, counted here from the start state the final
/// segments imply and every segment event after it.
#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn the_what_if_s_recorded_column_has_the_trace_s_own_peak() {
    use vramscope::trace::snapshot::Action;
    let file = real("sqattn_segment-churn.pickle");
    let snap = import_file(&file).expect("imports");
    let trace = &snap.device_traces[0];
    let delta = |e: &vramscope::trace::snapshot::TraceEntry| -> i128 {
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => e.size as i128,
            Action::SegmentFree | Action::SegmentUnmap => -(e.size as i128),
            _ => 0,
        }
    };
    let end: i128 = snap
        .segments
        .iter()
        .filter(|s| s.device == 0)
        .map(|s| s.total_size as i128)
        .sum();
    let mut now = end - trace.iter().map(delta).sum::<i128>();
    let mut peak = now;
    for e in trace {
        now += delta(e);
        peak = peak.max(now);
    }
    let (code, out, err) = common::vramscope(&[
        "replay",
        file.to_str().expect("utf-8"),
        "--conf",
        "expandable_segments:True",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v = common::json(&out);
    let recorded = &v["devices"][0]["configs"][0];
    assert_eq!(
        recorded["peak_reserved"].as_u64(),
        Some(peak as u64),
        "{recorded}"
    );
}
