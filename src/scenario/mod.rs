//! Scenario files (RON): a device, an allocator config, a model, data and a
//! training loop written as steps that read like the PyTorch code they stand
//! for, with narration and expectations. `load` parses and validates with
//! line:column errors; `build` turns a scenario into what the engine runs;
//! `run` is the one loop that steps it (engine, narration, leak detector),
//! which `headless` drives to its end for the report and the UI's producer
//! drives live; `library` holds the built-in scenarios; `listing` writes a
//! program out as the PyTorch code it stands for.

mod buffers;
mod build;
mod conditions;
mod dims;
mod events;
mod expect;
mod format;
mod headless;
mod library;
mod listing;
mod load;
mod narration;
mod ron_spans;
mod run;
mod size;
mod statement;
mod steps;
mod validate;
mod value_kinds;

#[cfg(test)]
mod tests;

pub use buffers::{buffers_allocated, MAX_BUFFERS};
pub use build::{at_point, has_seq, BuildError, Built};
pub(crate) use conditions::apply as apply_conditions;
pub use conditions::{lt_rule, Conditions, ENV_KEYS};
pub use dims::MAX_DIM;
pub use events::to_trace;
pub use expect::{check, ExpectationResult};
pub use format::{
    At, Criterion, DataSpec, DeviceSpec, Expectation, LayerSpec, ModelSpec, Narration, Scenario,
    SweepSpec,
};
pub use headless::{
    last_iteration_estimate, run, run_launching, run_launching_with, run_observed, GpuRun,
    OomReport, RunOptions, RunResult,
};
pub use library::{builtin, builtins, BuiltIn};
pub use listing::{CodeLine, Listing};
pub use load::{
    conf_label, load_file, load_named_file, load_str, resolve, resolve_under, LoadError,
};
pub use narration::NarrationTracker;
pub use run::{Advanced, IterationPoint, ScenarioRun, Unit};
pub use size::Size;
pub use statement::{statement, statement_in, LoopShape};
pub use steps::{StepSite, StepSites};
pub use validate::{steps_executed, MAX_ITERATIONS, MAX_STEPS};
