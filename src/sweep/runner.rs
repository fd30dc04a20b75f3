//! Running a sweep's points side by side, and the search for the largest
//! batch that fits.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::Serialize;

use super::error::SweepError;
use super::point::{run_point, SweepPoint};
use crate::scenario::{Built, Scenario, MAX_DIM};

/// The search stops doubling here: the largest batch a scenario may name.
pub const MAX_SEARCH_BATCH: u64 = MAX_DIM;

/// Every point in `points` run once, on up to `threads` threads (each point
/// is independent: its own engine and device). `done` hears each point as it
/// finishes, with its index in `points`, in whatever order they finish.
pub fn run_points(
    scenario: &Scenario,
    built: &Built,
    points: &[(u64, Option<u64>)],
    threads: usize,
    done: &(dyn Fn(usize, Result<SweepPoint, SweepError>) + Sync),
) {
    let next = AtomicUsize::new(0);
    let workers = threads.clamp(1, points.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(batch, seq)) = points.get(i) else {
                    break;
                };
                done(i, run_point(scenario, built, batch, seq));
            });
        }
    });
}

/// The threads a sweep uses: one per core.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// What the search for the largest batch found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MaxBatch {
    pub seq: Option<u64>,
    /// The largest batch that ran without an OOM; `None`: not even batch 1.
    pub batch: Option<u64>,
    /// The smallest batch that ran out of memory; `None`: none did up to
    /// [`MAX_SEARCH_BATCH`].
    pub first_oom: Option<u64>,
    /// Runs the search made (doubling, then bisection).
    pub runs: u32,
    /// Points the sweep had already run, read instead of run again.
    pub reused: u32,
    /// Every batch the search looked at, in order, and whether it fit.
    pub tried: Vec<(u64, bool)>,
    /// A failure other than an OOM that stopped the search.
    pub error: Option<String>,
}

/// The largest batch that fits at each of `seqs`, in their order: one
/// [`find_max_batch`] per length, the lengths side by side on up to
/// `threads` threads (each search is a chain of runs, one after another).
/// The first failure, in `seqs`' order, is the result's.
pub fn find_max_batches(
    scenario: &Scenario,
    built: &Built,
    seqs: &[Option<u64>],
    known: &[SweepPoint],
    threads: usize,
) -> Result<Vec<MaxBatch>, SweepError> {
    let next = AtomicUsize::new(0);
    let found: Mutex<Vec<Option<Result<MaxBatch, SweepError>>>> =
        Mutex::new(vec![None; seqs.len()]);
    let workers = threads.clamp(1, seqs.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&seq) = seqs.get(i) else { break };
                let r = find_max_batch(scenario, built, seq, known);
                if let Ok(mut f) = found.lock() {
                    f[i] = Some(r);
                }
            });
        }
    });
    found
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .flatten()
        .collect()
}

/// The largest batch that fits at `seq`: batch 1, 2, 4, … until one runs out
/// of memory, then bisection between the last that fit and the first that
/// did not. Points in `known` (the sweep's own) are read, not rerun.
pub fn find_max_batch(
    scenario: &Scenario,
    built: &Built,
    seq: Option<u64>,
    known: &[SweepPoint],
) -> Result<MaxBatch, SweepError> {
    search_max_batch(seq, known, MAX_SEARCH_BATCH, &mut |b| {
        run_point(scenario, built, b, seq)
    })
}

/// The search of [`find_max_batch`] over any way of running a point (a
/// scenario's, or a traced program's), up to `limit`.
pub fn search_max_batch<E>(
    seq: Option<u64>,
    known: &[SweepPoint],
    limit: u64,
    run: &mut dyn FnMut(u64) -> Result<SweepPoint, E>,
) -> Result<MaxBatch, E> {
    let mut found = MaxBatch {
        seq,
        batch: None,
        first_oom: None,
        runs: 0,
        reused: 0,
        tried: Vec::new(),
        error: None,
    };
    let mut try_batch = |b: u64, found: &mut MaxBatch| -> Result<Option<bool>, E> {
        let point = match known.iter().find(|p| p.batch == b && p.seq == seq) {
            Some(p) => {
                found.reused += 1;
                p.clone()
            }
            None => {
                found.runs += 1;
                run(b)?
            }
        };
        if let Some(e) = &point.error {
            found.error = Some(format!("batch {b}: {e}"));
            return Ok(None);
        }
        found.tried.push((b, !point.oom));
        Ok(Some(!point.oom))
    };
    // Doubling: `lo` fits, `hi` does not.
    let mut lo = 0;
    let mut hi = None;
    let mut b = 1;
    while b <= limit {
        match try_batch(b, &mut found)? {
            None => return Ok(found),
            Some(true) => lo = b,
            Some(false) => {
                hi = Some(b);
                break;
            }
        }
        b *= 2;
    }
    if let Some(mut h) = hi {
        while h - lo > 1 {
            let mid = lo + (h - lo) / 2;
            match try_batch(mid, &mut found)? {
                None => return Ok(found),
                Some(true) => lo = mid,
                Some(false) => h = mid,
            }
        }
        found.first_oom = Some(h);
    }
    found.batch = (lo > 0).then_some(lo);
    Ok(found)
}
