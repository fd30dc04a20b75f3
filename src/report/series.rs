//! `vramscope open a.pickle b.pickle …`: the figures of several snapshots
//! side by side (a series of dumps of one job, or one dump per rank), one
//! row per file and device. The UI's table across tabs draws the same rows.
//!
//! Definitions (the help and README say the same):
//! - reserved / allocated: the dump's segments (`total_size` /
//!   `allocated_size`), as `memory_stats()` counts them;
//! - peak: the most allocated / reserved at any entry of the trace, as the
//!   trace rebuilds the map from the state its first entry found (unknown
//!   without a trace; a wrapped ring only tells its own window);
//! - largest free block: the largest inactive block, a free piece of a
//!   split segment or a whole cached segment: the largest request the cache
//!   could serve without a new `cudaMalloc` (pool and stream aside);
//! - cached free: inactive bytes within reserved, as a share of reserved;
//! - fragmentation: 1 − largest free block / cached free: 0 when the free
//!   bytes are one block, near 1 when they are scattered in small pieces.

use std::fmt::Write;

use serde::Serialize;

use super::diff::LiveSet;
use crate::alloc::{format_size, Action, BlockState};
use crate::trace::mirror::{start_map, TraceMirror};
use crate::trace::replay::from_snapshot::{self, EntryReader};
use crate::trace::replay::reconstruct;
use crate::trace::snapshot::Snapshot;

/// One device's figures at the moment of the dump.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceFigures {
    pub device: i64,
    pub reserved: u64,
    pub allocated: u64,
    /// `None`: the file records no trace for this device.
    pub peak_allocated: Option<u64>,
    pub peak_reserved: Option<u64>,
    pub oom_count: usize,
    /// The first `oom` entry of the trace: its index and time (µs since the
    /// Unix epoch, where recorded).
    pub first_oom_entry: Option<usize>,
    pub first_oom_time_us: Option<i64>,
    pub largest_free_block: u64,
    /// Inactive bytes within reserved.
    pub cached_free: u64,
    /// `cached_free / reserved` (0 with nothing reserved).
    pub cached_free_share: f64,
    /// `1 − largest_free_block / cached_free` (0 with nothing free).
    pub fragmentation: f64,
}

/// What a view of a snapshot keeps of it for the views across files: its
/// figures and its live blocks (for a diff against another file).
#[derive(Debug, Clone, Default)]
pub struct SnapshotSummary {
    pub devices: Vec<DeviceFigures>,
    pub live: LiveSet,
}

impl SnapshotSummary {
    pub fn of(snap: &Snapshot) -> SnapshotSummary {
        SnapshotSummary {
            devices: figures(snap),
            live: LiveSet::of(snap),
        }
    }

    pub fn oom_count(&self) -> usize {
        self.devices.iter().map(|d| d.oom_count).sum()
    }
}

/// Every device the snapshot holds segments or a trace for, in order.
pub fn figures(snap: &Snapshot) -> Vec<DeviceFigures> {
    let mut devices: Vec<i64> = snap.segments.iter().map(|s| s.device).collect();
    devices.extend(
        (0..snap.device_traces.len())
            .filter(|d| !snap.device_traces[*d].is_empty())
            .filter_map(|d| i64::try_from(d).ok()),
    );
    devices.sort_unstable();
    devices.dedup();
    devices
        .into_iter()
        .map(|d| device_figures(snap, d))
        .collect()
}

