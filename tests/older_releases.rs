//! A Llama-style scenario under an older release (issue 42): `torch: "2.1"`
//! and `transformers: "4.40"` against today's default. Expected bytes come
//! from the rules the engine cites, written out here: PyTorch 2.0–2.1's
//! MeanBackward keeps its input (pytorch/pytorch #109876, fixed in 2.2 by
//! PR #109935), transformers before GQA-aware SDPA copies k and v to every
//! head (`repeat_kv`, models.md §4.2), and flash attention keeps its philox
//! state on the CPU before 2.7 (PR #146372).

use vramscope::scenario::{load_str, run, LoadError, RunOptions, RunResult};

/// A two-layer Llama in the module language, bf16 weights (models.md
/// regime P), H 256, 8 query / 2 key-value heads of 32, I 512, V 1,000,
/// T 256, batch 1, on a simulated sm80 device (flash attention first).
fn llama(extra: &str, steps: &str) -> String {
    format!(
        r#"Scenario(
    name: "llama-release",
    description: "a small Llama under a named release",
    device: (name: "sim", capacity: "8GiB", overhead: "0MiB"),
    {extra}
    model: Modules(
        input: Tokens(seq: 256),
        net: Sequential([
            ("embed_tokens", Embedding(num: 1000, dim: 256)),
            ("rotary_emb", RotaryEmbedding(head_dim: 32)),
            ("layers", Repeat(n: 2, block: DecoderLayer(hidden: 256, intermediate: 512, heads: 8, kv_heads: 2, head_dim: None, qkv_bias: false))),
            ("norm", RMSNorm(dim: 256)),
            ("lm_head", LmHead(hidden: 256, vocab: 1000, tied: false)),
        ]),
    ),
    model_dtype: BF16,
    criterion: CausalLm,
    data: (batch: 1),
    steps: [{steps}],
    iterations: 2,
)"#
    )
}

const FORWARD: &str = r#"LoadBatch(x: "x", y: "y"), Forward(input: "x", output: "out"), Delete(name: "out"), Delete(name: "x"), Delete(name: "y")"#;
const KEEP_GRAPH: &str = r#"LoadBatch(x: "x", y: "y"), Forward(input: "x", output: "out")"#;
const TRAIN: &str = r#"ZeroGrad(set_to_none: true), LoadBatch(x: "x", y: "y"), Forward(input: "x", output: "out"), Loss(output: "out", target: "y", into: "loss"), Delete(name: "out"), Backward(loss: "loss", retain_graph: false), OptimizerStep"#;

fn ran(text: &str) -> RunResult {
    let (scenario, built) = load_str(text, "llama.ron").expect("loads");
    let r = run(&scenario, &built, &RunOptions::default());
    assert!(
        r.error.is_none() && r.oom.is_none(),
        "{:?} {:?}",
        r.error,
        r.oom
    );
    assert_eq!(r.iterations_run, 2);
    r
}

fn end_allocated(r: &RunResult) -> u64 {
    r.per_iteration.last().expect("an iteration").allocated
}

const OLD: &str = r#"torch: "2.1", transformers: "4.40","#;

#[test]
fn a_forward_under_torch_2_1_and_transformers_4_40_keeps_what_the_rules_say() {
    let (l, n, h, heads, g, d) = (2u64, 256u64, 256u64, 8u64, 2u64, 32u64);
    let today = end_allocated(&ran(&llama("", KEEP_GRAPH)));
    let old = end_allocated(&ran(&llama(OLD, KEEP_GRAPH)));
    // Each RMSNorm (two per layer and the final one) keeps its fp32 square,
    // P [N, H], for the mean's backward.
    let squares = (2 * l + 1) * n * h * 4;
    // SDPA keeps bf16 k and v of every head (the copies) where today it
    // keeps them with g heads.
    let full_heads = l * 2 * n * (heads - g) * d * 2;
    // Today's flash keeps `rng_state` and `unused` on the GPU: one 512 B
    // block each, per layer.
    let rng = l * 2 * 512;
    assert_eq!(old + rng, today + squares + full_heads);
}

#[test]
fn after_a_training_step_nothing_of_the_older_graph_is_left() {
    // Backward frees every saved tensor, the kept squares and copies too:
    // the iteration ends hold the same weights, grads and AdamW state.
    let today = ran(&llama("", TRAIN));
    let old = ran(&llama(OLD, TRAIN));
    assert_eq!(end_allocated(&old), end_allocated(&today));
    // A forward alone (its output dropped) leaves nothing either.
    let plain = ran(&llama("", FORWARD));
    let older = ran(&llama(OLD, FORWARD));
    assert_eq!(end_allocated(&older), end_allocated(&plain));
    // The peak is the older run's: it kept more through the forward.
    assert!(old.peak_allocated > today.peak_allocated);
}

