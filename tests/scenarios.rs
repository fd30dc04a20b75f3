//! The built-in scenario library: every file loads, runs headless and shows
//! what its narration claims; buggy/fixed pairs differ as engine.md §9 says;
//! the CLI's `scenarios` and `run --json` behave as documented. Malformed
//! files are tests/scenario_files.rs.
//!
//! One test binary, so that `runs()` runs every built-in once for all the
//! tests: the helpers are here, the tests by subject in tests/scenarios/
//! (the library and the CLI, the buggy/fixed pairs, the detector's findings,
//! the leaks through kept state and through kept graphs).

mod common;
#[path = "scenarios/findings.rs"]
mod findings;
#[path = "scenarios/kept_graphs.rs"]
mod kept_graphs;
#[path = "scenarios/kept_state.rs"]
mod kept_state;
#[path = "scenarios/library.rs"]
mod library;
#[path = "scenarios/pairs.rs"]
mod pairs;

use std::collections::HashMap;
use std::sync::OnceLock;

use vramscope::scenario::{
    builtins, check, resolve, run, Expectation, RunOptions, RunResult, Scenario,
};

use common::{scenarios_dir, temp_dir, vramscope, VALID};

const MIB: u64 = 1 << 20;

struct Ran {
    scenario: Scenario,
    result: RunResult,
}

/// Every built-in, run once (in parallel) and shared by the tests.
fn runs() -> &'static HashMap<String, Ran> {
    static RUNS: OnceLock<HashMap<String, Ran>> = OnceLock::new();
    RUNS.get_or_init(|| {
        let names: Vec<&'static str> = builtins().iter().map(|b| b.name).collect();
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .clamp(1, 8);
        let chunks: Vec<Vec<&'static str>> = (0..threads)
            .map(|t| names.iter().skip(t).step_by(threads).copied().collect())
            .collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = chunks
                .into_iter()
                .map(|chunk| {
                    s.spawn(move || {
                        chunk
                            .into_iter()
                            .map(|name| {
                                let (scenario, built) = resolve(name)
                                    .unwrap_or_else(|e| panic!("{name} does not load: {e}"));
                                let result = run(&scenario, &built, &RunOptions::default());
                                (name.to_string(), Ran { scenario, result })
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("scenario thread"))
                .collect()
        })
    })
}

fn get(name: &str) -> &'static RunResult {
    &runs()
        .get(name)
        .unwrap_or_else(|| panic!("no built-in named {name}"))
        .result
}

/// Allocated bytes at iteration end from the second iteration on (what the
/// `AllocatedFlat` / `AllocatedGrowsAtLeast` expectations read).
fn steady(r: &RunResult) -> Vec<u64> {
    r.per_iteration
        .iter()
        .skip(1)
        .map(|p| p.allocated)
        .collect()
}

fn growth_per_iteration(r: &RunResult) -> f64 {
    let v = steady(r);
    assert!(
        v.len() >= 2,
        "{}: too few iterations to measure growth",
        r.scenario
    );
    (v[v.len() - 1] as f64 - v[0] as f64) / (v.len() - 1) as f64
}

fn assert_flat(r: &RunResult) {
    let v = steady(r);
    assert!(
        v.len() >= 2 && v.iter().all(|x| *x == v[0]),
        "{}: allocated at iteration end is not flat: {v:?}",
        r.scenario
    );
}

fn assert_growth_within_1pct(r: &RunResult, per_iter: u64) {
    let g = growth_per_iteration(r);
    let err = (g - per_iter as f64).abs() / per_iter as f64;
    assert!(
        err <= 0.01,
        "{}: allocated grows {g:.0} B per iteration, §9.1 says {per_iter} B ({:.2}% off)",
        r.scenario,
        err * 100.0
    );
}

/// The detector's finding on `root`.
fn finding_on<'a>(r: &'a RunResult, root: &str) -> &'a vramscope::leak::Finding {
    r.findings
        .iter()
        .find(|f| f.root == root)
        .unwrap_or_else(|| panic!("{}: no finding on {root}: {:?}", r.scenario, r.findings))
}

/// Each iteration of `points` after the first adds `by` bytes to what
/// `field` reads.
fn assert_each_iteration_adds(
    points: &[vramscope::scenario::IterationPoint],
    field: fn(&vramscope::scenario::IterationPoint) -> u64,
    by: u64,
) {
    for w in points.windows(2) {
        assert_eq!(
            field(&w[1]) - field(&w[0]),
            by,
            "iteration {}",
            w[1].iteration
        );
    }
}

fn is_detector_expectation(e: &Expectation) -> bool {
    matches!(
        e,
        Expectation::Leak { .. } | Expectation::NoLeak | Expectation::Finding(_)
    )
}

/// Runs a built-in with `edit` applied to its text (a variant a user
/// would write next to it).
fn run_variant(name: &str, edit: impl Fn(String) -> String) -> RunResult {
    let text = std::fs::read_to_string(scenarios_dir().join(format!("{name}.ron")))
        .unwrap_or_else(|e| panic!("{name}.ron: {e}"));
    let text = edit(text);
    let (s, built) = vramscope::scenario::load_str(&text, "variant.ron")
        .unwrap_or_else(|e| panic!("the variant of {name} loads: {e}"));
    run(&s, &built, &RunOptions::default())
}
