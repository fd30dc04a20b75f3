//! A least-squares line through points: a sweep's peak memory against batch
//! size (`sweep::fit`) and a live job's memory against its step (`job::creep`).

use serde::Serialize;

/// `y ≈ intercept + slope × x`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Line {
    pub intercept: f64,
    pub slope: f64,
    /// 1 − SS_res / SS_tot (1 where every point is on the line).
    pub r_squared: f64,
}

impl Line {
    pub fn at(&self, x: f64) -> f64 {
        self.intercept + self.slope * x
    }
}

/// Ordinary least squares through `(x, y)`; `None` with fewer than two
/// distinct x.
pub fn least_squares(points: &[(f64, f64)]) -> Option<Line> {
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    if points.len() < 2 || sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let slope = sxy / sxx;
    let intercept = mean_y - slope * mean_x;
    let ss_res: f64 = points
        .iter()
        .map(|p| (p.1 - intercept - slope * p.0).powi(2))
        .sum();
    let ss_tot: f64 = points.iter().map(|p| (p.1 - mean_y).powi(2)).sum();
    let r_squared = if ss_tot == 0.0 {
        if ss_res == 0.0 {
            1.0
        } else {
            0.0
        }
    } else {
        1.0 - ss_res / ss_tot
    };
    Some(Line {
        intercept,
        slope,
        r_squared,
    })
}
