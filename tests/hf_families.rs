//! Issue 42's `config.json` families — the mixtures of experts `mixtral`,
//! `qwen2_moe`, `qwen3_moe` and the dense `qwen3`, `phi3`, `gemma2`,
//! `gemma3_text` — build with the parameter counts of the published
//! checkpoints, with transformers' module names, and `vramscope model`
//! shows them with what they assume and leave out.

use std::path::PathBuf;
use std::process::Command;

use vramscope::engine::hf_config::read_with_notes;
use vramscope::engine::model_lang::count;
use vramscope::engine::ModelKind;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
        .join("config.json")
}

fn parameters(name: &str) -> u64 {
    let (m, _) = read_with_notes(&fixture(name)).unwrap_or_else(|e| panic!("{e}"));
    match &m.kind {
        ModelKind::Modules(lm) => count(&lm.net).parameters,
        _ => panic!("{name} is written in the module language"),
    }
}

/// Each reference is the checkpoint's own: the `total_size` of its
/// `model.safetensors.index.json` (or its one `model.safetensors` file's
/// tensor bytes) over the bytes per parameter of its `torch_dtype`, which
/// is the figure the model card rounds ("46.7B", "14.3B", "30.5B total",
/// "0.6B", "3.8B", "2.61B", "1B"). The formula beside each is the same
/// sum from the config's shapes, so a wrong rule fails here, not a typo.
#[test]
fn each_family_has_the_published_parameter_count() {
    // mistralai/Mixtral-8x7B-v0.1: 93,405,585,408 B of bf16. Per layer:
    // attention 2·4096² + 2·4096·1024, 8 experts × 3·4096·14336, the gate
    // 4096·8, two norms; embed and lm_head 32000·4096 each, the final norm.
    let mixtral = 32
        * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 8 * 3 * 4096 * 14336 + 4096 * 8 + 2 * 4096)
        + 2 * 32000 * 4096
        + 4096;
    assert_eq!(mixtral, 46_702_792_704);
    assert_eq!(parameters("mixtral-8x7b"), mixtral);
    // Qwen/Qwen1.5-MoE-A2.7B: 28,631,568,384 B of bf16. Attention with
    // q/k/v biases, 60 experts of 3·2048·1408, the shared expert 3·2048·5632
    // and its gate Linear(2048, 1), the router 2048·60, two norms.
    let qwen2_moe = 24
        * (4 * 2048 * 2048
            + 3 * 2048
            + 60 * 3 * 2048 * 1408
            + 3 * 2048 * 5632
            + 2048
            + 2048 * 60
            + 2 * 2048)
        + 2 * 151_936 * 2048
        + 2048;
    assert_eq!(qwen2_moe, 14_315_784_192);
    assert_eq!(parameters("qwen1.5-moe-a2.7b"), qwen2_moe);
    // Qwen/Qwen3-30B-A3B: 61,064,245,248 B of bf16. q 32·128, kv 4·128,
    // q_norm and k_norm of 128, 128 experts of 3·2048·768, the router.
    let qwen3_moe = 48
        * (2048 * 4096 * 2
            + 2 * 2048 * 512
            + 2 * 128
            + 128 * 3 * 2048 * 768
            + 2048 * 128
            + 2 * 2048)
        + 2 * 151_936 * 2048
        + 2048;
    assert_eq!(qwen3_moe, 30_532_122_624);
    assert_eq!(parameters("qwen3-30b-a3b"), qwen3_moe);
    // Qwen/Qwen3-0.6B: tied; the card's 0.44B non-embedding parameters
    // are these less 151936·1024.
    let qwen3 = 28 * (1024 * 2048 * 2 + 2 * 1024 * 1024 + 2 * 128 + 3 * 1024 * 3072 + 2 * 1024)
        + 151_936 * 1024
        + 1024;
    assert_eq!(qwen3, 596_049_920);
    assert_eq!(parameters("qwen3-0.6b"), qwen3);
    // microsoft/Phi-3-mini-4k-instruct: 7,642,159,104 B of bf16; qkv_proj
    // 3072 → 3·3072 and gate_up_proj 3072 → 2·8192 hold what separate
    // projections would.
    let phi3 = 32 * (3072 * 9216 + 3072 * 3072 + 3072 * 16384 + 8192 * 3072 + 2 * 3072)
        + 2 * 32064 * 3072
        + 3072;
    assert_eq!(phi3, 3_821_079_552);
    assert_eq!(parameters("phi-3-mini-4k"), phi3);
    // google/gemma-2-2b: 10,457,367,552 B of fp32; tied, head_dim 256,
    // four norms per layer.
    let gemma2 = 26 * (2304 * 2048 * 2 + 2 * 2304 * 1024 + 3 * 2304 * 9216 + 4 * 2304)
        + 256_000 * 2304
        + 2304;
    assert_eq!(gemma2, 2_614_341_888);
    assert_eq!(parameters("gemma-2-2b"), gemma2);
    // google/gemma-3-1b-pt: 1,999,771,904 B of bf16; q_norm, k_norm.
    let gemma3 = 26 * (1152 * 1024 * 2 + 2 * 1152 * 256 + 2 * 256 + 3 * 1152 * 6912 + 4 * 1152)
        + 262_144 * 1152
        + 1152;
    assert_eq!(gemma3, 999_885_952);
    assert_eq!(parameters("gemma-3-1b"), gemma3);
}

fn model_json(name: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["model", fixture(name).to_str().expect("utf-8"), "--json"])
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

