//! `SparseMoe` and the Hugging Face layers in scenario files (issue 42):
//! a Mixtral-style model trains end to end with transformers' dispatch,
//! the report names its routing as assumed, and routing or top-k that
//! cannot be are refused by field before anything runs.

mod common;

use common::temp_dir;
use common::vramscope;

/// A two-layer Mixtral in miniature: GQA attention with rotary positions,
/// 4 experts of SwiGLU, top 2, transformers' dispatch, routing assumed.
const TINY_MIXTRAL: &str = r#"Scenario(
    name: "tiny-mixtral",
    description: "a tiny Mixtral",
    device: (name: "sim", gpu: "H100-SXM-80GB", capacity: "4GiB", overhead: "0B"),
    model: Modules(
        input: Tokens(seq: 64),
        net: Sequential([
            ("model", Sequential([
                ("embed_tokens", Embedding(num: 1000, dim: 128)),
                ("layers", Repeat(n: 2, block: Sequential([
                    ("", Residual(Sequential([
                        ("input_layernorm", RMSNorm(dim: 128)),
                        ("self_attn", HfAttention(hidden: 128, heads: 4, kv_heads: 2, head_dim: 32)),
                    ]))),
                    ("", Residual(Sequential([
                        ("post_attention_layernorm", RMSNorm(dim: 128)),
                        ("block_sparse_moe", SparseMoe(hidden: 128, intermediate: 256, experts: 4, top_k: 2,
                            expert: Mixtral, routing: Balanced, dispatch: Hf)),
                    ]))),
                ]))),
                ("norm", RMSNorm(dim: 128)),
                ("rotary_emb", RotaryEmbedding(head_dim: 32)),
            ])),
            ("lm_head", LmHead(hidden: 128, vocab: 1000, tied: false)),
        ]),
    ),
    criterion: CausalLm,
    data: (batch: 2, seq: 64),
    steps: [
        LoadBatch(x: "idx", y: "tgt"),
        Forward(input: "idx", output: "logits"),
        Loss(output: "logits", target: "tgt", into: "loss"),
        Backward(loss: "loss", retain_graph: false),
        OptimizerStep,
        ZeroGrad(set_to_none: true),
        Delete(name: "logits"),
        Delete(name: "loss"),
    ],
    iterations: 3,
    expect: [NoOom, AllocatedFlat],
)
"#;

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p.to_str().expect("utf-8").to_string()
}

