//! Allocator throughput on long mixed request streams (issue: ≥1,000,000
//! malloc/free, ≥10,000 live blocks, both pools, splits and merges; target a
//! median ≤ 100 ns per operation).
//!
//! Two streams, both with every property the issue names:
//! - `training_like_1M_default`: the shape of a training loop (long-lived
//!   parameters and optimizer state, activations freed in reverse order by
//!   the backward pass, short-lived gradient temporaries);
//! - `mixed_1M_*`: a stress case that frees a uniformly random live block
//!   each time, which no training loop does; it keeps ~2,700 fragments in
//!   the free sets and makes every free a cache miss.
//!
//! Run: `cargo bench --bench allocator`. Criterion reports time per stream of
//! `OPS` operations (the throughput line gives operations per second); divide
//! by `OPS` for ns per operation. The stream's own bookkeeping (picking the
//! block to free) is precomputed so the measured loop is the allocator.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use vramscope::alloc::{AllocConfig, CachingAllocator, Tag};
use vramscope::device::SimDevice;

const OPS: usize = 1_000_000;
/// Live blocks stay between `LIVE_MIN` and `LIVE_MAX` once warmed up.
const LIVE_MIN: usize = 10_000;
const LIVE_MAX: usize = 14_000;

#[derive(Clone, Copy)]
enum Op {
    Malloc(u64),
    /// Free the live allocation at this index (below the live count).
    Free(u64),
}

/// A deterministic xorshift stream: sizes across both pools, 10,000 to 14,000
/// live blocks, random frees (so blocks split and merge).
fn request_stream() -> Vec<Op> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut ops = Vec::with_capacity(OPS);
    let mut live = 0usize;
    while ops.len() < OPS {
        let r = next();
        let want_malloc = live < LIVE_MIN || (live < LIVE_MAX && r % 2 == 0);
        if want_malloc {
            let size = match r % 10 {
                0..=5 => 1 + (r >> 8) % 65_536,
                6..=8 => 65_536 + (r >> 8) % 4_000_000,
                _ => 4_000_000 + (r >> 8) % 24_000_000,
            };
            ops.push(Op::Malloc(size));
            live += 1;
        } else {
            // The index is drawn here so the measured loop does no division.
            ops.push(Op::Free((r >> 4) % live as u64));
            live -= 1;
        }
    }
    ops
}

fn replay(conf: &str, ops: &[Op], record: bool) -> usize {
    let device = SimDevice::new("sim", 1 << 40, 0);
    let mut a = CachingAllocator::new(device, AllocConfig::parse(conf).expect("valid conf"));
    a.set_recording(record);
    let mut live: Vec<u64> = Vec::with_capacity(LIVE_MAX);
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Malloc(size) => live.push(a.malloc(size, 0, Tag(i as u64)).expect("fits")),
            Op::Free(k) => {
                let addr = live.swap_remove(k as usize);
                a.free(addr).expect("live");
            }
        }
        if record && i % 4096 == 0 {
            a.drain_events().for_each(drop);
        }
    }
    live.len() + a.take_events().len()
}

/// A training-like stream: ~12,000 long-lived blocks (parameters, gradients,
/// optimizer state) allocated once, then iterations whose forward pass
/// allocates activations and whose backward frees them in reverse order with
/// short-lived gradient temporaries in between.
fn training_stream() -> Vec<Op> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut ops = Vec::with_capacity(OPS);
    let mut live = 0u64;
    for _ in 0..12_000 {
        let r = next();
        ops.push(Op::Malloc(if r % 4 == 0 {
            1_048_577 + r % 8_000_000
        } else {
            512 + r % 900_000
        }));
        live += 1;
    }
    let layer_sizes: Vec<u64> = (0..300).map(|_| 4096 + next() % 6_000_000).collect();
    while ops.len() < OPS {
        for &size in &layer_sizes {
            ops.push(Op::Malloc(size));
            live += 1;
        }
        for _ in 0..layer_sizes.len() {
            ops.push(Op::Malloc(4096 + next() % 2_000_000));
            ops.push(Op::Free(live));
            ops.push(Op::Free(live - 1));
            live -= 1;
        }
    }
    ops.truncate(OPS);
    ops
}

/// Frees in `training_stream` name the most recent allocation (`Free(k)` with
/// k = live count): LIFO, as a backward pass frees its forward's activations.
fn replay_lifo(ops: &[Op]) -> usize {
    let device = SimDevice::new("sim", 1 << 40, 0);
    let mut a = CachingAllocator::new(device, AllocConfig::default());
    a.set_recording(false);
    let mut live: Vec<u64> = Vec::with_capacity(LIVE_MAX * 2);
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Malloc(size) => live.push(a.malloc(size, 0, Tag(i as u64)).expect("fits")),
            Op::Free(_) => {
                if let Some(addr) = live.pop() {
                    a.free(addr).expect("live");
                }
            }
        }
    }
    live.len()
}

fn bench(c: &mut Criterion) {
    let ops = request_stream();
    eprintln!("allocator bench: {} operations per iteration", ops.len());
    let mut group = c.benchmark_group("allocator");
    // The machine's speed drifts with its neighbours: more, longer samples
    // keep one slow spell from moving the median.
    group.sample_size(20);
    group.measurement_time(std::time::Duration::from_secs(10));
    group.throughput(Throughput::Elements(ops.len() as u64));
    group.bench_function("mixed_1M_default", |b| b.iter(|| replay("", &ops, false)));
    group.bench_function("mixed_1M_default_traced", |b| {
        b.iter(|| replay("", &ops, true))
    });
    group.bench_function("mixed_1M_expandable", |b| {
        b.iter(|| replay("expandable_segments:True", &ops, false))
    });
    let training = training_stream();
    group.bench_function("training_like_1M_default", |b| {
        b.iter(|| replay_lifo(&training))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
