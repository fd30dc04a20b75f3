//! One run as the UI holds it: its source, everything received, the cursor,
//! and the per-frame data (`RunFrame`) the views draw.

use super::by_line;
use super::marks::MarkIndex;
use super::views::{event_log, segment_map, stats, timeline};
use crate::alloc::{MemoryStats, Tag};
use crate::device::PciAddress;
use crate::engine::estimate::ComputeEstimate;
use crate::job::nvml_match::{JobPlace, LiveJob};
use crate::leak::Finding;
use crate::producers::{LoadProgress, SnapshotDevices, Source, TagInfo};
use crate::scenario::{Conditions, Listing};
use crate::trace::timeline::KEYFRAME_EVERY;
use crate::trace::{Event, Marker, MemoryMap, Timeline};
use std::collections::HashMap;
use std::sync::Arc;

mod intake;
mod navigation;

/// Data the views draw for one run, rebuilt by `App::prepare`.
#[derive(Debug, Clone, Default)]
pub struct RunFrame {
    pub map: segment_map::MapFrame,
    pub timeline: timeline::TimelineFrame,
    pub stats: stats::StatsFrame,
    pub log: event_log::LogFrame,
    /// The latest narration at or before the cursor, with any said
    /// together with it.
    pub narration: Vec<Arc<str>>,
    /// The latest `Marker::Error` at or before the cursor.
    pub error_marker: Option<Arc<str>>,
    /// The "by Python line" pane, when open.
    pub by_line: by_line::ByLineFrame,
    pub iteration: Option<u32>,
    pub phase: Option<&'static str>,
    /// The code pane's step at the cursor.
    pub code: super::code::CodeFrame,
    /// The presenter's large figures, when its strip is on screen.
    pub big: Vec<super::views::figures::BigFigure>,
}

/// One run: its source, everything received, and where the cursor is.
pub struct RunView {
    pub title: String,
    pub(super) source: Option<Source>,
    pub(super) can_restart: bool,
    pub capacity: Option<u64>,
    /// The simulated device's driver/context overhead, when the run sets one.
    pub overhead: Option<u64>,
    /// The CUDA ordinal of a run on a real GPU (`None`: simulated).
    pub cuda: Option<u32>,
    /// That GPU's PCI address: how the GPU panel finds NVML's reading of it.
    pub cuda_pci: Option<PciAddress>,
    /// NVML's reading of this process right after the GPU was opened.
    pub context_baseline: Option<u64>,
    /// Where a live job runs (`None`: not a live job).
    pub job_place: Option<JobPlace>,
    /// A live job's pid and devices, as its producer last sent them.
    pub job: Option<LiveJob>,
    pub tags: Option<Arc<dyn TagInfo>>,
    /// What a scenario run is under, as its file says.
    pub conditions: Option<Conditions>,
    /// A scenario's program as code, for the code pane.
    pub listing: Option<Arc<Listing>>,
    /// A snapshot's devices, and the one this view shows.
    pub devices: Option<SnapshotDevices>,
    /// A snapshot's figures and live blocks (the table and diff across tabs).
    pub summary: Option<Arc<crate::report::series::SnapshotSummary>>,
    /// The answer at the recorded run's OOM, from its producer.
    pub oom_answer: Option<Box<crate::leak::OomAnswer>>,
    /// A live job's memory at each step over the whole attach.
    pub step_trends: Vec<crate::job::creep::StepTrend>,
    /// Go to the first OOM as soon as the events hold one (after a device
    /// switch that `x` made).
    pub pending_oom: bool,
    /// How far the producer has got reading its file, until it is read.
    /// The last drain left messages in the source (it took its budget).
    /// Lines the leak panel is scrolled down by.
    pub(super) leak_scroll: u16,
    pub(super) backlog: bool,
    pub loading: Option<LoadProgress>,
    /// The producer reads a file (it said how far it had got).
    pub reads_file: bool,
    /// The events so far were placed as if the trace began with nothing
    /// reserved, which the producer can tell only once the file is read.
    pub assumed_empty_start: bool,
    /// The events the run will hold, where the producer knows it up front.
    pub expected_events: Option<usize>,
    pub timeline: Timeline,
    pub findings: Vec<Finding>,
    /// Findings of a live run by the number of events received when they came.
    pub(super) findings_at: Vec<(usize, Vec<Finding>)>,
    /// Each iteration's estimated compute time, from the event count at its end.
    pub compute_at: Vec<(usize, (u32, ComputeEstimate))>,
    /// The engine's `memory_stats()` counters, sent at the end: whole-run
    /// figures (the stats panel says so where it shows one).
    pub stats: Option<MemoryStats>,
    pub finished: bool,
    pub failure: Option<String>,
    /// The source's latest [`JobMsg::Note`](crate::producers::JobMsg) (a live job started over,
    /// or went away); kept across a restart, which it explains.
    pub note: Option<String>,
    /// Where the drawn marks are (kept as events arrive).
    pub marks: MarkIndex,
    /// Events applied: the map shows the state after `pos` events.
    pub pos: usize,
    /// The state after `map_pos` events; kept in step with `pos` by `sync_map`.
    pub map: MemoryMap,
    pub(super) map_pos: usize,
    /// Bumped whenever `map` changes: the key of the caches below.
    pub map_gen: u64,
    /// Map rows for `map_gen` (segments grouped by pool).
    pub(super) spans: (u64, Vec<segment_map::RowSpan>),
    /// Stats for (`map_gen`, events received).
    pub(super) stats_key: Option<(u64, usize)>,
    /// Timeline columns and their key (range, events, size, scale).
    pub(crate) tl_cache: Option<timeline::ColumnCache>,
    pub sel_block: Option<u64>,
    pub sel_finding: Option<usize>,
    /// Lines the event log is scrolled away from the cursor.
    pub log_offset: isize,
    pub map_zoom: u32,
    pub map_scroll_x: usize,
    pub map_scroll_y: usize,
    pub tl_zoom: u32,
    /// Event index the zoomed timeline is centred on.
    pub tl_anchor: usize,
    /// Category index per tag, so describing a tag happens once.
    pub(crate) cat_cache: HashMap<Tag, Option<u8>>,
    /// The "by Python line" pane, when open.
    pub by_line: Option<by_line::ByLine>,
    pub(crate) site_cache: by_line::SiteCache,
    pub(crate) site_events: by_line::SiteEvents,
    pub frame: RunFrame,
}

