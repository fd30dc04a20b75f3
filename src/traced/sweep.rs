//! A sweep over the user's own program (`vramscope trace --sweep
//! BATCH=1,2,4,8 -- python train.py --batch-size {BATCH}`): the program
//! traced once per value, `{BATCH}` replaced in its arguments, each point a
//! run of its own on a fresh simulated GPU; then `vramscope sweep`'s fit,
//! words and search for the largest batch that fits ([`crate::sweep`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::error::TraceError;
use super::launch::ChildOutput;
use super::outcome::TraceOutcome;
use super::serve::{start, TraceOptions};
use crate::device::GpuProfile;
use crate::sweep::{explain, fits, search_max_batch, MaxBatch, Sweep, SweepPoint};

/// What to sweep.
#[derive(Debug, Clone)]
pub struct TraceSweep {
    pub gpu: &'static GpuProfile,
    pub steps: Option<u32>,
    pub conf: Option<String>,
    /// The program and its arguments, with `{NAME}` where a value goes.
    pub command: Vec<String>,
    /// The placeholder's name (`BATCH`).
    pub name: String,
    pub values: Vec<u64>,
    pub find_max: bool,
    /// The largest value the search tries.
    pub limit: u64,
    pub threads: usize,
}

/// `{NAME}` replaced by `value` in every argument.
pub fn substitute(command: &[String], name: &str, value: u64) -> Vec<String> {
    let hole = format!("{{{name}}}");
    command
        .iter()
        .map(|a| a.replace(&hole, &value.to_string()))
        .collect()
}

/// `NAME=1,2,4,8` (or `NAME=` with no values, for a search alone).
pub fn parse_sweep(spec: &str) -> Result<(String, Vec<u64>), String> {
    let (name, list) = spec
        .split_once('=')
        .ok_or_else(|| format!("--sweep {spec:?}: expected NAME=V1,V2,… (e.g. BATCH=1,2,4,8)"))?;
    let name = name.trim();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!(
            "--sweep {spec:?}: the name must be letters, digits or _ (it is `{{NAME}}` in the arguments)"
        ));
    }
    let mut values = Vec::new();
    for v in list.split(',').map(str::trim).filter(|v| !v.is_empty()) {
        let n: u64 = v
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("--sweep {spec:?}: {v:?} is not a whole number above 0"))?;
        if !values.contains(&n) {
            values.push(n);
        }
    }
    Ok((name.to_string(), values))
}

/// One point from a traced run: its peaks, and whether it ran out of
/// memory (the program met an OOM, caught or not) or failed otherwise.
pub fn point_of(value: u64, o: &TraceOutcome) -> SweepPoint {
    let oom = o.ooms > 0;
    let error = if o.never_connected {
        Some("the program never reached vramscope (it did not import torch)".to_string())
    } else {
        match &o.exception {
            Some(e) if !(oom && e.kind.contains("OutOfMemoryError")) => {
                Some(format!("{}: {}", e.kind, e.message))
            }
            _ => o
                .exit_status
                .filter(|c| *c != 0 && !oom)
                .map(|c| format!("the program exited with status {c}")),
        }
    };
    SweepPoint {
        batch: value,
        seq: None,
        peak_allocated: o.peak_allocated,
        peak_reserved: o.peak_reserved,
        oom,
        oom_message: None,
        error,
        iterations_run: u32::try_from(o.steps).unwrap_or(u32::MAX),
        at_peak: None,
    }
}

impl TraceSweep {
    fn run_point(&self, value: u64) -> Result<SweepPoint, TraceError> {
        let opts = TraceOptions {
            gpu: self.gpu,
            steps: self.steps,
            conf: self.conf.clone(),
            command: substitute(&self.command, &self.name, value),
            output: ChildOutput::Capture,
            want_snapshot: false,
            save_requests: None,
            // A point's stream is not read: no holder walks.
            holders_budget_ms: 0.0,
        };
        let run = start(opts, Box::new(std::io::sink()))?;
        let (outcome, _) = run.join()?;
        Ok(point_of(value, &outcome))
    }

