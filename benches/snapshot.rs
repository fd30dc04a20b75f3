//! Snapshot importer figures (issue: a ≥1 GB synthetic snapshot with
//! PyTorch's memo sharing imports at ≥ 200 MB/s with peak RSS ≤ 2× the file;
//! replay ≥ 5 M entries/s; what-if with 4 configs on a 1 M-entry trace ≤ 1 s),
//! and the leak analysis `open` runs on the same trace.
//!
//! Run: `cargo bench --bench snapshot`. The 1 GB file is generated once into
//! `std::env::temp_dir()` (`vramscope-synth-*.pickle`, reused while its size
//! matches the `.stats` file beside it). `SNAPSHOT_BENCH_BYTES` overrides the
//! size (e.g. `200000000` for a quick run). Before the criterion loops it
//! prints the import's peak RSS (VmHWM, reset through `/proc/self/clear_refs`
//! where the kernel allows) against the file size.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[path = "common/synth_file.rs"]
mod synth_file;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use vramscope::alloc::AllocConfig;
use vramscope::leak::analyze_snapshot;
use vramscope::trace::replay::from_snapshot;
use vramscope::trace::replay::whatif::{self, Requests};
use vramscope::trace::snapshot::{import_bytes, import_file, synthetic_snapshot, Snapshot};

const BIG: u64 = 1_050_000_000;
const SEED: u64 = 1;
/// About 80 bytes per entry: enough for ≥ 1 M entries.
const REPLAY_BYTES: u64 = 100_000_000;

fn big_file() -> (PathBuf, u64) {
    let target = std::env::var("SNAPSHOT_BENCH_BYTES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(BIG);
    synth_file::generated(target, SEED)
}

fn status_kb(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn peak_rss_report(path: &Path, len: u64) {
    let before = status_kb("VmRSS:");
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let t = Instant::now();
    let snap = import_file(path).expect("imports");
    let secs = t.elapsed().as_secs_f64();
    let hwm = status_kb("VmHWM:") * 1024;
    let entries: usize = snap.device_traces.iter().map(Vec::len).sum();
    eprintln!(
        "import: {:.0} MB, {} entries, {:.1} s ({:.0} MB/s); peak RSS {:.0} MB = {:.2}x the file \
         (RSS before {:.0} MB{})",
        len as f64 / 1e6,
        entries,
        secs,
        len as f64 / 1e6 / secs,
        hwm as f64 / 1e6,
        hwm as f64 / len as f64,
        before as f64 * 1024.0 / 1e6,
        if reset {
            ""
        } else {
            "; VmHWM not reset, includes generation"
        },
    );
}

fn replay_snapshot() -> Snapshot {
    let mut bytes = Vec::new();
    synthetic_snapshot(&mut bytes, REPLAY_BYTES, SEED + 1).expect("generates");
    import_bytes(&bytes).expect("imports")
}

fn bench(c: &mut Criterion) {
    let (path, len) = big_file();
    peak_rss_report(&path, len);

    let mut g = c.benchmark_group("snapshot");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(30));
    g.throughput(Throughput::Bytes(len));
    g.bench_function("import_file", |b| {
        b.iter_with_large_drop(|| import_file(&path).expect("imports"))
    });

    let snap = replay_snapshot();
    let entries: usize = snap.device_traces.iter().map(Vec::len).sum();
    eprintln!("replay trace: {entries} entries");
    assert!(entries >= 1_000_000, "{entries}");
    let replays = from_snapshot::verify(&snap);
    assert!(replays.iter().all(|r| r.outcome.all_matched()));
    g.measurement_time(Duration::from_secs(10));
    g.throughput(Throughput::Elements(entries as u64));
    g.bench_function("verify_replay", |b| {
        b.iter_with_large_drop(|| from_snapshot::verify(&snap))
    });

    let r = &replays[0];
    let requests = Requests {
        entries: &r.entries,
        empty_cache_at: &r.outcome.empty_cache_at,
        start: Some(&r.start),
    };
    let configs = || -> Vec<AllocConfig> {
        [
            "",
            "expandable_segments:True",
            "max_split_size_mb:128",
            "roundup_power2_divisions:4",
        ]
        .iter()
        .map(|c| AllocConfig::parse(c).expect("valid conf"))
        .collect()
    };
    let capacity = 80 << 30;
    g.throughput(Throughput::Elements(entries as u64));
    g.bench_function("what_if_4_configs", |b| {
        b.iter_batched(
            configs,
            |cs| whatif::what_if_all(&requests, cs, capacity),
            BatchSize::LargeInput,
        )
    });

    // What `vramscope open` runs after the import: the trace's leak analysis
    // (boundaries inferred from the stacks, per-site survivors).
    g.bench_function("leak_analysis", |b| {
        b.iter_with_large_drop(|| analyze_snapshot(&snap, 0, None))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
