//! Memory at each step over the whole attach: the job's own
//! `memory_stats()` (sent after each step), kept across start-overs, so a
//! slow creep shows over hours even when the trace's history is dropped.

use serde::Serialize;

use super::message::DeviceStats;
use crate::least_squares::least_squares;

/// Readings kept; past it every other one is dropped (the series keeps its
/// span at half the density).
const MAX_READINGS: usize = 100_000;

/// One `stats` message: how many steps had ended, and the job's figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reading {
    device: u8,
    steps: u64,
    allocated: u64,
    reserved: u64,
}

#[derive(Debug, Clone, Default)]
pub struct StepSeries {
    readings: Vec<Reading>,
}

impl StepSeries {
    /// `stats` arrived after `steps` steps had ended. A step's reading is
    /// the first after it (read at its marker); later ones in the same step
    /// were read mid-step and are not kept.
    pub fn push(&mut self, steps: u64, s: &DeviceStats) {
        let same_step = self
            .readings
            .iter()
            .rev()
            .find(|r| r.device == s.device)
            .is_some_and(|r| r.steps == steps);
        if same_step {
            return;
        }
        let figure = |k: &str| s.get(k).and_then(|v| u64::try_from(v).ok());
        let (Some(allocated), Some(reserved)) = (
            figure("allocated_bytes.all.current"),
            figure("reserved_bytes.all.current"),
        ) else {
            return;
        };
        if self.readings.len() >= MAX_READINGS {
            let mut i = 0;
            self.readings.retain(|_| {
                i += 1;
                i % 2 == 1
            });
        }
        self.readings.push(Reading {
            device: s.device,
            steps,
            allocated,
            reserved,
        });
    }

    /// Per device, the trend of allocated and reserved across the steps.
    pub fn summaries(&self) -> Vec<StepTrend> {
        let mut devices: Vec<u8> = self.readings.iter().map(|r| r.device).collect();
        devices.sort_unstable();
        devices.dedup();
        devices
            .into_iter()
            .filter_map(|d| {
                let rs: Vec<&Reading> = self.readings.iter().filter(|r| r.device == d).collect();
                let (first, last) = (rs.first()?, rs.last()?);
                let slope = |f: fn(&Reading) -> u64| {
                    let points: Vec<(f64, f64)> =
                        rs.iter().map(|r| (r.steps as f64, f(r) as f64)).collect();
                    least_squares(&points).map(|l| l.slope.round() as i64)
                };
                Some(StepTrend {
                    device: i64::from(d),
                    readings: rs.len(),
                    first_step: first.steps,
                    last_step: last.steps,
                    allocated_first: first.allocated,
                    allocated_last: last.allocated,
                    reserved_first: first.reserved,
                    reserved_last: last.reserved,
                    allocated_per_step: slope(|r| r.allocated),
                    reserved_per_step: slope(|r| r.reserved),
                })
            })
            .collect()
    }
}

/// What the job's `memory_stats()` did over the steps of the whole attach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepTrend {
    pub device: i64,
    /// `stats` readings (one after each step, at most 10 a second).
    pub readings: usize,
    /// Steps ended at the first and the last reading.
    pub first_step: u64,
    pub last_step: u64,
    pub allocated_first: u64,
    pub allocated_last: u64,
    pub reserved_first: u64,
    pub reserved_last: u64,
    /// Least-squares slope of the readings against the step count, in
    /// bytes per step; `None` with readings at fewer than two step counts.
    pub allocated_per_step: Option<i64>,
    pub reserved_per_step: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(device: u8, allocated: i64, reserved: i64) -> DeviceStats {
        DeviceStats {
            device,
            seq: 0,
            stats: vec![
                ("allocated_bytes.all.current".into(), allocated),
                ("reserved_bytes.all.current".into(), reserved),
            ],
        }
    }

    #[test]
    fn a_creep_of_2_mib_a_step_reads_as_its_slope() {
        let mut s = StepSeries::default();
        for k in 0..50u64 {
            s.push(k, &stats(0, 1_000 + (k as i64) * (2 << 20), 4 << 30));
            s.push(k, &stats(1, 7_000, 8 << 30));
        }
        let t = s.summaries();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].allocated_per_step, Some(2 << 20));
        assert_eq!(t[0].reserved_per_step, Some(0));
        assert_eq!(
            (t[0].first_step, t[0].last_step, t[0].readings),
            (0, 49, 50)
        );
        assert_eq!(t[1].allocated_per_step, Some(0));
    }

    #[test]
    fn readings_without_the_figures_or_one_step_give_no_slope() {
        let mut s = StepSeries::default();
        s.push(
            3,
            &DeviceStats {
                device: 0,
                seq: 0,
                stats: vec![],
            },
        );
        assert!(s.summaries().is_empty());
        s.push(3, &stats(0, 10, 20));
        s.push(3, &stats(0, 30, 20));
        assert_eq!(s.summaries()[0].allocated_per_step, None);
    }

    #[test]
    fn a_step_keeps_its_first_reading_per_device() {
        let mut s = StepSeries::default();
        for k in 0..5u64 {
            s.push(k, &stats(0, (k as i64) << 20, 0));
            s.push(k, &stats(1, 0, 0));
            s.push(k, &stats(0, 900 << 20, 0)); // read mid-step: not this step's
        }
        let t = s.summaries();
        assert_eq!(t[0].readings, 5);
        assert_eq!(t[0].allocated_per_step, Some(1 << 20));
        assert_eq!(t[1].readings, 5);
    }

    #[test]
    fn a_long_series_keeps_its_span_at_half_the_density() {
        let mut s = StepSeries::default();
        for k in 0..(MAX_READINGS as u64 + 10) {
            s.push(k, &stats(0, k as i64 * 512, 0));
        }
        assert!(s.readings.len() <= MAX_READINGS);
        let t = &s.summaries()[0];
        assert_eq!(t.first_step, 0);
        assert_eq!(t.last_step, MAX_READINGS as u64 + 9);
        assert_eq!(t.allocated_per_step, Some(512));
    }
}
