//! One run as the UI holds it: its source, everything received, the cursor,
//! and the per-frame data (`RunFrame`) the views draw.

use super::by_line;
use super::input::{Dir, Jump};
use super::marks::MarkIndex;
use super::views::{event_log, segment_map, stats, timeline};
use crate::alloc::{MemoryStats, Tag};
use crate::device::PciAddress;
use crate::engine::estimate::ComputeEstimate;
use crate::job::nvml_match::{JobPlace, LiveJob};
use crate::leak::Finding;
use crate::producers::{
    JobMsg, LoadProgress, Polled, RecordedMsg, RunMsg, ScenarioMsg, SnapshotDevices, Source,
    SourceMsg, TagInfo,
};
use crate::scenario::{Conditions, Listing};
use crate::trace::timeline::KEYFRAME_EVERY;
use crate::trace::{Event, MarkKind, Marker, MemoryMap, Timeline};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// Messages taken from one source per drain, so a flood cannot stall a frame.
const DRAIN_BUDGET: usize = 4096;
/// Events taken per drain, so that a source far ahead of the UI (a large
/// snapshot rebuilt in the background) is taken in steps, with frames
/// drawn and keys answered in between.
const DRAIN_EVENTS: usize = 1 << 18;
/// How often a drain that takes events looks for a pressed key.
const KEY_CHECK: std::time::Duration = std::time::Duration::from_micros(500);

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

    /// Take what the source has: events until `until` at most (`None`: no
    /// time limit, only the budgets), or until `key_waiting` says a key was
    /// pressed (asked at most every [`KEY_CHECK`]); true when anything
    /// arrived.
    pub(super) fn drain(
        &mut self,
        until: Option<Instant>,
        key_waiting: &mut dyn FnMut() -> bool,
    ) -> bool {
        let mut changed = false;
        let mut events = 0;
        // The first look comes right after the first events.
        let mut asked = Instant::now()
            .checked_sub(KEY_CHECK)
            .unwrap_or_else(Instant::now);
        // Only a drain that stops at its budget leaves messages waiting.
        self.backlog = false;
        for taken in 0.. {
            let stop = events >= DRAIN_EVENTS
                || taken >= DRAIN_BUDGET
                || (events > 0 && {
                    let now = Instant::now();
                    until.is_some_and(|u| now >= u)
                        || (now >= asked + KEY_CHECK && {
                            asked = now;
                            key_waiting()
                        })
                });
            if stop {
                self.backlog = true;
                break;
            }
            let Some(src) = &self.source else { break };
            match src.poll() {
                Polled::Msg(m) => {
                    match &m {
                        SourceMsg::Run(RunMsg::Events(e)) => events += e.len(),
                        SourceMsg::Run(RunMsg::Part(p)) => events += p.events.len(),
                        _ => {}
                    }
                    self.receive(m);
                    changed = true;
                }
                Polled::Empty => break,
                Polled::Closed => {
                    if self.is_live() {
                        // A producer that vanishes without saying why is a
                        // failure to show, not a reason to wait forever.
                        self.failure =
                            Some("the event source closed before the run finished".into());
                    }
                    if !self.can_restart {
                        self.source = None;
                    }
                    changed = true;
                    break;
                }
            }
        }
        changed
    }

    /// One message: the run view takes every producer's group but a
    /// sweep's (the sweep chart's) and NVML's (the GPU panel's own source).
    pub(super) fn receive(&mut self, m: SourceMsg) {
        match m {
            SourceMsg::Run(m) => self.run_msg(m),
            SourceMsg::Scenario(m) => self.scenario_msg(m),
            SourceMsg::Recorded(m) => self.recorded_msg(m),
            SourceMsg::Job(m) => self.job_msg(m),
            SourceMsg::Gpus(_) | SourceMsg::Sweep(_) => {}
        }
    }

    fn run_msg(&mut self, m: RunMsg) {
        match m {
            RunMsg::Start(map) => {
                if self.timeline.is_empty() {
                    self.timeline = Timeline::starting_from(*map);
                    self.map = self.timeline.state_at(None);
                    self.map_pos = 0;
                    self.map_gen += 1;
                }
            }
            RunMsg::Events(events) => {
                self.timeline.extend(events);
                self.marks.update(&self.timeline);
            }
            RunMsg::Part(mut part) => {
                self.timeline.extend_part(&mut part);
                self.marks.update(&self.timeline);
                if let Some(source) = &self.source {
                    source.give_back(part);
                }
            }
            RunMsg::Findings(f) => {
                self.findings = f;
                if self.sel_finding.is_some_and(|i| i >= self.findings.len()) {
                    self.sel_finding = None;
                }
            }
            RunMsg::FindingsNow(f) => {
                self.findings_at.push((self.timeline.len(), f));
                self.show_findings_at_cursor();
            }
            RunMsg::Stats(s) => {
                self.stats = Some(*s);
                // The stats panel shows the run's retry count from these.
                self.stats_key = None;
            }
            RunMsg::Restarted => self.reset(),
            RunMsg::KeepFirst(n) => self.keep_first(n),
            RunMsg::Finished => {
                self.finished = true;
                self.loading = None;
            }
            RunMsg::Failed(msg) => {
                self.failure = Some(msg);
                self.loading = None;
            }
        }
    }

    fn scenario_msg(&mut self, m: ScenarioMsg) {
        match m {
            ScenarioMsg::Compute(c) => {
                self.compute_at.push((self.timeline.len(), *c));
                // The Stats panel shows it: no new event or cursor move
                // need come with it to redraw the panel.
                self.stats_key = None;
            }
            ScenarioMsg::ContextBaseline(b) => self.context_baseline = b,
        }
    }

    fn recorded_msg(&mut self, m: RecordedMsg) {
        match m {
            RecordedMsg::Loading(p) => {
                let LoadProgress::Reading { done, total } = p;
                // The last word of a reading says all of the file was read.
                self.loading = (total == 0 || done < total).then_some(p);
                self.reads_file = true;
            }
            RecordedMsg::Summary(s) => self.summary = Some(s),
            RecordedMsg::OomAnswer(a) => self.oom_answer = Some(a),
            RecordedMsg::Opened(o) => {
                self.assumed_empty_start = o.assumed_empty_start;
                self.tags = o.tags;
                self.capacity = o.capacity;
                self.devices = Some(o.devices);
                self.expected_events = o.events;
                // A what-if with no trace replayed nothing: said first in
                // every title, where even a narrow pane shows it.
                const NOTHING_REPLAYED: &str = "no trace, recorded state · ";
                if self.replayed_nothing_under().is_some()
                    && !self.title.starts_with(NOTHING_REPLAYED)
                {
                    self.title = format!("{NOTHING_REPLAYED}{}", self.title);
                }
                if o.since_step && self.by_line.is_none() {
                    self.by_line = Some(by_line::ByLine {
                        since_step: true,
                        ..by_line::ByLine::default()
                    });
                }
            }
        }
    }

    fn job_msg(&mut self, m: JobMsg) {
        match m {
            JobMsg::Note(n) => self.note = Some(n),
            JobMsg::StepTrends(t) => {
                self.step_trends = t;
                self.stats_key = None;
            }
            JobMsg::Place(j) => self.job = Some(*j),
        }
    }

    /// A live run's leak panel shows what the detector knew at the cursor.
    /// The estimate of the last iteration that ended at or before the cursor.
    pub fn compute_at_cursor(&self) -> Option<&(u32, ComputeEstimate)> {
        let k = self.compute_at.partition_point(|(at, _)| *at <= self.pos);
        k.checked_sub(1).map(|k| &self.compute_at[k].1)
    }

    pub(super) fn show_findings_at_cursor(&mut self) {
        if self.findings_at.is_empty() {
            return;
        }
        let k = self.findings_at.partition_point(|(at, _)| *at <= self.pos);
        self.findings = k
            .checked_sub(1)
            .map(|k| self.findings_at[k].1.clone())
            .unwrap_or_default();
        if self.sel_finding.is_some_and(|i| i >= self.findings.len()) {
            self.sel_finding = None;
        }
    }

    pub(super) fn reset(&mut self) {
        self.timeline = Timeline::new();
        self.findings.clear();
        self.findings_at.clear();
        self.oom_answer = None;
        self.compute_at.clear();
        self.stats = None;
        self.finished = false;
        self.failure = None;
        self.marks = MarkIndex::default();
        self.pos = 0;
        self.map = MemoryMap::default();
        self.map_pos = 0;
        self.map_gen += 1;
        self.tl_cache = None;
        self.sel_block = None;
        self.sel_finding = None;
        self.cat_cache.clear();
        self.site_events = by_line::SiteEvents::default();
    }

    /// The config a what-if was to replay under, when the file had no
    /// trace to replay (its view is the recorded state).
    pub(super) fn replayed_nothing_under(&self) -> Option<&crate::alloc::AllocConfig> {
        self.devices
            .as_ref()
            .and_then(|d| d.under.as_ref())
            .filter(|_| self.expected_events == Some(0))
    }

    /// Forget every event after the first `n`, and what was drawn from them.
    pub(super) fn keep_first(&mut self, n: usize) {
        if n >= self.timeline.len() {
            return;
        }
        self.timeline.truncate(n);
        self.findings_at.retain(|(at, _)| *at <= n);
        self.compute_at.retain(|(at, _)| *at <= n);
        self.finished = false;
        self.marks = MarkIndex::default();
        self.marks.update(&self.timeline);
        self.pos = self.pos.min(n);
        self.map = self.timeline.state_at(self.pos.checked_sub(1));
        self.map_pos = self.pos;
        self.map_gen += 1;
        self.tl_cache = None;
        self.sel_block = None;
        self.cat_cache.clear();
        self.site_events = by_line::SiteEvents::default();
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

    pub(super) fn jump(&mut self, jump: Jump, dir: Dir) -> bool {
        let before = self.pos;
        let kind = match jump {
            Jump::Event => {
                self.pos = match dir {
                    Dir::Fwd => (self.pos + 1).min(self.len()),
                    Dir::Back => self.pos.saturating_sub(1),
                };
                return self.pos != before;
            }
            Jump::Leak => return self.jump_leak(dir).is_ok(),
            // Iterations and phases step from begin to begin.
            Jump::Phase => {
                let begins: Vec<usize> = self.marks.phase.iter().map(|x| x.0).collect();
                return self.step_in(&begins, dir);
            }
            Jump::Iteration => {
                let begins: Vec<usize> = self.marks.iteration.iter().map(|x| x.0).collect();
                return self.step_in(&begins, dir);
            }
            Jump::Narration => {
                // What is said before any event is said at the start (`g`).
                let lead = self.with_moment(0);
                let n = &self.marks.narration;
                let at = n[n.partition_point(|i| *i < lead)..].to_vec();
                return self.step_in(&at, dir);
            }
            Jump::Oom => {
                let at = oom_stops(&self.marks.oom, &self.marks.error);
                return self.step_in(&at, dir);
            }
            Jump::Op => MarkKind::Op,
        };
        if let Some(i) = self.mark_from_cursor(kind, dir) {
            self.land_on(i);
        }
        self.pos != before
    }

    /// Move to the next/previous index of `sorted` relative to the cursor
    /// (back: relative to the moment the cursor's narration belongs to).
    pub(super) fn step_in(&mut self, sorted: &[usize], dir: Dir) -> bool {
        let target = match (dir, self.cursor()) {
            (Dir::Fwd, None) => sorted.first().copied(),
            (Dir::Fwd, Some(c)) => sorted.get(sorted.partition_point(|i| *i <= c)).copied(),
            (Dir::Back, _) => self
                .moment_start()
                .and_then(|c| sorted[..sorted.partition_point(|i| *i < c)].last().copied()),
        };
        target.is_some_and(|i| {
            self.land_on(i);
            true
        })
    }

    /// The cursor on event `index` and the narration said with it.
    fn land_on(&mut self, index: usize) {
        self.pos = self.with_moment(index + 1);
    }

    pub(super) fn mark_from_cursor(&self, kind: MarkKind, dir: Dir) -> Option<usize> {
        match (dir, self.cursor()) {
            (Dir::Fwd, None) => self
                .timeline
                .marks()
                .iter()
                .find(|(_, k)| *k == kind)
                .map(|(i, _)| *i),
            (Dir::Fwd, Some(c)) => self.timeline.next_mark(c, kind),
            (Dir::Back, _) => self
                .moment_start()
                .and_then(|c| self.timeline.prev_mark(c, kind)),
        }
    }

    /// Select the next / previous block, in map order, that a leak holds
    /// at the cursor (the selected finding's, or every leak's). Either way
    /// the text is for the notice line: which one of how many, or why none.
    pub(super) fn jump_leak(&mut self, dir: Dir) -> Result<String, String> {
        self.sync_map();
        let selected = self.sel_finding.and_then(|i| self.findings.get(i)).cloned();
        let mut held: Vec<u64> = match &selected {
            Some(f) => f.blocks.clone(),
            None => self
                .findings
                .iter()
                .filter(|f| f.kind.is_leak())
                .flat_map(|f| f.blocks.iter().copied())
                .collect(),
        };
        held.sort_unstable();
        let spans = self.row_spans().to_vec();
        let leaked: Vec<u64> = segment_map::block_order(&self.map, &spans)
            .into_iter()
            .filter(|a| held.binary_search(a).is_ok())
            .collect();
        if leaked.is_empty() {
            return Err(
                match (selected, self.findings.iter().any(|f| f.kind.is_leak())) {
                    (Some(f), _) => format!("f: `{}` holds no block at this moment", f.root),
                    (None, true) => "f: no leaked block is in the map at this moment".into(),
                    (None, false) => "f: no leak found up to this moment".into(),
                },
            );
        }
        let at = self
            .sel_block
            .and_then(|a| leaked.iter().position(|b| *b == a));
        let next = match (dir, at) {
            (Dir::Fwd, None) => Some(0),
            (Dir::Back, None) => Some(leaked.len() - 1),
            (Dir::Fwd, Some(i)) => (i + 1 < leaked.len()).then_some(i + 1),
            (Dir::Back, Some(i)) => i.checked_sub(1),
        };
        let n = leaked.len();
        match next {
            Some(i) => {
                self.sel_block = Some(leaked[i]);
                Ok(format!(
                    "leaked block {} of {n} (f next, F previous)",
                    i + 1
                ))
            }
            None if dir == Dir::Fwd => {
                Err(format!("f: the last of {n} leaked blocks (F goes back)"))
            }
            None => Err(format!("F: the first of {n} leaked blocks (f goes on)")),
        }
    }

    /// The iteration around the cursor and how far into it, for syncing.
    pub(super) fn iteration_position(&self) -> Option<(u32, f64)> {
        let c = self.cursor()?;
        let events = self.timeline.events();
        let begin = std::iter::once(c)
            .chain(std::iter::successors(
                self.timeline.prev_mark(c, MarkKind::Iteration),
                |&i| self.timeline.prev_mark(i, MarkKind::Iteration),
            ))
            .find(|&i| {
                matches!(
                    events.get(i),
                    Some(Event::Marker(Marker::IterationBegin(_)))
                )
            })?;
        let Some(Event::Marker(Marker::IterationBegin(k))) = events.get(begin) else {
            return None;
        };
        let end = self
            .timeline
            .next_mark(begin, MarkKind::Iteration)
            .unwrap_or(events.len());
        let span = (end - begin).max(1) as f64;
        Some((k, (c - begin) as f64 / span))
    }

    pub(super) fn iteration_bounds(&self, k: u32) -> Option<(usize, usize)> {
        let begin = self.marks.iteration_begin(k)?;
        let end = self
            .timeline
            .next_mark(begin, MarkKind::Iteration)
            .unwrap_or(self.timeline.len());
        Some((begin, end))
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
