//! The worked examples of allocator.md §16, each as a test. Expected numbers are
//! the spec's, written as the spec writes them.
//!
//! `basics`: E1–E10 (rounding, splitting, merging, best fit, fragmentation
//! OOM, retry); `configs`: E11–E19 (each `PYTORCH_CUDA_ALLOC_CONF` rule,
//! streams).

use vramscope::alloc::{
    memory_summary, Action, AllocConfig, AllocEvent, BlockState, CachingAllocator, Family, Level,
    SegmentInfo, Tag, TorchVersion,
};
use vramscope::device::SimDevice;

mod basics;
mod configs;

pub(crate) const KIB: u64 = 1024;

pub(crate) const MIB: u64 = 1 << 20;

pub(crate) const GIB: u64 = 1 << 30;

pub(crate) const BASE: u64 = 0x7f00_0000_0000;

pub(crate) fn alloc_with(total: u64, conf: &str) -> CachingAllocator<SimDevice> {
    let mut a = CachingAllocator::new(
        SimDevice::new("sim", total, 0),
        AllocConfig::parse(conf).expect("valid conf"),
    );
    a.set_oom_process_info(false);
    a
}

pub(crate) fn default_alloc() -> CachingAllocator<SimDevice> {
    alloc_with(8 * GIB, "")
}

pub(crate) fn m(a: &mut CachingAllocator<SimDevice>, size: u64) -> u64 {
    a.malloc(size, 0, Tag::NONE).expect("malloc")
}

pub(crate) fn cur(a: &CachingAllocator<SimDevice>, f: Family) -> i64 {
    a.stats().get(f, Level::All).current
}

/// Blocks of a segment as (size, allocated) pairs.
pub(crate) fn layout(seg: &SegmentInfo) -> Vec<(u64, bool)> {
    seg.blocks
        .iter()
        .map(|b| (b.size, b.state == BlockState::ActiveAllocated))
        .collect()
}

pub(crate) fn actions(events: &[AllocEvent]) -> Vec<(Action, u64, u64)> {
    events.iter().map(|e| (e.action, e.addr, e.size)).collect()
}

/// E9's state: 100 MiB device, ten 8 MiB blocks, every second one freed, then 16 MiB.
/// E9 in the spec's era (2.8: its OOM text is the spec's).
pub(crate) fn e9_state() -> (CachingAllocator<SimDevice>, vramscope::alloc::AllocError) {
    e9_state_in(TorchVersion(8))
}

pub(crate) fn e9_state_in(
    version: TorchVersion,
) -> (CachingAllocator<SimDevice>, vramscope::alloc::AllocError) {
    let mut a = CachingAllocator::new(
        SimDevice::new("sim", 100 * MIB, 0),
        AllocConfig::parse_for("", version).expect("valid conf"),
    );
    a.set_oom_process_info(false);
    let ptrs: Vec<u64> = (0..10).map(|_| m(&mut a, 8 * MIB)).collect();
    assert_eq!(a.snapshot().len(), 5);
    for p in ptrs.iter().skip(1).step_by(2) {
        a.free(*p).expect("free");
    }
    assert_eq!(cur(&a, Family::InactiveSplit), 5);
    assert_eq!(cur(&a, Family::InactiveSplitBytes), 60 * MIB as i64);
    let err = a
        .malloc(16 * MIB, 0, Tag::NONE)
        .expect_err("fragmentation OOM");
    (a, err)
}

pub(crate) fn default_alloc_conf(conf: &str) -> CachingAllocator<SimDevice> {
    alloc_with(8 * GIB, conf)
}
