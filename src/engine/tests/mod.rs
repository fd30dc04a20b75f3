//! Engine tests. Expected numbers are written from the spec's formulas
//! (engine.md section cited at each), never from the engine's own output.

mod behaviour;
mod bnb;
mod checkpointing;
mod driver_layout;
mod dtypes;
mod golden;
mod handwritten;
mod hf_families;
mod hvp;
mod lang;
pub(crate) mod launches;
mod loop_language;
mod moe_v5;
mod optimizer_sweeps;
mod precision;
mod presets;
mod reference_cycles;
mod releases;
mod transformer;
mod work;

use crate::alloc::{Action, AllocEvent};

use super::{Engine, ModelConfig};
use super::{EngineConfig, EngineEvent, OptimizerConfig, Program, Step};

/// The allocator's rounding of one request (allocator rule quoted in engine.md §1.2).
pub(crate) fn round512(bytes: u64) -> u64 {
    bytes.div_ceil(512).max(1) * 512
}

pub(crate) fn alloc_events(evs: &[EngineEvent]) -> Vec<AllocEvent> {
    evs.iter()
        .filter_map(|e| match e {
            EngineEvent::Alloc(a) => Some(*a),
            _ => None,
        })
        .collect()
}

/// (+size) for an alloc, (-size) for a free request.
pub(crate) fn requests(evs: &[EngineEvent]) -> Vec<i64> {
    alloc_events(evs)
        .into_iter()
        .filter_map(|a| match a.action {
            Action::Alloc => Some(a.size as i64),
            Action::FreeRequested => Some(-(a.size as i64)),
            _ => None,
        })
        .collect()
}

/// The rows of a GPU sweep's table, `tests/fixtures/<name>` (written by the
/// sweep program beside it): comment lines skipped, each row split at tabs.
pub(crate) fn sweep_rows(name: &str) -> Vec<Vec<String>> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect()
}

/// A sweep's `+bytes -bytes …` column as signed requests.
pub(crate) fn signed_requests(field: &str) -> Vec<i64> {
    field
        .split(' ')
        .filter(|r| !r.is_empty())
        .map(|r| r.parse().unwrap_or_else(|e| panic!("{r:?}: {e}")))
        .collect()
}

/// The requests a backward of `y * y`'s sum makes inside the last node to
/// run whose name ends with `node` (`y * y` hands that node a contiguous
/// gradient, as the GPU sweeps' `y.backward(g)` does; the product's own
/// MulBackward0 runs first).
pub(crate) fn node_requests_in_backward(
    e: &mut Engine,
    y: super::TensorId,
    node: &str,
) -> Vec<i64> {
    let z = e.mul(y, y).expect("mul");
    let loss = e.sum(z).expect("sum");
    e.take_events();
    e.backward(loss, false).expect("backward");
    let evs = e.take_events();
    let start = evs
        .iter()
        .rposition(|ev| matches!(ev, EngineEvent::OpBegin { name, .. } if name.ends_with(node)))
        .unwrap_or_else(|| panic!("no {node} ran"));
    let len = evs[start..]
        .iter()
        .position(|ev| matches!(ev, EngineEvent::OpEnd))
        .expect("its end");
    requests(&evs[start..start + len])
}

pub(crate) fn engine(model: ModelConfig) -> Engine {
    engine_with(model, OptimizerConfig::adamw(), EngineConfig::default())
}

pub(crate) fn engine_with(model: ModelConfig, opt: OptimizerConfig, cfg: EngineConfig) -> Engine {
    match Engine::new(cfg, &model, &opt) {
        Ok(e) => e,
        Err(e) => panic!("engine build failed: {e}"),
    }
}

/// An engine config whose reductions take the H100's scratch (132 SMs,
/// 2,048 threads each), as the sweeps under tests/fixtures were run.
pub(crate) fn h100_reductions() -> EngineConfig {
    EngineConfig {
        reduce_device: Some(super::ReduceDevice {
            sm_count: 132,
            max_threads_per_sm: 2048,
        }),
        ..EngineConfig::default()
    }
}

pub(crate) fn s(x: &str) -> String {
    x.to_string()
}

pub(crate) fn forward_steps() -> Vec<Step> {
    Program::forward_steps()
}

pub(crate) fn program(steps: Vec<Step>, iterations: u32) -> Program {
    Program {
        setup: Vec::new(),
        steps,
        iterations,
        batch_sizes: Vec::new(),
        seq_lens: Vec::new(),
        epoch_len: 0,
    }
}

/// The program's setup, then its iterations, stopping at the first error.
pub(crate) fn run_program(e: &mut Engine, p: &Program) -> crate::engine::Result<()> {
    e.ctx.iteration = 0;
    for (i, s) in p.setup.iter().enumerate() {
        e.run_step(s, i as u32, p)?;
    }
    for _ in 0..p.iterations {
        e.run_iteration(p)?;
    }
    Ok(())
}

pub(crate) fn run(e: &mut Engine, p: &Program) {
    if let Err(err) = run_program(e, p) {
        panic!("program failed: {err}");
    }
}

/// zero_grad, the forward and loss, backward, step: one training iteration.
pub(crate) fn train_steps() -> Vec<Step> {
    Program::training(1).steps
}

pub(crate) fn mlp() -> Engine {
    engine(ModelConfig::mlp_mnist())
}

/// Bytes of every parameter.
pub(crate) fn param_bytes(e: &Engine) -> u64 {
    e.parameters().iter().map(|p| e.nbytes(*p)).sum()
}
