//! vramscope: where GPU memory goes in a PyTorch-style training loop.
//!
//! Data flows one way (see DESIGN.md): scenarios drive the `engine`, which asks
//! `alloc` (a model of PyTorch's CUDA caching allocator) for memory on a
//! `device`; everything that happens is a `trace` of events that the `leak`
//! detector, the headless `report` and, through the `producers` layer, the
//! `tui` read.
#![deny(clippy::unwrap_used)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

pub mod alloc;
pub mod device;
pub mod engine;
pub mod files;
pub mod job;
pub mod leak;
pub mod least_squares;
pub mod lesson;
pub mod producers;
pub mod report;
pub mod scenario;
pub mod sweep;
pub mod trace;
pub mod traced;
pub mod tui;
pub mod units;

#[cfg(test)]
#[path = "../tests/common/real_snapshots.rs"]
pub(crate) mod real_snapshots;
#[cfg(test)]
#[path = "../tests/common/scratch.rs"]
pub(crate) mod scratch;
