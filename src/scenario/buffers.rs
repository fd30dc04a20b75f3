//! How many tensors a run's `AllocateBuffers` steps ask for, every `Repeat`
//! and iteration counted: `count: 1000000000` passed `check`, then the run
//! reserved room for a billion list items (40 GB) and aborted.

use super::format::Scenario;
use super::validate::StepProblem;
use crate::engine::Step;
use crate::units::format_count;

/// Buffers a run may allocate in all. Each is a block the UI's keyframes
/// copy while it lives: 100,000 live buffers drew in 136 MB, 1,000,000
/// took 3.2 GB (headless 725 MB).
pub const MAX_BUFFERS: u64 = 100_000;

/// Buffers `steps` allocate once through (an `Every` at most once).
fn allocated(steps: &[Step]) -> u64 {
    steps
        .iter()
        .map(|s| match s {
            Step::Repeat { times, steps } => u64::from(*times).saturating_mul(allocated(steps)),
            Step::Every { steps, .. } => allocated(steps),
            Step::AllocateBuffers { count, .. } => u64::from(*count),
            Step::AllocateBuffer { .. } => 1,
            _ => 0,
        })
        .fold(0, u64::saturating_add)
}

/// Buffers a run of `s` allocates with `iterations` iterations.
pub fn buffers_allocated(s: &Scenario, iterations: u64) -> u64 {
    allocated(&s.setup).saturating_add(iterations.saturating_mul(allocated(&s.steps)))
}

/// The `AllocateBuffers` with the largest `count`, as (its occurrence among
/// the file's `AllocateBuffers`, in the order the validator walks them, and
/// its count).
fn largest(setup: &[Step], steps: &[Step]) -> Option<(usize, u32)> {
    fn visit(steps: &[Step], seen: &mut usize, best: &mut Option<(usize, u32)>) {
        for s in steps {
            if let Step::AllocateBuffers { count, .. } = s {
                if best.is_none_or(|(_, c)| *count > c) {
                    *best = Some((*seen, *count));
                }
                *seen += 1;
            } else if let Some(inner) = s.children() {
                visit(inner, seen, best);
            }
        }
    }
    let (mut seen, mut best) = (0, None);
    visit(setup, &mut seen, &mut best);
    visit(steps, &mut seen, &mut best);
    best
}

/// More buffers than [`MAX_BUFFERS`]: the problem, at the `AllocateBuffers`
/// with the largest `count`.
pub(super) fn too_many_buffers(s: &Scenario, iterations: u64) -> Option<StepProblem> {
    let total = buffers_allocated(s, iterations);
    if total <= MAX_BUFFERS {
        return None;
    }
    let (occurrence, count) = largest(&s.setup, &s.steps)?;
    Some(StepProblem {
        variant: "AllocateBuffers",
        occurrence,
        message: format!(
            "AllocateBuffers count: {}: the run would allocate {} buffers (every Repeat and \
             iteration counted), more than the {} a run may",
            format_count(u64::from(count)),
            format_count(total),
            format_count(MAX_BUFFERS)
        ),
    })
}
