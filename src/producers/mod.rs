//! Producers: everything that feeds the UI, each on a thread of its own, all
//! over one message type ([`SourceMsg`]) to one receiving end ([`Source`])
//! that the UI drains without blocking (DESIGN.md "producers"; bottom's
//! collection thread, gitui's async jobs). A new producer plugs in here
//! without touching the views.
//!
//! - `scenario`: a scenario stepped live ([`crate::scenario::ScenarioRun`],
//!   the loop the headless report drives too), with restart;
//! - `snapshot`: a PyTorch snapshot's trace mirrored into events, or its
//!   requests replayed under another allocator config (`devices`: which of
//!   its devices a view shows);
//! - `job`: a running PyTorch job attached over `crate::job` (or a
//!   recording of one), growing as it runs;
//! - `nvml`: the NVML poller (the GPU panel and `watch`);
//! - `open`: the producer for an input as a user names it;
//! - `sweep`: a batch sweep's points as they finish, then its fit.
//!
//! They draw nothing and compute no allocator rule of their own: facts come
//! from `alloc`, `trace`, `scenario` and `leak`.

pub mod devices;
mod entry_times;
pub mod job;
mod job_tags;
pub mod nvml;
pub mod open;
pub mod scenario;
pub mod snapshot;
mod snapshot_stream;
mod snapshot_tags;
pub mod source;
pub mod sweep;
mod tapped_read;
mod whatif_stream;

pub use devices::{snapshot_devices, SnapshotDevices};
pub use job::{job_source, job_source_with, JobOptions};
pub use nvml::nvml_source;
pub use open::{file_title, is_snapshot_path, open_source, open_source_under};
pub use scenario::{scenario_source, scenario_source_on, RealGpu, ITERATION_PACE};
pub use snapshot::{
    reopen_on, snapshot_source, snapshot_tab_source, snapshot_to_source, what_if_file_source,
    what_if_source, ImportError,
};
pub use source::{
    BlockStack, EngineCommand, EntryDetail, JobMsg, LoadProgress, Opened, Polled, RecordedMsg,
    RunMsg, ScenarioMsg, ScenarioStep, SiteKind, Source, SourceMsg, StackOrigin, SweepMsg,
    TagDescription, TagInfo,
};
pub use sweep::sweep_source;