fn device_figures(snap: &Snapshot, device: i64) -> DeviceFigures {
    let segs = snap.segments.iter().filter(|s| s.device == device);
    let (mut reserved, mut allocated, mut cached_free, mut largest) = (0u64, 0u64, 0u64, 0u64);
    for s in segs {
        // Saturating: sizes come from the file.
        reserved = reserved.saturating_add(s.total_size);
        allocated = allocated.saturating_add(s.allocated_size);
        for b in s.blocks.iter().filter(|b| b.state == BlockState::Inactive) {
            cached_free = cached_free.saturating_add(b.size);
            largest = largest.max(b.size);
        }
    }
    let trace = usize::try_from(device)
        .ok()
        .and_then(|d| snap.device_traces.get(d).map(|t| (d, t)))
        .filter(|(_, t)| !t.is_empty());
    let peak = trace.map(|(d, _)| trace_peak(snap, d));
    let mut ooms = trace
        .into_iter()
        .flat_map(|(_, t)| t.iter().enumerate())
        .filter(|(_, e)| e.action == Action::Oom);
    let first = ooms.next();
    let ratio = |x: u64, of: u64| if of == 0 { 0.0 } else { x as f64 / of as f64 };
    DeviceFigures {
        device,
        reserved,
        allocated,
        peak_allocated: peak.map(|(a, _)| a.max(allocated)),
        peak_reserved: peak.map(|(_, r)| r.max(reserved)),
        oom_count: usize::from(first.is_some()) + ooms.count(),
        first_oom_entry: first.map(|(i, _)| i),
        first_oom_time_us: first.and_then(|(_, e)| e.time_us()),
        largest_free_block: largest,
        cached_free,
        cached_free_share: ratio(cached_free, reserved),
        fragmentation: crate::alloc::fragmentation(largest, cached_free),
    }
}

/// The most allocated and reserved after any entry of `device`'s trace, the
/// map rebuilt as the UI's view rebuilds it (from the state the first entry
/// found, for a trace that began late).
fn trace_peak(snap: &Snapshot, device: usize) -> (u64, u64) {
    let trace = snap
        .device_traces
        .get(device)
        .map_or(&[][..], Vec::as_slice);
    let reader = EntryReader::new(snap, trace);
    let config = from_snapshot::config(snap);
    let finals = from_snapshot::final_segments(snap, device);
    let entries = trace.iter().map(|e| reader.entry(e));
    let start = start_map(&reconstruct::initial_state(entries, &finals, &config));
    let mut peak = (start.allocated, start.reserved);
    let mut mirror = TraceMirror::starting_from(start, &config);
    for (i, e) in trace.iter().enumerate() {
        mirror.event(i, &reader.entry(e), None);
        let m = mirror.map();
        peak = (peak.0.max(m.allocated), peak.1.max(m.reserved));
    }
    peak
}

/// The number a file name gives after `word` (`rank-3`, `rank_12`,
/// `step200`), the last such in the name; directories are not read.
fn number_after(name: &str, word: &str) -> Option<u64> {
    let file = name.rsplit(['/', '\\']).next().unwrap_or(name);
    let lower = file.to_ascii_lowercase();
    let mut found = None;
    for (at, _) in lower.match_indices(word) {
        let rest = &lower[at + word.len()..];
        let rest = rest.strip_prefix(['-', '_', ' ']).unwrap_or(rest);
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(n) = digits.parse() {
            found = Some(n);
        }
    }
    found
}

/// The rank a file name says it holds (`oom_rank-3.pickle`,
/// `snapshot_rank_12.pickle`, `rank3.pickle`), as Megatron-style jobs name
/// their dumps.
pub fn rank_of(name: &str) -> Option<u32> {
    number_after(name, "rank").and_then(|n| u32::try_from(n).ok())
}

/// The training step a file name says it was dumped at
/// (`memory_at_step100.pickle`, `snapshot_step-2000.pickle`).
pub fn step_of(name: &str) -> Option<u64> {
    number_after(name, "step")
}

/// Put `names` in rank order when every one of them names a rank; else
/// leave them as given. Returns whether they were sorted.
pub fn sort_by_rank<T>(items: &mut [T], name: impl Fn(&T) -> &str) -> bool {
    if items.len() < 2 || items.iter().any(|i| rank_of(name(i)).is_none()) {
        return false;
    }
    items.sort_by_key(|i| rank_of(name(i)));
    true
}

