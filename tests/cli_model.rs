//! `vramscope model` and a scenario written in the module language, run as
//! a script runs them. Expected figures come from the constructors'
//! parameter formulas and models.md's tables, not from the program.

mod common;

use common::{json, temp_dir, vramscope};

/// A small language model in the module language: token ids → embedding →
/// a residual MLP block → an untied head, trained with cross-entropy.
const LM: &str = r#"Scenario(
    name: "tiny-lm",
    description: "a language model written as modules",
    device: (name: "sim", capacity: "1GiB"),
    model: Modules(
        input: Tokens(seq: 64),
        net: Sequential([
            ("emb", Embedding(num: 1000, dim: 64)),
            ("block", Residual(Sequential([
                ("ln", LayerNorm(dim: 64)),
                ("fc1", Linear(in: 64, out: 256)),
                ("act", GELU),
                ("fc2", Linear(in: 256, out: 64)),
            ]))),
            ("head", Linear(in: 64, out: 1000, bias: false)),
        ]),
        freeze: ["emb"],
    ),
    data: (batch: 4),
    steps: [
        ZeroGrad(set_to_none: true),
        LoadBatch(x: "x", y: "y"),
        Forward(input: "x", output: "out"),
        Loss(output: "out", target: "y", into: "loss"),
        Backward(loss: "loss", retain_graph: false),
        OptimizerStep,
    ],
    iterations: 3,
    expect: [AllocatedFlat, NoOom],
)
"#;

/// nn.Embedding(1000, 64), nn.LayerNorm(64), nn.Linear(64, 256),
/// nn.Linear(256, 64), nn.Linear(64, 1000, bias=False).
const LM_EMB: u64 = 1000 * 64;
const LM_PARAMS: u64 = LM_EMB + 2 * 64 + (64 * 256 + 256) + (256 * 64 + 64) + 64 * 1000;

/// The scenario `text` written to a scratch file: the scratch directory
/// (removed when dropped) and the file's path.
fn lm_file(tag: &str, text: &str) -> (common::Scratch, String) {
    let dir = temp_dir(tag);
    let path = dir.join("tiny-lm.ron");
    std::fs::write(&path, text).expect("write");
    let path = path.to_str().expect("utf-8").to_string();
    (dir, path)
}

#[test]
fn list_names_every_preset_and_how_it_is_checked() {
    let (code, out, err) = vramscope(&["model", "--list"]);
    assert_eq!(code, 0, "{err}");
    let rows: Vec<&str> = out.lines().take_while(|l| !l.is_empty()).collect();
    let names: Vec<&str> = rows
        .iter()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        names,
        [
            "mlp-mnist",
            "gpt2-small",
            "gpt-tiny",
            "lstm-lm-ptb",
            "lstm-lm-medium",
            "resnet18",
            "resnet50",
            "deep-mlp",
            "tinyllama-1.1b",
            "llama-3.2-1b",
            "llama-3-8b",
            "mistral-7b",
            "qwen2.5-0.5b",
            "qwen2.5-0.5b-lora",
            "qwen2.5-0.5b-qlora",
            "llama-3-8b-qlora",
            "bert-base"
        ]
    );
    let row = |n: &str| rows.iter().find(|l| l.starts_with(n)).expect(n).to_string();
    assert!(row("mlp-mnist").contains("verified on hardware"));
    // GPT-2's capture program forced SDPA's kernel; its scenario states it.
    assert!(row("gpt2-small").contains("verified, with conditions"));
    // ResNet-50 matches its captures with cuDNN's measured workspaces only.
    assert!(row("resnet50").contains("verified, with conditions"));
    assert!(row("deep-mlp").contains("verified on hardware"));
    assert!(row("llama-3-8b").contains("from source only"));
    // The evidence column starts at the same place on every row.
    let column: Vec<Option<usize>> = rows
        .iter()
        .map(|l| {
            l.find("verified on hardware")
                .or_else(|| l.find("verified, with conditions"))
                .or_else(|| l.find("from source only"))
        })
        .collect();
    assert!(
        column.iter().all(|c| c.is_some() && *c == column[0]),
        "{out}"
    );
}

