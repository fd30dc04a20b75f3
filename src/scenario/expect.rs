//! Checking a run against the scenario's own expectations.

use serde::Serialize;

use super::format::Expectation;
use super::headless::RunResult;
use crate::alloc::format_size;
use crate::leak::FindingKind;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExpectationResult {
    pub expectation: String,
    pub passed: bool,
    /// What the run showed, in words.
    pub observed: String,
}

fn describe(e: &Expectation) -> String {
    match e {
        Expectation::Leak { root, kind } => format!(
            "a leak rooted at `{root}`{}",
            kind.as_ref()
                .map(|k| format!(" ({})", FindingKind::words_for(k)))
                .unwrap_or_default()
        ),
        Expectation::NoLeak => "no memory leak".into(),
        Expectation::Finding(kind) => format!("a {} finding", FindingKind::words_for(kind)),
        Expectation::Oom(Some(i)) => format!("an OOM in iteration {i}"),
        Expectation::Oom(None) => "an OOM".into(),
        Expectation::NoOom => "no OOM".into(),
        Expectation::Error(text) => format!("an error containing \"{text}\""),
        Expectation::Warning(text) => format!("a warning containing \"{text}\""),
        Expectation::PeakReservedUnder(s) => format!("peak reserved under {}", format_size(s.0)),
        Expectation::PeakReservedOver(s) => format!("peak reserved over {}", format_size(s.0)),
        Expectation::PeakAllocatedUnder(s) => format!("peak allocated under {}", format_size(s.0)),
        Expectation::PeakAllocatedOver(s) => format!("peak allocated over {}", format_size(s.0)),
        Expectation::AllocatedGrowsAtLeast(s) => format!(
            "allocated grows by at least {} per iteration",
            format_size(s.0)
        ),
        Expectation::AllocatedFlat => "allocated flat across iterations".into(),
        Expectation::RequestedFlat => {
            "the same tensors live at every iteration end (requested bytes flat)".into()
        }
        Expectation::ReservedGrowsAllocatedFlat => {
            "reserved grows while allocated stays flat".into()
        }
    }
}

/// Allocated bytes at iteration end, from the second iteration on (the first
/// includes one-time state such as optimizer buffers).
fn steady(r: &RunResult) -> Vec<u64> {
    r.per_iteration
        .iter()
        .skip(1)
        .map(|p| p.allocated)
        .collect()
}

fn all_equal(v: &[u64]) -> bool {
    v.len() > 1 && v.iter().all(|x| *x == v[0])
}

/// Requested bytes at iteration end, from the second iteration on.
fn steady_requested(r: &RunResult) -> Vec<u64> {
    r.per_iteration
        .iter()
        .skip(1)
        .map(|p| p.requested)
        .collect()
}

