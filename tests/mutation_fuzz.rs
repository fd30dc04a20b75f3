//! Seeded mutation fuzzing that runs in `cargo test`: snapshots and
//! scenarios mangled the ways an
//! adversary mangles them — flipped and inserted bytes, cut files, ranges
//! repeated (shared-object bombs), numbers swapped for extreme ones — go
//! through everything a user can run on them. Each must end in a value or
//! an error, never a panic, and within a bounded time. By default a sample
//! of 200 cases each, seeded by the project's H100 captures, the library
//! scenarios and `tests/fixtures/hostile/` (a few seconds); the full 1,500
//! cases, with the real-snapshot corpus as seeds, under `cargo test --
//! --ignored` (CI runs them where the corpus is). The
//! same generator feeds the cargo-fuzz targets in `fuzz/` where cargo-fuzz
//! is available. A failing case prints its seed and case number: rerun it
//! with `VRAMSCOPE_FUZZ_CASE=SEED:N cargo test --test mutation_fuzz`, and
//! explore other cases with `VRAMSCOPE_FUZZ_SEED=N`.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use common::{real_dir, scenarios_dir};
use std::path::{Path, PathBuf};
use vramscope::alloc::AllocConfig;
use vramscope::report::snapshot::SnapshotReport;
use vramscope::scenario::{load_str, run, RunOptions};
use vramscope::trace::mirror::trace_events;
use vramscope::trace::replay::from_snapshot;
use vramscope::trace::replay::replayed::device_capacity;
use vramscope::trace::replay::whatif::{self, Requests};
use vramscope::trace::snapshot::{export_bytes, import_bytes, Snapshot};
use vramscope::trace::Timeline;

/// Cases per test in the full sweep.
const CASES: usize = 1500;

/// Cases per test in the default run.
const SAMPLE: usize = 200;

/// Longest any one case may take (a debug build; a hang fails the test).
const CASE_LIMIT: Duration = Duration::from_secs(20);

/// xorshift64*: the same cases on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn hostile_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hostile")
}

/// Files of `dir` ending in `ext`, smaller than `max` bytes, sorted.
fn seeds(dir: &std::path::Path, ext: &str, max: u64) -> Vec<Vec<u8>> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    paths.retain(|p| {
        p.extension().is_some_and(|e| e == ext) && std::fs::metadata(p).is_ok_and(|m| m.len() < max)
    });
    paths.sort();
    paths.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

/// One mangling of `b`.
fn mutate(b: &mut Vec<u8>, rng: &mut Rng) {
    if b.is_empty() {
        b.push(rng.next() as u8);
        return;
    }
    match rng.below(6) {
        // A few bytes changed.
        0 => {
            for _ in 0..1 + rng.below(8) {
                let i = rng.below(b.len());
                b[i] = rng.next() as u8;
            }
        }
        // Random bytes inserted.
        1 => {
            let at = rng.below(b.len());
            let n = 1 + rng.below(16);
            let junk: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            b.splice(at..at, junk);
        }
        // Cut short.
        2 => b.truncate(rng.below(b.len())),
        // A range repeated many times: shared references, nested containers.
        3 => {
            let from = rng.below(b.len());
            let len = 1 + rng.below((b.len() - from).min(64));
            let piece = b[from..from + len].to_vec();
            let times = 1 + rng.below(2000);
            let at = rng.below(b.len());
            let repeated: Vec<u8> = piece.iter().copied().cycle().take(len * times).collect();
            b.splice(at..at, repeated);
        }
        // A range deleted.
        4 => {
            let from = rng.below(b.len());
            let len = 1 + rng.below((b.len() - from).min(256));
            b.drain(from..from + len);
        }
        // A byte set to a boundary value (lengths, counts, opcodes).
        _ => {
            let i = rng.below(b.len());
            b[i] = [0x00, 0x7f, 0x80, 0xff][rng.below(4)];
        }
    }
}

