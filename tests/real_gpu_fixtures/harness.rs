//! What every capture check shares: the captured files, PyTorch's counters
//! beside them, the simulation of a scenario as the capture's release ran
//! it, and the comparisons.

use std::path::PathBuf;
use vramscope::alloc::{AllocConfig, TorchVersion};
use vramscope::scenario::{resolve, run, Built, RunOptions, RunResult, Scenario, ENV_KEYS};
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
    /// `memory_allocated()` / `memory_reserved()` at each iteration's end
    /// (`requested_bytes.all.current` there is always exact).
    pub(crate) ends: u64,
    /// `memory_reserved()` alone at an iteration's end, where only the
    /// segments differ (the larger of this and `ends` applies to it).
    pub(crate) reserved_ends: u64,
}

pub(crate) const EXACT: Layout = Layout {
    requested: 0,
    allocated: 0,
    reserved: 0,
    ends: 0,
    reserved_ends: 0,
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

/// The scenario as shipped: the capture it names must be this one, and it
/// must carry the capture's conditions itself (the GPU, the release, the
/// allocator config, the environment, the memory the run was held to, the
/// iterations). Nothing here changes a setting.
pub(crate) fn simulate(scenario: &str, m: &serde_json::Value) -> RunResult {
    simulate_recording(scenario, m, false)
}

/// [`simulate`], keeping the run's trace events when `record_events`.
pub(crate) fn simulate_recording(
    scenario: &str,
    m: &serde_json::Value,
    record_events: bool,
) -> RunResult {
    let (sc, built) = resolve(scenario).unwrap_or_else(|e| panic!("{scenario}: {e}"));
    assert_eq!(m["scenario"], sc.name.as_str(), "{scenario}");
    same_conditions(scenario, &sc, &built, m);
    let sim = run(
        &sc,
        &built,
        &RunOptions {
            iterations: None,
            record_events,
        },
    );
    println!(
        "{scenario} against {} / torch {}",
        m["gpu_name"], m["torch_version"]
    );
    sim
}

/// The scenario file says what the capture ran under.
fn same_conditions(scenario: &str, sc: &Scenario, built: &Built, m: &serde_json::Value) {
    let c = &built.conditions;
    let stem = m["snapshot"]
        .as_str()
        .and_then(|s| s.strip_suffix(".pickle"))
        .expect("the capture's snapshot");
    assert_eq!(c.capture.as_deref(), Some(stem), "{scenario}: capture");
    let version = m["torch_version"].as_str().expect("torch_version");
    let release: String = version.split('.').take(2).collect::<Vec<_>>().join(".");
    assert_eq!(c.torch, release, "{scenario}: PyTorch release");
    assert_eq!(
        c.gpu.map(|g| g.product),
        m["gpu_name"].as_str(),
        "{scenario}: GPU"
    );
    let settings = &m["allocator_settings"];
    // The same allocator rules; a memory fraction the program set itself
    // (`per_process_memory_fraction` in the scenario's config) is the same
    // limit on the memory the run may use.
    let read = |conf: &str| {
        AllocConfig::parse_for(conf, TorchVersion(11))
            .unwrap_or_else(|e| panic!("{scenario}: {conf}: {e}"))
    };
    let mut ours = read(&sc.alloc_conf);
    let theirs = read(settings["alloc_conf"].as_str().unwrap_or_default());
    if let Some(fraction) = ours.per_process_memory_fraction.take() {
        let budget = (c.capacity - c.overhead) as f64;
        assert_eq!(
            (fraction * budget) as u64,
            u64_field(m, "allowed_memory_maximum"),
            "{scenario}: the program's memory fraction"
        );
    }
    assert!(
        ours.same_rules(&theirs),
        "{scenario}: PYTORCH_CUDA_ALLOC_CONF"
    );
    for key in ENV_KEYS {
        assert_eq!(
            c.env.get(key).map(String::as_str),
            settings["env"][key].as_str(),
            "{scenario}: {key}"
        );
    }
    // set_per_process_memory_fraction held the card to the scenario's device.
    assert_eq!(
        c.capacity - c.overhead,
        u64_field(m, "budget_bytes"),
        "{scenario}: the memory the run may use"
    );
    assert_eq!(
        u64::from(built.program.iterations),
        u64_field(m, "iterations_requested"),
        "{scenario}: iterations"
    );
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

/// The scenario as shipped against the capture: what the tensors requested
/// at the peak byte for byte, the same OOM, and the layout within `layout`
/// (exact unless a test names the cause of a difference).
pub(crate) fn check(scenario: &str, stem: &str, layout: Layout) -> (RunResult, serde_json::Value) {
    let m = replay_checks(stem);
    let sim = simulate(scenario, &m);
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
    expectations_hold_on_the_capture(scenario, &sim, &m);
    (sim, m)
}

/// The scenario's own figures-based expectations (peaks, flat or growing
/// ends) judged on what the GPU measured: a scenario may not promise what the
/// real run did not do. Leak and error expectations need the autograd graph,
/// which a capture does not hold; the OOM is [`same_story`]'s.
fn expectations_hold_on_the_capture(scenario: &str, sim: &RunResult, m: &serde_json::Value) {
    use vramscope::scenario::{check as check_expectations, Expectation, IterationPoint};
    let (sc, _) = resolve(scenario).unwrap_or_else(|e| panic!("{scenario}: {e}"));
    let figures: Vec<Expectation> = sc
        .expect
        .iter()
        .filter(|e| {
            matches!(
                e,
                Expectation::PeakReservedUnder(_)
                    | Expectation::PeakReservedOver(_)
                    | Expectation::PeakAllocatedUnder(_)
                    | Expectation::PeakAllocatedOver(_)
                    | Expectation::AllocatedGrowsAtLeast(_)
                    | Expectation::AllocatedFlat
                    | Expectation::RequestedFlat
                    | Expectation::ReservedGrowsAllocatedFlat
            )
        })
        .cloned()
        .collect();
    let mut real = sim.clone();
    real.peak_allocated = u64_field(m, "max_memory_allocated");
    real.peak_reserved = u64_field(m, "max_memory_reserved");
    real.per_iteration = m["per_iteration"]
        .as_array()
        .expect("per_iteration")
        .iter()
        .map(|p| IterationPoint {
            iteration: u32::try_from(u64_field(p, "iteration")).expect("small"),
            allocated: u64_field(p, "allocated"),
            requested: u64_field(p, "requested"),
            reserved: u64_field(p, "reserved"),
            peak_allocated: u64_field(p, "peak_allocated"),
            // A capture records memory, not kernel work.
            work: Default::default(),
        })
        .collect();
    for result in check_expectations(&figures, &real) {
        assert!(
            result.passed,
            "{scenario}: expects {} but the GPU measured {}",
            result.expectation, result.observed
        );
    }
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
    let (mut widest, mut widest_requested) = (0u64, 0u64);
    for (r, s) in real.iter().zip(&sim.per_iteration) {
        // What the live tensors requested does not depend on the layout.
        let fields = [
            ("requested", s.requested, 0),
            ("allocated", s.allocated, tol),
            ("reserved", s.reserved, tol.max(layout.reserved_ends)),
            ("peak_allocated", s.peak_allocated, tol),
        ];
        for (key, simulated, tol) in fields {
            let recorded = u64_field(r, key);
            let gap = recorded.abs_diff(simulated);
            if key == "requested" {
                widest_requested = widest_requested.max(gap);
            } else {
                widest = widest.max(gap);
            }
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
        "{scenario}: {n} iteration ends compared, {off} figures off (layout allowance {tol} B, reserved {} B); widest gap {widest} B, requested {widest_requested} B",
        tol.max(layout.reserved_ends)
    );
    assert_eq!(off, 0, "{scenario}: iteration ends differ (above)");
}

/// What cuDNN 9.19 chose on the H100 for this LSTM (2 layers, T 35, B 20,
/// H 200, fp32, dropout 0.2): the trace's `_cudnn_rnn` allocations, which
/// the LSTM scenarios carry as their own settings.
pub(crate) const CUDNN_DROPOUT_STATE: u64 = 6_488_064;

pub(crate) const CUDNN_WORKSPACE: u64 = 23_577_632;

pub(crate) const CUDNN_RESERVE: u64 = 6_177_760;

/// The LSTM scenarios carry the cuDNN sizes measured on the H100 as their
/// own conditions: `workspace` (training or inference), and in training the
/// dropout state and the reserve.
pub(crate) fn carries_cudnn_as_measured(scenario: &str, workspace: u64, training: bool) {
    let (_, built) = resolve(scenario).unwrap_or_else(|e| panic!("{scenario}: {e}"));
    let cfg = &built.engine;
    assert_eq!(cfg.rnn_workspace_bytes, workspace, "{scenario}");
    if training {
        assert_eq!(
            (cfg.cudnn_dropout_state_bytes, cfg.rnn_reserve_bytes),
            (CUDNN_DROPOUT_STATE, Some(CUDNN_RESERVE)),
            "{scenario}"
        );
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
    use vramscope::alloc::Action;
    use vramscope::trace::Event;
    let sim = simulate_recording(scenario, &meta(stem), true);
    sim.events
        .iter()
        .filter_map(|e| match e {
            Event::Alloc(a) if a.action == Action::Alloc => Some((true, a.size)),
            Event::Alloc(a) if a.action == Action::FreeRequested => Some((false, a.size)),
            _ => None,
        })
        .collect()
}

/// Every request and free of `scenario`'s run where the capture has it
/// (the liberties [`out_of_place`] names aside).
pub(crate) fn requests_in_place(scenario: &str, stem: &str) {
    let real = real_requests(stem);
    let off = out_of_place(&real, &simulated_requests(scenario, stem));
    assert!(
        off.is_empty(),
        "{scenario}: {} of {} out of place:\n{}",
        off.len(),
        real.len(),
        off[..off.len().min(20)].join("\n")
    );
}

/// Where `sim` differs from `real`: every request and free in the same
/// place, none missing or extra — but for one liberty, which the capture
/// programs take: they load a batch in two statements (`x = …` frees the
/// last `x` before `y = …` makes the new `y`), where the scenario's
/// `LoadBatch` binds both at once. So a free just before an alloc in the
/// capture may come just after it in the simulation. Scenarios whose
/// program binds the batch in two statements say
/// `LoadBatch(..., assign: InTurn)` and need no liberty there; it is still
/// taken where a capture frees a tensor before the next request although
/// the program's lines say otherwise (the LSTM programs' `x, y = batch()`
/// frees a 5,600 B tensor between the two new ones; gradient accumulation's
/// 4-byte loss sums). And two frees side by
/// side may come in either order: tensors released by one statement (a
/// tuple's elements, a frame's locals, a node's saved values) go in an
/// order Python and the autograd engine choose and the engine does not
/// model. Nothing else may move, and nothing moves further than its
/// neighbour's place.
pub(crate) fn out_of_place(real: &Requests, sim: &Requests) -> Vec<String> {
    let mut off = Vec::new();
    if real.len() != sim.len() {
        off.push(format!(
            "{} real requests, {} simulated",
            real.len(),
            sim.len()
        ));
    }
    let mut i = 0;
    while i < real.len() {
        let r = real[i];
        if sim.get(i) == Some(&r) {
            i += 1;
            continue;
        }
        // A free swapped with the next event: an alloc (the two-statement
        // batch) or another free (released together).
        let swapped = !r.0 && sim.get(i) == real.get(i + 1) && sim.get(i + 1) == Some(&r);
        if swapped {
            i += 2;
            continue;
        }
        off.push(format!(
            "real request {i} {r:?}: simulated {:?}",
            sim.get(i)
        ));
        i += 1;
    }
    off
}
