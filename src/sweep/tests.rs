//! The sweep against figures worked out by hand: least squares on small
//! data sets, the parse of flag lists, and the peak's make-up of an MLP
//! whose tensor sizes follow from its shapes.

use super::*;
use crate::scenario::{load_str, Built, Scenario};

/// An MLP's forward and `out.sum().backward()`: the course's exercise on a
/// model whose tensors are easy to count.
const MLP_SUM: &str = r#"Scenario(
    name: "mlp-sum",
    description: "forward and out.sum().backward()",
    device: (name: "sim", capacity: "1GiB", overhead: "0MiB"),
    model: Mlp(dims: [784, 1024, 1024, 10]),
    criterion: Sum,
    steps: [
        LoadBatch(x: "x", y: "y"),
        Forward(input: "x", output: "out"),
        Loss(output: "out", target: "y", into: "loss"),
        Backward(loss: "loss", retain_graph: false),
    ],
    iterations: 1,
)"#;

fn mlp() -> (Scenario, Built) {
    load_str(MLP_SUM, "mlp-sum.ron").expect("loads")
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9 * b.abs().max(1.0)
}

#[test]
fn least_squares_through_points_on_a_line_is_the_line() {
    let l = fit::least_squares(&[(1.0, 5.0), (2.0, 7.0), (4.0, 11.0)]).expect("a line");
    assert!(close(l.slope, 2.0) && close(l.intercept, 3.0), "{l:?}");
    assert!(close(l.r_squared, 1.0), "{l:?}");
}

#[test]
fn least_squares_matches_the_worked_example() {
    // x̄ = 2.5, ȳ = 3.75, Sxy = 3.5, Sxx = 5: slope 0.7, intercept 2.0;
    // residuals −0.7, 0.6, 0.9, −0.8: SS_res = 2.3, SS_tot = 4.75.
    let l = fit::least_squares(&[(1.0, 2.0), (2.0, 4.0), (3.0, 5.0), (4.0, 4.0)]).expect("a line");
    assert!(close(l.slope, 0.7) && close(l.intercept, 2.0), "{l:?}");
    assert!(close(l.r_squared, 1.0 - 2.3 / 4.75), "{l:?}");
}

#[test]
fn no_line_through_one_batch() {
    assert!(fit::least_squares(&[(4.0, 1.0), (4.0, 2.0)]).is_none());
    assert!(fit::least_squares(&[(4.0, 1.0)]).is_none());
}

#[test]
fn batch_lists_parse_sorted_and_once() {
    assert_eq!(parse_list("--batch", "8, 2,4,2"), Ok(vec![2, 4, 8]));
}

#[test]
fn bad_batch_lists_name_the_flag_and_the_entry() {
    for (text, says) in [
        ("1,x", "`x` is not a whole number"),
        ("0", "0 is not a size"),
        ("", "an empty entry"),
        ("1,,2", "an empty entry"),
        ("-3", "`-3` is not a whole number"),
        ("4194304", "larger than 2097152"),
    ] {
        let err = parse_list("--batch", text).expect_err(text).to_string();
        assert!(
            err.starts_with(&format!("--batch {text}:")) && err.contains(says),
            "{text}: {err}"
        );
    }
}

#[test]
fn seq_on_a_model_without_one_is_refused() {
    let (s, b) = mlp();
    let err = SweepPlan::new(&s, &b, Some("1,2"), Some("128"), false).expect_err("no seq");
    assert!(err.to_string().starts_with("--seq:"), "{err}");
}

#[test]
fn no_points_and_no_search_is_refused() {
    let (s, b) = mlp();
    let err = SweepPlan::new(&s, &b, None, None, false).expect_err("nothing to run");
    assert!(err.to_string().contains("--batch"), "{err}");
    let search_only = SweepPlan::new(&s, &b, None, None, true).expect("the search is the sweep");
    assert!(search_only.points().is_empty());
}

