//! Leak analysis after one iteration: 10,000 live tensors and a retained
//! graph chain spanning 100 iterations. Target ≤ 1 ms (it runs at every TUI step).

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use vramscope::alloc::Tag;
use vramscope::engine::{
    Category, DType, DeviceKind, Engine, EngineConfig, GradContext, HeldState, KeepWhat,
    ModelConfig, NodeId, NodeInfo, OptimizerConfig, Program, RootInfo, RootKind, SavedInfo, Step,
    StorageId, StorageInfo, TensorId,
};
use vramscope::leak::Detector;

const ITERS: u32 = 100;
const NODES_PER_ITER: u32 = 8;
const LIST: u32 = 9_500;

/// A root that holds its own storage and no graph.
fn plain_root(
    kind: RootKind,
    name: String,
    tensor: TensorId,
    storage: u32,
    bytes: u64,
) -> RootInfo {
    RootInfo {
        kind,
        name,
        tensor,
        storage: StorageId(storage),
        bytes,
        device: DeviceKind::Cuda,
        nodes: Vec::new(),
        saved_storages: Vec::new(),
        leaf_storages: Vec::new(),
        saved_bytes: 0,
        exclusive_saved_bytes: 0,
        oldest_node_iteration: None,
        spent_nodes: 0,
    }
}

fn storage(id: u32, bytes: u64, it: u32, refs: u32, saved: u32) -> StorageInfo {
    StorageInfo {
        id: StorageId(id),
        device: DeviceKind::Cuda,
        bytes,
        // The default config's rounding (allocator.md §2.2).
        block: vramscope::alloc::rounding::round_size(
            bytes,
            &vramscope::alloc::AllocConfig::default(),
        ),
        addr: Some(0x7f00_0000_0000 + id as u64 * 0x10_0000),
        category: Category::Activation,
        tag: Tag(0),
        iteration: it,
        tensor_refs: refs,
        saved_by: saved,
        engine_held: false,
        graph_leaf: false,
    }
}

