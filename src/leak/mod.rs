//! The leak detector: which root keeps which memory alive, how fast it grows,
//! and what to change (engine.md §9, §9.1, §11.2).
//!
//! - [`Detector`]: scenario runs, from the engine's
//!   [`crate::engine::HeldState`] after every iteration (`scenario::ScenarioRun`
//!   feeds it).
//! - [`analyze_snapshot`]: imported PyTorch snapshots, from the trace alone
//!   (allocations that survive iteration boundaries, grouped by call site).
//! - [`findings_json`] / [`findings_text`]: the report's views.

mod classify;
mod counted_annotations;
mod creep;
mod detector;
mod device_wide;
mod finding;
mod fix;
mod format;
mod growth;
mod holders;
mod observe;
mod oom;
mod oom_trace;
mod program;
mod reach;
mod render;
mod requests;
mod site_series;
mod snapshot;
mod stale_optimizer;

#[cfg(test)]
mod tests;

pub use detector::{Detector, GroupSample, IterationSample, MIN_GROWTH_STEPS};
pub use finding::{Finding, FindingKind, Severity};
pub use holders::Holder;
pub use oom::{Grew, OomAnswer, WhatIf, LISTED_HOLDERS};
pub use oom_trace::answer_trace_oom;
pub use render::{findings_json, findings_text};
pub use requests::{RequestLog, RunDevice};
pub use snapshot::{
    analyze_snapshot, analyze_snapshot_with, Boundaries, BoundarySource, SnapshotLeakReport,
    SurvivorGroup,
};