/// A snapshot changed where its meaning is, not its encoding: addresses and
/// sizes set to extremes, actions swapped, entries repeated, dropped or
/// reordered, block states changed. The import reads it; what comes after
/// must cope.
fn mutate_snapshot(snap: &mut Snapshot, rng: &mut Rng) {
    use vramscope::alloc::{Action, BlockState};
    let extreme = |rng: &mut Rng| -> u64 {
        [
            0,
            1,
            511,
            512,
            1 << 20,
            20 << 20,
            u64::MAX >> 1,
            rng.next() >> 16,
        ][rng.below(8)]
    };
    // Every action the allocator makes, and a `snapshot` marker.
    let actions: Vec<Action> = Action::ALL.into_iter().chain([Action::Snapshot]).collect();
    if let Some(trace) = snap.device_traces.iter_mut().find(|t| !t.is_empty()) {
        let i = rng.below(trace.len());
        match rng.below(6) {
            0 => trace[i].addr = extreme(rng),
            1 => trace[i].size = extreme(rng),
            2 => trace[i].action = actions[rng.below(actions.len())],
            3 => {
                let e = trace[i];
                let n = 1 + rng.below(500);
                trace.splice(i..i, std::iter::repeat_n(e, n));
            }
            4 => {
                let j = rng.below(trace.len());
                trace.swap(i, j);
            }
            _ => {
                trace.remove(i);
            }
        }
    }
    let k = rng.below(snap.segments.len().max(1));
    if let Some(seg) = snap.segments.get_mut(k) {
        match rng.below(4) {
            0 => seg.total_size = extreme(rng),
            1 => seg.address = extreme(rng),
            _ => {
                let k = rng.below(seg.blocks.len().max(1));
                if let Some(b) = seg.blocks.get_mut(k) {
                    b.state = [BlockState::ActiveAllocated, BlockState::Inactive][rng.below(2)];
                    b.size = extreme(rng);
                }
            }
        }
    }
}

/// Scenario text with a number replaced by an extreme one, or lines
/// repeated, removed or swapped.
fn mutate_text(text: &str, rng: &mut Rng) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    if lines.is_empty() {
        return String::new();
    }
    let i = rng.below(lines.len());
    match rng.below(5) {
        0 => {
            let extreme = [
                "0",
                "1",
                "4294967295",
                "18446744073709551615",
                "-1",
                "1e300",
                "65536",
            ][rng.below(7)];
            let line = &lines[i];
            if let Some(start) = line.find(|c: char| c.is_ascii_digit()) {
                let end = line[start..]
                    .find(|c: char| !c.is_ascii_digit())
                    .map_or(line.len(), |e| start + e);
                lines[i] = format!("{}{extreme}{}", &line[..start], &line[end..]);
            }
        }
        1 => {
            let copy = lines[i].clone();
            for _ in 0..1 + rng.below(50) {
                lines.insert(i, copy.clone());
            }
        }
        2 => {
            lines.remove(i);
        }
        3 => {
            let j = rng.below(lines.len());
            lines.swap(i, j);
        }
        _ => {
            let mut b = lines[i].clone().into_bytes();
            mutate(&mut b, rng);
            lines[i] = String::from_utf8_lossy(&b).into_owned();
        }
    }
    lines.join("\n")
}

/// Run `f` on a thread of its own: a panic or a hang fails the case.
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = flume::bounded(1);
    let handle = std::thread::spawn(move || {
        let _ = tx.send(catch_unwind(AssertUnwindSafe(f)).ok());
    });
    match rx.recv_timeout(CASE_LIMIT) {
        Ok(Some(value)) => {
            let _ = handle.join();
            value
        }
        Ok(None) => panic!("{what}: panicked"),
        Err(_) => panic!("{what}: still running after {CASE_LIMIT:?}"),
    }
}

/// Everything a user can do with a snapshot file, on `bytes`; whether it
/// imported.
fn snapshot_paths(bytes: Vec<u8>) -> bool {
    let Ok(snap) = import_bytes(&bytes) else {
        return false;
    };
    let report = SnapshotReport::new("fuzz.pickle", &snap);
    let _ = report.to_text();
    // What the UI shows: the recorded trace mirrored into the map it keeps,
    // and the same requests replayed under another config.
    let config = from_snapshot::config(&snap);
    for device in from_snapshot::traced_devices(&snap) {
        let entries = from_snapshot::entries(&snap, device);
        let mut timeline = Timeline::new();
        timeline.extend(trace_events(&entries, |_| None, &config));
        let _ = timeline.state_at(timeline.len().checked_sub(1));
    }
    for replay in from_snapshot::verify(&snap) {
        let requests = Requests {
            entries: &replay.entries,
            empty_cache_at: &replay.outcome.empty_cache_at,
            start: Some(&replay.start),
        };
        let expandable = AllocConfig::parse("expandable_segments:True").expect("a config");
        let _ = whatif::what_if(&requests, expandable, device_capacity(&replay, None));
    }
    let exported = export_bytes(&snap);
    assert!(import_bytes(&exported).is_ok(), "an export reads back");
    true
}