/// Iteration `it` of a synthetic run: `total_loss` chains 100 iterations of
/// graphs (8 Nodes and 4 saved 1 MiB tensors each), `preds` holds 9,500
/// detached outputs, `out`/`loss` the current graph, plus parameters and grads.
fn synthetic(it: u32) -> HeldState {
    let module: Arc<str> = Arc::from("fc1");
    let mut storages = Vec::new();
    let mut nodes = Vec::new();
    let mut roots = Vec::new();
    let mut sid = 0u32;
    let mut chain_saved = Vec::new();
    let mut chain_nodes = Vec::new();
    let mut prev_acc: Option<NodeId> = None;
    for k in 1..=ITERS.min(it) {
        let base = (k - 1) * NODES_PER_ITER;
        for j in 0..NODES_PER_ITER {
            let id = NodeId(base + j);
            let mut saved = Vec::new();
            if j % 2 == 1 {
                storages.push(storage(sid, 1 << 20, k, 0, 1));
                saved.push(SavedInfo {
                    name: "mat1",
                    shape: vec![256, 1024],
                    dtype: DType::F32,
                    bytes: 1 << 20,
                    storage: Some(StorageId(sid)),
                    is_output: false,
                });
                chain_saved.push(StorageId(sid));
                sid += 1;
            }
            let mut next = Vec::new();
            if j + 1 < NODES_PER_ITER {
                next.push(NodeId(base + j + 1));
            }
            if j == 0 {
                if let Some(p) = prev_acc {
                    next.push(p);
                }
            }
            nodes.push(NodeInfo {
                id,
                name: if j == 0 {
                    "AddBackward0"
                } else {
                    "AddmmBackward0"
                },
                iteration: k,
                seq: id.0 as u64,
                released: false,
                module: module.clone(),
                saved,
                held: Vec::new(),
                next,
            });
            chain_nodes.push(id);
        }
        prev_acc = Some(NodeId(base));
    }
    let acc_storage = sid;
    storages.push(storage(sid, 4, 1, 1, 0));
    sid += 1;
    roots.push(RootInfo {
        kind: RootKind::Variable,
        name: "total_loss".into(),
        tensor: TensorId(0),
        storage: StorageId(acc_storage),
        bytes: 4,
        device: DeviceKind::Cuda,
        nodes: chain_nodes.iter().rev().copied().collect(),
        saved_bytes: chain_saved.len() as u64 * (1 << 20),
        exclusive_saved_bytes: chain_saved.len() as u64 * (1 << 20),
        saved_storages: chain_saved,
        leaf_storages: Vec::new(),
        oldest_node_iteration: Some(it.saturating_sub(ITERS) + 1),
        spent_nodes: 0,
    });
    for i in 0..LIST {
        storages.push(storage(sid, 10_240, i * it / LIST, 1, 0));
        roots.push(plain_root(
            RootKind::ListElement { index: i as usize },
            format!("preds[{i}]"),
            TensorId(1 + i),
            sid,
            10_240,
        ));
        sid += 1;
    }
    for i in 0..500u32 {
        storages.push(storage(sid, 4 << 20, 0, 1, 0));
        let kind = if i % 2 == 0 {
            RootKind::Parameter
        } else {
            RootKind::Gradient
        };
        roots.push(plain_root(
            kind,
            format!("param[{}]{}", i / 2, if i % 2 == 1 { ".grad" } else { "" }),
            TensorId(20_000 + i),
            sid,
            4 << 20,
        ));
        sid += 1;
    }
    let allocated = storages.iter().map(|s| s.bytes.div_ceil(512) * 512).sum();
    HeldState {
        iteration: it,
        host_graph_nodes: nodes.len(),
        roots,
        nodes,
        storages,
        allocated,
        reserved: allocated + (64 << 20),
        peak_allocated: allocated,
        spent_reached: None,
    }
}

fn synthetic_bench(c: &mut Criterion) {
    let mut d = Detector::new(80 << 30);
    for it in 1..=ITERS {
        let ls = synthetic(it);
        d.observe(&ls, ls.allocated, ls.reserved);
    }
    let ls = synthetic(ITERS);
    assert!(ls.roots.len() >= 10_000, "{}", ls.roots.len());
    assert!(!d.findings().is_empty());
    // The machine may be shared: also print the best of 200 runs.
    let best = (0..200)
        .map(|_| {
            let t = std::time::Instant::now();
            std::hint::black_box(d.observe(&ls, ls.allocated, ls.reserved).len());
            t.elapsed()
        })
        .min()
        .unwrap_or_default();
    eprintln!("leak_observe_10k_tensors_100_iter_chain: best of 200 = {best:?}");
    c.bench_function("leak_observe_10k_tensors_100_iter_chain", |b| {
        b.iter(|| {
            let f = d.observe(&ls, ls.allocated, ls.reserved);
            std::hint::black_box(f.len())
        })
    });
}

fn engine_bench(c: &mut Criterion) {
    // mlp-mnist evaluated with grad, `total_loss += loss` (pitfall 1b) for 100 iterations.
    let mut e = match Engine::new(
        EngineConfig::default(),
        &ModelConfig::mlp_mnist(),
        &OptimizerConfig::adamw(),
    ) {
        Ok(e) => e,
        Err(err) => panic!("build: {err}"),
    };
    let mut steps = vec![Step::Eval {
        grad: GradContext::Enabled,
    }];
    steps.extend(Program::forward_steps());
    steps.push(Step::AccumulateLoss {
        from: "loss".into(),
        into: "total_loss".into(),
        what: KeepWhat::Tensor,
    });
    let p = Program {
        setup: Vec::new(),
        steps,
        iterations: ITERS,
        batch_sizes: Vec::new(),
        seq_lens: Vec::new(),
        epoch_len: 0,
    };
    let mut d = Detector::for_engine(&e).with_program(&p);
    for _ in 0..ITERS {
        if let Err(err) = e.run_iteration(&p) {
            panic!("iteration: {err}");
        }
        e.clear_events();
        let ls = e.held_state();
        d.observe(&ls, e.allocated_bytes(), e.reserved_bytes());
    }
    let ls = e.held_state();
    let (a, r) = (e.allocated_bytes(), e.reserved_bytes());
    c.bench_function("leak_observe_mlp_total_loss_100_iters", |b| {
        b.iter(|| std::hint::black_box(d.observe(&ls, a, r).len()))
    });
    c.bench_function("engine_live_state_mlp_total_loss_100_iters", |b| {
        b.iter(|| std::hint::black_box(e.held_state().roots.len()))
    });
}