#[test]
fn the_scenario_s_sweep_section_gives_the_points_and_a_schedule_is_said_overridden() {
    let text = MLP_SUM
        .replace(
            "iterations: 1,",
            "iterations: 1,\n    sweep: (batch: [16, 4]),",
        )
        .replace(
            "criterion: Sum,",
            "criterion: Sum,\n    data: (batch_schedule: [8, 2]),",
        );
    let (s, b) = load_str(&text, "s.ron").expect("loads");
    let plan = SweepPlan::new(&s, &b, None, None, false).expect("plan");
    assert_eq!(plan.points(), vec![(4, None), (16, None)]);
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("batch_schedule [8, 2] is overridden")),
        "{:?}",
        plan.notes
    );
    let flags = SweepPlan::new(&s, &b, Some("2"), None, false).expect("plan");
    assert_eq!(flags.batches, vec![2], "--batch wins over the section");
}

#[test]
fn the_peak_s_make_up_adds_up_to_the_allocator_s_own_peak() {
    let (s, b) = mlp();
    for batch in [1, 3, 64, 1000] {
        let p = run_point(&s, &b, batch, None).expect("runs");
        let m = p.at_peak.as_ref().expect("make-up known");
        assert_eq!(
            m.by_category.values().sum::<u64>(),
            p.peak_allocated,
            "batch {batch}: {m:?}"
        );
        assert!(m.requested <= p.peak_allocated && m.requested > 0);
        assert_eq!(
            m.phase,
            Some("backward"),
            "the peak of fwd+bwd is in backward"
        );
    }
}

/// Σ over the MLP's weights and biases of numel × 4 B, each rounded up to
/// PyTorch's 512 B block.
fn mlp_parameter_blocks() -> u64 {
    let dims = [784u64, 1024, 1024, 10];
    let round = |b: u64| b.div_ceil(512) * 512;
    dims.windows(2)
        .map(|w| round(w[0] * w[1] * 4) + round(w[1] * 4))
        .sum()
}

#[test]
fn the_fit_s_intercept_holds_the_parameters_and_the_input_grows_per_sample() {
    let (s, b) = mlp();
    // Multiples of 8: x = [b, 784] f32 is b × 3,136 B, a whole number of 512 B blocks.
    let plan = SweepPlan::new(&s, &b, Some("8,16,32,64,128"), None, false).expect("plan");
    let sweep = run(&s, &b, &plan, false, 2).expect("runs");
    let fit = &sweep.fits[0];
    let line = |name: &str| {
        fit.by_category
            .iter()
            .find(|l| l.category == name)
            .unwrap_or_else(|| panic!("no {name} line: {:?}", fit.by_category))
    };
    let params = line("parameter");
    assert!(params.values.iter().all(|v| *v == mlp_parameter_blocks()));
    assert!(
        close(params.line.slope, 0.0)
            && close(params.line.intercept, mlp_parameter_blocks() as f64)
    );
    let input = line("input");
    assert!(
        close(input.line.slope, 3136.0) && input.line.intercept.abs() < 1e-6,
        "{input:?}"
    );
    assert!(
        sweep
            .explanation
            .iter()
            .any(|l| l.contains("The same at every point") && l.contains("parameter")),
        "{:?}",
        sweep.explanation
    );
}

#[test]
fn the_search_finds_a_batch_that_fits_next_to_one_that_does_not() {
    let text = MLP_SUM.replace("capacity: \"1GiB\"", "capacity: \"64MiB\"");
    let (s, b) = load_str(&text, "small.ron").expect("loads");
    let m = find_max_batch(&s, &b, None, &[]).expect("searches");
    let best = m.batch.expect("batch 1 fits on 64 MiB");
    assert_eq!(m.first_oom, Some(best + 1));
    assert!(run_point(&s, &b, best, None).expect("runs").fits());
    assert!(run_point(&s, &b, best + 1, None).expect("runs").oom);
    // Doubling to the first OOM, then one bisection step per halving.
    let doublings = 64 - best.leading_zeros() + 1;
    assert!(m.runs <= 2 * doublings, "{} runs for {best}", m.runs);
    assert_eq!(m.runs as usize, m.tried.len());
}