/// The seed of a test: its own, or `VRAMSCOPE_FUZZ_SEED` to explore further
/// (CI runs the fixed ones).
fn seed_or(fixed: u64) -> u64 {
    std::env::var("VRAMSCOPE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(fixed)
}

/// A case picked by `VRAMSCOPE_FUZZ_CASE=SEED:N`, or every case.
fn only_case() -> Option<(u64, usize)> {
    let v = std::env::var("VRAMSCOPE_FUZZ_CASE").ok()?;
    let (seed, n) = v.split_once(':')?;
    Some((seed.parse().ok()?, n.parse().ok()?))
}

/// Case `n` of `seed` draws from its own generator, so that one case can
/// be rerun alone.
fn cases(seed: u64, count: usize, mut case: impl FnMut(&mut Rng, usize)) {
    let only = only_case();
    for n in 0..count {
        if only.is_none_or(|(s, k)| s == seed && k == n) {
            // splitmix64 of (seed, n): a nonzero, well-mixed start.
            let mut z = seed ^ (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            case(&mut Rng((z ^ (z >> 31)) | 1), n);
        }
    }
}

/// The project's smaller H100 captures: seeds that are part of the repository.
fn captures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pytorch/captured")
}

#[test]
fn mangled_snapshots_end_in_a_value_or_an_error() {
    mangle_snapshots(&captures_dir(), 64 << 10, SAMPLE);
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn mangled_snapshots_end_in_a_value_or_an_error_full() {
    mangle_snapshots(&real_dir(), 1 << 20, CASES);
}

/// `count` manglings of the snapshots under `dir` (each at most `max` bytes)
/// and the hostile fixtures.
fn mangle_snapshots(dir: &Path, max: u64, count: usize) {
    let mut files = seeds(dir, "pickle", max);
    files.extend(seeds(&hostile_dir(), "pickle", 1 << 20));
    assert!(files.len() >= 8, "{} seed files", files.len());
    // The seeds as snapshots too, for changes to their meaning.
    let parsed: Vec<Snapshot> = files.iter().filter_map(|b| import_bytes(b).ok()).collect();
    let seed = seed_or(0x005e_ed0f_5a4b);
    let mut imported = 0;
    cases(seed, count, |rng, n| {
        let b = if rng.below(2) == 0 {
            let mut b = files[rng.below(files.len())].clone();
            for _ in 0..1 + rng.below(3) {
                mutate(&mut b, rng);
            }
            b
        } else {
            let mut snap = parsed[rng.below(parsed.len())].clone();
            for _ in 0..1 + rng.below(4) {
                mutate_snapshot(&mut snap, rng);
            }
            export_bytes(&snap)
        };
        imported += usize::from(bounded(&format!("snapshot case {seed}:{n}"), move || {
            snapshot_paths(b)
        }));
    });
    // Not every mangling is fatal: the paths past the import get exercised.
    assert!(
        only_case().is_some() || imported >= count / 10,
        "{imported} of {count} imported"
    );
}

#[test]
fn mangled_scenarios_end_in_a_value_or_an_error() {
    mangle_scenarios(SAMPLE);
}

#[test]
#[ignore = "the full 1,500-case sweep (cargo test -- --ignored)"]
fn mangled_scenarios_end_in_a_value_or_an_error_full() {
    mangle_scenarios(CASES);
}

fn mangle_scenarios(count: usize) {
    let mut texts: Vec<String> = seeds(&scenarios_dir(), "ron", 1 << 20)
        .into_iter()
        .chain(seeds(&hostile_dir(), "ron", 1 << 20))
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect();
    texts.retain(|t| t.contains("Scenario("));
    assert!(texts.len() >= 40, "{} seed scenarios", texts.len());
    let seed = seed_or(0x005e_ed0f_2c3e);
    let mut ran = 0;
    cases(seed, count, |rng, n| {
        let mut text = texts[rng.below(texts.len())].clone();
        for _ in 0..1 + rng.below(3) {
            text = mutate_text(&text, rng);
        }
        ran += usize::from(bounded(&format!("scenario case {seed}:{n}"), move || {
            let Ok((scenario, built)) = load_str(&text, "fuzz.ron") else {
                return false;
            };
            // Two iterations are enough to reach every step.
            let opts = RunOptions {
                iterations: Some(built.program.iterations.min(2)),
                record_events: false,
            };
            let _ = run(&scenario, &built, &opts);
            true
        }));
    });
    assert!(
        only_case().is_some() || ran >= count / 10,
        "{ran} of {count} ran"
    );
}
