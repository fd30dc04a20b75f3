//! The leak detector: which root keeps which memory alive, how fast it grows,
//! and what to change (issue: leak detector). This module holds the findings'
//! shape; the analyses fill it.

mod finding;

pub use finding::{Finding, FindingKind, Severity};