fn synthetic(batch: u64, peak: u64, oom: bool) -> SweepPoint {
    SweepPoint {
        batch,
        seq: None,
        peak_allocated: peak,
        peak_reserved: peak,
        oom,
        oom_message: None,
        error: None,
        iterations_run: 1,
        at_peak: None,
    }
}

#[test]
fn points_on_a_line_are_called_linear_and_a_bent_one_is_named() {
    let on_line: Vec<SweepPoint> = [1u64, 2, 4, 8]
        .iter()
        .map(|&b| synthetic(b, (100 << 20) + (b << 20), false))
        .collect();
    let f = fits(&on_line);
    assert!(f[0].linear);
    // 10 % above the line at batch 8 of points otherwise on it.
    let mut bent = on_line.clone();
    bent[3].peak_allocated += bent[3].peak_allocated / 10;
    let f = fits(&bent);
    assert!(!f[0].linear);
    let (s, b) = mlp();
    let sweep = Sweep::from_points(&s, &b, Vec::new(), bent, Vec::new());
    assert!(
        sweep
            .explanation
            .iter()
            .any(|l| l.starts_with("Not linear: batch ")),
        "{:?}",
        sweep.explanation
    );
}

/// Where the line reaches the capacity far past the points measured, the
/// words say the peak may move there; close to them, they do not.
#[test]
fn a_reach_far_past_the_points_is_said_to_be_an_extrapolation() {
    let (s, b) = mlp();
    let reach = |per_sample: u64| {
        let points: Vec<SweepPoint> = [1u64, 2, 4, 8]
            .iter()
            .map(|&n| synthetic(n, (1 << 20) + n * per_sample, false))
            .collect();
        let sweep = Sweep::from_points(&s, &b, Vec::new(), points, Vec::new());
        sweep
            .explanation
            .into_iter()
            .find(|l| l.starts_with("The line reaches"))
            .expect("a reach")
    };
    let capacity = crate::sweep::capacity(&b);
    let far = reach(1 << 10);
    assert!(
        far.contains("far past the largest batch measured (8)"),
        "{far}"
    );
    let near = reach(capacity / 10);
    assert!(!near.contains("far past"), "{near}");
}

#[test]
fn an_oom_point_is_left_out_of_the_line_and_said() {
    let mut points: Vec<SweepPoint> = [1u64, 2, 4]
        .iter()
        .map(|&b| synthetic(b, b << 20, false))
        .collect();
    points.push(synthetic(8, 3 << 20, true));
    let f = fits(&points);
    assert_eq!(f[0].batches, vec![1, 2, 4]);
    assert_eq!(f[0].left_out, vec![8]);
    let (s, b) = mlp();
    let sweep = Sweep::from_points(&s, &b, Vec::new(), points, Vec::new());
    assert!(
        sweep
            .explanation
            .iter()
            .any(|l| l.starts_with("Batch 8 ran out of memory")),
        "{:?}",
        sweep.explanation
    );
    assert_eq!(sweep.largest_fitting_point(None), Some(4));
}

#[test]
fn a_bad_sweep_section_is_a_load_error_naming_the_field() {
    for (section, says) in [
        ("sweep: (batch: [])", "sweep.batch: the list is empty"),
        ("sweep: (batch: [1, 0])", "sweep.batch: 0 is not a size"),
        (
            "sweep: (batch: [1], seq: [128])",
            "sweep.seq: this model has no sequence length",
        ),
    ] {
        let text = MLP_SUM.replace("iterations: 1,", &format!("iterations: 1,\n    {section},"));
        let err = load_str(&text, "s.ron").expect_err(section).to_string();
        assert!(
            err.starts_with("s.ron:") && err.contains(says),
            "{section}: {err}"
        );
    }
}

#[test]
fn a_point_the_scenario_cannot_run_at_is_refused_before_any_runs() {
    let (s, b) = crate::scenario::resolve("checkpoint-none").expect("built-in");
    let err = SweepPlan::new(&s, &b, Some("1,2"), Some("256,1024"), false).expect_err("seq 1024");
    assert!(
        err.to_string()
            .starts_with("sweep point batch 1, seq 1024:")
            && err.to_string().contains("block_size 512"),
        "{err}"
    );
}