#[test]
fn a_tiny_mixtral_trains_and_its_routing_is_named_as_assumed() {
    let dir = temp_dir("moe-lang");
    let file = write(&dir, "tiny-mixtral.ron", TINY_MIXTRAL);
    let (code, out, err) = vramscope(&["run", &file, "--headless"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains(
            "data-dependent, as the scenario states it: model.layers.N.block_sparse_moe (N = 0…1): routing assumed balanced, not measured"
        ),
        "{out}"
    );
    assert!(out.contains("iterations run: 3"), "{out}");
    // The parameters: the experts' w1, w2, w3 under transformers' names.
    let (code, out, err) = vramscope(&["model", &file, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let names: Vec<&str> = v["modules"]
        .as_array()
        .expect("modules")
        .iter()
        .filter_map(|m| m["module"].as_str())
        .collect();
    assert!(
        names.contains(&"model.layers.1.block_sparse_moe.experts.3.w3"),
        "{names:?}"
    );
    assert!(
        names.contains(&"model.layers.0.block_sparse_moe.gate"),
        "{names:?}"
    );
    // Per layer: attention 128·(128 + 2·64) + 128·128, the gate 128·4,
    // 4 experts of 3·128·256, two norms; embed, head, the final norm.
    let layer = 128 * (128 + 2 * 64) + 128 * 128 + 128 * 4 + 4 * 3 * 128 * 256 + 2 * 128;
    assert_eq!(v["parameters"], 2 * layer + 2 * 1000 * 128 + 128);
}

#[test]
fn routing_that_cannot_be_is_refused_by_field() {
    let dir = temp_dir("moe-lang-bad");
    // 2 × 64 rows, top 2: each list must route 256 rows.
    let short = TINY_MIXTRAL.replace("routing: Balanced", "routing: Counts([[64, 64, 64, 63]])");
    let file = write(&dir, "short.ron", &short);
    let (code, _, err) = vramscope(&["check", &file]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("routing") && err.contains("routes 255 rows; 128 rows × top_k 2 is 256"),
        "{err}"
    );
    let too_many = TINY_MIXTRAL.replace("routing: Balanced", "routing: Counts([[129, 127, 0, 0]])");
    let file = write(&dir, "too-many.ron", &too_many);
    let (code, _, err) = vramscope(&["check", &file]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("sends 129 rows to one expert"), "{err}");
    let top = TINY_MIXTRAL.replace("top_k: 2", "top_k: 5");
    let file = write(&dir, "top.ron", &top);
    let (code, _, err) = vramscope(&["check", &file]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("top_k (5) is more than experts (4)"), "{err}");
    // Counts that fit run, and are named as the scenario's, not assumed.
    let given = TINY_MIXTRAL.replace(
        "routing: Balanced",
        "routing: Counts([[128, 64, 64, 0], [32, 96, 100, 28]])",
    );
    let file = write(&dir, "given.ron", &given);
    let (code, out, err) = vramscope(&["run", &file, "--headless"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("routing as the counts per expert the scenario gives (2 forwards"),
        "{out}"
    );
    assert!(!out.contains("assumed balanced"), "{out}");
}

/// What one forward of a `SparseMoe` keeps for backward, from PyTorch's
/// rules (ops/moe.rs): softmax's result `[T, E]`, topk's int64 indices
/// `[T, k]`, div's `other` (the sum `[T, 1]`) and `self` (topk's values
/// `[T, k]`); per expert with `c` rows: nonzero's `[c, 2]` int64 (kept by
/// index_select, index and index_add), the gathered rows `[c, H]` (up's
/// input), up's output `[c, I]` (gelu's input), gelu's output (down's
/// input), down's output `[c, H]` and the gathered weights `[c]` (mul's
/// operands), the weighted output `[c, H]` (index_add's `source`). The
/// module's own output and the router's logits are not kept.
#[test]
fn a_sparse_moe_keeps_what_pytorch_s_rules_say() {
    let (t, h, i, e, k) = (64u64, 32u64, 48u64, 4u64, 2u64);
    let text = format!(
        r#"Scenario(
    name: "moe-rules",
    description: "one SparseMoe",
    device: (name: "sim", capacity: "1GiB", overhead: "0B"),
    model: Modules(
        input: Tokens(seq: {t}),
        net: Sequential([
            ("embed", Embedding(num: 100, dim: {h})),
            ("moe", SparseMoe(hidden: {h}, intermediate: {i}, experts: {e}, top_k: {k},
                expert: Gelu, routing: Balanced, dispatch: Loop)),
        ]),
    ),
    steps: [LoadBatch(x: "x", y: "y"), Forward(input: "x", output: "out")],
    iterations: 1,
)
"#
    );
    let dir = temp_dir("moe-rules");
    let file = write(&dir, "moe-rules.ron", &text);
    let (code, out, err) = vramscope(&["model", &file, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let saved: u64 = v["modules"]
        .as_array()
        .expect("modules")
        .iter()
        .filter(|m| m["module"].as_str().is_some_and(|p| p.starts_with("moe")))
        .filter_map(|m| m["saved_bytes_per_sample"].as_u64())
        .sum();
    let routed = t * k; // every row to k experts: Σ c = T·k
    let router = t * e * 4 + t * k * 8 + t * 4 + t * k * 4;
    let per_row = 16 + 4 * h + 4 * i + 4 * i + 4 * h + 4 + 4 * h;
    assert_eq!(saved, router + routed * per_row);
}