/// Rank order where every name says a rank, else step order where every
/// name says a step (a shell's glob puts `step1000` before `step200`), else
/// as given.
pub fn sort_series<T>(items: &mut [T], name: impl Fn(&T) -> &str) {
    if sort_by_rank(items, &name) {
        return;
    }
    if items.len() > 1 && items.iter().all(|i| step_of(name(i)).is_some()) {
        items.sort_by_key(|i| step_of(name(i)));
    }
}

/// One row of the table: a file's device, or why the file gave none.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeriesRow {
    /// `rank N` for a rank file, else the file's name; with ` · cuda:N`
    /// when the file holds several devices.
    pub label: String,
    pub file: String,
    pub rank: Option<u32>,
    #[serde(flatten)]
    pub figures: Option<DeviceFigures>,
    pub error: Option<String>,
}

/// The table across files.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeriesTable {
    pub rows: Vec<SeriesRow>,
    pub definitions: Definitions,
}

/// What each column counts, in the JSON beside the figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Definitions {
    pub peak: &'static str,
    pub largest_free_block: &'static str,
    pub cached_free_share: &'static str,
    pub fragmentation: &'static str,
}

pub const DEFINITIONS: Definitions = Definitions {
    peak: "the most allocated / reserved after any entry of the device's trace (from the state its first entry found); null without a trace",
    largest_free_block: "the largest inactive block: a free piece of a split segment or a whole cached segment",
    cached_free_share: "inactive bytes within reserved / reserved",
    fragmentation: crate::alloc::FRAGMENTATION_DEFINITION,
};

/// One file as the table takes it: its name, and its figures or why not.
pub struct SeriesFile<'a> {
    pub file: &'a str,
    pub figures: Result<&'a [DeviceFigures], &'a str>,
}

impl SeriesTable {
    pub fn new(files: &[SeriesFile<'_>]) -> SeriesTable {
        let mut rows = Vec::new();
        for f in files {
            let rank = rank_of(f.file);
            let name = match rank {
                Some(r) => format!("rank {r}"),
                None => f
                    .file
                    .rsplit(['/', '\\'])
                    .next()
                    .unwrap_or(f.file)
                    .to_string(),
            };
            let row = |label, figures, error| SeriesRow {
                label,
                file: f.file.to_string(),
                rank,
                figures,
                error,
            };
            match f.figures {
                Err(why) => rows.push(row(name, None, Some(why.to_string()))),
                Ok([]) => rows.push(row(name, None, Some("no device in the file".into()))),
                Ok([one]) => rows.push(row(name, Some(one.clone()), None)),
                Ok(many) => rows
                    .extend(many.iter().map(|d| {
                        row(format!("{name} · cuda:{}", d.device), Some(d.clone()), None)
                    })),
            }
        }
        SeriesTable {
            rows,
            definitions: DEFINITIONS,
        }
    }

    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let width = self
            .rows
            .iter()
            .map(|r| r.label.chars().count())
            .max()
            .unwrap_or(4)
            .max(4);
        let _ = writeln!(
            out,
            "{:<width$}  {:>10}  {:>10}  {:>10}  {:>10}  {:<12}  {:>10}  {:>6}  {:>5}",
            "file",
            "reserved",
            "allocated",
            "peak alloc",
            "peak res",
            "OOM",
            "largest free",
            "free",
            "frag"
        );
        for r in &self.rows {
            let Some(f) = &r.figures else {
                let why = r.error.as_deref().unwrap_or("no figures");
                let _ = writeln!(out, "{:<width$}  {why}", r.label);
                continue;
            };
            let peak = |p: Option<u64>| p.map_or_else(|| "unknown".to_string(), format_size);
            let _ = writeln!(
                out,
                "{:<width$}  {:>10}  {:>10}  {:>10}  {:>10}  {:<12}  {:>10}  {:>5.1}%  {:>4.1}%",
                r.label,
                format_size(f.reserved),
                format_size(f.allocated),
                peak(f.peak_allocated),
                peak(f.peak_reserved),
                oom_cell(f),
                format_size(f.largest_free_block),
                f.cached_free_share * 100.0,
                f.fragmentation * 100.0
            );
        }
        let d = &self.definitions;
        let _ = writeln!(out, "\npeak: {}", d.peak);
        let _ = writeln!(out, "largest free: {}", d.largest_free_block);
        let _ = writeln!(out, "free: {}", d.cached_free_share);
        let _ = writeln!(out, "frag: {}", d.fragmentation);
        out
    }
}

