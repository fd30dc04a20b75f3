//! Kernel launches of a CUDA run, without a GPU: a RecordingLauncher writes
//! them down, and every launch is checked against the allocator's blocks at
//! the moment it goes out (`launch_violations`). Library scenarios run with
//! the check in `scenario::tests::launches`.

use super::super::{Category, DType, LaunchStats, Shape};
use super::*;
use crate::alloc::BlockState;
use crate::device::{Launch, RecordingLauncher};

/// Why `l` reaches outside the blocks allocated right now, if it does: each
/// range must lie inside one allocated block's *requested* bytes.
pub(crate) fn violation(e: &Engine, l: &Launch) -> Option<String> {
    let segs = e.allocator().snapshot();
    for (addr, bytes) in l.extents() {
        if bytes == 0 {
            return Some(format!("{l:?}: an empty range at {addr:#x}"));
        }
        let inside = segs.iter().flat_map(|s| &s.blocks).any(|b| {
            b.state == BlockState::ActiveAllocated
                && b.address <= addr
                && addr + bytes <= b.address + b.requested_size
        });
        if !inside {
            return Some(format!(
                "{l:?}: [{addr:#x}, +{bytes} B) is not inside an allocated block"
            ));
        }
    }
    None
}

#[test]
fn cpu_tensors_get_no_launch() {
    let mut e = engine(ModelConfig::mlp_mnist());
    let rec = RecordingLauncher::new();
    let log = rec.log();
    e.set_launcher(Some(Box::new(rec)));
    let gpu = e
        .factory(Shape::new(&[1024]), DType::F32, Category::Activation)
        .expect("gpu tensor");
    let cpu = e.cpu(gpu);
    assert!(!e.is_cuda(cpu) && e.is_cuda(gpu));
    e.k_fill(cpu, 1.0);
    e.k_unary(gpu, cpu);
    e.k_unary(cpu, gpu);
    e.k_binary(gpu, cpu, gpu);
    e.k_sum(cpu, gpu);
    assert_eq!(log.lock().expect("log").len(), 0);
    e.k_fill(gpu, 1.0);
    e.k_unary(gpu, gpu);
    assert_eq!(log.lock().expect("log").len(), 2);
}

#[test]
fn the_check_catches_a_launch_past_a_block_or_on_a_freed_one() {
    let mut e = engine(ModelConfig::mlp_mnist());
    let t = e
        .factory(Shape::new(&[256]), DType::F32, Category::Activation)
        .expect("tensor");
    let (addr, n) = e.span(t).expect("on the GPU");
    assert_eq!(n, 256);
    assert_eq!(
        violation(
            &e,
            &Launch::Fill {
                out: addr,
                value: 0.0,
                n
            }
        ),
        None
    );
    // One element past the requested 1,024 bytes (the block is 1,024 too).
    assert!(violation(
        &e,
        &Launch::Fill {
            out: addr,
            value: 0.0,
            n: n + 1
        }
    )
    .is_some());
    e.release(t);
    assert!(violation(
        &e,
        &Launch::Fill {
            out: addr,
            value: 0.0,
            n
        }
    )
    .is_some());
}

#[test]
fn a_simulated_run_launches_nothing() {
    let mut e = engine(ModelConfig::mlp_mnist());
    e.launch_violations = Some(Vec::new());
    run(&mut e, &Program::training(1));
    assert!(!e.has_launcher());
    assert_eq!(e.launch_stats(), &LaunchStats::default());
}
