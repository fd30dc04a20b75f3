//! Each part's answer checked against its scenario's run: the part's
//! expectations on the run, and its comparisons against other scenarios'
//! runs. A lesson whose answer its scenario does not show fails here.

use super::format::{Comparison, Figure, Part};
use super::load::LoadedLesson;
use crate::alloc::{format_size, Action, Family, Level};
use crate::scenario::{check, run, ExpectationResult, LoadError, RunOptions, RunResult, Size};
use crate::trace::event::{Event, Marker, Phase};

/// One part's run and what its checks found.
#[derive(Debug, Clone)]
pub struct PartVerdict {
    pub run: RunResult,
    /// The part's `check` and `compare` entries, each with whether it held.
    pub checks: Vec<ExpectationResult>,
}

impl PartVerdict {
    pub fn holds(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }
}

fn run_named(lesson: &LoadedLesson, name: &str, events: bool) -> Result<RunResult, LoadError> {
    let (scenario, built) = lesson.scenario(name)?;
    let opts = RunOptions {
        iterations: None,
        record_events: events,
    };
    Ok(run(&scenario, &built, &opts))
}

/// The phase allocated is in when it first reaches the run's peak, summing
/// the allocator's entries (alloc +, free_completed −) between the markers.
fn peak_phase(r: &RunResult) -> Option<Phase> {
    let (mut allocated, mut peak) = (0u64, 0u64);
    let (mut phase, mut at) = (None, None);
    for e in &r.events {
        match e {
            Event::Marker(Marker::PhaseBegin(p)) => phase = Some(*p),
            Event::Marker(Marker::PhaseEnd(_)) => phase = None,
            Event::Alloc(a) if a.action == Action::Alloc => {
                allocated += a.block_size;
                if allocated > peak {
                    peak = allocated;
                    at = phase;
                }
            }
            Event::Alloc(a) if a.action == Action::FreeCompleted => {
                allocated = allocated.saturating_sub(a.block_size)
            }
            _ => {}
        }
    }
    at
}

fn compare_one(c: &Comparison, mine: &RunResult, other: &RunResult) -> ExpectationResult {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let (what, a, b, want) = match c {
        Comparison::PeakAllocatedAbove(_) => (
            "peak allocated",
            mine.peak_allocated,
            other.peak_allocated,
            Greater,
        ),
        Comparison::PeakAllocatedBelow(_) => (
            "peak allocated",
            mine.peak_allocated,
            other.peak_allocated,
            Less,
        ),
        Comparison::PeakAllocatedSame(_) => (
            "peak allocated",
            mine.peak_allocated,
            other.peak_allocated,
            Equal,
        ),
        Comparison::PeakReservedAbove(_) => (
            "peak reserved",
            mine.peak_reserved,
            other.peak_reserved,
            Greater,
        ),
        Comparison::PeakReservedBelow(_) => (
            "peak reserved",
            mine.peak_reserved,
            other.peak_reserved,
            Less,
        ),
    };
    let relation = match want {
        Greater => "above",
        Less => "below",
        Equal => "the same as",
    };
    ExpectationResult {
        expectation: format!("{what} {relation} {}'s", c.other()),
        passed: a.cmp(&b) == want,
        observed: format!(
            "{what} {} here, {} in {}",
            format_size(a),
            format_size(b),
            c.other()
        ),
    }
}

fn figure_one(f: &Figure, r: &RunResult) -> ExpectationResult {
    let ends: Vec<u64> = r.per_iteration.iter().map(|p| p.allocated).collect();
    let (low, high) = (
        ends.iter().copied().min().unwrap_or(0),
        ends.iter().copied().max().unwrap_or(0),
    );
    let between = format!(
        "allocated at iteration ends {}..{}",
        format_size(low),
        format_size(high)
    );
    let context = format!("{} not the allocator's", format_size(r.conditions.overhead));
    let sized = |what: &str, s: &Size| format!("{what} {}", format_size(s.0));
    let (expectation, passed, observed) = match f {
        Figure::BetweenStepsAllocatedUnder(s) => (
            sized("allocated at every iteration end under", s),
            !ends.is_empty() && high < s.0,
            between,
        ),
        Figure::BetweenStepsAllocatedOver(s) => (
            sized("allocated at every iteration end over", s),
            !ends.is_empty() && low > s.0,
            between,
        ),
        Figure::ContextOver(s) => (
            sized("the context over", s),
            r.conditions.overhead > s.0,
            context,
        ),
        Figure::ContextUnder(s) => (
            sized("the context under", s),
            r.conditions.overhead < s.0,
            context,
        ),
        Figure::ActiveEqualsAllocated => {
            let active = r.stats.get(Family::ActiveBytes, Level::All).current as u64;
            let allocated = r.stats.allocated_bytes();
            (
                "active bytes equal to allocated bytes at the end".to_string(),
                active == allocated,
                format!(
                    "active {}, allocated {}",
                    format_size(active),
                    format_size(allocated)
                ),
            )
        }
        Figure::InactiveSplitOver(s) => {
            let split = r.stats.get(Family::InactiveSplitBytes, Level::All).current as u64;
            (
                sized("inactive split bytes at the end over", s),
                split > s.0,
                format!("inactive split {}", format_size(split)),
            )
        }
        Figure::PeakIn(want) => {
            let name = peak_phase(r).map_or("no phase", |p| p.name());
            (
                format!("the peak in the {want} phase"),
                name == want,
                format!(
                    "peak allocated {} reached in {name}",
                    format_size(r.peak_allocated)
                ),
            )
        }
    };
    ExpectationResult {
        expectation,
        passed,
        observed,
    }
}

/// Run one part's scenario (and any it compares with) and check its answer.
pub fn verify_part(lesson: &LoadedLesson, part: &Part) -> Result<PartVerdict, LoadError> {
    let events = part.figures.iter().any(|f| matches!(f, Figure::PeakIn(_)));
    let mine = run_named(lesson, &part.scenario, events)?;
    let mut checks = check(&part.check, &mine);
    checks.extend(part.figures.iter().map(|f| figure_one(f, &mine)));
    for c in &part.compare {
        let other = run_named(lesson, c.other(), false)?;
        checks.push(compare_one(c, &mine, &other));
    }
    Ok(PartVerdict { run: mine, checks })
}

/// Every part, in order.
pub fn verify(lesson: &LoadedLesson) -> Result<Vec<PartVerdict>, LoadError> {
    lesson
        .lesson
        .parts
        .iter()
        .map(|p| verify_part(lesson, p))
        .collect()
}