/// An engine after `graphs` iterations of evaluation with grad enabled,
/// each appending its loss, graph and all, to a list: `graphs` retained
/// graphs, as the deque of issue 39 held before the device ran out.
fn retained(graphs: u32) -> (Engine, Program) {
    let mut e = match Engine::new(
        EngineConfig {
            device_bytes: 80 << 30,
            ..EngineConfig::default()
        },
        &ModelConfig::mlp_mnist(),
        &OptimizerConfig::adamw(),
    ) {
        Ok(e) => e,
        Err(err) => panic!("build: {err}"),
    };
    let mut steps = vec![Step::Eval {
        grad: GradContext::Enabled,
    }];
    steps.extend(Program::forward_steps());
    steps.push(Step::Append {
        from: "loss".into(),
        list: "kept".into(),
        what: KeepWhat::Tensor,
    });
    let p = Program {
        setup: Vec::new(),
        steps,
        iterations: graphs,
        batch_sizes: vec![8],
        seq_lens: Vec::new(),
        epoch_len: 0,
    };
    for _ in 0..graphs {
        if let Err(err) = e.run_iteration(&p) {
            panic!("iteration: {err}");
        }
        e.clear_events();
    }
    (e, p)
}

/// One observation (the engine's live state, then the detector's
/// analysis) with 200 and with 1,601 retained graphs: linear means the
/// second takes about 8× the first.
fn retained_graphs_bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("leak_retained_graphs");
    group.sample_size(10);
    for graphs in [200u32, 800, 1_601, 3_200] {
        let (e, p) = retained(graphs);
        let mut d = Detector::for_engine(&e).with_program(&p);
        let (a, r) = (e.allocated_bytes(), e.reserved_bytes());
        let best = (0..5)
            .map(|_| {
                let t = std::time::Instant::now();
                let ls = e.held_state();
                std::hint::black_box(d.observe(&ls, a, r).len());
                t.elapsed()
            })
            .min()
            .unwrap_or_default();
        eprintln!("leak_retained_graphs/{graphs}: best of 5 = {best:?}");
        let t = std::time::Instant::now();
        let ls = e.held_state();
        let t_ls = t.elapsed();
        let t = std::time::Instant::now();
        std::hint::black_box(d.observe(&ls, a, r).len());
        eprintln!(
            "  of which held_state {t_ls:?}, observe {:?} ({} roots reaching {} nodes in all, {} saved; {} nodes, {} storages)",
            t.elapsed(),
            ls.roots.len(),
            ls.roots.iter().map(|r| r.nodes.len()).sum::<usize>(),
            ls.roots.iter().map(|r| r.saved_storages.len()).sum::<usize>(),
            ls.nodes.len(),
            ls.storages.len()
        );
        group.bench_function(format!("{graphs}"), |b| {
            b.iter(|| {
                let ls = e.held_state();
                std::hint::black_box(d.observe(&ls, a, r).len())
            })
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    synthetic_bench,
    engine_bench,
    retained_graphs_bench
);
criterion_main!(benches);