#[test]
fn gpt2_small_and_resnet50_parameter_counts() {
    let (code, out, err) = vramscope(&["model", "gpt2-small", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    // engine.md §10.2: 12 (12d² + 13d) + V·d + 1024·d + 2d at d = 768.
    assert_eq!(v["parameters"], 124_439_808u64);
    assert_eq!(v["trainable_parameters"], 124_439_808u64);
    assert!(v["evidence"]
        .as_str()
        .is_some_and(|e| e.starts_with("verified on hardware")));
    assert!(v["evidence"]
        .as_str()
        .is_some_and(|e| e.contains("memory-efficient kernel forced")));

    let (code, out, err) = vramscope(&["model", "resnet50", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["parameters"], 25_557_032u64);
    // 53 BatchNorm2d layers, three buffers each.
    assert_eq!(v["buffers"], 159u64);
    // models.md §7.5: 85,909,504 B per image, plus each BN's save_mean and
    // save_invstd (2 × 26,560 channels × 4 B) that the table leaves out.
    assert_eq!(v["saved_bytes_per_sample"], 85_909_504u64 + 212_480);
    assert_eq!(v["sample_input"], serde_json::json!([1, 3, 224, 224]));
    let rows = v["modules"].as_array().expect("modules");
    let conv = rows
        .iter()
        .find(|r| r["module"] == "layer1.0.conv1")
        .expect("layer1.0.conv1");
    // Conv2d(64, 64, 1) without bias; its output [64, 56, 56] fp32 is saved by bn1.
    assert_eq!(conv["parameters"], 64 * 64u64);
    assert_eq!(conv["saved_bytes_per_sample"], 64 * 56 * 56 * 4u64);
    let input = rows
        .iter()
        .find(|r| r["module"] == "(input)")
        .expect("(input)");
    assert_eq!(input["saved_bytes_per_sample"], 3 * 224 * 224 * 4u64);
    let evidence = v["evidence"].as_str().expect("evidence");
    assert!(
        evidence.starts_with(
            "verified on hardware: the scenario `resnet50-batch-sweep` on it matches the H100 \
             capture `resnet50_batch_sweep` with cuDNN's convolution workspaces measured"
        ) && evidence.ends_with("elsewhere the engine's estimate"),
        "{evidence}"
    );
}

#[test]
fn text_report_says_how_saved_bytes_were_measured() {
    let (code, out, err) = vramscope(&["model", "deep-mlp"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(
            "deep-mlp: verified on hardware: the scenario `deep-mlp-no-checkpoint` on it matches \
             the H100 capture `deep_mlp_no_checkpoint`"
        ),
        "{out}"
    );
    // 20 × (4096² + 4096).
    assert!(out.contains("335,626,240 (335,626,240 trainable)"), "{out}");
    assert!(out.contains("one forward pass at batch 1"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("layers.19.fc ")), "{out}");
}

#[test]
fn a_scenario_file_in_the_module_language() {
    let (_dir, file) = lm_file("lm", LM);
    let (code, out, err) = vramscope(&["model", &file, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["parameters"], LM_PARAMS);
    assert_eq!(v["trainable_parameters"], LM_PARAMS - LM_EMB);

    // It runs end to end and meets its expectations.
    let (code, out, err) = vramscope(&["run", &file, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v = json(&out);
    assert_eq!(v["iterations_run"], 3);
    assert!(v["error"].is_null(), "{}", v["error"]);
    let expectations = v["expectations"].as_array().expect("expectations");
    assert_eq!(expectations.len(), 2);
    // The weights, the head's grads and AdamW's state are at least there:
    // 4 B per parameter, 3 × 4 B per trainable one.
    let floor = 4 * LM_PARAMS + 12 * (LM_PARAMS - LM_EMB);
    assert!(v["peak_allocated"].as_u64().is_some_and(|p| p > floor));
}

#[test]
fn bad_models_are_refused_with_the_module_named() {
    let wrong = LM.replace(
        "(\"fc2\", Linear(in: 256, out: 64))",
        "(\"fc2\", Linear(in: 128, out: 64))",
    );
    let (_dir, file) = lm_file("lm-shape", &wrong);
    let (code, _, err) = vramscope(&["check", &file]);
    assert_eq!(code, 2, "{err}");
    // At the module itself (from the file's structure), naming it and what
    // it was given.
    let at = wrong.find("Linear(in: 128").expect("written");
    let line = wrong[..at].matches('\n').count() + 1;
    let column = at - wrong[..at].rfind('\n').map_or(0, |i| i + 1) + 1;
    let expected = format!("tiny-lm.ron:{line}:{column}: model: block.fc2: Linear(in: 128)");
    assert!(err.contains(&expected), "{expected} in {err}");
    assert!(err.contains("[4, 64, 256]"), "{err}");

    let unknown = LM.replace("(\"act\", GELU)", "(\"act\", Swish)");
    let (_dir, file) = lm_file("lm-variant", &unknown);
    let (code, _, err) = vramscope(&["check", &file]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("tiny-lm.ron:"), "{err}");
    assert!(err.contains("Swish"), "{err}");

    let frozen = LM.replace("freeze: [\"emb\"]", "freeze: [\"encoder\"]");
    let (_dir, file) = lm_file("lm-freeze", &frozen);
    for command in ["check", "model"] {
        let (code, _, err) = vramscope(&[command, &file]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("no parameter under module `encoder`"), "{err}");
    }

    let (code, _, err) = vramscope(&["model", "resnet-500"]);
    assert_eq!(code, 2);
    assert!(err.contains("resnet-500"), "{err}");
}

#[test]
fn hugging_face_config_json_files_are_models() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf");
    let (code, out, err) = vramscope(&[
        "model",
        &format!("{dir}/qwen2.5-0.5b/config.json"),
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    // Qwen2.5-0.5B: tied embeddings, q/k/v biases (the brief's figure).
    assert_eq!(v["parameters"], 494_032_768u64);
    let scratch = temp_dir("hf-configs");
    let json_file = |tag: &str, text: &str| {
        let dir = scratch.join(tag);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("config.json");
        std::fs::write(&path, text).expect("write");
        path.to_str().expect("utf-8").to_string()
    };
    let bad = json_file(
        "hf-bad",
        r#"{"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 4}"#,
    );
    let (code, _, err) = vramscope(&["model", &bad]);
    assert_ne!(code, 0);
    assert!(
        err.contains(&bad) && err.contains("`intermediate_size`"),
        "{err}"
    );
    let t5 = json_file("hf-t5", r#"{"model_type": "t5"}"#);
    let (code, _, err) = vramscope(&["model", &t5]);
    assert_ne!(code, 0);
    assert!(err.contains("model_type \"t5\" is not supported"), "{err}");
}

/// The tiny LM in bf16 with its LayerNorm in fp32 (`model.to(bfloat16)`,
/// then `model.block.ln.float()`).
fn fp32_norm_lm() -> String {
    LM.replace(
        "        freeze: [\"emb\"],\n",
        "        freeze: [\"emb\"],\n        dtypes: [(\"block.ln\", F32)],\n",
    )
    .replace(
        "    data: (batch: 4),",
        "    model_dtype: BF16,\n    data: (batch: 4),",
    )
}

#[test]
fn mixed_parameter_dtypes_are_shown_per_dtype() {
    let text = fp32_norm_lm();
    assert!(text.contains("dtypes:") && text.contains("model_dtype: BF16"));
    let (_dir, file) = lm_file("lm-dtypes", &text);
    let (code, out, err) = vramscope(&["model", &file, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["parameters"], LM_PARAMS);
    // LayerNorm(64)'s weight and bias in fp32, every other parameter in bf16.
    let norm = 2 * 64;
    assert_eq!(v["bytes_by_dtype"]["float32"], 4 * norm);
    assert_eq!(v["bytes_by_dtype"]["bfloat16"], 2 * (LM_PARAMS - norm));
    let (code, out, err) = vramscope(&["model", &file]);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("parameters + buffers"))
        .expect("the per-dtype line");
    assert!(
        line.contains("bfloat16") && line.contains("float32 512 bytes"),
        "{line}"
    );

    // It trains: the norm's fp32 weights take a bf16 input, as PyTorch's
    // mixed-type layer_norm kernel does, and return bf16 to the Linear.
    let (code, out, err) = vramscope(&["run", &file, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(json(&out)["error"].is_null(), "{out}");
}

#[test]
fn a_linear_in_another_dtype_is_refused_as_pytorch_refuses_it() {
    // fc1 in fp32 in a bf16 model: F.linear gets a bf16 input and fp32
    // weights, which PyTorch refuses outside autocast.
    let text = fp32_norm_lm().replace("(\"block.ln\", F32)", "(\"block.fc1\", F32)");
    let (_dir, file) = lm_file("lm-dtypes-linear", &text);
    let (_, out, err) = vramscope(&["run", &file, "--json"]);
    let v = json(&out);
    let error = v["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("expected m1 and m2 to have the same dtype"),
        "{out}{err}"
    );

    let nothing = fp32_norm_lm().replace("(\"block.ln\", F32)", "(\"block.norm\", F32)");
    let (_dir, file) = lm_file("lm-dtypes-nothing", &nothing);
    for command in ["check", "model"] {
        let (code, _, err) = vramscope(&[command, &file]);
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains("no parameter under module `block.norm`"),
            "{err}"
        );
    }
}

/// The tiny LM's block with its activation written op for op: `h *
/// torch.sigmoid(h)` as `Ops`.
#[test]
fn ops_are_written_in_the_file_and_their_errors_located() {
    let ops = LM.replace(
        "(\"act\", GELU)",
        "(\"act\", Ops([(\"s\", Sigmoid(X)), (\"out\", Mul(X, Var(\"s\")))]))",
    );
    assert_ne!(ops, LM);
    let (_dir, file) = lm_file("lm-ops", &ops);
    let (code, out, err) = vramscope(&["run", &file, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(json(&out)["error"].is_null(), "{out}");

    let unbound = ops.replace("Var(\"s\")", "Var(\"t\")");
    let (_dir, file) = lm_file("lm-ops-unbound", &unbound);
    let (code, _, err) = vramscope(&["check", &file]);
    assert_eq!(code, 2, "{err}");
    let at = unbound.find("Ops([").expect("written");
    let line = unbound[..at].matches('\n').count() + 1;
    assert!(
        err.contains(&format!("tiny-lm.ron:{line}:"))
            && err.contains("block.act: Ops: `t` is not bound"),
        "{err}"
    );
}
