//! What a run view takes from its source: the messages of each producer, in
//! bounded drains between frames, and what a restart or a cut undoes.

use super::RunView;
use crate::engine::estimate::ComputeEstimate;
use crate::producers::{JobMsg, LoadProgress, Polled, RecordedMsg, RunMsg, ScenarioMsg, SourceMsg};
use crate::trace::{MemoryMap, Timeline};
use crate::tui::by_line;
use crate::tui::marks::MarkIndex;
use std::time::Instant;

/// Messages taken from one source per drain, so a flood cannot stall a frame.
const DRAIN_BUDGET: usize = 4096;
/// Events taken per drain, so that a source far ahead of the UI (a large
/// snapshot rebuilt in the background) is taken in steps, with frames
/// drawn and keys answered in between.
const DRAIN_EVENTS: usize = 1 << 18;
/// How often a drain that takes events looks for a pressed key.
const KEY_CHECK: std::time::Duration = std::time::Duration::from_micros(500);

impl RunView {
    /// Take what the source has: events until `until` at most (`None`: no
    /// time limit, only the budgets), or until `key_waiting` says a key was
    /// pressed (asked at most every [`KEY_CHECK`]); true when anything
    /// arrived.
    pub(in crate::tui) fn drain(
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
    pub(in crate::tui) fn receive(&mut self, m: SourceMsg) {
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

    pub(in crate::tui) fn show_findings_at_cursor(&mut self) {
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

    pub(in crate::tui) fn reset(&mut self) {
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
    pub(in crate::tui) fn replayed_nothing_under(&self) -> Option<&crate::alloc::AllocConfig> {
        self.devices
            .as_ref()
            .and_then(|d| d.under.as_ref())
            .filter(|_| self.expected_events == Some(0))
    }

    /// Forget every event after the first `n`, and what was drawn from them.
    pub(in crate::tui) fn keep_first(&mut self, n: usize) {
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
}
