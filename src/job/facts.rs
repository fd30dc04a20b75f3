//! What only a live job tells, beside the snapshot report of it
//! (`report::job` puts the two together for `attach --headless`/`--json`).

use serde::Serialize;

use super::message::{LostMark, OomMark};

/// What only a live job tells.
#[derive(Debug, Clone, Serialize)]
pub struct LiveFacts {
    /// The address or recording read.
    pub address: String,
    pub pid: Option<u64>,
    pub rank: Option<u64>,
    pub world_size: Option<u64>,
    pub hostname: Option<String>,
    pub argv: Vec<String>,
    pub torch: Option<String>,
    /// `agent` or `poll`; `None` before the hello.
    pub mode: Option<String>,
    pub stacks: Option<bool>,
    /// Every step marker received; `steps_kept`: since the last start-over.
    pub steps_seen: u64,
    pub steps_kept: usize,
    pub step_source: Option<String>,
    /// Filled by the report, from its leak analysis of the steps.
    pub growth: Vec<DeviceGrowth>,
    /// The job's own `memory_stats()` at each step over the whole attach
    /// (across start-overs): the creep a long run shows.
    pub memory_per_step: Vec<super::creep::StepTrend>,
    pub ooms: Vec<OomMark>,
    pub lost: Vec<LostMark>,
    /// Each time the view started over, and why.
    pub started_over: Vec<String>,
    /// Each device against NVML's reading of the job's process, read once
    /// at the end (`attach --headless`/`--json`; empty elsewhere).
    pub nvml: Vec<super::nvml_match::NvmlEntry>,
    /// The helper's walks from the job's Python names to its tensors: who
    /// holds what grew (PROTOCOL.md `holders`), oldest first.
    pub holders: Vec<super::holders::HoldersReport>,
    /// Why the stream ended (`bye`'s reason, or the disconnect); `None`
    /// while it goes on (a Ctrl-C report).
    pub ended: Option<String>,
}

/// Live bytes of one device at each step boundary since the last start-over.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceGrowth {
    pub device: i64,
    /// Bytes of the trace's allocations live at each step boundary.
    pub live_at_step: Vec<u64>,
    /// The change from one boundary to the next.
    pub growth_per_step: Vec<i64>,
}
