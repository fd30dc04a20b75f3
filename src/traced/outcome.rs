//! What a traced run came to, beside the stream: the figures `--json` puts
//! at the top (`peak_allocated`, `peak_reserved`, as `run --json` has them),
//! how the program ended, and what could not be traced.

use serde::Serialize;

use super::replay::ReplayInfo;

/// Something the trace could not follow, with the program's line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Untraced {
    /// The aten op (`aten.nonzero.default`).
    pub what: String,
    /// Why (PyTorch's words).
    pub why: String,
    /// The innermost frame of the program's own code: `file:line in name`.
    pub at: Option<String>,
    /// What vramscope did instead.
    pub instead: String,
}

/// A size the trace estimated (no measurement for this shape on this GPU
/// and release: cuDNN's workspaces, reserves and dropout state).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Estimate {
    /// The call and its shape.
    pub what: String,
    /// The size the trace took (bytes; a workspace and a reserve summed).
    pub bytes: u64,
    /// How many calls took it.
    pub calls: u64,
}

/// A shape the trace could not know and took from an assumption: an op
/// whose output size depends on the data (`nonzero`, `torch.where(cond)`,
/// `masked_select`, a boolean mask index, `bincount`), which the simulated
/// GPU does not hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Assumed {
    /// The aten op (`aten.nonzero`).
    pub what: String,
    /// The assumption, in words (balanced top-k routing; every element true).
    pub assumption: String,
    /// The innermost frame of the program's own code: `file:line in name`.
    pub at: Option<String>,
    /// How many calls took it.
    pub calls: u64,
}

/// A data-dependent size the trace took from the program's own values
/// (`nonzero`, a boolean mask index, `bincount`, `unique` of a tensor whose
/// values follow from values the program had: the helper keeps small
/// tensors' values on the CPU, docs/trace.md "Known values").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Known {
    /// The aten op (`aten.nonzero`).
    pub what: String,
    /// The innermost frame of the program's own code: `file:line in name`.
    pub at: Option<String>,
    /// How many calls took their size so.
    pub calls: u64,
}

/// An exception that ended the program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Exception {
    pub kind: String,
    pub message: String,
    /// Where it was raised: `file:line in name`, innermost first.
    pub at: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct TraceOutcome {
    /// `max_memory_allocated()` over the run, bytes.
    pub peak_allocated: u64,
    /// `max_memory_reserved()` over the run, bytes.
    pub peak_reserved: u64,
    /// At the end of the trace.
    pub allocated: u64,
    pub reserved: u64,
    /// The GPU profile simulated.
    pub gpu: String,
    /// The traced program's PyTorch, and whose rules the trace followed.
    pub torch: Option<String>,
    pub rules: Option<String>,
    /// `PYTORCH_CUDA_ALLOC_CONF` the allocator ran under, and where it came from.
    pub alloc_conf: String,
    pub alloc_conf_from: String,
    pub command: Vec<String>,
    pub steps: u64,
    pub allocations: u64,
    /// The program's messages that waited for an answer, and those sent
    /// without waiting (frees, storages within the headroom, stacks, steps).
    pub waited: u64,
    pub posted: u64,
    pub ooms: u64,
    /// Why the trace ended (`the program ended`, `stopped after 3 optimizer steps`).
    pub ended: Option<String>,
    /// The program's exit status (None: killed by a signal, or not waited for).
    pub exit_status: Option<i32>,
    pub exception: Option<Exception>,
    pub untraced: Vec<Untraced>,
    /// Sizes estimated, not measured (each said in the report).
    pub estimates: Vec<Estimate>,
    /// Data-dependent shapes taken from an assumption (each said in the report).
    pub assumed: Vec<Assumed>,
    /// Data-dependent shapes taken from values the program computed (not
    /// assumed: each said in the report).
    pub known: Vec<Known>,
    /// Set when the run is a replay of saved requests (`--from`).
    pub replay: Option<ReplayInfo>,
    /// Whether the program ever started CUDA (imported torch and used the GPU).
    pub cuda_started: bool,
    /// The program never connected (it did not import torch, or ran with
    /// `python -I`/`-S`, which skip the helper): said, never silent.
    pub never_connected: bool,
}
