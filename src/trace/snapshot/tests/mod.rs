//! Import/export tests on the 12 real snapshots. Expected numbers come from
//! `shared/snapshots/real/SOURCES.md` and `SCHEMA.md`, not from this code.

use std::collections::BTreeMap;

use crate::trace::pickle::tests::{real_dir, real_files};
use crate::trace::pickle::PickleWriter;

use super::*;

fn load(stem: &str) -> Snapshot {
    let path = real_dir().join(format!("{stem}.pickle"));
    import_file(&path).unwrap_or_else(|e| panic!("{e}"))
}

const GIB: f64 = (1u64 << 30) as f64;

/// `bytes` shown in GiB with `decimals` decimals equals `expected`.
fn assert_gib(bytes: u64, expected: f64, decimals: i32, what: &str) {
    let gib = bytes as f64 / GIB;
    let tol = 0.5 * 10f64.powi(-decimals) + 1e-9;
    assert!(
        (gib - expected).abs() <= tol,
        "{what}: {gib:.4} GiB, expected {expected}"
    );
}

fn reserved(s: &Snapshot) -> u64 {
    s.segments.iter().map(|g| g.total_size).sum()
}

fn allocated(s: &Snapshot) -> u64 {
    s.segments.iter().map(|g| g.allocated_size).sum()
}

fn trace_lens(s: &Snapshot) -> Vec<usize> {
    s.device_traces.iter().map(Vec::len).collect()
}

/// Count of each action over all devices.
fn actions(s: &Snapshot) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for e in s.device_traces.iter().flatten() {
        *m.entry(s.action_name(e).to_string()).or_insert(0) += 1;
    }
    m
}

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|&(k, v)| (k.to_string(), v)).collect()
}

fn blocks(s: &Snapshot) -> impl Iterator<Item = &Block> {
    s.segments.iter().flat_map(|g| &g.blocks)
}

fn count_state(s: &Snapshot, state: BlockState) -> usize {
    blocks(s).filter(|b| b.state == state).count()
}

fn large_small(s: &Snapshot) -> (usize, usize) {
    let large = s
        .segments
        .iter()
        .filter(|g| g.segment_type == PoolKind::Large)
        .count();
    (large, s.segments.len() - large)
}

mod export;
mod malformed;
mod real_files;
mod speed;
mod streaming;
