//! Headless output: reports as text (in the style of `memory_summary()`) and JSON.

pub mod diff;
pub mod handout;
pub mod job;
pub mod lesson;
pub mod replay;
pub mod run;
pub mod series;
pub mod snapshot;
pub mod sweep;
