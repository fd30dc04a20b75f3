//! Which points a sweep runs: `--batch`/`--seq` when given, else the
//! scenario's own `sweep:` section.

use super::error::{ListProblem, SweepError};
use crate::scenario::{at_point, has_seq, Built, Scenario, MAX_DIM};

/// Points a sweep may run: each is a run of its own, and 100,000 took
/// 14.5 s and wrote 96 MB of JSON.
pub const MAX_POINTS: usize = 1024;
/// Characters of a `--batch`/`--seq` list quoted in an error.
const QUOTED: usize = 40;

/// The batches and sequence lengths to run, every batch at every length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepPlan {
    /// Ascending, each once.
    pub batches: Vec<u64>,
    /// `[None]` when the sweep leaves the sequence length as the scenario has it.
    pub seqs: Vec<Option<u64>>,
    /// What the sweep overrides in the scenario, said in the report.
    pub notes: Vec<String>,
}

/// `1,2,4,8` → `[1, 2, 4, 8]`, ascending and each once; every value a
/// whole number from 1 to [`MAX_DIM`]. `flag` names the list in errors.
pub fn parse_list(flag: &'static str, text: &str) -> Result<Vec<u64>, SweepError> {
    let quoted = match text.char_indices().nth(QUOTED) {
        Some((cut, _)) => format!("{}… ({} bytes)", &text[..cut], text.len()),
        None => text.to_string(),
    };
    let bad = |reason: ListProblem| SweepError::List {
        flag,
        text: crate::units::escape_line(&quoted).into_owned(),
        reason,
    };
    let mut values = Vec::new();
    for item in text.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(bad(ListProblem::EmptyEntry));
        }
        let v: u64 = item
            .parse()
            .map_err(|_| bad(ListProblem::NotWhole(item.to_string())))?;
        check_range(v).map_err(bad)?;
        values.push(v);
    }
    values.sort_unstable();
    values.dedup();
    Ok(values)
}

fn check_range(v: u64) -> Result<(), ListProblem> {
    if v == 0 {
        Err(ListProblem::Zero)
    } else if v > MAX_DIM {
        Err(ListProblem::TooLarge(v))
    } else {
        Ok(())
    }
}

impl SweepPlan {
    /// The plan for `scenario` from the flags' text (`None`: not given).
    /// With `find_max` a plan may have no batches: the search is the sweep.
    pub fn new(
        scenario: &Scenario,
        built: &Built,
        batch: Option<&str>,
        seq: Option<&str>,
        find_max: bool,
    ) -> Result<SweepPlan, SweepError> {
        let carried = scenario.sweep.as_ref();
        let batches = match batch {
            Some(text) => parse_list("--batch", text)?,
            None => sorted(carried.map(|s| s.batch.clone()).unwrap_or_default()),
        };
        if batches.is_empty() && !find_max {
            return Err(SweepError::NoPoints(scenario.name.clone()));
        }
        let seq_values = match seq {
            Some(text) => parse_list("--seq", text)?,
            None => sorted(carried.map(|s| s.seq.clone()).unwrap_or_default()),
        };
        if !seq_values.is_empty() && !has_seq(built) {
            return Err(SweepError::NoSeq {
                model: "this model".to_string(),
            });
        }
        let mut notes = Vec::new();
        if !scenario.data.batch_schedule.is_empty() {
            notes.push(format!(
                "the scenario's data.batch_schedule {:?} is overridden: each point runs every iteration at its own batch",
                scenario.data.batch_schedule
            ));
        }
        if !seq_values.is_empty() && !scenario.data.seq_schedule.is_empty() {
            notes.push(format!(
                "the scenario's data.seq_schedule {:?} is overridden: each point runs every iteration at its own sequence length",
                scenario.data.seq_schedule
            ));
        }
        let seqs = if seq_values.is_empty() {
            vec![None]
        } else {
            seq_values.into_iter().map(Some).collect()
        };
        let points = (batches.len() as u64).saturating_mul(seqs.len() as u64);
        if points > MAX_POINTS as u64 {
            let from = match (batch, seq) {
                (Some(_), Some(_)) => "--batch and --seq",
                (Some(_), None) => "--batch",
                (None, Some(_)) => "--seq",
                (None, None) => "the scenario's sweep.batch and sweep.seq",
            };
            return Err(SweepError::TooManyPoints {
                from: from.to_string(),
                batches: batches.len(),
                seqs: seqs.len(),
                points,
            });
        }
        let plan = SweepPlan {
            batches,
            seqs,
            notes,
        };
        // Every point builds before any runs: a bad one is refused up front,
        // the same in the report and in the chart.
        for (batch, seq) in plan.points() {
            at_point(scenario, built, batch, seq).map_err(|source| SweepError::Point {
                batch,
                seq,
                source: Box::new(source),
            })?;
        }
        Ok(plan)
    }

    /// Every (batch, seq) pair, batches inner.
    pub fn points(&self) -> Vec<(u64, Option<u64>)> {
        self.seqs
            .iter()
            .flat_map(|&t| self.batches.iter().map(move |&b| (b, t)))
            .collect()
    }
}

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v.dedup();
    v
}
