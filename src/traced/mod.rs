//! `vramscope trace` (issue 38): the user's own PyTorch program, unmodified,
//! on a simulated GPU. The program runs under `python/vramscope_trace/`
//! (PyTorch's `meta` device relabelled as CUDA; every aten op's new storages
//! are requests, every storage that dies a free) and talks to this module
//! over a unix socket; here each request is placed by the caching allocator
//! model ([`crate::alloc`]) and the CUDA rules meta does not show come from
//! the engine's settings ([`crate::engine::EngineConfig`]: cuBLAS/cuBLASLt
//! workspaces, the SDPA backend).
//!
//! What comes out is the live protocol of `python/PROTOCOL.md` (mode
//! `trace`), so `attach`'s session, views, reports and recordings read a
//! traced program as they read a live job.
//!
//! - `launch`: the private folder with the helper, the socket, the child;
//! - `rules`: the engine's CUDA rules for the traced GPU and environment;
//! - `wire`: the live stream written as the allocator decides;
//! - `simulator`: one request at a time: allocator, stats, OOMs, dumps;
//! - `kernels`: what CUDA kernels take beyond their outputs (workspaces, scratch);
//! - `plans`: those buffers stage by stage, for ops that take them between
//!   or before their outputs (cuDNN convolutions and RNNs, softmax, norms);
//! - `message`: a frame from the program as its message (JSON, or the
//!   binary form of the frequent `ma` and `f`);
//! - `serve`: the connection, the child's end, the outcome;
//! - `replay`: the program's requests saved, and replayed on another GPU or
//!   allocator config without running it again;
//! - `sweep`: the program traced once per value of an argument, fitted as
//!   `vramscope sweep` fits a scenario.

mod args;
mod error;
mod kernels;
mod launch;
mod message;
mod outcome;
mod plans;
mod replay;
mod rules;
mod serve;
mod simulator;
mod sweep;
#[cfg(test)]
mod tests;
mod wire;

pub use error::TraceError;
pub use launch::{ChildOutput, Launch, HELPER_MODULES, HOLDERS_SOURCE};
pub use outcome::{Assumed, Estimate, Exception, Known, TraceOutcome, Untraced};
pub use replay::{replay, ReplayInfo, ReplayOptions, RequestLog, REQUESTS_MAGIC};
pub use rules::{release_of, Rules};
pub use serve::{start, TraceOptions, TraceRun};
pub use simulator::{Simulator, HOLDERS_BUDGET_MS};
pub use sweep::{parse_sweep, point_of, substitute, TraceSweep};
