//! One point of a sweep: the scenario run at one batch (and sequence
//! length), and what its peak is made of, read from the run's own events.

use std::collections::BTreeMap;

use serde::Serialize;

use super::error::SweepError;
use crate::alloc::{Action, Tag};
use crate::engine::{Category, TagTable};
use crate::scenario::{at_point, run_observed, Built, RunOptions, Scenario};
use crate::trace::Event;

/// The moment allocated memory peaked: the live blocks by what they hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PeakMoment {
    /// Block bytes by tensor category (`untagged`: requests the engine made
    /// without a tag); they add up to the peak.
    pub by_category: BTreeMap<&'static str, u64>,
    /// What the live blocks' requests asked for; the rest of the peak is
    /// the allocator's rounding.
    pub requested: u64,
    /// The request that reached the peak: its phase, op and module.
    pub phase: Option<&'static str>,
    pub op: Option<String>,
    pub module: Option<String>,
}

impl PeakMoment {
    pub fn category(&self, name: &str) -> u64 {
        self.by_category.get(name).copied().unwrap_or(0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SweepPoint {
    pub batch: u64,
    /// The sequence length the point set; `None`: the scenario's own.
    pub seq: Option<u64>,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub oom: bool,
    /// PyTorch's OOM message.
    pub oom_message: Option<String>,
    /// Any other failure that stopped the run.
    pub error: Option<String>,
    pub iterations_run: u32,
    /// `None` where the run's peak statistic was reset (`ResetPeakStats`),
    /// so the events' own peak is not the one reported.
    pub at_peak: Option<PeakMoment>,
}

impl SweepPoint {
    /// Ran to its end without an OOM or another failure.
    pub fn fits(&self) -> bool {
        !self.oom && self.error.is_none()
    }
}

const UNTAGGED: usize = Category::ALL.len();

/// Live block bytes by category as the events go by, kept at their peak.
#[derive(Debug, Default)]
struct PeakTracker {
    live: [u64; UNTAGGED + 1],
    total: u64,
    requested: u64,
    peak: u64,
    at_peak: [u64; UNTAGGED + 1],
    requested_at_peak: u64,
    peak_tag: Tag,
}

fn slot(tag: Tag) -> usize {
    TagTable::category_of(tag)
        .and_then(|c| Category::ALL.iter().position(|x| *x == c))
        .unwrap_or(UNTAGGED)
}

impl PeakTracker {
    // PyTorch's allocated_bytes counts whole blocks, from the alloc until the
    // free completes (allocator.md §10): the same moments here.
    fn observe(&mut self, events: &[Event]) {
        for e in events {
            let Event::Alloc(a) = e else { continue };
            match a.action {
                Action::Alloc => {
                    self.live[slot(a.tag)] += a.block_size;
                    self.total += a.block_size;
                    self.requested += a.size;
                    if self.total > self.peak {
                        self.peak = self.total;
                        self.at_peak = self.live;
                        self.requested_at_peak = self.requested;
                        self.peak_tag = a.tag;
                    }
                }
                Action::FreeCompleted => {
                    let s = slot(a.tag);
                    self.live[s] = self.live[s].saturating_sub(a.block_size);
                    self.total = self.total.saturating_sub(a.block_size);
                    self.requested = self.requested.saturating_sub(a.size);
                }
                _ => {}
            }
        }
    }

    fn moment(&self, peak_allocated: u64, tags: &TagTable) -> Option<PeakMoment> {
        if self.peak != peak_allocated {
            return None;
        }
        let names = Category::ALL.iter().map(|c| c.name()).chain(["untagged"]);
        let by_category = names
            .zip(self.at_peak)
            .filter(|(_, bytes)| *bytes > 0)
            .collect();
        let info = tags.info(self.peak_tag);
        Some(PeakMoment {
            by_category,
            requested: self.requested_at_peak,
            phase: info.as_ref().map(|i| i.phase.name()),
            op: info.as_ref().map(|i| i.op.to_string()),
            module: info.map(|i| i.module.to_string()),
        })
    }
}

/// The scenario run once at `batch` (and `seq`), start to end, on a fresh
/// simulated device.
pub fn run_point(
    scenario: &Scenario,
    built: &Built,
    batch: u64,
    seq: Option<u64>,
) -> Result<SweepPoint, SweepError> {
    let (s, b) = at_point(scenario, built, batch, seq).map_err(|source| SweepError::Point {
        batch,
        seq,
        source: Box::new(source),
    })?;
    let mut tracker = PeakTracker::default();
    let r = run_observed(&s, &b, &RunOptions::default(), &mut |events| {
        tracker.observe(events)
    });
    Ok(SweepPoint {
        batch,
        seq,
        peak_allocated: r.peak_allocated,
        peak_reserved: r.peak_reserved,
        oom: r.oom.is_some(),
        oom_message: r.oom.map(|o| o.message),
        error: r.error,
        iterations_run: r.iterations_run,
        at_peak: tracker.moment(r.peak_allocated, &r.tags),
    })
}
