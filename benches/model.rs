//! `vramscope model` for every preset: build the model on a simulated device,
//! one forward at batch 1, and the summary. Target ≤ 50 ms per preset.

use criterion::{criterion_group, criterion_main, Criterion};
use vramscope::engine::summary::ModelSummary;
use vramscope::engine::{ModelConfig, PRESET_CATALOGUE};

fn model_summary(c: &mut Criterion) {
    let mut group = c.benchmark_group("model_summary");
    group.sample_size(20);
    for p in PRESET_CATALOGUE {
        let Some(cfg) = ModelConfig::preset(p.name) else {
            panic!("{}: not a preset", p.name);
        };
        group.bench_function(p.name, |b| {
            b.iter(|| match ModelSummary::measure(&cfg) {
                Ok(s) => s.parameters,
                Err(e) => panic!("{}: {e}", p.name),
            })
        });
    }
    group.finish();
}

criterion_group!(benches, model_summary);
criterion_main!(benches);
