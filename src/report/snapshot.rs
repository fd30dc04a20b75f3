//! `vramscope open --headless`: what an imported snapshot holds, per device.

use std::fmt::Write;
use std::sync::Arc;

use serde::Serialize;

use crate::alloc::{format_size, BlockState};
use crate::leak::{analyze_snapshot_with, Boundaries, SnapshotLeakReport};
use crate::trace::sites::{group_by_site, NO_STACK};
use crate::trace::snapshot::{Action, PoolKind, Snapshot};
use crate::units::format_count;

/// Live bytes grouped by the first user frame of their allocation stack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CallSite {
    /// `file:line in function`, or `(no stack recorded)`.
    pub site: String,
    pub bytes: u64,
    pub blocks: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OomEntry {
    pub entry: usize,
    pub size: u64,
    pub device_free: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StateCount {
    pub blocks: usize,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceReport {
    pub device: i64,
    pub reserved: u64,
    pub allocated: u64,
    pub active: u64,
    pub segments: usize,
    pub large_segments: usize,
    pub small_segments: usize,
    pub expandable_segments: usize,
    pub private_pool_segments: usize,
    pub active_allocated: StateCount,
    pub active_pending_free: StateCount,
    pub inactive: StateCount,
    pub largest_free_block: u64,
    /// [`crate::alloc::fragmentation`]: 1 − largest free block / cached free bytes.
    pub fragmentation: f64,
    /// Cached free (inactive) bytes / reserved bytes.
    pub cached_free_share: f64,
    pub trace_entries: usize,
    pub top_allocations: Vec<CallSite>,
    /// OOM entries of the trace: all of them counted, the first
    /// [`LISTED`] listed (a crafted file can repeat one millions of times).
    pub oom_count: usize,
    pub ooms: Vec<OomEntry>,
    /// What the trace says about memory surviving iterations (devices with a trace).
    pub leaks: Option<SnapshotLeakReport>,
    /// At the trace's last OOM: the lines that held the memory, what grew,
    /// and whether `empty_cache()` or expandable segments would have let
    /// the request fit (the trace's requests replayed).
    pub oom_answer: Option<crate::leak::OomAnswer>,
}

/// [`SnapshotReport::layout`] of a live job's report (`attach`): it came
/// from a stream, not a file of some layout.
pub const LIVE_LAYOUT: &str = "Live";

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SnapshotReport {
    pub file: String,
    pub layout: String,
    pub alloc_conf: Option<String>,
    pub devices: Vec<DeviceReport>,
}

const TOP: usize = 10;
/// Entries a report lists of a kind that a file can repeat without bound.
pub const LISTED: usize = 100;
/// Of those, the lines the text shows.
const TEXT_LISTED: usize = 10;

impl SnapshotReport {
    pub fn new(file: &str, snap: &Snapshot) -> SnapshotReport {
        Self::with_step_marker(file, snap, None)
    }

    /// The report, with iteration boundaries taken from `step_marker` (a
    /// substring of an annotation or frame) when given.
    pub fn with_step_marker(
        file: &str,
        snap: &Snapshot,
        step_marker: Option<&str>,
    ) -> SnapshotReport {
        Self::with_boundaries(file, snap, &|_| Boundaries::Find { step_marker })
    }

    /// The report, with each device's iteration boundaries from
    /// `boundaries(device)` (a live job's exact steps).
    pub fn with_boundaries<'m>(
        file: &str,
        snap: &Snapshot,
        boundaries: &dyn Fn(usize) -> Boundaries<'m>,
    ) -> SnapshotReport {
        let mut devices: Vec<i64> = snap.segments.iter().map(|s| s.device).collect();
        devices.extend(
            (0..snap.device_traces.len())
                .filter(|d| !snap.device_traces[*d].is_empty())
                .map(|d| d as i64),
        );
        devices.sort_unstable();
        devices.dedup();
        SnapshotReport {
            file: file.to_string(),
            layout: format!("{:?}", snap.layout),
            alloc_conf: snap.allocator_settings.as_ref().map(|s| s.conf.clone()),
            devices: devices
                .into_iter()
                .map(|d| device_report(snap, d, boundaries))
                .collect(),
        }
    }

    pub fn to_text(&self) -> String {
        let mut out = String::new();
        if self.layout == LIVE_LAYOUT {
            let _ = writeln!(out, "{} (a live job's stream)", self.file);
        } else {
            let _ = writeln!(out, "{} ({} layout)", self.file, self.layout);
        }
        if let Some(conf) = &self.alloc_conf {
            let _ = writeln!(out, "PYTORCH_CUDA_ALLOC_CONF=\"{conf}\"");
        }
        for d in &self.devices {
            let _ = writeln!(out, "\n== device {} ==", d.device);
            let _ = writeln!(
                out,
                "reserved {}  allocated {}  active {}  cached free {:.1}% of reserved",
                format_size(d.reserved),
                format_size(d.allocated),
                format_size(d.active),
                d.cached_free_share * 100.0
            );
            let _ = writeln!(
                out,
                "segments {} (large {}, small {}, expandable {}, in private pools {})",
                d.segments,
                d.large_segments,
                d.small_segments,
                d.expandable_segments,
                d.private_pool_segments
            );
            for (name, c) in [
                ("active_allocated", &d.active_allocated),
                ("active_pending_free", &d.active_pending_free),
                ("inactive", &d.inactive),
            ] {
                let _ = writeln!(
                    out,
                    "  {name:<20} {:>7} blocks {:>12}",
                    c.blocks,
                    format_size(c.bytes)
                );
            }
            let _ = writeln!(
                out,
                "largest free block {}  fragmentation {:.1}% ({})",
                format_size(d.largest_free_block),
                d.fragmentation * 100.0,
                crate::alloc::FRAGMENTATION_DEFINITION
            );
            let _ = writeln!(out, "trace entries {}", d.trace_entries);
            if !d.top_allocations.is_empty() {
                let _ = writeln!(out, "biggest live allocations by first user frame:");
                for c in &d.top_allocations {
                    let _ = writeln!(
                        out,
                        "  {:>12} in {:>5} block{}  {}",
                        format_size(c.bytes),
                        c.blocks,
                        if c.blocks == 1 { " " } else { "s" },
                        c.site
                    );
                }
            }
            if let Some(l) = &d.leaks {
                let _ = writeln!(out, "leaks (from the trace alone):");
                for f in &l.findings {
                    let _ = writeln!(
                        out,
                        "  [{}] {} — {} per iteration over {} {}; {}",
                        f.severity.as_str(),
                        f.root,
                        format_size(f.growth_per_iter.max(0) as u64),
                        f.iterations,
                        if f.iterations == 1 {
                            "iteration"
                        } else {
                            "iterations"
                        },
                        f.evidence
                    );
                }
                let _ = writeln!(out, "  {}", l.conclusion);
            }
            for o in d.ooms.iter().take(TEXT_LISTED) {
                let free = o.device_free.map_or("unknown".to_string(), format_size);
                let _ = writeln!(
                    out,
                    "OOM at entry {}: {} requested, {} free on the device",
                    o.entry,
                    format_size(o.size),
                    free
                );
            }
            if d.oom_count > TEXT_LISTED {
                let _ = writeln!(
                    out,
                    "… and {} more OOM entries ({} OOMs in all; the JSON report lists the first {LISTED})",
                    format_count((d.oom_count - TEXT_LISTED) as u64),
                    format_count(d.oom_count as u64)
                );
            }
            if let Some(a) = &d.oom_answer {
                for line in a.lines() {
                    let _ = writeln!(out, "  {line}");
                }
            }
        }
        out
    }
}

fn saturating_sum(values: impl Iterator<Item = u64>) -> u64 {
    values.fold(0, u64::saturating_add)
}

fn device_report<'m>(
    snap: &Snapshot,
    device: i64,
    boundaries: &dyn Fn(usize) -> Boundaries<'m>,
) -> DeviceReport {
    let segs: Vec<_> = snap
        .segments
        .iter()
        .filter(|s| s.device == device)
        .collect();
    let mut r = DeviceReport {
        device,
        // Saturating: sizes come from the file.
        reserved: saturating_sum(segs.iter().map(|s| s.total_size)),
        allocated: saturating_sum(segs.iter().map(|s| s.allocated_size)),
        active: saturating_sum(segs.iter().map(|s| s.active_size)),
        segments: segs.len(),
        large_segments: segs
            .iter()
            .filter(|s| s.segment_type == PoolKind::Large)
            .count(),
        small_segments: segs
            .iter()
            .filter(|s| s.segment_type == PoolKind::Small)
            .count(),
        expandable_segments: segs.iter().filter(|s| s.is_expandable).count(),
        private_pool_segments: segs.iter().filter(|s| s.pool_id != (0, 0)).count(),
        active_allocated: StateCount::default(),
        active_pending_free: StateCount::default(),
        inactive: StateCount::default(),
        largest_free_block: 0,
        fragmentation: 0.0,
        cached_free_share: 0.0,
        trace_entries: 0,
        top_allocations: Vec::new(),
        oom_count: 0,
        ooms: Vec::new(),
        leaks: None,
        oom_answer: None,
    };
    let mut live = Vec::new();
    for b in segs.iter().flat_map(|s| s.blocks.iter()) {
        let count = match b.state {
            BlockState::ActiveAllocated => &mut r.active_allocated,
            BlockState::ActivePendingFree => &mut r.active_pending_free,
            BlockState::Inactive => &mut r.inactive,
        };
        count.blocks += 1;
        count.bytes = count.bytes.saturating_add(b.size);
        if b.state == BlockState::Inactive {
            r.largest_free_block = r.largest_free_block.max(b.size);
        } else {
            let site = snap.user_site(b.frames).map(Arc::from);
            live.push((b.address, b.size, site));
        }
    }
    if r.reserved > 0 {
        r.cached_free_share = r.inactive.bytes as f64 / r.reserved as f64;
    }
    r.fragmentation = crate::alloc::fragmentation(r.largest_free_block, r.inactive.bytes);
    r.top_allocations = group_by_site(live, NO_STACK)
        .into_iter()
        .take(TOP)
        .map(|g| CallSite {
            site: g.site.to_string(),
            bytes: g.bytes,
            blocks: g.blocks.len(),
        })
        .collect();
    if let Some((d, trace)) = usize::try_from(device)
        .ok()
        .and_then(|d| snap.device_traces.get(d).map(|t| (d, t)))
    {
        r.trace_entries = trace.len();
        if !trace.is_empty() {
            r.leaks = Some(analyze_snapshot_with(snap, d, boundaries(d)));
        }
        let mut ooms = trace
            .iter()
            .enumerate()
            .filter(|(_, e)| e.action == Action::Oom);
        r.ooms = ooms
            .by_ref()
            .take(LISTED)
            .map(|(entry, e)| OomEntry {
                entry,
                size: e.size,
                device_free: snap.device_free(e),
            })
            .collect();
        r.oom_count = r.ooms.len() + ooms.count();
        if r.oom_count > 0 {
            r.oom_answer = crate::leak::answer_trace_oom(snap, d, r.leaks.as_ref());
        }
    }
    r
}
