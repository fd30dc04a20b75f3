//! The built-in scenarios, compiled into the binary so `vramscope` works from
//! any directory.

/// One built-in scenario file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuiltIn {
    pub name: &'static str,
    pub source: &'static str,
}

macro_rules! builtins {
    ($($name:literal),* $(,)?) => {
        &[$(BuiltIn { name: $name, source: include_str!(concat!("../../scenarios/", $name, ".ron")) }),*]
    };
}

/// Every built-in, in the order `vramscope scenarios` lists them; the first is the guided tour.
static BUILTINS: &[BuiltIn] = builtins![
    "tour",
    "accumulate-loss-train-bug",
    "accumulate-loss-train-fixed",
    "loss-list-train-bug",
    "accumulate-loss-eval-bug",
    "accumulate-loss-eval-fixed",
    "rnn-hidden-bug",
    "rnn-hidden-retain-graph-bug",
    "rnn-hidden-fixed",
    "rnn-hidden-eval-bug",
    "rnn-hidden-every-other-bug",
    "rnn-hidden-every-batch-fixed",
    "eval-no-grad-bug",
    "eval-no-grad-fixed",
    "eval-inference-mode-fixed",
    "store-outputs-bug",
    "store-outputs-detach-bug",
    "store-outputs-fixed",
    "metric-state-epoch-bug",
    "metric-state-epoch-fixed",
    "bounded-deque-graphs-bug",
    "bounded-deque-item-fixed",
    "val-outputs-inner-loop-bug",
    "val-outputs-cpu-fixed",
    "forward-hook-activations-bug",
    "forward-hook-removed-fixed",
    "backward-hook-grads-bug",
    "backward-hook-removed-fixed",
    "adversarial-input-graph-bug",
    "adversarial-input-detach-fixed",
    "pgd-autograd-grad-bug",
    "pgd-autograd-grad-fixed",
    "ema-update-grad-bug",
    "ema-update-no-grad-fixed",
    "input-grad-create-graph-bug",
    "input-grad-create-graph-detach-fixed",
    "teacher-forward-grad-bug",
    "teacher-forward-no-grad-fixed",
    "model-recreated-stale-optimizer-bug",
    "model-recreated-with-optimizer-fixed",
    "gan-retain-graph-log-bug",
    "gan-detach-item-fixed",
    "wgan-gp-grad-maps-bug",
    "wgan-gp-grad-maps-cpu-fixed",
    "hvp-grad-history-bug",
    "hvp-grad-history-cpu-fixed",
    "zero-grad-missing-bug",
    "zero-grad-fixed",
    "zero-grad-keep-grads",
    "buffer-in-loop-bug",
    "buffer-preallocated-fixed",
    "var-batch-fragmentation-bug",
    "var-batch-expandable-fixed",
    "var-batch-max-split",
    "var-batch-gc-threshold",
    "fragmentation-oom-bug",
    "fragmentation-oom-empty-cache",
    "fragmentation-oom-expandable-fixed",
    "fragmentation-experiment",
    "fragmentation-experiment-oom",
    "loop-schedule-metrics",
    "amp-fp32",
    "amp-fp16",
    "amp-fp16-overflow",
    "autocast-around-loop-bug",
    "finetune-frozen-layers",
    "amp-bf16",
    "amp-half-model-bug",
    "bf16-model",
    "amp-bce-bug",
    "amp-bce-with-logits-fixed",
    "checkpoint-none",
    "checkpoint-every-layer",
    "checkpoint-sqrt-segments",
    "attention-math-fallback",
    "checkpoint-reentrant-frozen-bug",
    "checkpoint-reentrant-frozen-fixed",
    "grad-accum-big-batch-oom",
    "grad-accum-sum-bug",
    "grad-accum-fixed",
    "adam-first-step-oom-bug",
    "adam-first-step-sgd",
    "optimizer-cpu-offload",
    "gpt2-small-fits",
    "gpt2-small-oom",
    "resnet50-batch-sweep",
    "deep-mlp-no-checkpoint",
    "deep-mlp-checkpoint",
    "deep-mlp-checkpoint-segments",
    "llama-lora-finetune",
    "qlora-finetune",
    "handwritten-transformer",
    "moe-small",
    "peak-inside-step",
    "cuda-context",
    "batch-moves-peak-small",
    "batch-moves-peak-large",
    "amp-raises-peak",
    "amp-raises-peak-fp32",
    "inplace-ops",
    "inplace-ops-out-of-place",
    "inplace-ops-error",
    "reference-cycle-bug",
    "reference-cycle-gc",
];

pub fn builtins() -> &'static [BuiltIn] {
    BUILTINS
}

pub fn builtin(name: &str) -> Option<&'static BuiltIn> {
    let name = name.strip_suffix(".ron").unwrap_or(name);
    BUILTINS.iter().find(|b| b.name == name)
}
