//! A snapshot's requests replayed under another `PYTORCH_CUDA_ALLOC_CONF`, as
//! a snapshot of its own (for export, and for comparing two configs side by
//! side in the views).

use crate::alloc::{Action, AllocConfig, Tag};
use crate::trace::snapshot::from_run::{snapshot_of_run, DeviceRun};
use crate::trace::snapshot::Snapshot;

use super::from_snapshot::{self, DeviceReplay};
use super::tag_entry;
use super::whatif::{self, Requests};

/// The device size a what-if replays on: `given`, else what the trace tells,
/// else the most the recorded run reserved (the run never held more, so a
/// request that would have taken it above that failed there too, and the
/// allocator freed its cache and retried: on this capacity the replay under
/// the recorded config makes the same releases), else, where the
/// reservations cannot be rebuilt (expandable segments), the peak the
/// recorded config reaches on an unbounded device.
pub fn device_capacity(replay: &DeviceReplay, given: Option<u64>) -> u64 {
    given
        .or(replay.device_total)
        .or_else(|| recorded_peak_reserved(replay))
        .unwrap_or_else(|| {
            let requests = Requests {
                entries: &replay.entries,
                empty_cache_at: &replay.outcome.empty_cache_at,
                start: Some(&replay.start),
            };
            let probe = whatif::what_if(&requests, AllocConfig::default(), u64::MAX / 4);
            probe.peak_reserved.max(1)
        })
}

/// Where [`device_capacity`]'s figure comes from, in words.
pub fn capacity_source(replay: &DeviceReplay, given: Option<u64>) -> &'static str {
    if given.is_some() {
        "--capacity"
    } else if replay.device_total.is_some() {
        "the device size the trace tells"
    } else if recorded_peak_reserved(replay).is_some() {
        "the most the recorded run reserved: the trace does not tell the device's size"
    } else {
        "the recorded config's peak on an unbounded device: the trace does not tell the device's size"
    }
}

/// The recorded run, as the what-if table's first column shows it: the
/// verify replay followed the trace decision for decision (its segment calls
/// are the recorded ones), so its figures are the run's own.
pub fn recorded_result(replay: &DeviceReplay, conf: &str) -> whatif::WhatIfResult {
    let s = &replay.stats;
    let oom_entries: Vec<whatif::WhatIfOom> = replay
        .entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action == Action::Oom)
        .map(|(entry, e)| whatif::WhatIfOom {
            entry,
            size: e.size,
        })
        .collect();
    whatif::WhatIfResult {
        conf: conf.to_string(),
        peak_reserved: s.peak_reserved_bytes(),
        peak_allocated: s.peak_allocated_bytes(),
        reserved_end: s.reserved_bytes(),
        largest_free_at_worst: replay.outcome.at_worst.largest_free,
        fragmentation_at_worst: replay.outcome.at_worst.fragmentation,
        num_alloc_retries: s.num_alloc_retries,
        oom_count: oom_entries.len(),
        ooms: oom_entries.into_iter().take(whatif::LISTED_OOMS).collect(),
        segments: replay.outcome.segments_end,
    }
}

/// The most the trace's segments reserved at once, from the rebuilt start
/// state and the segment entries; `None` where they cannot say (expandable
/// segments, or nothing reserved).
pub fn recorded_peak_reserved(replay: &DeviceReplay) -> Option<u64> {
    if replay.start.expandable {
        return None;
    }
    let start: u64 = replay
        .start
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter())
        .map(|b| b.size)
        .sum();
    let (mut now, mut peak) = (start, start);
    for e in &replay.entries {
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => now = now.saturating_add(e.size),
            Action::SegmentFree | Action::SegmentUnmap => now = now.saturating_sub(e.size),
            _ => continue,
        }
        peak = peak.max(now);
    }
    (peak > 0).then_some(peak)
}

/// Every traced device's requests replayed under `config`; frames come from
/// the trace entries that made the requests.
pub fn replayed_snapshot(snap: &Snapshot, config: &AllocConfig) -> Snapshot {
    let replays = from_snapshot::verify(snap);
    let runs: Vec<_> = replays
        .iter()
        .map(|r| {
            let requests = Requests {
                entries: &r.entries,
                empty_cache_at: &r.outcome.empty_cache_at,
                start: Some(&r.start),
            };
            let capacity = device_capacity(r, None);
            let mut run = whatif::run(&requests, config.clone(), capacity, true);
            let a = &mut run.allocator;
            (a.snapshot(), a.take_events(), r.device)
        })
        .collect();
    let devices: Vec<DeviceRun<'_>> = runs
        .iter()
        .map(|(segments, events, device)| DeviceRun {
            device: *device,
            segments,
            events,
        })
        .collect();
    let frames_of = |device: usize, tag: Tag| -> Vec<(String, i64, String)> {
        snap.device_traces
            .get(device)
            .zip(tag_entry(tag))
            .and_then(|(t, i)| t.get(i))
            .map(|e| {
                snap.frames
                    .resolve(e.frames)
                    .map(|f| (f.filename.to_string(), f.line, f.name.to_string()))
                    .collect()
            })
            .unwrap_or_default()
    };
    snapshot_of_run(&devices, config, &frames_of)
}
