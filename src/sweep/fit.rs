//! A least-squares line of peak memory against batch size, for allocated
//! and reserved, and one per tensor category at the peak, so the line's
//! intercept and slope can be broken down into what the engine allocated.

use std::collections::BTreeSet;

use serde::Serialize;

use super::point::{PeakMoment, SweepPoint};
pub use crate::least_squares::{least_squares, Line};

/// A sweep is called linear when every point lies within this fraction of
/// its own peak from the line.
pub const LINEAR_WITHIN: f64 = 0.01;

/// A point's distance from the allocated line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Residual {
    pub batch: u64,
    /// What the line gives at this batch.
    pub predicted: f64,
    /// Measured minus the line, in bytes.
    pub bytes: f64,
    /// `bytes` as a fraction of the point's peak.
    pub relative: f64,
}

/// One category's bytes at the peak, fitted against batch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CategoryLine {
    /// A tensor category (`parameter`, `activation`, …), or `rounding`.
    pub category: String,
    pub line: Line,
    /// The category's own bytes at each fitted point, in batch order.
    pub values: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fit {
    pub seq: Option<u64>,
    /// The batches fitted (those that ran to the end), ascending.
    pub batches: Vec<u64>,
    /// Batches left out: they ran out of memory or failed.
    pub left_out: Vec<u64>,
    pub allocated: Line,
    pub reserved: Line,
    pub residuals: Vec<Residual>,
    /// Reserved's largest distance from its line, as a fraction of the point's peak.
    pub reserved_worst_relative: f64,
    /// Block bytes by category at each peak; they add up to the peak.
    /// Empty when a point's peak make-up is unknown.
    pub by_category: Vec<CategoryLine>,
    /// The peak less what its blocks' requests asked for: the allocator's
    /// rounding, a part of the categories' bytes above.
    pub rounding: Option<CategoryLine>,
    pub linear: bool,
}

impl Fit {
    /// The residual furthest from the line.
    pub fn worst(&self) -> Option<&Residual> {
        self.residuals
            .iter()
            .max_by(|a, b| a.relative.abs().total_cmp(&b.relative.abs()))
    }
}

/// One fit per sequence length among `points`, where at least two
/// different batches ran to the end.
pub fn fits(points: &[SweepPoint]) -> Vec<Fit> {
    let seqs: BTreeSet<Option<u64>> = points.iter().map(|p| p.seq).collect();
    seqs.into_iter()
        .filter_map(|seq| {
            let mut at: Vec<&SweepPoint> = points.iter().filter(|p| p.seq == seq).collect();
            at.sort_by_key(|p| p.batch);
            fit_one(seq, &at)
        })
        .collect()
}

fn fit_one(seq: Option<u64>, at: &[&SweepPoint]) -> Option<Fit> {
    let used: Vec<&SweepPoint> = at.iter().copied().filter(|p| p.fits()).collect();
    let xy = |f: &dyn Fn(&SweepPoint) -> u64| -> Vec<(f64, f64)> {
        used.iter().map(|p| (p.batch as f64, f(p) as f64)).collect()
    };
    let allocated = least_squares(&xy(&|p| p.peak_allocated))?;
    let reserved = least_squares(&xy(&|p| p.peak_reserved))?;
    let residuals = used
        .iter()
        .map(|p| {
            let predicted = allocated.at(p.batch as f64);
            let bytes = p.peak_allocated as f64 - predicted;
            Residual {
                batch: p.batch,
                predicted,
                bytes,
                relative: bytes / (p.peak_allocated.max(1) as f64),
            }
        })
        .collect::<Vec<_>>();
    let reserved_worst_relative = used
        .iter()
        .map(|p| {
            (p.peak_reserved as f64 - reserved.at(p.batch as f64)) / p.peak_reserved.max(1) as f64
        })
        .fold(0.0, |m: f64, r| if r.abs() > m.abs() { r } else { m });
    let linear = residuals.iter().all(|r| r.relative.abs() <= LINEAR_WITHIN);
    Some(Fit {
        seq,
        batches: used.iter().map(|p| p.batch).collect(),
        left_out: at.iter().filter(|p| !p.fits()).map(|p| p.batch).collect(),
        allocated,
        reserved,
        residuals,
        reserved_worst_relative,
        by_category: by_category(&used),
        rounding: rounding(&used),
        linear,
    })
}

fn moments<'a>(used: &[&'a SweepPoint]) -> Option<Vec<&'a PeakMoment>> {
    used.iter().map(|p| p.at_peak.as_ref()).collect()
}

fn category_line(used: &[&SweepPoint], category: String, values: Vec<u64>) -> Option<CategoryLine> {
    let xy: Vec<(f64, f64)> = used
        .iter()
        .zip(&values)
        .map(|(p, v)| (p.batch as f64, *v as f64))
        .collect();
    least_squares(&xy).map(|line| CategoryLine {
        category,
        line,
        values,
    })
}

fn by_category(used: &[&SweepPoint]) -> Vec<CategoryLine> {
    let Some(moments) = moments(used) else {
        return Vec::new();
    };
    let names: BTreeSet<&str> = moments
        .iter()
        .flat_map(|m| m.by_category.keys().copied())
        .collect();
    names
        .into_iter()
        .filter_map(|name| {
            let values = moments.iter().map(|m| m.category(name)).collect();
            category_line(used, name.to_string(), values)
        })
        .collect()
}

fn rounding(used: &[&SweepPoint]) -> Option<CategoryLine> {
    let values = used
        .iter()
        .zip(moments(used)?)
        .map(|(p, m)| p.peak_allocated.saturating_sub(m.requested))
        .collect();
    category_line(used, "rounding".to_string(), values)
}
