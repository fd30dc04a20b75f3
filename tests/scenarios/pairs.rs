//! Buggy/fixed pairs differ as engine.md §9 says: the leaks grow by the
//! §9.1 figure and the fixes stay flat, peaks move with eval, AMP,
//! checkpointing, accumulation and the optimizer, and fragmentation OOMs
//! answer to the allocator's settings.

use super::*;

/// §9 pitfalls 1b, 2, 5 and §8.3: the buggy loop grows by the §9.1 figure
/// (written out in each file), the fixed one stays flat.
#[test]
fn leaks_grow_by_the_9_1_formula_and_fixes_stay_flat() {
    let table: [(&str, &str, u64); 5] = [
        // mlp-mnist S_iter: 2 × 1 MiB ReLU outs + 10,240 log-probs + 512
        // total_weight + 802,816 x + 2,048 y.
        (
            "accumulate-loss-eval-bug",
            "accumulate-loss-eval-fixed",
            2_912_768,
        ),
        // One 0-dim loss per entry: a 512 B block.
        ("loss-list-train-bug", "accumulate-loss-train-fixed", 512),
        // lstm-lm-ptb in eval: x 5,632 + emb 560,128 + LSTM out 560,128 + h, c 2 × 32,256.
        ("rnn-hidden-eval-bug", "rnn-hidden-fixed", 1_190_400),
        // A_out = [256, 8192] fp32 logits.
        ("store-outputs-bug", "store-outputs-fixed", 8_388_608),
        ("store-outputs-detach-bug", "store-outputs-fixed", 8_388_608),
    ];
    for (bug, fixed, per_iter) in table {
        assert_growth_within_1pct(get(bug), per_iter);
        assert_flat(get(fixed));
        assert!(get(fixed).oom.is_none(), "{fixed} ran out of memory");
    }
    // The eval leak and the stored outputs end in an OOM within 60 iterations.
    for bug in [
        "accumulate-loss-eval-bug",
        "rnn-hidden-eval-bug",
        "store-outputs-bug",
        "store-outputs-detach-bug",
    ] {
        let r = get(bug);
        assert!(r.oom.is_some(), "{bug}: no OOM");
        assert!(r.iterations_run < 60);
    }
    // detach() keeps the storage: the two store-outputs bugs are identical on the GPU.
    let (t, d) = (get("store-outputs-bug"), get("store-outputs-detach-bug"));
    assert_eq!(steady(t), steady(d));
    assert_eq!(t.iterations_run, d.iterations_run);
}
/// §9 pitfall 1: in training, `total_loss += loss` keeps one 512 B tensor on
/// the GPU and nothing else; `.item()` keeps nothing.
#[test]
fn total_loss_in_training_is_flat_on_the_gpu() {
    let bug = get("accumulate-loss-train-bug");
    let fixed = get("accumulate-loss-train-fixed");
    assert_flat(bug);
    assert_flat(fixed);
    assert_eq!(steady(bug)[0], steady(fixed)[0] + 512);
    assert_eq!(bug.iterations_run, fixed.iterations_run);
}
/// §8.3: not detaching → backward-twice error at iteration 2; retain_graph
/// keeps batch 1's graph, then hits the version-counter check (§2.6);
/// detaching trains.
#[test]
fn rnn_hidden_state_stories() {
    let bug = get("rnn-hidden-bug");
    assert_eq!(bug.iterations_run, 1, "the error comes at iteration 2");
    assert!(bug.error.as_deref().is_some_and(
        |e| e.starts_with("RuntimeError: Trying to backward through the graph a second time")
    ));
    assert!(bug.oom.is_none());

    let retain = get("rnn-hidden-retain-graph-bug");
    let fixed = get("rnn-hidden-fixed");
    assert_eq!(retain.iterations_run, 1);
    assert!(retain
        .error
        .as_deref()
        .is_some_and(|e| e.contains("modified by an inplace operation")));
    // Batch 1's graph is still alive at the end of iteration 1.
    assert!(
        retain.per_iteration[0].allocated > fixed.per_iteration[0].allocated + 6_720_000,
        "retain_graph keeps at least the cuDNN reserve"
    );
    assert_eq!(fixed.iterations_run, 30);
    assert!(fixed.error.is_none());
}
/// §9 pitfall 4: eval without no_grad is a peak of ≈ 2·S_iter, not a leak;
/// no_grad and inference_mode use the same GPU bytes.
#[test]
fn eval_without_no_grad_is_a_peak_not_a_leak() {
    let bug = get("eval-no-grad-bug");
    let no_grad = get("eval-no-grad-fixed");
    let inference = get("eval-inference-mode-fixed");
    assert_flat(bug);
    assert_flat(no_grad);
    assert_eq!(no_grad.peak_allocated, inference.peak_allocated);
    assert_eq!(steady(no_grad), steady(inference));
    let floor = steady(no_grad)[0];
    let s_iter = steady(bug)[0] - floor;
    let predicted = floor + 2 * s_iter;
    let err = (bug.peak_allocated as f64 - predicted as f64).abs() / predicted as f64;
    assert!(
        err < 0.01,
        "peak {} vs floor + 2·S_iter {predicted}",
        bug.peak_allocated
    );
    assert!(bug.peak_allocated > 2 * no_grad.peak_allocated);
}
/// §3.1, §3.2, §9 pitfalls 6–7: no zero_grad → same memory as zeroing in
/// place; set_to_none lowers the peak by at most G.
#[test]
fn zero_grad_variants() {
    let missing = get("zero-grad-missing-bug");
    let none = get("zero-grad-fixed");
    let zeroed = get("zero-grad-keep-grads");
    for r in [missing, none, zeroed] {
        assert_flat(r);
        assert!(r.oom.is_none());
    }
    assert_eq!(missing.peak_allocated, zeroed.peak_allocated);
    assert_eq!(steady(missing), steady(zeroed));
    let g: u64 = 7_454_760; // mlp-mnist parameter (= gradient) bytes, §10.1
    let saved = zeroed.peak_allocated - none.peak_allocated;
    assert!(saved > 0 && saved <= g + 8 * 512, "peak difference {saved}");
}
/// §9 pitfall 12: a fixed-shape buffer allocated in the loop does not grow,
/// but old and new overlap once: one buffer more reserved.
#[test]
fn buffer_in_loop_costs_one_buffer_at_the_peak() {
    let bug = get("buffer-in-loop-bug");
    let fixed = get("buffer-preallocated-fixed");
    assert_flat(bug);
    assert_flat(fixed);
    assert_eq!(steady(bug), steady(fixed));
    assert_eq!(bug.peak_reserved - fixed.peak_reserved, 64 * MIB);
}
/// §9 pitfall 11 and the allocator settings.
#[test]
fn variable_batches_fragment_and_settings_differ() {
    let bug = get("var-batch-fragmentation-bug");
    let exp = get("var-batch-expandable-fixed");
    let split = get("var-batch-max-split");
    let gc = get("var-batch-gc-threshold");
    for r in [bug, exp, split, gc] {
        assert_flat(r);
        assert!(r.oom.is_none());
        assert_eq!(r.peak_allocated, bug.peak_allocated, "{}", r.scenario);
    }
    let reserved: Vec<u64> = bug.per_iteration.iter().map(|p| p.reserved).collect();
    assert!(reserved.windows(2).take(15).filter(|w| w[1] > w[0]).count() >= 10);
    assert!(bug.peak_reserved > 4 * bug.peak_allocated);
    assert!(exp.peak_reserved * 2 < bug.peak_reserved);
    assert!(exp.peak_reserved < bug.peak_allocated + 64 * MIB);
    assert!(gc.peak_reserved < bug.peak_reserved * 3 / 4);
    // max_split_size_mb does not help ever-growing shapes (as its narration says).
    assert!(split.peak_reserved * 20 >= bug.peak_reserved * 19);
}
/// §9 pitfalls 11 and 16: a fragmentation OOM with more than the request free
/// in the cache; empty_cache() frees only whole segments and does not help.
#[test]
fn fragmentation_oom_and_empty_cache() {
    let bug = get("fragmentation-oom-bug");
    let ec = get("fragmentation-oom-empty-cache");
    let fixed = get("fragmentation-oom-expandable-fixed");
    for r in [bug, ec] {
        let oom = r.oom.as_ref().expect("OOM");
        assert_eq!(oom.iteration, 1);
        assert_eq!(oom.requested, 32 * MIB);
        let cached_free = r.stats.reserved_bytes() - r.stats.allocated_bytes();
        assert!(
            cached_free > oom.requested,
            "{}: only {cached_free} B cached free",
            r.scenario
        );
        assert!(oom.message.contains("reserved by PyTorch but unallocated"));
        assert!(oom.message.contains("expandable_segments:True"));
    }
    assert_eq!(
        bug.stats.reserved_bytes(),
        ec.stats.reserved_bytes(),
        "the allocator frees fully free segments itself before raising"
    );
    assert_eq!(bug.stats.allocated_bytes(), ec.stats.allocated_bytes());
    assert!(fixed.oom.is_none());
    assert_eq!(fixed.iterations_run, 1);
}
/// §6.4, §7.3, §3.4: AMP and checkpointing lower the peak; gradient
/// accumulation keeps the micro-batch's peak.
#[test]
fn amp_checkpointing_and_accumulation_lower_the_peak() {
    let fp32 = get("amp-fp32");
    let fp16 = get("amp-fp16");
    let bf16 = get("amp-bf16");
    assert!(fp16.peak_allocated < fp32.peak_allocated * 4 / 5);
    let d = fp16.peak_allocated.abs_diff(bf16.peak_allocated);
    assert!(d < 8 * MIB, "fp16 and bf16 activations are the same size");

    let none = get("checkpoint-none");
    let every = get("checkpoint-every-layer");
    assert_eq!(none.peak_allocated, fp32.peak_allocated);
    assert!(every.peak_allocated < none.peak_allocated * 3 / 5);

    let big = get("grad-accum-big-batch-oom");
    let summed = get("grad-accum-sum-bug");
    let micro = get("grad-accum-fixed");
    assert_eq!(big.oom.as_ref().map(|o| o.iteration), Some(1));
    assert_eq!(summed.oom.as_ref().map(|o| o.iteration), Some(1));
    assert!(micro.oom.is_none());
    // Batch-8 peak plus the gradients kept between micro-batches (G ≈ 94 MB).
    assert!(micro.peak_allocated > fp32.peak_allocated);
    assert!(micro.peak_allocated < fp32.peak_allocated + 100_000_000);
    assert!(summed.peak_allocated > micro.peak_allocated * 3 / 2);
}
/// §5.1, §5.3, §9 pitfalls 14–15: AdamW's state OOMs at step 1; SGD and
/// offloaded AdamW fit with the same peak.
#[test]
fn adam_state_at_the_first_step() {
    let adam = get("adam-first-step-oom-bug");
    let sgd = get("adam-first-step-sgd");
    let off = get("optimizer-cpu-offload");
    let oom = adam.oom.as_ref().expect("OOM");
    assert_eq!(oom.iteration, 1);
    assert_eq!(adam.iterations_run, 0);
    // The first step was reached: narration of the optimizer step was said before the OOM.
    assert!(adam
        .narration
        .iter()
        .any(|(_, t)| t.starts_with("The first optimizer.step()")));
    assert!(sgd.oom.is_none() && off.oom.is_none());
    assert_eq!(sgd.peak_allocated, off.peak_allocated);
    assert!(sgd.peak_reserved < 1400 * MIB);
}
/// §10.2: GPT-2 small fits at batch 8 on 16 GiB and not at 16.
#[test]
fn gpt2_small_fits_and_ooms() {
    let fits = get("gpt2-small-fits");
    let oom = get("gpt2-small-oom");
    assert!(fits.oom.is_none());
    assert_eq!(fits.iterations_run, 3);
    let o = oom.oom.as_ref().expect("OOM");
    assert_eq!(o.iteration, 1);
    assert!(
        o.message
            .starts_with("CUDA out of memory. Tried to allocate 3.07 GiB. GPU 0 has a total capacity of 16.00 GiB"),
        "{}",
        o.message
    );
    assert!(o.message.contains("is reserved by PyTorch but unallocated"));
}
