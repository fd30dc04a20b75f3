//! Real snapshots captured on an H100 by `tests/fixtures/pytorch/*.py`
//! (issue 7): each PyTorch program is the loop of a library scenario. Its
//! trace replays address for address through our allocator and ends with
//! PyTorch's own `memory_stats()`, every counter; and the scenario, run as
//! shipped, requests what PyTorch's tensors requested and reaches the real
//! peaks, byte for byte or within an allowance whose cause the test names.
//!
//! `harness`: the shared checks; `scenarios`: each library scenario against
//! its capture; `traces`: what the captured traces show beyond the figures
//! (leaks between annotated iterations, the order of requests); `course`:
//! the course's misconceptions and exercises; `gpt_defaults`,
//! `cudnn_attention`, `convnets`, `resnet50_sweep`, `lstm_loop`: the captures
//! of 2026-11-26 that needed the engine taught (their layout allowances proven
//! to be the driver's addresses); `handwritten`: issue 42's hand-written
//! Transformer, written op for op in the module language; `moe`: issue 42's
//! small mixture of experts (`SparseMoe`), its layout allowance proven to
//! be the driver's addresses; `inventory`: every program captured, every
//! capture checked.

mod addresses;
mod convnets;
mod course;
mod cudnn_attention;
mod driver_placement;
mod gpt_defaults;
mod handwritten;
mod harness;
mod inventory;
mod leak_patterns;
mod lstm_loop;
mod moe;
mod oom_answers;
mod resnet50_sweep;
mod scenarios;
mod traces;
