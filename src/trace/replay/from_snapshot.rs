//! Turn an imported snapshot into replay input: per-device entries, the final
//! segments, the allocator config it ran under, and the device size.

use crate::alloc::{Action as AllocAction, AllocConfig, ConfigError, TorchVersion};
use crate::trace::snapshot::Snapshot;

use super::reconstruct::{initial_state, Reconstruction};
use super::{Entry, EntryAction, FinalBlock, FinalSegment, ReplayOutcome, Replayer};

/// Device size when neither the user nor the trace tells (an 80 GB-class card).
pub const DEFAULT_DEVICE_TOTAL: u64 = 80 << 30;

/// The trace of `device` as replay entries.
pub fn entries(snap: &Snapshot, device: usize) -> Vec<Entry> {
    let Some(trace) = snap.device_traces.get(device) else {
        return Vec::new();
    };
    trace
        .iter()
        .map(|e| Entry {
            action: match e.action.allocator() {
                Some(AllocAction::Alloc) => EntryAction::Alloc,
                Some(AllocAction::FreeRequested) => EntryAction::FreeRequested,
                Some(AllocAction::FreeCompleted) => EntryAction::FreeCompleted,
                Some(AllocAction::Oom) => EntryAction::Oom,
                Some(segment) => EntryAction::Segment(segment),
                None => EntryAction::Other,
            },
            addr: e.addr,
            size: e.size,
            stream: e.stream,
        })
        .collect()
}

/// The recorded end state of `device` (default pool only: private pools are
/// CUDA-graph memory the model does not simulate).
pub fn final_segments(snap: &Snapshot, device: usize) -> Vec<FinalSegment> {
    snap.segments
        .iter()
        .filter(|s| s.device == device as i64 && s.pool_id == (0, 0))
        .map(|s| FinalSegment {
            address: s.address,
            total_size: s.total_size,
            stream: s.stream,
            is_expandable: s.is_expandable,
            blocks: s
                .blocks
                .iter()
                .map(|b| FinalBlock {
                    address: b.address,
                    size: b.size,
                    requested_size: b.requested_size,
                    state: b.state,
                })
                .collect(),
        })
        .collect()
}

/// The allocator config the snapshot recorded: its `PYTORCH_CUDA_ALLOC_CONF`
/// string, read by the era that wrote it (files with `allocator_settings`
/// come from 2.4 or later; the string is also checked against the recorded
/// `expandable_segments`).
pub fn config(snap: &Snapshot) -> Result<AllocConfig, ConfigError> {
    let Some(settings) = &snap.allocator_settings else {
        return Ok(AllocConfig::default());
    };
    let mut config = AllocConfig::parse_for(&settings.conf, TorchVersion::DEFAULT)
        .or_else(|_| AllocConfig::parse_for(&settings.conf, TorchVersion(10)))?;
    config.expandable_segments |= settings.expandable_segments;
    Ok(config)
}

/// Device ordinals with a non-empty trace.
pub fn traced_devices(snap: &Snapshot) -> Vec<usize> {
    (0..snap.device_traces.len())
        .filter(|d| !snap.device_traces[*d].is_empty())
        .collect()
}

/// `totalGlobalMem` as the trace reveals it: with expandable segments the
/// small-pool reservation starts right after the large one, whose size is
/// `ceil(9/8 · T / page)` pages (allocator.md §8.1).
pub fn infer_device_total(entries: &[Entry], large_page: u64) -> Option<u64> {
    let maps = entries
        .iter()
        .filter(|e| e.action == EntryAction::Segment(AllocAction::SegmentMap));
    let large_base = maps
        .clone()
        .filter(|e| e.size % large_page == 0)
        .map(|e| e.addr)
        .min()?;
    let small_base = maps
        .filter(|e| e.size % large_page != 0 && e.addr > large_base)
        .map(|e| e.addr)
        .min()?;
    let span = small_base - large_base;
    if span % large_page != 0 {
        return None;
    }
    let reservation = |t: u64| (t + t / 8).div_ceil(large_page) * large_page;
    // The largest T whose reservation is at most `span` (reservation grows with T).
    let (mut lo, mut hi) = (0u64, span);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if reservation(mid) <= span {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    (reservation(lo) == span).then_some(lo)
}

/// Everything one device's verify replay needs and found.
#[derive(Debug, Clone)]
pub struct DeviceReplay {
    pub device: usize,
    pub entries: Vec<Entry>,
    pub start: Reconstruction,
    pub device_total: Option<u64>,
    pub outcome: ReplayOutcome,
}

/// Replay every traced device of `snap` under its own settings, starting from
/// the rebuilt state at the first entry (empty for a closed trace).
pub fn verify(snap: &Snapshot) -> Result<Vec<DeviceReplay>, ConfigError> {
    let config = config(snap)?;
    Ok(traced_devices(snap)
        .into_iter()
        .map(|device| {
            let entries = entries(snap, device);
            let finals = final_segments(snap, device);
            let start = initial_state(&entries, &finals, &config);
            let device_total = infer_device_total(&entries, config.large_segment_size);
            let total = device_total.unwrap_or(DEFAULT_DEVICE_TOTAL);
            let outcome =
                Replayer::seeded(config.clone(), total, &start).run(&entries, Some(&finals));
            DeviceReplay {
                device,
                entries,
                start,
                device_total,
                outcome,
            }
        })
        .collect())
}
