//! `vramscope check` refuses every model in the module language that the
//! build refuses, at the line and column of the field at fault, and `run`
//! and `model` refuse them too (issue 37 "one validation", issue 40's
//! invalid models). Each bad file is a valid one with one thing changed; the
//! expected position is where the test itself wrote that thing, found in the
//! test's own text. The description and a comment name the same fields, so a
//! search for a word would point at the wrong line.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::vramscope;

/// A scratch folder removed when the test ends, whatever happens.
struct Scratch(common::Scratch);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        Scratch(common::temp_dir(tag))
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).expect("write");
        p
    }
}

/// A small Llama-like model that checks and runs.
const LM: &str = r#"Scenario(
    name: "tiny-llama",
    description: "kv_heads, head_dim, tied, padding, r: words a search would find here first",
    device: (name: "sim", capacity: "8GiB", overhead: "0MiB"),
    // heads, kv_heads, Checkpoint, RotaryEmbedding: and in this comment.
    model: Modules(
        input: Tokens(seq: 16),
        net: Sequential([
            ("embed", Embedding(num: 100, dim: 64)),
            ("rope", RotaryEmbedding(head_dim: 16)),
            ("layers", Repeat(n: 2, block: DecoderLayer(hidden: 64, intermediate: 128, heads: 4, kv_heads: Some(2)))),
            ("norm", RMSNorm(dim: 64)),
            ("head", LmHead(hidden: 64, vocab: 100, tied: true)),
        ]),
    ),
    criterion: Sum,
    data: (batch: 2),
    steps: [
        ZeroGrad(set_to_none: true),
        LoadBatch(x: "x", y: "y"),
        Forward(input: "x", output: "out"),
        Loss(output: "out", target: "y", into: "loss"),
        Backward(loss: "loss", retain_graph: false),
        OptimizerStep,
    ],
    iterations: 1,
)
"#;

/// An image model with a max-pool.
const CNN: &str = r#"Scenario(
    name: "tiny-cnn",
    description: "a max-pool with its padding",
    device: (name: "sim", capacity: "8GiB", overhead: "0MiB"),
    model: Modules(
        input: Images(channels: 3, height: 32, width: 32),
        net: Sequential([
            ("conv", Conv2d(in: 3, out: 8, kernel: 3, padding: 1)),
            ("pool", MaxPool2d(kernel: 3, stride: 2, padding: 1)),
            ("flat", Flatten),
            ("fc", Linear(in: 2048, out: 10)),
        ]),
    ),
    criterion: Sum,
    data: (batch: 2),
    steps: [
        LoadBatch(x: "x", y: "y"),
        Forward(input: "x", output: "out"),
        Loss(output: "out", target: "y", into: "loss"),
        Backward(loss: "loss", retain_graph: false),
    ],
    iterations: 1,
)
"#;

/// `text` with `from` (which must occur once) replaced by `to`.
fn with(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "`{from}` once in the base");
    text.replacen(from, to, 1)
}

/// 1-based line and column of the only occurrence of `marker` in the
/// model part of `text` (after `model:`), counted in characters.
fn position_of(text: &str, marker: &str) -> (usize, usize) {
    let model = text.find("model: Modules(").expect("a model");
    let at = model
        + text[model..]
            .find(marker)
            .expect("the marker is in the model");
    let line = text[..at].matches('\n').count() + 1;
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    (line, text[line_start..at].chars().count() + 1)
}

struct Case {
    name: &'static str,
    text: String,
    /// What the position must point at (the test's own text).
    marker: &'static str,
    /// Words the message must hold.
    says: &'static [&'static str],
}

