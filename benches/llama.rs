//! One simulated training iteration of Llama-3-8B (32 layers, 8,030,261,248
//! parameters) at batch 1 × 2,048 tokens with AdamW, under autocast bf16 on
//! fp32 weights (HF Trainer `bf16=True`), on an sm90 profile: target ≤ 5 ms.
//! The simulated device is 256 GiB so the run measures the engine's speed,
//! not an OOM (on an 80 GB card fp32 AdamW state alone is 64 GB).

use criterion::{criterion_group, criterion_main, Criterion};
use vramscope::engine::{
    BatchAssign, DType, Engine, EngineConfig, GpuArch, ModelConfig, OptimizerConfig, Program, Step,
};

fn training_program() -> Program {
    let s = |x: &str| x.to_string();
    let mut p = Program::training(1);
    p.steps = vec![
        Step::ZeroGrad {
            set_to_none: Some(true),
            optimizer: None,
        },
        Step::LoadBatch {
            x: s("x"),
            y: s("y"),
            assign: BatchAssign::Together,
        },
        Step::AutocastEnter { dtype: DType::BF16 },
        Step::Forward {
            input: s("x"),
            output: s("out"),
            model: None,
        },
        Step::Loss {
            output: s("out"),
            target: s("y"),
            into: s("loss"),
            divide_by: None,
        },
        Step::AutocastExit,
        Step::Delete { name: s("out") },
        Step::Backward {
            loss: s("loss"),
            retain_graph: false,
        },
        Step::OptimizerStep,
    ];
    p
}

fn llama3_8b_iteration(c: &mut Criterion) {
    let cfg = EngineConfig {
        device_bytes: 256 << 30,
        gpu_arch: Some(GpuArch::Sm90),
        ..EngineConfig::default()
    };
    let Some(model) = ModelConfig::preset("llama-3-8b") else {
        panic!("no llama-3-8b preset");
    };
    let mut e = match Engine::new(cfg, &model, &OptimizerConfig::adamw()) {
        Ok(e) => e,
        Err(err) => panic!("build: {err}"),
    };
    let p = training_program();
    // Warm up past the lazy first step (Adam state, workspaces).
    for _ in 0..2 {
        if let Err(err) = e.run_iteration(&p) {
            panic!("iteration: {err}");
        }
    }
    e.clear_events();
    let mut group = c.benchmark_group("llama");
    group.sample_size(20);
    group.bench_function("llama3_8b_train_iteration_1x2048_adamw", |b| {
        b.iter(|| {
            if let Err(err) = e.run_iteration(&p) {
                panic!("iteration: {err}");
            }
            e.clear_events();
        })
    });
    group.finish();
}

criterion_group!(benches, llama3_8b_iteration);
criterion_main!(benches);
