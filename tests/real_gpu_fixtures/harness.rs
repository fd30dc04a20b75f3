//! What every capture check shares: the captured files, PyTorch's counters
//! beside them, the simulation of a scenario as the capture's release ran
//! it, and the comparisons.

use std::path::PathBuf;
use vramscope::engine::{CublasLtWorkspace, EngineConfig, ReduceDevice};
use vramscope::scenario::{resolve, run, RunOptions, RunResult};
use vramscope::trace::replay::from_snapshot;
use vramscope::trace::snapshot::import_file;

pub(crate) const MIB: f64 = (1u64 << 20) as f64;

pub(crate) fn captured(stem: &str, ext: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pytorch/captured")
        .join(format!("{stem}.{ext}"))
}

/// What the capture program wrote beside the snapshot: PyTorch's counters.
pub(crate) fn meta(stem: &str) -> serde_json::Value {
    let p = captured(stem, "json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

pub(crate) fn u64_field(m: &serde_json::Value, key: &str) -> u64 {
    m[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in the capture's JSON"))
}

/// A simulated figure against PyTorch's: equal, or within `tol` bytes.
pub(crate) fn close(what: &str, sim: u64, real: u64, tol: u64) {
    println!(
        "{what}: sim {sim} B ({:.2} MiB), real {real} B ({:.2} MiB), off by {} B (allowed {tol})",
        sim as f64 / MIB,
        real as f64 / MIB,
        sim.abs_diff(real)
    );
    assert!(sim.abs_diff(real) <= tol, "{what}: sim {sim}, real {real}");
}

/// How far the simulation's block layout may sit from the real one. The
/// requests are checked exactly (`requested_bytes`); which cached block serves
/// one, and so its unsplit tail, also follows the addresses the driver
/// returned and kernel scratch the engine leaves out (README).
pub(crate) struct Layout {
    /// `requested_bytes.all.peak` (what the tensors asked for: the engine's
    /// part, exact unless a size the engine cannot know is involved).
    pub(crate) requested: u64,
    /// Peak allocated bytes.
    pub(crate) allocated: u64,
    /// Peak reserved bytes.
    pub(crate) reserved: u64,
    /// `memory_allocated()` / `memory_reserved()` at each iteration's end.
    pub(crate) ends: u64,
    /// `requested_bytes.all.current` at each iteration's end.
    pub(crate) requested_ends: u64,
}

pub(crate) const EXACT: Layout = Layout {
    requested: 0,
    allocated: 0,
    reserved: 0,
    ends: 0,
    requested_ends: 0,
};

/// (a) import, (b) verify replay: every address, segment event and OOM, and
/// the final segments, then every `memory_stats()` counter at the end
/// against PyTorch's own; returns the capture's JSON.
pub(crate) fn replay_checks(stem: &str) -> serde_json::Value {
    let m = meta(stem);
    let snap = import_file(&captured(stem, "pickle")).expect("imports");
    // The program held PyTorch to the scenario's budget with
    // set_per_process_memory_fraction, which the snapshot does not record
    // (garbage_collection_threshold acts only under it).
    let allowed = m["allowed_memory_maximum"].as_u64();
    let replays = from_snapshot::verify_with(&snap, allowed);
    assert_eq!(replays.len(), 1, "{stem}: one traced device");
    let o = &replays[0].outcome;
    assert_eq!(o.replayable_from, 0, "{stem}: the trace is closed");
    assert_eq!(
        o.final_state_match,
        Some(true),
        "{stem}: {:?}",
        o.differences
    );
    assert!(
        o.all_matched() && o.differences.is_empty(),
        "{stem}: allocs {}/{}, segment events {}/{}, ooms {}/{}\n{}",
        o.alloc_addr_match,
        o.allocs,
        o.segment_event_match,
        o.segment_events,
        o.oom_match,
        o.ooms,
        o.differences.join("\n")
    );
    assert!(o.allocs > 10, "{stem}: {} allocs replayed", o.allocs);
    assert_eq!(
        o.ooms,
        usize::from(!m["oom"].is_null()),
        "{stem}: the recorded OOMs"
    );

    let ours = replays[0].stats.to_map(false);
    let real = m["memory_stats"].as_object().expect("memory_stats");
    let mut off = Vec::new();
    for (key, value) in real {
        let value = value
            .as_i64()
            .unwrap_or_else(|| panic!("{stem}: {key} is not a number"));
        match ours.get(key.as_str()) {
            Some(v) if *v == value => {}
            other => off.push(format!("{key}: ours {other:?}, PyTorch {value}")),
        }
    }
    assert_eq!(ours.len(), real.len(), "{stem}: memory_stats() keys");
    println!("{stem}: {} memory_stats() counters compared", real.len());
    assert!(
        off.is_empty(),
        "{stem}: memory_stats() differs:\n{}",
        off.join("\n")
    );
    m
}

/// The scenario run as the capture's PyTorch release would run it.
pub(crate) fn simulate(
    scenario: &str,
    m: &serde_json::Value,
    tune: &dyn Fn(&mut EngineConfig),
) -> RunResult {
    simulate_recording(scenario, m, tune, false)
}

/// [`simulate`], keeping the run's trace events when `record_events`.
pub(crate) fn simulate_recording(
    scenario: &str,
    m: &serde_json::Value,
    tune: &dyn Fn(&mut EngineConfig),
    record_events: bool,
) -> RunResult {
    let (sc, mut built) = resolve(scenario).unwrap_or_else(|e| panic!("{scenario}: {e}"));
    assert_eq!(m["scenario"], sc.name.as_str(), "{scenario}");
    let version = m["torch_version"].as_str().expect("torch_version");
    let minor: u32 = version
        .split('.')
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("a 2.x version");
    built.engine.torch_minor = Some(minor);
    // This release keeps one cuBLASLt workspace per handle (see
    // `the_lt_workspace_is_cached_in_this_release`).
    built.engine.cublaslt_workspace = CublasLtWorkspace::Cached;
    // The H100's 132 SMs size the reductions' scratch (bias gradients, a
    // loss's mean) as ATen does.
    built.engine.reduce_device = Some(ReduceDevice {
        sm_count: 132,
        max_threads_per_sm: 2048,
    });
    tune(&mut built.engine);
    let iterations = m["iterations_requested"].as_u64().map(|n| n as u32);
    let sim = run(
        &sc,
        &built,
        &RunOptions {
            iterations,
            record_events,
        },
    );
    println!("{scenario} against {} / torch {version}", m["gpu_name"]);
    sim
}

pub(crate) fn same_story(scenario: &str, sim: &RunResult, m: &serde_json::Value) {
    match (&sim.oom, m["oom"]["iteration"].as_u64()) {
        (None, None) => assert_eq!(
            u64::from(sim.iterations_run),
            u64_field(m, "iterations_run"),
            "{scenario}: iterations"
        ),
        (Some(s), Some(real)) => {
            println!(
                "{scenario}: OOM in iteration {} (sim) vs {real} (real)",
                s.iteration
            );
            assert_eq!(u64::from(s.iteration), real, "{scenario}: OOM iteration");
        }
        (s, real) => panic!(
            "{scenario}: sim OOM {:?}, real OOM in iteration {real:?}",
            s.as_ref().map(|o| o.iteration)
        ),
    }
}

/// The exception that ended the real run, if any, ends the simulation too,
/// with PyTorch's words (the first sentence of its message).
pub(crate) fn same_error(scenario: &str, sim: &RunResult, m: &serde_json::Value) {
    match (&sim.error, m["error"]["message"].as_str()) {
        (None, None) => {}
        (Some(ours), Some(real)) => {
            println!("{scenario}: error\n  sim:  {ours}\n  real: {real}");
            let first = real
                .split(". ")
                .next()
                .unwrap_or(real)
                .trim_end_matches('.');
            assert!(
                ours.contains(first),
                "{scenario}: the simulated error does not say {first:?}"
            );
        }
        (ours, real) => panic!("{scenario}: sim error {ours:?}, real error {real:?}"),
    }
}

/// The scenario against the capture: what the tensors requested at the peak
/// byte for byte, the same OOM, and the layout within `layout`.
pub(crate) fn check(scenario: &str, stem: &str, layout: Layout) -> (RunResult, serde_json::Value) {
    check_tuned(scenario, stem, layout, &|_| {})
}

/// [`check`] with engine settings the capture measured (`tune`).
pub(crate) fn check_tuned(
    scenario: &str,
    stem: &str,
    layout: Layout,
    tune: &dyn Fn(&mut EngineConfig),
) -> (RunResult, serde_json::Value) {
    let m = replay_checks(stem);
    let sim = simulate(scenario, &m, tune);
    same_error(scenario, &sim, &m);
    let ours = sim.stats.to_map(false);
    close(
        &format!("{scenario} requested_bytes.all.peak"),
        ours.get("requested_bytes.all.peak")
            .map_or(0, |v| *v as u64),
        m["memory_stats"]["requested_bytes.all.peak"]
            .as_u64()
            .expect("requested_bytes.all.peak"),
        layout.requested,
    );
    close(
        &format!("{scenario} peak allocated"),
        sim.peak_allocated,
        u64_field(&m, "max_memory_allocated"),
        layout.allocated,
    );
    close(
        &format!("{scenario} peak reserved"),
        sim.peak_reserved,
        u64_field(&m, "max_memory_reserved"),
        layout.reserved,
    );
    same_story(scenario, &sim, &m);
    every_iteration_end(scenario, &sim, &m, &layout);
    (sim, m)
}

/// `memory_allocated()`, `memory_reserved()` and the running peak after each
/// iteration, as the program read them, against the simulation's: each
/// within `tol` bytes, and `requested_bytes.all.current` exactly.
pub(crate) fn every_iteration_end(
    scenario: &str,
    sim: &RunResult,
    m: &serde_json::Value,
    layout: &Layout,
) {
    let tol = layout.ends;
    let real = m["per_iteration"].as_array().expect("per_iteration");
    if real.is_empty() {
        // An OOM or error in the first iteration: no iteration ended on either side.
        assert!(
            sim.per_iteration.is_empty(),
            "{scenario}: sim ended iterations"
        );
        assert!(
            !m["oom"].is_null() || !m["error"].is_null(),
            "{scenario}: no iteration recorded"
        );
        return;
    }
    let n = real.len().min(sim.per_iteration.len());
    assert!(
        n + 1 >= real.len(),
        "{scenario}: the simulation stopped early"
    );
    let mut off = 0;
    for (r, s) in real.iter().zip(&sim.per_iteration) {
        // What the live tensors requested does not depend on the layout.
        let fields = [
            ("requested", s.requested, layout.requested_ends),
            ("allocated", s.allocated, tol),
            ("reserved", s.reserved, tol),
            ("peak_allocated", s.peak_allocated, tol),
        ];
        for (key, simulated, tol) in fields {
            let recorded = u64_field(r, key);
            if recorded.abs_diff(simulated) > tol {
                off += 1;
                println!(
                    "{scenario} iteration {}: {key} sim {simulated} real {recorded}",
                    s.iteration
                );
            }
        }
    }
    println!(
        "{scenario}: {n} iteration ends compared, {off} figures off (layout allowance {tol} B)"
    );
    assert_eq!(off, 0, "{scenario}: iteration ends differ (above)");
}

/// Where the tensors are PyTorch's to the byte at the peak and at every
/// iteration end (`requested`) but which cached blocks serve them follows the
/// device's addresses and the order of frees the engine does not model
/// (README): allocated bytes within 1 % of the real peak. The same runs on
/// top-down addresses move them by as much.
pub(crate) fn layout_dependent(real_peak_allocated: u64) -> Layout {
    Layout {
        allocated: real_peak_allocated / 100,
        ends: real_peak_allocated / 100,
        ..EXACT
    }
}

/// What cuDNN 9.19 chose on the H100 for this LSTM (2 layers, T 35, B 20,
/// H 200, fp32, dropout 0.2): the trace's `_cudnn_rnn` allocations. The
/// engine takes the first two as settings; the reserve it computes
/// (`L·T·B·H·k·4`, k = 6) is the one size it cannot know.
pub(crate) const CUDNN_DROPOUT_STATE: u64 = 6_488_064;

pub(crate) const CUDNN_WORKSPACE: u64 = 23_577_632;

pub(crate) const CUDNN_RESERVE: u64 = 6_177_760;

/// The engine's reserve for the LSTM of these programs: L·T·B·H·k·4 B.
pub(crate) fn modelled_reserve() -> u64 {
    let (l, t, b, h, k) = (2u64, 35u64, 20u64, 200u64, 6u64);
    l * t * b * h * k * 4
}

/// The engine set to the cuDNN sizes measured on the H100 (the reserve's
/// factor stays the formula's).
pub(crate) fn cudnn_as_measured(cfg: &mut EngineConfig) {
    cfg.rnn_workspace_bytes = CUDNN_WORKSPACE;
    cfg.cudnn_dropout_state_bytes = CUDNN_DROPOUT_STATE;
    assert_eq!(cfg.lstm_reserve_factor, 6);
}

/// Each reserve alive at the peak (`graphs`: one per graph still held) is
/// one block: allocated differs by it, rounded to 512 B. A graph still held
/// at an iteration's end holds its reserve there too.
pub(crate) fn cudnn_reserve_layout(graphs: u64) -> Layout {
    let off = graphs * modelled_reserve().abs_diff(CUDNN_RESERVE);
    // A second reserve's block may also keep another unsplit tail (a large
    // block is split only when more than 1 MiB would remain).
    let tails = (graphs - 1) << 20;
    Layout {
        requested: off,
        allocated: off.div_ceil(512) * 512 + tails,
        reserved: 2 << 20,
        ends: 2 << 20,
        requested_ends: (graphs - 1) * modelled_reserve().abs_diff(CUDNN_RESERVE),
    }
}

/// cuDNN 9.19's inference workspace for the same LSTM on the H100 (eval mode:
/// no reserve, no dropout state).
pub(crate) const CUDNN_INFERENCE_WORKSPACE: u64 = 23_017_632;

/// Every `alloc` and `free_requested` of a run, as (is_alloc, requested bytes).
pub(crate) type Requests = Vec<(bool, u64)>;

pub(crate) fn real_requests(stem: &str) -> Requests {
    use vramscope::alloc::Action;
    let snap = import_file(&captured(stem, "pickle")).expect("imports");
    from_snapshot::entries(&snap, 0)
        .iter()
        .filter_map(|e| match e.action {
            Action::Alloc => Some((true, e.size)),
            Action::FreeRequested => Some((false, e.size)),
            _ => None,
        })
        .collect()
}

pub(crate) fn simulated_requests(scenario: &str, stem: &str) -> Requests {
    simulated_requests_tuned(scenario, stem, &|_| {})
}

pub(crate) fn simulated_requests_tuned(
    scenario: &str,
    stem: &str,
    tune: &dyn Fn(&mut EngineConfig),
) -> Requests {
    use vramscope::alloc::Action;
    use vramscope::trace::Event;
    let sim = simulate_recording(scenario, &meta(stem), tune, true);
    sim.events
        .iter()
        .filter_map(|e| match e {
            Event::Alloc(a) if a.action == Action::Alloc => Some((true, a.size)),
            Event::Alloc(a) if a.action == Action::FreeRequested => Some((false, a.size)),
            _ => None,
        })
        .collect()
}

/// Where `sim` differs from `real`: an event is allowed one place away from
/// its real position (and no further), none may be missing or extra.
pub(crate) fn out_of_place(real: &Requests, sim: &Requests) -> Vec<String> {
    let mut used = vec![false; sim.len()];
    let mut off = Vec::new();
    if real.len() != sim.len() {
        off.push(format!(
            "{} real requests, {} simulated",
            real.len(),
            sim.len()
        ));
    }
    for (i, r) in real.iter().enumerate() {
        let near =
            (i.saturating_sub(1)..=i + 1).find(|&j| j < sim.len() && !used[j] && sim[j] == *r);
        match near {
            Some(j) => used[j] = true,
            None => off.push(format!(
                "real request {i} {r:?}: simulated {:?}",
                sim.get(i)
            )),
        }
    }
    off
}

/// A change to the engine's settings before a run.
pub(crate) type Tune = dyn Fn(&mut EngineConfig);
