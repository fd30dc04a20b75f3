//! One simulated training iteration of GPT-2-small (12 layers): target ≤ 1 ms.

use criterion::{criterion_group, criterion_main, Criterion};
use vramscope::engine::{Engine, EngineConfig, ModelConfig, OptimizerConfig, Program};

fn gpt2_iteration(c: &mut Criterion) {
    let cfg = EngineConfig {
        device_bytes: 80 << 30,
        ..EngineConfig::default()
    };
    let mut e = match Engine::new(
        cfg,
        &ModelConfig::gpt2_small(8, 1024),
        &OptimizerConfig::adamw(),
    ) {
        Ok(e) => e,
        Err(err) => panic!("build: {err}"),
    };
    let p = Program::training(1);
    // Warm up past the lazy first step (Adam state, workspaces).
    for _ in 0..2 {
        if let Err(err) = e.run_iteration(&p) {
            panic!("iteration: {err}");
        }
    }
    e.clear_events();
    c.bench_function("gpt2_small_train_iteration", |b| {
        b.iter(|| {
            if let Err(err) = e.run_iteration(&p) {
                panic!("iteration: {err}");
            }
            e.clear_events();
        })
    });
}

criterion_group!(benches, gpt2_iteration);
criterion_main!(benches);