impl std::fmt::Debug for RunView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunView")
            .field("title", &self.title)
            .field("events", &self.timeline.len())
            .field("pos", &self.pos)
            .field("finished", &self.finished)
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

impl RunView {
    pub fn new(title: impl Into<String>, source: Source) -> RunView {
        RunView {
            title: title.into(),
            can_restart: source.can_restart(),
            capacity: source.capacity,
            overhead: source.overhead,
            cuda: source.cuda,
            cuda_pci: source.cuda_pci,
            context_baseline: None,
            job_place: source.job_place.clone(),
            job: None,
            tags: source.tags.clone(),
            conditions: source.conditions.clone(),
            listing: source.listing.clone(),
            devices: source.devices.clone(),
            summary: None,
            oom_answer: None,
            step_trends: Vec::new(),
            pending_oom: false,
            // A source that reads a file says so from the first frame.
            loading: source
                .reads
                .map(|total| LoadProgress::Reading { done: 0, total }),
            backlog: false,
            leak_scroll: 0,
            reads_file: source.reads.is_some(),
            assumed_empty_start: false,
            expected_events: None,
            source: Some(source),
            timeline: Timeline::new(),
            findings: Vec::new(),
            findings_at: Vec::new(),
            compute_at: Vec::new(),
            stats: None,
            finished: false,
            failure: None,
            note: None,
            marks: MarkIndex::default(),
            pos: 0,
            map: MemoryMap::default(),
            map_pos: 0,
            map_gen: 1,
            spans: (0, Vec::new()),
            stats_key: None,
            tl_cache: None,
            sel_block: None,
            sel_finding: None,
            log_offset: 0,
            map_zoom: 1,
            map_scroll_x: 0,
            map_scroll_y: 0,
            tl_zoom: 1,
            tl_anchor: 0,
            cat_cache: HashMap::new(),
            by_line: None,
            site_cache: by_line::SiteCache::default(),
            site_events: by_line::SiteEvents::default(),
            frame: RunFrame::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.timeline.len()
    }

    pub fn is_empty(&self) -> bool {
        self.timeline.is_empty()
    }

    /// Whether the source may still send events.
    pub fn is_live(&self) -> bool {
        !self.finished && self.failure.is_none()
    }

    /// Index of the last applied event (the cursor event), if any.
    pub fn cursor(&self) -> Option<usize> {
        self.pos.checked_sub(1)
    }

    /// The event of the log's selected line: the cursor's, moved by the
    /// log's scroll.
    pub fn log_selected(&self) -> Option<usize> {
        let last = self.len().checked_sub(1)? as isize;
        let at = self.cursor().unwrap_or(0) as isize + self.log_offset;
        Some(at.clamp(0, last) as usize)
    }

    /// Move the log's selected line by `delta`, within the events.
    pub(super) fn scroll_log(&mut self, delta: isize) {
        let c = self.cursor().unwrap_or(0) as isize;
        let last = self.len().saturating_sub(1) as isize;
        self.log_offset = (c + self.log_offset + delta).clamp(0, last) - c;
    }

    /// Bring `map` to the state after `pos` events: forward by replaying the
    /// events in between when that is no more work than a seek, otherwise
    /// `Timeline::state_at` (nearest keyframe + replay, exact).
    pub fn sync_map(&mut self) {
        self.pos = self.pos.min(self.timeline.len());
        if self.map_pos == self.pos {
            return;
        }
        if self.pos > self.map_pos && self.pos - self.map_pos <= KEYFRAME_EVERY {
            for e in self.timeline.events().range(self.map_pos..self.pos) {
                if let Event::Alloc(a) = e {
                    let _ = self.map.apply(&a);
                }
            }
        } else {
            self.map = self.timeline.state_at(self.cursor());
        }
        self.map_pos = self.pos;
        self.map_gen += 1;
        self.show_findings_at_cursor();
    }

    /// Rows of the map at the cursor (cached per map state).
    pub fn row_spans(&mut self) -> &[segment_map::RowSpan] {
        if self.spans.0 != self.map_gen {
            self.spans = (self.map_gen, segment_map::row_spans(&self.map));
        }
        &self.spans.1
    }

    /// Move the cursor so that event `index` is the last one applied.
    pub fn seek_to_event(&mut self, index: usize) {
        self.pos = (index + 1).min(self.timeline.len());
    }

    pub fn set_pos(&mut self, pos: usize) {
        self.pos = pos.min(self.timeline.len());
    }

    pub(super) fn describe_category(&mut self, tag: Tag) -> Option<u8> {
        if tag == Tag::NONE {
            return None;
        }
        let tags = self.tags.clone();
        *self.cat_cache.entry(tag).or_insert_with(|| {
            tags.and_then(|t| t.describe(tag))
                .and_then(|d| d.category)
                .and_then(super::theme::category_index)
        })
    }

    /// Blocks to highlight: those of the selected "by Python line" line,
    /// else those of the selected finding.
    pub fn highlighted(&self) -> Vec<u64> {
        if let Some(v) = self.site_highlight() {
            return v;
        }
        let mut v = self
            .sel_finding
            .and_then(|i| self.findings.get(i))
            .map(|f| f.blocks.clone())
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    /// Timeline view range `[from, to)` for the current zoom.
    pub fn timeline_range(&self) -> (usize, usize) {
        let len = self.timeline.len();
        let zoom = self.tl_zoom.max(1) as usize;
        if zoom == 1 || len == 0 {
            return (0, len);
        }
        let span = len.div_ceil(zoom).max(16).min(len);
        let start = self.tl_anchor.saturating_sub(span / 2).min(len - span);
        (start, start + span)
    }
}

/// Where `x` stops: OOM entries and error markers are both "where it went
/// wrong", but an OOM whose message (an error marker) follows before the
/// next OOM is one stop, at its message, so the first `x` shows PyTorch's
/// words with the OOM rather than the entry without them.
pub(super) fn oom_stops(oom: &[usize], error: &[usize]) -> Vec<usize> {
    let mut at: Vec<usize> = error.to_vec();
    for (k, &o) in oom.iter().enumerate() {
        let next_oom = oom.get(k + 1).copied().unwrap_or(usize::MAX);
        let said = error[error.partition_point(|e| *e <= o)..]
            .first()
            .is_some_and(|e| *e < next_oom);
        if !said {
            at.push(o);
        }
    }
    at.sort_unstable();
    at
}

/// Narration, error marker, iteration and phase at the cursor, found by
/// binary search in the per-kind mark index (`Timeline::prev_mark` walks
/// back over every mark, which for a rare kind is the whole run).
pub(super) fn prepare_markers(r: &mut RunView) {
    let events = r.timeline.events();
    let upto = r.pos;
    let last = |v: &[usize]| v[..v.partition_point(|i| *i < upto)].last().copied();
    let said = r.said_upto();
    let n = &r.marks.narration;
    r.frame.narration = n[..n.partition_point(|i| *i < said)]
        .last()
        .copied()
        .map(|i| super::narration::moment(events, i))
        .unwrap_or_default();
    r.frame.error_marker = last(&r.marks.error).and_then(|i| match events.get(i) {
        Some(Event::Marker(Marker::Error(t))) => Some(t.clone()),
        _ => None,
    });
    let it = &r.marks.iteration;
    let iter = it[..it.partition_point(|x| x.0 < upto)].last().copied();
    r.frame.iteration = iter.map(|x| x.1);
    let ph = &r.marks.phase;
    // A phase from an earlier iteration is over; show none until the next begins.
    r.frame.phase = ph[..ph.partition_point(|x| x.0 < upto)]
        .last()
        .filter(|p| iter.is_none_or(|i| p.0 > i.0))
        .map(|x| r.marks.phase_name(*x));
}

/// Category per tag of the blocks in the map (described once per tag).
pub(super) fn collect_categories(r: &mut RunView) -> HashMap<Tag, Option<u8>> {
    let tags: Vec<Tag> = r.map.blocks.values().map(|b| b.tag).collect();
    tags.into_iter()
        .map(|t| (t, r.describe_category(t)))
        .collect()
}
