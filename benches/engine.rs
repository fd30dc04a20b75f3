//! One simulated training iteration of GPT-2-small (12 layers): target ≤ 1 ms.
//! And a loop of N `AllocateBuffer` steps, each into a name of its own, at
//! 10,000 and 100,000 names: the time per step must not grow with the names
//! bound (it once went 0.8 s → 24 s for 10× the names).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use vramscope::engine::{Engine, EngineConfig, ModelConfig, OptimizerConfig, Program};
use vramscope::scenario::{load_str, run, RunOptions};

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

/// A scenario of `n` `AllocateBuffer` steps into distinct names, one iteration.
fn distinct_names(n: usize) -> String {
    let steps: Vec<String> = (0..n)
        .map(|i| format!("        AllocateBuffer(name: \"b{i}\", shape: [8], dtype: F32),"))
        .collect();
    format!(
        "Scenario(\n    name: \"names\",\n    description: \"many names\",\n    device: (name: \"sim\", capacity: \"16GiB\", overhead: \"0\"),\n    model: Preset(\"mlp-mnist\"),\n    steps: [\n{}\n    ],\n    iterations: 1,\n)\n",
        steps.join("\n")
    )
}

fn steps_with_many_names(c: &mut Criterion) {
    let mut group = c.benchmark_group("allocate_buffer_steps");
    group.sample_size(10);
    for n in [10_000, 100_000] {
        let (scenario, built) = match load_str(&distinct_names(n), "names.ron") {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| run(&scenario, &built, &RunOptions::default()))
        });
    }
    group.finish();
}

criterion_group!(benches, gpt2_iteration, steps_with_many_names);
criterion_main!(benches);
