//! Turn an imported snapshot into replay input: per-device entries, the final
//! segments, the allocator config it ran under, and the device size.

use crate::alloc::{Action, AllocConfig, MemoryStats, TorchVersion};
use std::collections::HashSet;

use crate::trace::snapshot::{
    AllocatorSettings, FrameTable, FramesId, Segment, Snapshot, TraceEntry,
};

use super::reconstruct::{initial_state, Reconstruction};
use super::{Entry, FinalBlock, FinalSegment, ReplayOutcome, Replayer};

/// Device size when neither the user nor the trace tells (an 80 GB-class card).
pub const DEFAULT_DEVICE_TOTAL: u64 = 80 << 30;

/// The trace of `device` as replay entries.
pub fn entries(snap: &Snapshot, device: usize) -> Vec<Entry> {
    let Some(trace) = snap.device_traces.get(device) else {
        return Vec::new();
    };
    let reader = EntryReader::new(snap, trace);
    trace.iter().map(|e| reader.entry(e)).collect()
}

/// Reads a device's trace entries as replay entries, without the snapshot
/// (which a large trace's view lets go before reading them).
#[derive(Debug, Clone, Default)]
pub struct EntryReader {
    /// The stacks of segment releases that show `torch.cuda.empty_cache()`.
    empty_cache: HashSet<FramesId>,
    /// The stacks of the requests before the program's first kernel
    /// ([`BeforeKernels`]).
    before_kernels: HashSet<FramesId>,
}

impl EntryReader {
    pub fn new(snap: &Snapshot, trace: &[TraceEntry]) -> EntryReader {
        let empty_cache = trace
            .iter()
            .filter(|e| releases_segment(e.action))
            .map(|e| e.frames)
            .collect::<HashSet<_>>()
            .into_iter()
            .filter(|id| shows_empty_cache(&snap.frames, *id))
            .collect();
        let mut before = BeforeKernels::default();
        let before_kernels = trace
            .iter()
            .filter(|e| before.read(&snap.frames, e))
            .map(|e| e.frames)
            .collect();
        EntryReader {
            empty_cache,
            before_kernels,
        }
    }

    pub fn entry(&self, e: &TraceEntry) -> Entry {
        Entry {
            action: e.action,
            addr: e.addr,
            size: e.size,
            stream: e.stream,
            in_empty_cache: releases_segment(e.action) && self.empty_cache.contains(&e.frames),
            // A stack seen before the first kernel may come again after it:
            // a what-if reads the flag up to the first request without it.
            before_kernels: self.before_kernels.contains(&e.frames),
        }
    }
}

/// Which requests came before the program's first kernel, read entry by
/// entry as `vramscope trace` tells its device: those under
/// `nn.Module._apply` (a module's `.to()`) or transformers 5.x's loading
/// copies (`is_module_conversion`) before the first request that is not.
/// Stops reading stacks at that request.
#[derive(Debug, Clone, Copy, Default)]
pub struct BeforeKernels {
    started: bool,
}

impl BeforeKernels {
    /// Whether `e` came before the first kernel (frees and segment entries
    /// do not start kernels; they take the flag of the requests around them).
    pub fn read(&mut self, frames: &FrameTable, e: &TraceEntry) -> bool {
        if !self.started && matches!(e.action, Action::Alloc | Action::Oom) {
            self.started = !frames.resolve(e.frames).any(|f| f.is_module_conversion());
        }
        !self.started
    }
}

/// Whether stack `id` passes through `torch.cuda.empty_cache()`.
pub fn shows_empty_cache(frames: &FrameTable, id: FramesId) -> bool {
    frames
        .resolve(id)
        .any(|f| &*f.name == "empty_cache" || f.name.contains("emptyCache"))
}

/// Whether `action` gives a segment (or its pages) back.
pub fn releases_segment(action: Action) -> bool {
    matches!(action, Action::SegmentFree | Action::SegmentUnmap)
}

/// The recorded end state of `device` (default pool only: private pools are
/// CUDA-graph memory the model does not simulate).
pub fn final_segments(snap: &Snapshot, device: usize) -> Vec<FinalSegment> {
    final_segments_in(&snap.segments, device)
}