    /// The points, side by side on `threads` threads, then the search.
    pub fn run(&self) -> Result<Sweep, TraceError> {
        let next = AtomicUsize::new(0);
        let slots: Mutex<Vec<Option<Result<SweepPoint, TraceError>>>> =
            Mutex::new((0..self.values.len()).map(|_| None).collect());
        std::thread::scope(|s| {
            for _ in 0..self.threads.clamp(1, self.values.len().max(1)) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&v) = self.values.get(i) else { break };
                    let r = self.run_point(v);
                    if let Ok(mut slots) = slots.lock() {
                        slots[i] = Some(r);
                    }
                });
            }
        });
        let mut points = slots
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .into_iter()
            .flatten()
            .collect::<Result<Vec<_>, _>>()?;
        let max: Vec<MaxBatch> = if self.find_max {
            vec![search_max_batch(None, &points, self.limit, &mut |b| {
                self.run_point(b)
            })?]
        } else {
            Vec::new()
        };
        points.sort_by_key(|p| p.batch);
        let overhead = self.gpu.context_bytes.unwrap_or(0);
        let mut sweep = Sweep {
            scenario: self.command.join(" "),
            capacity: self.gpu.total_memory.saturating_sub(overhead),
            fits: fits(&points),
            points,
            max_batch: max.first().cloned(),
            max_batch_by_seq: max,
            notes: vec![format!(
                "each point is the program traced on a simulated {} with {{{}}} set to the point's \
                 value{}",
                self.gpu.name,
                self.name,
                match self.steps {
                    Some(n) => format!(", stopped after {n} optimizer steps"),
                    None => ", run to its end".to_string(),
                }
            )],
            explanation: Vec::new(),
            narration: Vec::new(),
        };
        sweep.explanation = explain(&sweep);
        Ok(sweep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traced::outcome::Exception;

    #[test]
    fn a_sweep_is_a_name_and_whole_numbers() {
        assert_eq!(
            parse_sweep("BATCH=1,2, 4,8,4").expect("valid"),
            ("BATCH".to_string(), vec![1, 2, 4, 8])
        );
        assert_eq!(
            parse_sweep("BS=").expect("search only").1,
            Vec::<u64>::new()
        );
        assert!(parse_sweep("BATCH").is_err());
        assert!(parse_sweep("BATCH=0").is_err());
        assert!(parse_sweep("B-S=1").is_err());
        assert!(parse_sweep("BATCH=two").is_err());
    }

    #[test]
    fn the_value_goes_where_the_arguments_name_it() {
        let cmd: Vec<String> = [
            "python",
            "train.py",
            "--batch-size",
            "{BATCH}",
            "--x={BATCH}0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            substitute(&cmd, "BATCH", 8),
            ["python", "train.py", "--batch-size", "8", "--x=80"]
        );
    }

    #[test]
    fn an_oom_is_an_oom_whether_caught_or_not_and_other_failures_are_errors() {
        let mut o = TraceOutcome {
            peak_allocated: 10,
            ooms: 1,
            exception: Some(Exception {
                kind: "OutOfMemoryError".into(),
                message: "CUDA out of memory.".into(),
                at: Vec::new(),
            }),
            exit_status: Some(1),
            ..TraceOutcome::default()
        };
        let p = point_of(4, &o);
        assert!(p.oom && p.error.is_none() && !p.fits());
        o.exception = Some(Exception {
            kind: "ValueError".into(),
            message: "bad".into(),
            at: Vec::new(),
        });
        o.ooms = 0;
        let p = point_of(4, &o);
        assert_eq!(p.error.as_deref(), Some("ValueError: bad"));
        o.exception = None;
        o.exit_status = Some(0);
        assert!(point_of(4, &o).fits());
    }
}