#[test]
fn the_report_names_the_transformers_release() {
    let text = llama(OLD, FORWARD);
    let (scenario, built) = load_str(&text, "llama.ron").expect("loads");
    let r = run(&scenario, &built, &RunOptions::default());
    assert_eq!(r.conditions.torch, "2.1");
    assert_eq!(r.conditions.transformers.as_deref(), Some("4.40"));
    let report = vramscope::report::run::text(&scenario, &r, &[]);
    assert!(
        report.contains("PyTorch 2.1 rules, transformers 4.40's attention;"),
        "{report}"
    );
    let json = vramscope::report::run::json(&r, &[]);
    assert_eq!(json["conditions"]["transformers"], "4.40");
    // A 5.x release decides more than the attention, and says so.
    let v5 = llama(r#"transformers: "5.16.1","#, FORWARD);
    let (scenario, built) = load_str(&v5, "llama.ron").expect("loads");
    let r = run(&scenario, &built, &RunOptions::default());
    let report = vramscope::report::run::text(&scenario, &r, &[]);
    assert!(
        report.contains(
            "transformers 5.16.1's attention, from_pretrained's 4-bit loading and model forward;"
        ),
        "{report}"
    );
    // Without the field nothing is said, and the JSON has no key for it.
    let today = ran(&llama("", FORWARD));
    assert_eq!(today.conditions.transformers, None);
    let json = vramscope::report::run::json(&today, &[]);
    assert!(json["conditions"].get("transformers").is_none(), "{json}");
}

#[test]
fn a_release_that_is_not_modelled_is_refused_at_its_field() {
    for (extra, word) in [
        (r#"transformers: "4.30","#, "4.36"),
        (r#"transformers: "four","#, "MAJOR.MINOR"),
        (r#"transformers: "5.17","#, "5.16"),
        (r#"torch: "1.13","#, "2.0 to 2.15"),
    ] {
        let text = llama(extra, FORWARD);
        match load_str(&text, "llama.ron") {
            Err(LoadError::At { line, message, .. }) => {
                assert!(message.contains(word), "{message}");
                let field = extra.split(':').next().expect("a field");
                assert!(
                    text.lines()
                        .nth(line - 1)
                        .is_some_and(|l| l.contains(field)),
                    "line {line} for {extra}"
                );
            }
            other => panic!("{extra}: {other:?}"),
        }
    }
}

#[test]
fn settings_a_release_does_not_have_are_refused_at_their_field() {
    for (extra, field, word) in [
        (
            r#"torch: "2.3", engine: (hf_rmsnorm: TorchFused),"#,
            "hf_rmsnorm",
            "2.4",
        ),
        (
            r#"torch: "2.2", engine: (sdpa_backend: Cudnn),"#,
            "sdpa_backend",
            "2.3",
        ),
    ] {
        let text = llama(extra, FORWARD);
        match load_str(&text, "llama.ron") {
            Err(LoadError::At {
                line,
                column,
                message,
                ..
            }) => {
                assert!(message.contains(word), "{message}");
                let at = text.lines().nth(line - 1).expect("the line");
                assert!(at[column - 1..].starts_with(field), "{at} col {column}");
            }
            other => panic!("{extra}: {other:?}"),
        }
    }
    // The releases that have them take them.
    for extra in [
        r#"torch: "2.4", engine: (hf_rmsnorm: TorchComposite),"#,
        r#"torch: "2.3", engine: (sdpa_backend: Cudnn),"#,
    ] {
        load_str(&llama(extra, FORWARD), "llama.ron").expect(extra);
    }
}

/// One grouped-query `Attention` with the memory-efficient kernel forced.
fn efficient_gqa(extra: &str) -> String {
    format!(
        r#"Scenario(
    name: "efficient-gqa",
    description: "memory-efficient SDPA forced on grouped heads",
    device: (name: "sim", capacity: "8GiB", overhead: "0MiB"),
    {extra}
    model: Modules(
        input: Tokens(seq: 256),
        net: Sequential([
            ("embed_tokens", Embedding(num: 1000, dim: 256)),
            ("rotary_emb", RotaryEmbedding(head_dim: 32)),
            ("attn", Attention(hidden: 256, heads: 8, kv_heads: Some(2), head_dim: None, causal: true, rotary: true, bias: false, dropout: 0.0, sdpa: Some(Efficient))),
            ("lm_head", LmHead(hidden: 256, vocab: 1000, tied: false)),
        ]),
    ),
    model_dtype: BF16,
    criterion: CausalLm,
    data: (batch: 1),
    steps: [{TRAIN}],
    iterations: 2,
)"#
    )
}

#[test]
fn efficient_on_grouped_heads_is_refused_only_where_sdpa_would_get_them_grouped() {
    // Today's transformers hands k and v to SDPA with their 2 heads
    // (`enable_gqa`), which PyTorch's memory-efficient kernel does not take.
    let text = efficient_gqa("");
    let (line, message) = match load_str(&text, "gqa.ron") {
        Err(LoadError::At { line, message, .. }) => (line, message),
        other => panic!("refused at a position, not {:?}", other.map(|_| ())),
    };
    assert!(message.contains("kv_heads 2 < heads 8"), "{message}");
    let attn_line = 1 + text
        .lines()
        .position(|l| l.contains("(\"attn\""))
        .expect("attn");
    assert_eq!(line, attn_line, "{message}");
    // Before GQA-aware SDPA (transformers 4.40, or torch 2.4 with no
    // `enable_gqa`), `repeat_kv` copies them to all 8 heads first: the
    // kernel runs, as it did on those releases.
    for extra in [r#"transformers: "4.40","#, r#"torch: "2.4","#] {
        let r = ran(&efficient_gqa(extra));
        assert!(r.peak_allocated > 0, "{extra}");
    }
}