fn module_names(v: &serde_json::Value) -> Vec<String> {
    v["modules"]
        .as_array()
        .expect("modules")
        .iter()
        .filter_map(|m| m["module"].as_str().map(str::to_string))
        .collect()
}

/// transformers' module names, shown by `vramscope model FILE`.
#[test]
fn the_model_view_names_each_family_s_own_modules() {
    let phi3 = module_names(&model_json("phi-3-mini-4k"));
    for name in [
        "model.layers.0.self_attn.qkv_proj",
        "model.layers.0.mlp.gate_up_proj",
        "model.layers.31.mlp.down_proj",
    ] {
        assert!(phi3.iter().any(|m| m == name), "phi3 lacks {name}");
    }
    assert!(!phi3.iter().any(|m| m.ends_with("q_proj")));
    let qwen3 = module_names(&model_json("qwen3-0.6b"));
    for name in [
        "model.layers.0.self_attn.q_norm",
        "model.layers.0.self_attn.k_norm",
    ] {
        assert!(qwen3.iter().any(|m| m == name), "qwen3 lacks {name}");
    }
    let gemma = module_names(&model_json("gemma-2-2b"));
    for name in [
        "model.layers.0.pre_feedforward_layernorm",
        "model.layers.0.post_feedforward_layernorm",
    ] {
        assert!(gemma.iter().any(|m| m == name), "gemma2 lacks {name}");
    }
}

/// A mixture of experts' routing is the data's: from a config.json it is
/// the `Balanced` assumption, and the view says so; what a family does
/// that is not modelled is said too.
#[test]
fn the_model_view_says_what_is_assumed_and_what_is_left_out() {
    let v = model_json("qwen1.5-moe-a2.7b");
    let notes: Vec<&str> = v["notes"]
        .as_array()
        .expect("notes")
        .iter()
        .filter_map(|n| n.as_str())
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("routing assumed balanced, not measured")),
        "{notes:?}"
    );
    let names = module_names(&v);
    assert!(names
        .iter()
        .any(|m| m == "model.layers.23.mlp.shared_expert_gate"));
    assert!(names
        .iter()
        .any(|m| m == "model.layers.0.mlp.experts.59.up_proj"));
    let g = model_json("gemma-2-2b");
    assert!(
        g["notes"]
            .as_array()
            .expect("notes")
            .iter()
            .any(|n| n.as_str().is_some_and(|n| n.contains("soft-capping"))),
        "{g}"
    );
    // A dense family with nothing data-dependent claims no routing.
    let q = model_json("qwen3-0.6b");
    assert!(!q["notes"].to_string().contains("routing"));
}

/// The `unused_sliding_mask` of a config's rotary module, and its notes.
fn sliding_mask_of(text: &str) -> (Option<u64>, Vec<String>) {
    use vramscope::engine::model_lang::Module;
    fn find(m: &Module) -> Option<Option<u64>> {
        match m {
            Module::RotaryEmbedding {
                unused_sliding_mask,
                ..
            } => Some(*unused_sliding_mask),
            Module::Sequential(children) => children.iter().find_map(|(_, c)| find(c)),
            Module::Registered { module, .. } => find(module),
            Module::HfModel(inner) => find(inner),
            _ => None,
        }
    }
    let (m, notes) =
        vramscope::engine::hf_config::parse_with_notes(text, "c.json").expect("parses");
    let ModelKind::Modules(lm) = &m.kind else {
        panic!("written in the module language")
    };
    (find(&lm.net).expect("a RotaryEmbedding"), notes)
}

/// Qwen2-MoE's forward builds a sliding-window mask whatever its layers
/// (transformers 5.16.1 modeling_qwen2_moe.py:493-496), of window 0 without
/// `use_sliding_window` (configuration_qwen2_moe.py:111): the model says so
/// and it is no longer a note; with `use_sliding_window` the sliding layers
/// are a note.
#[test]
fn qwen2_moe_builds_its_unused_sliding_mask_of_window_0() {
    let text = std::fs::read_to_string(fixture("qwen1.5-moe-a2.7b")).expect("fixture");
    let (mask, notes) = sliding_mask_of(&text);
    assert_eq!(mask, Some(0));
    assert!(!notes.iter().any(|n| n.contains("sliding")), "{notes:?}");
    let sliding = text.replace(
        "\"use_sliding_window\": false",
        "\"use_sliding_window\": true",
    );
    assert_ne!(sliding, text);
    let (mask, notes) = sliding_mask_of(&sliding);
    assert_eq!(mask, None);
    assert!(
        notes.iter().any(|n| n.contains("use_sliding_window")),
        "{notes:?}"
    );
    // Other families' forwards build no unused mask.
    let mixtral = std::fs::read_to_string(fixture("mixtral-8x7b")).expect("fixture");
    assert_eq!(sliding_mask_of(&mixtral).0, None);
}

/// A family the reader refuses says which field and why.
#[test]
fn mixed_dense_and_sparse_layers_are_refused_by_field() {
    let text = std::fs::read_to_string(fixture("qwen3-30b-a3b")).expect("fixture");
    let mixed = text.replace("\"mlp_only_layers\": []", "\"mlp_only_layers\": [0, 1]");
    assert_ne!(mixed, text);
    let e = vramscope::engine::hf_config::parse(&mixed, "q.json").map(|_| ());
    let e = e.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.starts_with("q.json: field `mlp_only_layers`"), "{e}");
    let many = text.replace("\"num_experts_per_tok\": 8", "\"num_experts_per_tok\": 200");
    let e = vramscope::engine::hf_config::parse(&many, "q.json").map(|_| ());
    let e = e.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("num_experts_per_tok"), "{e}");
}
