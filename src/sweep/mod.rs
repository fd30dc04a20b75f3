//! Batch sweeps: one scenario run at several batch sizes (and sequence
//! lengths), each point a run of its own on a fresh simulated device, run in
//! parallel. `plan` reads the points (flags or the scenario's `sweep:`),
//! `point` runs one and reads what the peak is made of from the run's
//! events, `runner` runs them all and searches the largest batch that fits,
//! `fit` draws a least-squares line of peak against batch, and `explain`
//! says in words what the line's intercept and slope are and where the
//! points leave it.

mod error;
mod explain;
pub mod fit;
mod plan;
mod point;
mod runner;

pub use error::{ListProblem, SweepError};
pub use explain::explain;
pub use fit::{fits, CategoryLine, Fit, Line, Residual, LINEAR_WITHIN};
pub use plan::{parse_list, SweepPlan};
pub use point::{run_point, PeakMoment, SweepPoint};
pub use runner::{
    default_threads, find_max_batch, find_max_batches, run_points, search_max_batch, MaxBatch,
    MAX_SEARCH_BATCH,
};

use std::sync::Mutex;

use serde::Serialize;

use crate::scenario::{Built, Scenario};

/// Everything a sweep found: the report and the UI read this.
#[derive(Debug, Clone, Serialize)]
pub struct Sweep {
    pub scenario: String,
    /// What the allocator may use: the device's memory less its overhead.
    pub capacity: u64,
    pub points: Vec<SweepPoint>,
    /// One fit per sequence length (one in all for a model without one).
    pub fits: Vec<Fit>,
    /// The largest batch that fits at the first sequence length: searched
    /// with `--find-max-batch` (kept for readers of the JSON before
    /// `max_batch_by_seq`).
    pub max_batch: Option<MaxBatch>,
    /// The search's result at every sequence length, in the plan's order
    /// (empty without `--find-max-batch`).
    pub max_batch_by_seq: Vec<MaxBatch>,
    /// What the sweep changed in the scenario to run its points.
    pub notes: Vec<String>,
    /// The fit and the points in words.
    pub explanation: Vec<String>,
    /// What the scenario's `sweep:` section says the sweep shows.
    pub narration: Vec<String>,
}

impl Sweep {
    /// The largest batch among the points that ran without an OOM or an
    /// error, at sequence length `seq`.
    pub fn largest_fitting_point(&self, seq: Option<u64>) -> Option<u64> {
        self.points
            .iter()
            .filter(|p| p.seq == seq && p.fits())
            .map(|p| p.batch)
            .max()
    }
}

impl Sweep {
    /// The sweep's figures from its points (in any order) and the search's
    /// results, one per sequence length: the fits and the words.
    pub fn from_points(
        scenario: &Scenario,
        built: &Built,
        notes: Vec<String>,
        mut points: Vec<SweepPoint>,
        max_batch_by_seq: Vec<MaxBatch>,
    ) -> Sweep {
        points.sort_by_key(|p| (p.seq, p.batch));
        let mut sweep = Sweep {
            scenario: scenario.name.clone(),
            capacity: capacity(built),
            fits: fits(&points),
            points,
            max_batch: max_batch_by_seq.first().cloned(),
            max_batch_by_seq,
            notes,
            explanation: Vec::new(),
            narration: scenario
                .sweep
                .as_ref()
                .map(|s| s.narration.clone())
                .unwrap_or_default(),
        };
        sweep.explanation = explain(&sweep);
        sweep
    }
}

/// What the allocator may use on the scenario's device.
pub fn capacity(built: &Built) -> u64 {
    built
        .engine
        .device_bytes
        .saturating_sub(built.engine.device_overhead)
}

/// The plan's points run on `threads` threads, then the search for the
/// largest batch when `find_max`, at each of the plan's sequence lengths.
pub fn run(
    scenario: &Scenario,
    built: &Built,
    plan: &SweepPlan,
    find_max: bool,
    threads: usize,
) -> Result<Sweep, SweepError> {
    let wanted = plan.points();
    let slots: Mutex<Vec<Option<Result<SweepPoint, SweepError>>>> =
        Mutex::new(vec![None; wanted.len()]);
    run_points(scenario, built, &wanted, threads, &|i, r| {
        if let Ok(mut s) = slots.lock() {
            s[i] = Some(r);
        }
    });
    let results = slots.into_inner().unwrap_or_else(|e| e.into_inner());
    let points = results
        .into_iter()
        .flatten()
        .collect::<Result<Vec<_>, _>>()?;
    let max_batches = if find_max {
        find_max_batches(scenario, built, &plan.seqs, &points, threads)?
    } else {
        Vec::new()
    };
    Ok(Sweep::from_points(
        scenario,
        built,
        plan.notes.clone(),
        points,
        max_batches,
    ))
}

#[cfg(test)]
mod tests;
