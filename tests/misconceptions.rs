//! The misconception and seed-topic scenarios (issue 26): each one's
//! narration quotes figures, and these tests hold the quotes to the run's
//! own numbers (read from the run, formatted here), and check where the
//! peak falls against the phase markers of the event stream.

use vramscope::alloc::Action;
use vramscope::scenario::{resolve, run, RunOptions, RunResult, Scenario};
use vramscope::trace::event::{Event, Marker, Phase};

const MIB: f64 = 1_048_576.0;

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / MIB)
}

/// A size narration states in whole MiB (`128 MiB`).
fn whole_mib(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

fn run_named(name: &str, events: bool) -> (Scenario, RunResult) {
    let path = format!("{}/scenarios/{name}.ron", env!("CARGO_MANIFEST_DIR"));
    let (scenario, built) = resolve(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    let result = run(
        &scenario,
        &built,
        &RunOptions {
            iterations: None,
            record_events: events,
        },
    );
    assert!(result.error.is_none(), "{name}: {:?}", result.error);
    assert!(result.oom.is_none(), "{name}: {:?}", result.oom);
    (scenario, result)
}

/// The narration item said at `at` (its `Debug` form, e.g. `End`).
fn said(s: &Scenario, at: &str) -> String {
    s.narration
        .iter()
        .find(|n| format!("{:?}", n.at) == at)
        .unwrap_or_else(|| panic!("{}: no narration at {at}", s.name))
        .text
        .clone()
}

fn assert_quotes(text: &str, figure: &str) {
    assert!(
        text.contains(figure),
        "narration does not say {figure}: {text}"
    );
}

/// The highest allocated inside one phase of one iteration.
fn phase_peak(r: &RunResult, it: u32, want: Phase) -> u64 {
    let (mut allocated, mut peak) = (0u64, 0u64);
    let (mut iteration, mut phase) = (0u32, None);
    for e in &r.events {
        match e {
            Event::Marker(Marker::IterationBegin(i)) => iteration = *i,
            Event::Marker(Marker::PhaseBegin(p)) => phase = Some(*p),
            Event::Marker(Marker::PhaseEnd(_)) => phase = None,
            Event::Alloc(a) if a.action == Action::Alloc => {
                allocated += a.block_size;
                if iteration == it && phase == Some(want) {
                    peak = peak.max(allocated);
                }
            }
            Event::Alloc(a) if a.action == Action::FreeCompleted => allocated -= a.block_size,
            _ => {}
        }
    }
    peak
}

/// Where allocated first reaches its peak: (iteration, phase, the ops open
/// there, outermost first), from
/// the allocator entries (alloc +, free_completed −) between the markers.
fn peak_moment(r: &RunResult) -> (u32, Option<Phase>, String) {
    let (mut allocated, mut peak) = (0u64, 0u64);
    let (mut iteration, mut phase, mut ops) = (0u32, None, Vec::<String>::new());
    let mut at = (0, None, String::new());
    for e in &r.events {
        match e {
            Event::Marker(Marker::IterationBegin(i)) => iteration = *i,
            Event::Marker(Marker::PhaseBegin(p)) => phase = Some(*p),
            Event::Marker(Marker::PhaseEnd(_)) => phase = None,
            Event::Marker(Marker::OpBegin { name, .. }) => ops.push(name.to_string()),
            Event::Marker(Marker::OpEnd) => {
                ops.pop();
            }
            Event::Alloc(a) if a.action == Action::Alloc => {
                allocated += a.block_size;
                if allocated > peak {
                    peak = allocated;
                    at = (iteration, phase, ops.join(" > "));
                }
            }
            Event::Alloc(a) if a.action == Action::FreeCompleted => allocated -= a.block_size,
            _ => {}
        }
    }
    assert_eq!(
        peak, r.peak_allocated,
        "{}: the entries add up to the peak",
        r.scenario
    );
    at
}

/// The parameter tensors of Mlp(dims: [1024, 4096, 4096, 10]), in elements.
const MLP_TENSORS: [u64; 6] = [1024 * 4096, 4096, 4096 * 4096, 4096, 4096 * 10, 10];
const MLP_PARAMS: u64 = 21_020_682;

/// One tensor like each parameter at `bytes` per element, as the allocator
/// holds them: each request rounded up to 512 B (engine.md §1.2).
fn per_param_blocks(bytes: u64) -> u64 {
    MLP_TENSORS
        .iter()
        .map(|n| (n * bytes).div_ceil(512) * 512)
        .sum()
}

#[test]
fn peak_inside_step_quotes_both_readings() {
    assert_eq!(MLP_TENSORS.iter().sum::<u64>(), MLP_PARAMS);
    let (s, r) = run_named("peak-inside-step", true);
    let between = r.per_iteration.last().expect("iterations").allocated;
    assert!(r.per_iteration.iter().all(|p| p.allocated == between));
    let end = said(&s, "End");
    assert_quotes(&end, &mib(between));
    assert_quotes(&end, &mib(r.peak_allocated));
    assert_quotes(&end, &mib(r.peak_allocated - between));
    // Iteration 1 peaks before AdamW's moments exist: 2 × 4 B per parameter less.
    let first = r.per_iteration[0].peak_allocated;
    let moments = 2 * per_param_blocks(4);
    assert_eq!(r.peak_allocated - first, moments);
    let second = said(&s, "Iteration(2)");
    assert_quotes(&second, &mib(first));
    assert_quotes(&second, &mib(moments));
    // Saved ReLU outputs: [8192, 4096] fp32.
    assert_quotes(
        &said(&s, "Phase(1, \"backward\")"),
        &whole_mib(8192 * 4096 * 4),
    );
    let (it, phase, _) = peak_moment(&r);
    assert_eq!((it, phase), (2, Some(Phase::Backward)));
    // Nothing of the step's peak is left between steps: more than the saved
    // activations (2 × 128 MiB) separate the two readings.
    assert!(r.peak_allocated - between > (2 * 128) << 20);
}

#[test]
fn cuda_context_names_allocated_reserved_and_nvidia_smi() {
    let (s, r) = run_named("cuda-context", false);
    // The H100 profile's measured context (scenarios/README.md's table).
    let context: u64 = 552_402_944;
    assert_eq!(r.conditions.overhead, context);
    let last = r.per_iteration.last().expect("iterations");
    let end = said(&s, "End");
    assert_quotes(&end, &mib(last.allocated));
    assert_quotes(&end, &mib(last.reserved));
    assert_quotes(&end, &mib(context));
    assert_quotes(&end, &mib(last.reserved + context));
    assert_quotes(&said(&s, "Start"), &mib(context));
    let first = &r.per_iteration[0];
    let after_one = said(&s, "Iteration(2)");
    assert_quotes(&after_one, &mib(first.allocated));
    assert_quotes(&after_one, &mib(first.reserved));
    assert!(
        context > last.reserved,
        "the narration calls the context the largest"
    );
}

#[test]
fn the_batch_moves_the_peak_between_optimizer_and_backward() {
    let (small_s, small) = run_named("batch-moves-peak-small", true);
    let (large_s, large) = run_named("batch-moves-peak-large", true);
    let state = 4 * per_param_blocks(4);
    let sqrt_list = per_param_blocks(4);
    let moments = 2 * per_param_blocks(4);

    let (it, phase, op) = peak_moment(&small);
    assert_eq!((it, phase), (1, Some(Phase::Optimizer)));
    assert!(op.starts_with("optimizer.step"), "{op}");
    let between = small.per_iteration.last().expect("iterations").allocated;
    assert_eq!(
        small.peak_allocated - between,
        sqrt_list,
        "the peak is state + the sqrt list"
    );
    for text in [said(&small_s, "Start"), said(&large_s, "Start")] {
        assert_quotes(&text, &mib(state));
    }
    assert_quotes(&said(&small_s, "Start"), &whole_mib(64 * 4096 * 4));
    let step = said(&small_s, "Op(\"optimizer.step\")");
    assert_quotes(&step, &mib(moments));
    assert_quotes(&step, &mib(sqrt_list));
    let end = said(&small_s, "End");
    assert_quotes(&end, &mib(small.peak_allocated));
    assert_quotes(&end, &mib(between));

    let (it, phase, _) = peak_moment(&large);
    assert_eq!((it, phase), (2, Some(Phase::Backward)));
    let between = large.per_iteration.last().expect("iterations").allocated;
    let step_peak = phase_peak(&large, 2, Phase::Optimizer);
    assert_eq!(step_peak, between + sqrt_list);
    let end = said(&large_s, "End");
    assert_quotes(&end, &mib(large.peak_allocated));
    assert_quotes(&end, &mib(step_peak));
    assert_quotes(&end, &mib(between));
    assert_quotes(&end, &mib(sqrt_list));
    assert_quotes(&said(&large_s, "Start"), &whole_mib(8192 * 4096 * 4));
}

/// The parameter tensors of Mlp(dims: [4096, 8192, 8192, 10]), in elements.
const WIDE_TENSORS: [u64; 6] = [4096 * 8192, 8192, 8192 * 8192, 8192, 8192 * 10, 10];

#[test]
fn autocast_raises_the_peak_of_a_weight_heavy_model() {
    let (amp_s, amp) = run_named("amp-raises-peak", true);
    let (fp32_s, fp32) = run_named("amp-raises-peak-fp32", true);
    let params: u64 = WIDE_TENSORS.iter().sum();
    let blocks = |bytes: u64| -> u64 {
        WIDE_TENSORS
            .iter()
            .map(|n| (n * bytes).div_ceil(512) * 512)
            .sum()
    };
    assert!(amp.peak_allocated > fp32.peak_allocated);
    for (s, r) in [(&amp_s, &amp), (&fp32_s, &fp32)] {
        let (it, phase, _) = peak_moment(r);
        assert_eq!((it, phase), (2, Some(Phase::Backward)), "{}", s.name);
        let start = said(s, "Start");
        assert_quotes(
            &start,
            &format!(
                "{},{:03},{:03}",
                params / 1_000_000,
                params / 1000 % 1000,
                params % 1000
            ),
        );
        assert_quotes(&start, &mib(4 * params));
        let end = said(s, "End");
        assert_quotes(&end, &mib(r.peak_allocated));
        assert_quotes(&end, &mib(phase_peak(r, 2, Phase::Forward)));
        assert_quotes(&end, &mib(amp.peak_allocated - fp32.peak_allocated));
    }
    assert_quotes(&said(&amp_s, "End"), &mib(fp32.peak_allocated));
    assert_quotes(
        &said(&amp_s, "End"),
        &mib(phase_peak(&fp32, 2, Phase::Forward)),
    );
    assert!(phase_peak(&amp, 2, Phase::Forward) > phase_peak(&fp32, 2, Phase::Forward));
    // The cast cache: one fp16 copy of every weight and bias.
    assert_quotes(&said(&amp_s, "Phase(2, \"forward\")"), &mib(blocks(2)));
    // SGD's momentum buffers: one fp32 clone of each gradient.
    assert_quotes(&said(&fp32_s, "Phase(2, \"backward\")"), &mib(blocks(4)));
    // Both end their iterations with the same tensors: weights, grads,
    // momentum, the last batch.
    let end_amp = amp.per_iteration.last().expect("iterations").allocated;
    let end_fp32 = fp32.per_iteration.last().expect("iterations").allocated;
    assert!(
        end_amp.abs_diff(end_fp32) < 1 << 20,
        "{end_amp} vs {end_fp32}"
    );
}

#[test]
fn inplace_relu_lowers_the_forward_not_the_training_peak() {
    let (ip_s, ip) = run_named("inplace-ops", true);
    let (oop_s, oop) = run_named("inplace-ops-out-of-place", true);
    let ip_fwd = phase_peak(&ip, 2, Phase::Forward);
    let oop_fwd = phase_peak(&oop, 2, Phase::Forward);
    // One [8192, 4096] fp32 activation, within the 512 B rounding of small tensors.
    let activation: u64 = 8192 * 4096 * 4;
    assert!(oop_fwd > ip_fwd);
    assert!(
        (oop_fwd - ip_fwd).abs_diff(activation) < activation / 100,
        "{}",
        oop_fwd - ip_fwd
    );
    assert_eq!(
        ip.peak_allocated, oop.peak_allocated,
        "the saved tensors are the same"
    );
    for (s, r) in [(&ip_s, &ip), (&oop_s, &oop)] {
        assert_eq!(peak_moment(r).1, Some(Phase::Backward), "{}", s.name);
        let end = said(s, "End");
        assert_quotes(&end, &mib(ip_fwd));
        assert_quotes(&end, &mib(oop_fwd));
        assert_quotes(&end, &mib(r.peak_allocated));
        assert_quotes(&said(s, "Start"), &whole_mib(activation));
    }
    assert_quotes(&said(&ip_s, "End"), &mib(oop_fwd - ip_fwd));
}

#[test]
fn inplace_after_a_saved_output_raises_pytorch_s_error_in_backward() {
    let path = format!(
        "{}/scenarios/inplace-ops-error.ron",
        env!("CARGO_MANIFEST_DIR")
    );
    let (s, built) = resolve(&path).expect("loads");
    let r = run(
        &s,
        &built,
        &RunOptions {
            iterations: None,
            record_events: false,
        },
    );
    // PyTorch's message (torch/csrc/autograd/saved_variable.cpp), for the
    // first ReLU's output [8192, 4096] that relu_ took from version 0 to 1.
    let error = r.error.as_deref().expect("the run stops with an error");
    assert!(
        error.starts_with(
            "RuntimeError: one of the variables needed for gradient computation has been \
             modified by an inplace operation: [torch.cuda.FloatTensor [8192, 4096]], which is \
             output 0 of ReluBackward0, is at version 1; expected version 0 instead."
        ),
        "{error}"
    );
    assert_eq!(r.iterations_run, 0, "iteration 1 never finished");
    assert!(r.oom.is_none());
    assert_eq!(
        r.narration.len(),
        s.narration.len(),
        "every item said, the backward one included"
    );
}

#[test]
fn reference_cycles_hold_each_output_until_the_collector_runs() {
    let (gc_s, gc) = run_named("reference-cycle-gc", true);
    let (bug_s, bug) = run_named("reference-cycle-bug", false);
    // out = [2048, 4096] fp32.
    let out: u64 = 2048 * 4096 * 4;
    let ends: Vec<u64> = gc.per_iteration.iter().map(|p| p.allocated).collect();
    assert_eq!(ends.len(), 8);
    let base = ends[0];
    // gc.collect() every 4th iteration: 1, 2, 3 records waiting, then none.
    let waiting = [0, 1, 2, 0, 1, 2, 3, 0];
    for (i, w) in waiting.iter().enumerate() {
        assert_eq!(ends[i], base + w * out, "iteration {}", i + 1);
    }
    assert_quotes(&said(&gc_s, "Start"), &whole_mib(out));
    let third = said(&gc_s, "Iteration(3)");
    assert_quotes(&third, &mib(ends[1]));
    assert_quotes(&third, &mib(out));
    assert_quotes(&said(&gc_s, "Iteration(5)"), &mib(ends[3]));
    let end = said(&gc_s, "End");
    assert_quotes(&end, &mib(ends[6]));
    assert_quotes(&end, &mib(ends[7]));
    assert_quotes(&end, &mib(gc.peak_allocated));
    assert!(
        gc.findings.iter().all(|f| f.root != "rec"),
        "bounded: no leak"
    );

    // Without the collector every record stays.
    let ends: Vec<u64> = bug.per_iteration.iter().map(|p| p.allocated).collect();
    for (i, a) in ends.iter().enumerate() {
        assert_eq!(*a, base + i as u64 * out, "iteration {}", i + 1);
    }
    let end = said(&bug_s, "End");
    assert_quotes(&end, &mib(out));
    assert_quotes(&end, &mib(ends[7]));
    let f = bug
        .findings
        .iter()
        .find(|f| f.root == "rec")
        .expect("a finding for rec");
    assert_eq!(f.growth_per_iter, out as i64);
    assert!(f.fix.starts_with("del rec[\"self\"]"), "{}", f.fix);
    assert!(f.evidence.contains("rebound 7 times"), "{}", f.evidence);
    assert_quotes(&end, "7 unreachable records");
}