fn cases() -> Vec<Case> {
    let layer = "DecoderLayer(hidden: 64, intermediate: 128, heads: 4, kv_heads: Some(2))";
    vec![
        Case {
            name: "kv_heads-not-dividing",
            text: with(LM, "kv_heads: Some(2)", "kv_heads: Some(3)"),
            marker: "kv_heads: Some(3)",
            says: &["layers.0", "kv_heads", "multiple"],
        },
        Case {
            name: "kv_heads-over-heads",
            text: with(LM, "kv_heads: Some(2)", "kv_heads: Some(8)"),
            marker: "kv_heads: Some(8)",
            says: &["layers.0", "kv_heads", "more than heads"],
        },
        Case {
            name: "heads-3-kv-2",
            text: with(
                &with(LM, "heads: 4, kv_heads: Some(2)", "heads: 3, kv_heads: Some(2)"),
                "hidden: 64, intermediate",
                "hidden: 48, intermediate",
            )
            .replace("dim: 64", "dim: 48")
            .replace("LmHead(hidden: 64", "LmHead(hidden: 48"),
            marker: "kv_heads: Some(2)",
            says: &["layers.0", "heads (3)", "kv_heads (2)"],
        },
        Case {
            // hidden 60 / heads 4 = head_dim 15, not written: the layer is pointed at.
            name: "odd-head-dim-with-rotary",
            text: with(LM, layer, "DecoderLayer(hidden: 60, intermediate: 128, heads: 4)")
                .replace("dim: 64", "dim: 60")
                .replace("LmHead(hidden: 64", "LmHead(hidden: 60"),
            marker: "DecoderLayer(hidden: 60",
            says: &["layers.0", "head_dim (15)", "even"],
        },
        Case {
            name: "rotary-without-rotary-embedding",
            text: with(LM, "            (\"rope\", RotaryEmbedding(head_dim: 16)),\n", ""),
            marker: "DecoderLayer(",
            says: &["layers.0", "RotaryEmbedding"],
        },
        Case {
            name: "nested-checkpoint",
            text: with(
                LM,
                layer,
                &format!("Checkpoint(module: Checkpoint(module: {layer}, reentrant: false), reentrant: false)"),
            ),
            marker: "Checkpoint(module: Decoder",
            says: &["layers.0", "Checkpoint inside another Checkpoint"],
        },
        Case {
            name: "tied-head-without-embedding",
            text: with(LM, "            (\"embed\", Embedding(num: 100, dim: 64)),\n", "")
                .replace("Tokens(seq: 16)", "Features(64)")
                .replace(
                    &format!("            (\"layers\", Repeat(n: 2, block: {layer})),\n"),
                    "",
                )
                .replace("            (\"rope\", RotaryEmbedding(head_dim: 16)),\n", ""),
            marker: "tied: true",
            says: &["head", "tied", "Embedding before it"],
        },
        Case {
            name: "lora-rank-0",
            text: with(
                LM,
                "        ]),\n    ),",
                "        ]),\n        lora: Some((r: 0, alpha: 16.0, target_modules: [\"q_proj\"])),\n    ),",
            ),
            marker: "r: 0",
            says: &["lora", "r must be at least 1"],
        },
        Case {
            name: "linear-in-zero",
            text: with(CNN, "Linear(in: 2048, out: 10)", "Linear(in: 0, out: 10)"),
            marker: "in: 0",
            says: &["fc", "in", "must be at least 1"],
        },
        Case {
            name: "conv-out-past-the-largest-dimension",
            text: with(CNN, "Conv2d(in: 3, out: 8,", "Conv2d(in: 3, out: 4194304,"),
            marker: "out: 4194304",
            says: &["conv", "out", "larger than 2097152"],
        },
        Case {
            // A tuple variant's one value: the module is pointed at.
            name: "dropout-not-a-probability",
            text: with(
                CNN,
                "            (\"flat\", Flatten),\n",
                "            (\"flat\", Flatten),\n            (\"drop\", Dropout(1.5)),\n",
            ),
            marker: "Dropout(1.5)",
            says: &["drop", "1.5 is not a probability"],
        },
        Case {
            name: "too-many-modules-to-build",
            text: with(
                CNN,
                "            (\"flat\", Flatten),\n",
                "            (\"flat\", Flatten),\n            (\"many\", Repeat(n: 100000, block: ReLU)),\n",
            ),
            marker: "Sequential([",
            says: &["100006 modules once every Repeat is unrolled"],
        },
        Case {
            name: "lora-targets-nothing-in-the-model",
            text: with(
                LM,
                "        ]),\n    ),",
                "        ]),\n        lora: Some((r: 8, alpha: 16.0, target_modules: [\"c_attn\"])),\n    ),",
            ),
            marker: "target_modules",
            says: &["lora", "no projection is named c_attn"],
        },
        Case {
            name: "maxpool-padding-over-half-the-kernel",
            text: with(CNN, "stride: 2, padding: 1", "stride: 2, padding: 2"),
            marker: "padding: 2",
            says: &["pool", "padding", "half"],
        },
    ]
}

