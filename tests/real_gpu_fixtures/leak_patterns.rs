//! The leak patterns of issue 39, captured on an H100 on 2026-12-05
//! (python/gpu/round_captures.sh): each built-in as shipped against its
//! program's capture.

use crate::addresses::{figures_of, on_simulated_addresses};
use crate::harness::{check, out_of_place, real_requests, simulated_requests, Requests, EXACT};

#[test]
fn rnn_hidden_every_other_bug_matches_the_h100() {
    check(
        "rnn-hidden-every-other-bug",
        "rnn_hidden_every_other_bug",
        EXACT,
    );
}

#[test]
fn rnn_hidden_every_batch_fixed_matches_the_h100() {
    check(
        "rnn-hidden-every-batch-fixed",
        "rnn_hidden_every_batch_fixed",
        EXACT,
    );
}

#[test]
fn metric_state_epoch_bug_matches_the_h100() {
    check("metric-state-epoch-bug", "metric_state_epoch_bug", EXACT);
}

#[test]
fn metric_state_epoch_fixed_matches_the_h100() {
    check(
        "metric-state-epoch-fixed",
        "metric_state_epoch_fixed",
        EXACT,
    );
}

#[test]
fn bounded_deque_graphs_bug_matches_the_h100() {
    check(
        "bounded-deque-graphs-bug",
        "bounded_deque_graphs_bug",
        EXACT,
    );
}

#[test]
fn bounded_deque_item_fixed_matches_the_h100() {
    check(
        "bounded-deque-item-fixed",
        "bounded_deque_item_fixed",
        EXACT,
    );
}

#[test]
fn val_outputs_inner_loop_bug_matches_the_h100() {
    check(
        "val-outputs-inner-loop-bug",
        "val_outputs_inner_loop_bug",
        EXACT,
    );
}

#[test]
fn val_outputs_cpu_fixed_matches_the_h100() {
    check("val-outputs-cpu-fixed", "val_outputs_cpu_fixed", EXACT);
}

/// Every request is the H100's, in order, up to the program's end, where
/// leaving the `with torch.autocast(...)` that wraps the whole loop frees
/// the cached weight casts in the order of autocast's hash map (keyed by
/// host pointers): the same frees, in another order. (The backward inside
/// the autocast region runs under it: each bias gradient is summed into
/// fp32 and cast back to fp16, which the engine does as PyTorch did.)
#[test]
fn autocast_around_loop_bug_matches_the_h100() {
    let (scenario, stem) = ("autocast-around-loop-bug", "autocast_around_loop_bug");
    let (mut real, mut sim) = (real_requests(stem), simulated_requests(scenario, stem));
    let (real_end, sim_end) = (teardown(&mut real), teardown(&mut sim));
    let off = out_of_place(&real, &sim);
    assert!(off.is_empty(), "{}", off.join("\n"));
    assert_eq!(real_end, sim_end, "the frees at the end, as a multiset");
    // Exact on the H100 driver's layout (in request order 2 MiB apart at
    // the peak and up to 7 MiB at an iteration end). The H100's own
    // requests on the simulated device's addresses make the simulation's
    // figures exactly: which cached block the addresses make the best fit
    // is the device's, nothing the engine asks for.
    let (sim, _) = check(scenario, stem, EXACT);
    // The last iteration's end on that replay is the trace's end, after the
    // program's teardown: compared up to the iteration before.
    let (mut real, mut ours) = (
        on_simulated_addresses(scenario, stem).figures,
        figures_of(&sim),
    );
    let n = ours.ends.len() - 1;
    real.ends.truncate(n);
    ours.ends.truncate(n);
    assert_eq!(real, ours, "the H100's requests on the simulated device");
}

/// Splits off the frees after the last request, sorted.
fn teardown(requests: &mut Requests) -> Vec<(bool, u64)> {
    let last_alloc = requests.iter().rposition(|r| r.0).map_or(0, |i| i + 1);
    let mut end = requests.split_off(last_alloc);
    end.sort_unstable();
    end
}

#[test]
fn forward_hook_activations_bug_matches_the_h100() {
    check(
        "forward-hook-activations-bug",
        "forward_hook_activations_bug",
        EXACT,
    );
}

#[test]
fn forward_hook_removed_fixed_matches_the_h100() {
    check(
        "forward-hook-removed-fixed",
        "forward_hook_removed_fixed",
        EXACT,
    );
}