/// `no`, or `yes @421` (the first OOM's trace entry) and how many in all.
pub fn oom_cell(f: &DeviceFigures) -> String {
    match (f.oom_count, f.first_oom_entry) {
        (0, _) => "no".to_string(),
        (1, Some(e)) => format!("yes @{e}"),
        (n, Some(e)) => format!("{n}× from @{e}"),
        (n, None) => format!("{n}×"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_read_from_megatron_style_names() {
        assert_eq!(rank_of("oom_rank-3.pickle"), Some(3));
        assert_eq!(rank_of("/runs/step100/snapshot_rank_12.pickle"), Some(12));
        assert_eq!(rank_of("Rank7.pickle"), Some(7));
        assert_eq!(
            rank_of("rank 5 · pid 4242"),
            Some(5),
            "a live rank tab's title"
        );
        assert_eq!(rank_of("frank.pickle"), None);
        assert_eq!(rank_of("memory_at_step100.pickle"), None);
        // The folder's name does not count, only the file's.
        assert_eq!(rank_of("rank-1/memory.pickle"), None);
    }

    #[test]
    fn steps_order_a_series_when_every_name_has_one_and_no_rank() {
        let mut names = vec![
            "memory_at_step1000.pickle",
            "memory_at_step200.pickle",
            "memory_at_step100.pickle",
        ];
        sort_series(&mut names, |n| n);
        assert_eq!(
            names,
            [
                "memory_at_step100.pickle",
                "memory_at_step200.pickle",
                "memory_at_step1000.pickle"
            ]
        );
        let mut mixed = vec!["step300_rank-1.pickle", "step100_rank-0.pickle"];
        sort_series(&mut mixed, |n| n);
        assert_eq!(mixed, ["step100_rank-0.pickle", "step300_rank-1.pickle"]);
        let mut some = vec!["b_step3.pickle", "a.pickle"];
        sort_series(&mut some, |n| n);
        assert_eq!(some, ["b_step3.pickle", "a.pickle"], "as given");
        assert_eq!(step_of("/runs/step100/final.pickle"), None);
    }

    #[test]
    fn rank_sorting_is_numeric_and_only_when_every_name_has_one() {
        let mut names = vec![
            "oom_rank-10.pickle",
            "oom_rank-2.pickle",
            "oom_rank-0.pickle",
        ];
        assert!(sort_by_rank(&mut names, |n| n));
        assert_eq!(
            names,
            [
                "oom_rank-0.pickle",
                "oom_rank-2.pickle",
                "oom_rank-10.pickle"
            ]
        );
        let mut mixed = vec!["b_rank-1.pickle", "a.pickle"];
        assert!(!sort_by_rank(&mut mixed, |n| n));
        assert_eq!(mixed, ["b_rank-1.pickle", "a.pickle"]);
    }

    #[test]
    fn a_table_row_says_why_a_file_has_no_figures() {
        let t = SeriesTable::new(&[SeriesFile {
            file: "x_rank-2.pickle",
            figures: Err("x_rank-2.pickle: not a pickle"),
        }]);
        assert_eq!(t.rows[0].label, "rank 2");
        assert_eq!(
            t.rows[0].error.as_deref(),
            Some("x_rank-2.pickle: not a pickle")
        );
        assert!(t
            .to_text()
            .contains("rank 2  x_rank-2.pickle: not a pickle"));
    }
}