#[test]
fn the_base_models_check_and_run() {
    let dir = Scratch::new("check-models-base");
    for (name, text) in [("lm.ron", LM), ("cnn.ron", CNN)] {
        let p = dir.write(name, text);
        let p = p.to_str().expect("utf-8 path");
        let (code, _, err) = vramscope(&["check", p]);
        assert_eq!(code, 0, "{name}: {err}");
        let (code, _, err) = vramscope(&["run", p, "--headless"]);
        assert_eq!(code, 0, "{name}: {err}");
    }
}

#[test]
fn check_refuses_every_model_the_build_refuses_at_the_field() {
    let dir = Scratch::new("check-models-bad");
    for case in cases() {
        let p = dir.write(&format!("{}.ron", case.name), &case.text);
        let shown = p.to_str().expect("utf-8 path");
        let (code, out, err) = vramscope(&["check", shown]);
        assert_eq!(code, 2, "{}: check must refuse it\n{out}{err}", case.name);
        let (line, column) = position_of(&case.text, case.marker);
        let at = format!("{shown}:{line}:{column}: ");
        assert!(
            err.contains(&at),
            "{}: expected {at}, got: {err}",
            case.name
        );
        for word in case.says {
            assert!(err.contains(word), "{}: no `{word}` in: {err}", case.name);
        }
        assert!(!err.contains("program error"), "{}: {err}", case.name);
    }
}

#[test]
fn run_and_model_never_accept_what_check_refuses() {
    let dir = Scratch::new("check-models-run");
    for case in cases() {
        let p = dir.write(&format!("{}.ron", case.name), &case.text);
        let shown = p.to_str().expect("utf-8 path");
        let (code, _, err) = vramscope(&["run", shown, "--headless"]);
        assert_eq!(code, 2, "{}: run must refuse it: {err}", case.name);
        let (check_code, _, check_err) = vramscope(&["check", shown]);
        assert_eq!(
            (code, err.trim()),
            (check_code, check_err.trim()),
            "{}",
            case.name
        );
        let (code, _, err) = vramscope(&["model", shown]);
        assert_eq!(code, 2, "{}: model must refuse it: {err}", case.name);
    }
}

/// `vramscope ARGS`, killed after `limit`: its status, or `None` if it hung.
fn finishes(args: &[&str], limit: Duration) -> Option<i32> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("vramscope runs");
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return Some(status.code().unwrap_or(-1));
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn repeat_bombs_are_refused_by_check_model_and_run_without_unrolling() {
    let dir = Scratch::new("check-models-repeat");
    let block = "DecoderLayer(hidden: 64, intermediate: 128, heads: 4, kv_heads: Some(2))";
    let bombs = [
        (
            "u64-max",
            with(LM, "Repeat(n: 2,", "Repeat(n: 18446744073709551615,"),
        ),
        (
            "nested-1000-cubed",
            with(
                LM,
                &format!("Repeat(n: 2, block: {block})"),
                "Repeat(n: 1000, block: Repeat(n: 1000, block: Repeat(n: 1000, block: RMSNorm(dim: 64))))",
            ),
        ),
    ];
    for (name, text) in bombs {
        let p = dir.write(&format!("{name}.ron"), &text);
        let shown = p.to_str().expect("utf-8 path");
        for args in [
            vec!["check", shown],
            vec!["model", shown],
            vec!["run", shown, "--headless"],
        ] {
            // A hang guard, not a timing: unrolled, these never finish.
            let code = finishes(&args, Duration::from_secs(20));
            assert_eq!(code, Some(2), "{name}: {args:?}");
        }
        let (_, _, err) = vramscope(&["check", shown]);
        assert!(err.contains("Repeat is unrolled"), "{name}: {err}");
    }
}

#[test]
fn a_shape_preserving_repeat_checks_by_its_first_copy() {
    // 40 layers: the check walks one (the block's output is its input) and
    // the run builds all 40.
    let dir = Scratch::new("check-models-forty");
    let text = with(LM, "Repeat(n: 2,", "Repeat(n: 40,");
    let p = dir.write("forty.ron", &text);
    let (code, out, err) = vramscope(&["model", p.to_str().expect("utf-8 path"), "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = common::json(&out);
    // Per layer: q, o (64·64 each), k, v (64·32 each), 3 MLP (64·128), 2 norms.
    let per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64;
    // Embedding (tied with the head) and the final norm.
    let expected = 40 * per_layer + 100 * 64 + 64;
    assert_eq!(v["parameters"], expected, "{out}");
}