/// [`final_segments`] of a snapshot's `segments` (read before its traces).
pub fn final_segments_in(segments: &[Segment], device: usize) -> Vec<FinalSegment> {
    segments
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
/// `expandable_segments`). A snapshot does not say its release: the default
/// era is tried first, then the others, newest first, so that a key only a
/// newer release knows (`large_segment_size_mb`, 2.12) is read as that
/// release reads it. A string no modelled release accepts (a release after
/// them) leaves the settings PyTorch recorded beside it, which are the values
/// it ran with.
pub fn config(snap: &Snapshot) -> AllocConfig {
    let Some(settings) = &snap.allocator_settings else {
        return AllocConfig::default();
    };
    // `allocator_settings` is recorded from 2.4 on: older eras need no try.
    let eras = std::iter::once(TorchVersion::DEFAULT).chain(
        (4..=TorchVersion::NEWEST.0)
            .rev()
            .map(TorchVersion)
            .filter(|v| *v != TorchVersion::DEFAULT),
    );
    for era in eras {
        if let Ok(mut config) = AllocConfig::parse_for(&settings.conf, era) {
            config.expandable_segments |= settings.expandable_segments;
            return config;
        }
    }
    recorded_config(settings)
}

/// The settings PyTorch recorded in `allocator_settings`, as a config.
fn recorded_config(settings: &AllocatorSettings) -> AllocConfig {
    let mut config = AllocConfig {
        raw: settings.conf.clone(),
        max_split_size: u64::try_from(settings.max_split_size).unwrap_or(u64::MAX),
        garbage_collection_threshold: settings.garbage_collection_threshold,
        expandable_segments: settings.expandable_segments,
        ..AllocConfig::default()
    };
    for &(start_mib, divisions) in &settings.roundup_power2_divisions {
        if start_mib.is_power_of_two() {
            let i = start_mib.trailing_zeros() as usize;
            if let Some(slot) = config.roundup_power2_divisions.get_mut(i) {
                *slot = divisions;
            }
        }
    }
    config
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
pub fn infer_device_total(
    entries: impl IntoIterator<Item = Entry, IntoIter: Clone>,
    large_page: u64,
) -> Option<u64> {
    let maps = entries
        .into_iter()
        .filter(|e| e.action == Action::SegmentMap);
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
    /// Our allocator's `memory_stats()` at the end of the replay.
    pub stats: MemoryStats,
}

/// Replay every traced device of `snap` under its own settings, starting from
/// the rebuilt state at the first entry (empty for a closed trace).
pub fn verify(snap: &Snapshot) -> Vec<DeviceReplay> {
    verify_with(snap, None)
}

/// [`verify`] for a run that `set_per_process_memory_fraction` held to
/// `allowed` bytes.
pub fn verify_with(snap: &Snapshot, allowed: Option<u64>) -> Vec<DeviceReplay> {
    traced_devices(snap)
        .into_iter()
        .filter_map(|device| verify_device(snap, device, allowed))
        .collect()
}

/// [`verify_with`] for one device; `None` when it has no trace.
pub fn verify_device(snap: &Snapshot, device: usize, allowed: Option<u64>) -> Option<DeviceReplay> {
    let entries = entries(snap, device);
    if entries.is_empty() {
        return None;
    }
    let config = config(snap);
    let finals = final_segments(snap, device);
    let start = initial_state(entries.iter().copied(), &finals, &config);
    let device_total = infer_device_total(entries.iter().copied(), config.large_segment_size);
    let total = device_total.unwrap_or(DEFAULT_DEVICE_TOTAL);
    let mut replayer = Replayer::seeded(config, total, &start).with_allowed_memory(allowed);
    replayer.replay(&entries, Some(&finals));
    let stats = replayer.allocator().stats().clone();
    Some(DeviceReplay {
        device,
        entries,
        start,
        device_total,
        outcome: replayer.into_outcome(),
        stats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::constants::MIB;
    use crate::trace::snapshot::{EntryExtras, FrameTable, Layout};

    fn with_settings(conf: &str, max_split_size: i64, divisions: Vec<(u64, u64)>) -> Snapshot {
        Snapshot {
            segments: Vec::new(),
            device_traces: Vec::new(),
            allocator_settings: Some(AllocatorSettings {
                conf: conf.to_string(),
                max_split_size,
                garbage_collection_threshold: 0.0,
                expandable_segments: false,
                roundup_power2_divisions: divisions,
                other: Vec::new(),
            }),
            external_annotations: Vec::new(),
            layout: Layout::CurrentDict,
            frames: FrameTable::default(),
            entry_extras: EntryExtras::default(),
        }
    }

    #[test]
    fn a_key_of_a_newer_release_is_read_as_that_release_reads_it() {
        // `large_segment_size_mb` exists from 2.12; the default era (2.8) rejects it.
        assert!(AllocConfig::parse("large_segment_size_mb:40").is_err());
        let c = config(&with_settings("large_segment_size_mb:40", -1, Vec::new()));
        assert_eq!(c.large_segment_size, 40 * MIB);
        assert!(c.version.has_large_segment_size(), "{}", c.version);
        let c = config(&with_settings(
            "max_split_size_mb:200",
            200 * MIB as i64,
            Vec::new(),
        ));
        assert_eq!(
            (c.max_split_size, c.version),
            (200 * MIB, TorchVersion::DEFAULT)
        );
    }

    #[test]
    fn a_string_no_release_accepts_leaves_the_recorded_values() {
        let c = config(&with_settings(
            "a_future_key:3,max_split_size_mb:64",
            64 * MIB as i64,
            vec![(1, 0), (256, 4), (512, 8)],
        ));
        assert_eq!(c.max_split_size, 64 * MIB);
        assert_eq!(c.roundup_power2_divisions[8], 4);
        assert_eq!(c.roundup_power2_divisions[9], 8);
        assert_eq!(c.roundup_power2_divisions[0], 0);
        assert_eq!(c.raw, "a_future_key:3,max_split_size_mb:64");
    }
}
