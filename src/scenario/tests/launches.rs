//! Kernel launches of library scenarios run without a GPU: a
//! RecordingLauncher writes them down, and every launch is checked against
//! the allocator's blocks at the moment it goes out
//! (`engine::tests::launches::violation`).

use std::sync::{Arc, Mutex};

use crate::device::{Kernel, Launch, RecordingLauncher, SimDevice};
use crate::engine::modules::Model;
use crate::engine::optim::Optimizer;
use crate::engine::{Engine, Program};
use crate::scenario::resolve;

struct Run {
    engine: Engine,
    log: Arc<Mutex<Vec<Launch>>>,
    program: Program,
}

/// A library scenario's engine with a checked recording launcher from the
/// first parameter on (what `Engine::new_launching` does, plus the check).
fn scenario_engine(name: &str) -> Run {
    let (_, built) = match resolve(name) {
        Ok(x) => x,
        Err(e) => panic!("{name}: {e}"),
    };
    let dev = Box::new(SimDevice::new(
        &built.conditions.device_name,
        built.engine.device_bytes,
        built.engine.device_overhead,
    ));
    let rec = RecordingLauncher::new();
    let log = rec.log();
    let mut e = Engine::bare_on(built.engine.clone(), dev).expect("engine");
    e.set_launcher(Some(Box::new(rec)));
    e.launch_violations = Some(Vec::new());
    let m = Model::build(&mut e, &built.model).expect("model");
    e.model = Some(Box::new(m));
    e.optimizer = Some(Optimizer::new(built.optimizer.clone()));
    Run {
        engine: e,
        log,
        program: built.program,
    }
}

fn run_scenario(name: &str, iterations: u32) -> Run {
    let mut r = scenario_engine(name);
    let p = r.program.clone();
    for (i, step) in p.setup.iter().enumerate() {
        r.engine.run_step(step, i as u32, &p).expect("setup step");
    }
    for _ in 0..iterations {
        if let Err(err) = r.engine.run_iteration(&p) {
            panic!("{name}: iteration failed: {err}");
        }
    }
    r
}

fn assert_clean(name: &str, r: &Run) {
    let violations = r.engine.launch_violations.clone().unwrap_or_default();
    assert!(
        violations.is_empty(),
        "{name}: {} launches outside allocated blocks, first: {}",
        violations.len(),
        violations[0]
    );
    let stats = r.engine.launch_stats();
    for k in [
        Kernel::Matmul,
        Kernel::Add,
        Kernel::Relu,
        Kernel::Fill,
        Kernel::Sum,
    ] {
        assert!(stats.count(k) > 0, "{name}: no {} launch", k.name());
    }
    let logged = r.log.lock().map(|l| l.len()).unwrap_or(0) as u64;
    assert_eq!(stats.total(), logged, "{name}: every launch counted once");
    assert_eq!(stats.failed, 0);
}

#[test]
fn mlp_scenario_launches_stay_inside_allocated_blocks() {
    let r = run_scenario("zero-grad-fixed", 2);
    assert_clean("zero-grad-fixed", &r);
    let log = r.log.lock().expect("log").clone();
    // mlp-mnist (§10.1): 784 → 1024 → 1024 → 10 at B = 256. The first GEMM
    // of the run is the first Linear's forward: [256, 784] · W → [256, 1024].
    let first = log.iter().find_map(|l| match *l {
        Launch::Matmul { m, n, k, .. } => Some((m, n, k)),
        _ => None,
    });
    assert_eq!(first, Some((256, 1024, 784)));
    // Every parameter is filled once at build time, before any other kernel:
    // 3 weights and 3 biases.
    let fills_first = log
        .iter()
        .take_while(|l| l.kernel() == Kernel::Fill)
        .count();
    assert!(fills_first >= 6, "{fills_first} fills before the first op");
    // Two iterations of 3 Linear layers: 3 forward GEMMs each, and backward
    // GEMMs for the weights (all 3) and for the inputs of layers 2 and 3.
    let gemms = log.iter().filter(|l| l.kernel() == Kernel::Matmul).count();
    assert_eq!(gemms, 2 * (3 + 3 + 2));
}

#[test]
fn gpt_scenarios_launch_inside_allocated_blocks() {
    // fp32, autocast fp16 with a GradScaler, and activation checkpointing.
    for name in ["amp-fp32", "amp-fp16", "checkpoint-every-layer"] {
        let r = run_scenario(name, 1);
        assert_clean(name, &r);
    }
}

#[test]
fn zero_grad_in_place_fills_every_grad() {
    // set_to_none=False zeroes each existing .grad in place (§3.2): from the
    // second iteration on, one fill per parameter in zero_grad.
    let r = run_scenario("zero-grad-keep-grads", 2);
    assert_clean("zero-grad-keep-grads", &r);
    let params = r.engine.parameters();
    let grads: Vec<u64> = params
        .iter()
        .filter_map(|p| r.engine.grad(*p))
        .filter_map(|g| r.engine.span(g).map(|s| s.0))
        .collect();
    assert_eq!(grads.len(), params.len());
    let log = r.log.lock().expect("log").clone();
    let zero_fills = log
        .iter()
        .filter(|l| matches!(l, Launch::Fill { out, value, .. } if *value == 0.0 && grads.contains(out)))
        .count();
    assert!(
        zero_fills >= params.len(),
        "{zero_fills} zero fills of grads"
    );
}

#[test]
fn offloaded_optimizer_state_gets_no_launch() {
    // optimizer-cpu-offload: AdamW state in host memory, the step on the CPU
    // (§5.3). No launch may touch a CPU storage, so the optimizer phase of a
    // GPU run launches nothing; the rest of the run does.
    let mut r = scenario_engine("optimizer-cpu-offload");
    let p = r.program.clone();
    r.engine.run_iteration(&p).expect("iteration 1");
    let before = r.engine.launch_stats().total();
    r.engine.optimizer_step().expect("offloaded step");
    assert_eq!(r.engine.launch_stats().total(), before);
    assert!(before > 0);
    assert_clean("optimizer-cpu-offload", &r);
    // Its state really is on the host.
    let state_on_gpu = r.engine.optimizer.as_ref().map(|o| {
        o.state
            .values()
            .flat_map(|s| &s.bufs)
            .any(|b| r.engine.is_cuda(*b))
    });
    assert_eq!(state_on_gpu, Some(false));
}