fn sizes(v: &[u64]) -> String {
    v.iter()
        .map(|x| format_size(*x))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The allocated figures; where they move but the requested ones do not,
/// why (allocated bytes also count the unsplit tail of whichever cached
/// block served a request, and on a real GPU that choice follows the
/// addresses the driver returned).
fn allocated_observed(r: &RunResult) -> String {
    let allocated = steady(r);
    let requested = steady_requested(r);
    let mut text = format!("allocated at iteration end: {}", sizes(&allocated));
    if !all_equal(&allocated) && all_equal(&requested) {
        text.push_str(&format!(
            " (requested {} at every end: the same tensors, in blocks with different unsplit tails)",
            format_size(requested[0])
        ));
    }
    text
}

fn requested_observed(r: &RunResult) -> String {
    let allocated = steady(r);
    let requested = steady_requested(r);
    let mut text = format!("requested at iteration end: {}", sizes(&requested));
    if all_equal(&requested) && !all_equal(&allocated) {
        text.push_str(&format!(
            " (allocated {}: unsplit block tails)",
            sizes(&allocated)
        ));
    }
    text
}

fn growth_per_iteration(values: &[u64]) -> Option<i64> {
    let (first, last) = (values.first()?, values.last()?);
    (values.len() > 1).then(|| (*last as i64 - *first as i64) / (values.len() as i64 - 1))
}

fn check_one(e: &Expectation, r: &RunResult) -> (bool, String) {
    let leaks: Vec<_> = r.findings.iter().filter(|f| f.kind.is_leak()).collect();
    let leak_list = || {
        leaks
            .iter()
            .map(|f| format!("{} ({})", f.root, f.kind.label()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match e {
        Expectation::Leak { root, kind } => {
            let hit = leaks
                .iter()
                .any(|f| f.root == *root && kind.as_ref().is_none_or(|k| f.kind.as_str() == k));
            (
                hit,
                if leaks.is_empty() {
                    "no leak found".into()
                } else {
                    format!("leaks: {}", leak_list())
                },
            )
        }
        Expectation::NoLeak => (
            leaks.is_empty(),
            if leaks.is_empty() {
                "no leak found".into()
            } else {
                format!("leaks: {}", leak_list())
            },
        ),
        Expectation::Finding(kind) => {
            let kinds: Vec<&str> = r.findings.iter().map(|f| f.kind.as_str()).collect();
            let words: Vec<&str> = r.findings.iter().map(|f| f.kind.label()).collect();
            (
                kinds.contains(&kind.as_str()),
                format!("findings: [{}]", words.join(", ")),
            )
        }
        Expectation::Oom(at) => match &r.oom {
            Some(o) => (
                at.is_none_or(|i| i == o.iteration),
                format!("OOM in iteration {}", o.iteration),
            ),
            None => (false, "no OOM".into()),
        },
        Expectation::NoOom => (
            r.oom.is_none(),
            r.oom.as_ref().map_or("no OOM".into(), |o| {
                format!("OOM in iteration {}", o.iteration)
            }),
        ),
        Expectation::Error(text) => match &r.error {
            Some(msg) => (msg.contains(text.as_str()), format!("error: {msg}")),
            None => (false, "no error".into()),
        },
        Expectation::Warning(text) => (
            r.warnings.iter().any(|w| w.contains(text.as_str())),
            if r.warnings.is_empty() {
                "no warning".into()
            } else {
                format!("warnings: {}", r.warnings.join("; "))
            },
        ),
        Expectation::PeakReservedUnder(s) => (
            r.peak_reserved < s.0,
            format!("peak reserved {}", format_size(r.peak_reserved)),
        ),
        Expectation::PeakReservedOver(s) => (
            r.peak_reserved > s.0,
            format!("peak reserved {}", format_size(r.peak_reserved)),
        ),
        Expectation::PeakAllocatedUnder(s) => (
            r.peak_allocated < s.0,
            format!("peak allocated {}", format_size(r.peak_allocated)),
        ),
        Expectation::PeakAllocatedOver(s) => (
            r.peak_allocated > s.0,
            format!("peak allocated {}", format_size(r.peak_allocated)),
        ),
        Expectation::AllocatedGrowsAtLeast(s) => {
            let g = growth_per_iteration(&steady(r)).unwrap_or(0);
            (
                g >= s.0 as i64,
                format!(
                    "allocated grows {} per iteration",
                    format_size(g.max(0) as u64)
                ),
            )
        }
        Expectation::AllocatedFlat => (all_equal(&steady(r)), allocated_observed(r)),
        Expectation::RequestedFlat => (all_equal(&steady_requested(r)), requested_observed(r)),
        Expectation::ReservedGrowsAllocatedFlat => {
            let reserved: Vec<u64> = r.per_iteration.iter().skip(1).map(|p| p.reserved).collect();
            let grows = reserved.last() > reserved.first();
            (
                all_equal(&steady(r)) && grows,
                format!(
                    "reserved {} → {}",
                    format_size(reserved.first().copied().unwrap_or(0)),
                    format_size(reserved.last().copied().unwrap_or(0))
                ),
            )
        }
    }
}

/// Every expectation with whether it held.
pub fn check(expectations: &[Expectation], r: &RunResult) -> Vec<ExpectationResult> {
    expectations
        .iter()
        .map(|e| {
            let (passed, observed) = check_one(e, r);
            ExpectationResult {
                expectation: describe(e),
                passed,
                observed,
            }
        })
        .collect()
}
