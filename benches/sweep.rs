//! The course's 7-point ResNet-50 sweep (batch 1…64, forward and
//! `sum().backward()`, each point a fresh run): target ≤ 1 s. On two
//! threads (the points in parallel) and on one, and one point alone at
//! batch 64, the largest.

use criterion::{criterion_group, criterion_main, Criterion};
use vramscope::scenario::resolve;
use vramscope::sweep::{run, run_point, SweepPlan};

fn resnet50_sweep(c: &mut Criterion) {
    let (scenario, built) = match resolve("resnet50-batch-sweep") {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    let plan = match SweepPlan::new(&scenario, &built, None, None, false) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(plan.points().len(), 7);
    let mut group = c.benchmark_group("resnet50_sweep_7_points");
    group.sample_size(20);
    for threads in [1, 2] {
        group.bench_function(format!("{threads}_threads"), |b| {
            b.iter(|| match run(&scenario, &built, &plan, false, threads) {
                Ok(s) => s,
                Err(e) => panic!("{e}"),
            })
        });
    }
    group.bench_function("one_point_batch_64", |b| {
        b.iter(|| match run_point(&scenario, &built, 64, None) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        })
    });
    group.bench_function("find_max_batch", |b| {
        b.iter(|| match run(&scenario, &built, &plan, true, 2) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        })
    });
    group.finish();
}

criterion_group!(benches, resnet50_sweep);
criterion_main!(benches);
