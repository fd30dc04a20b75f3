//! TEMPORARY: each new capture against its scenario, first failure only.
use crate::harness::{check, EXACT};

const PAIRS: [(&str, &str); 25] = [
    ("tests/fixtures/pytorch/default-workspaces.ron", "default_workspaces"),
    ("tests/fixtures/pytorch/sdpa-default-fp32.ron", "sdpa_default_fp32"),
    ("tests/fixtures/pytorch/sdpa-default-fp16.ron", "sdpa_default_fp16"),
    ("tests/fixtures/pytorch/resnet18-train.ron", "resnet18_train"),
    ("tests/fixtures/pytorch/adamw-forloop.ron", "adamw_forloop"),
    ("tests/fixtures/pytorch/adamw-fused.ron", "adamw_fused"),
    ("tests/fixtures/pytorch/clip-grad-norm.ron", "clip_grad_norm"),
    ("tests/fixtures/pytorch/lstm-medium.ron", "lstm_medium"),
    ("tests/fixtures/pytorch/gpt-dropout.ron", "gpt_dropout"),
    ("tests/fixtures/pytorch/resnet50-sum.ron", "resnet50_sum"),
    ("tests/fixtures/pytorch/deep-mlp-checkpoint-train.ron", "deep_mlp_checkpoint_train"),
    ("fragmentation-experiment", "fragmentation_experiment"),
    ("fragmentation-experiment-oom", "fragmentation_experiment_oom"),
    ("peak-inside-step", "peak_inside_step"),
    ("cuda-context", "cuda_context"),
    ("batch-moves-peak-small", "batch_moves_peak_small"),
    ("batch-moves-peak-large", "batch_moves_peak_large"),
    ("amp-raises-peak", "amp_raises_peak"),
    ("amp-raises-peak-fp32", "amp_raises_peak_fp32"),
    ("inplace-ops", "inplace_ops"),
    ("inplace-ops-out-of-place", "inplace_ops_out_of_place"),
    ("inplace-ops-error", "inplace_ops_error"),
    ("reference-cycle-gc", "reference_cycle_gc"),
    ("reference-cycle-bug", "reference_cycle_bug"),
    ("loop-schedule-metrics", "loop_schedule_metrics"),
];

#[test]
fn survey() {
    let filter = std::env::var("SURVEY").unwrap_or_default();
    for (scenario, stem) in PAIRS {
        if !filter.is_empty() && !stem.contains(&filter) {
            continue;
        }
        println!("\n######## {stem}");
        let r = std::panic::catch_unwind(|| check(scenario, stem, EXACT));
        match r {
            Ok(_) => println!("######## {stem}: EXACT MATCH"),
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                println!("######## {stem}: FAIL: {}", msg.lines().take(6).collect::<Vec<_>>().join(" | "));
            }
        }
    }
}
