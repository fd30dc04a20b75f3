//! `vramscope model` on bitsandbytes models: a pre-quantised `config.json`
//! and the QLoRA preset, each figure computed here from the configs'
//! shapes and bitsandbytes' storage rule (two 4-bit values a byte; per 64
//! values a uint8 absmax; per 256 of those an fp32 one; a 16-value fp32
//! code, a 256-value fp32 map and a 0-dim fp32 offset per weight — the
//! QLoRA paper's §3 and `quantize_4bit`'s docstring), not from the program.

mod common;

use common::{json, temp_dir, vramscope};

/// Llama-3-8B's seven projections per layer, as [out, in].
const LLAMA3_8B: [(u64, u64); 7] = [
    (4096, 4096),
    (1024, 4096),
    (1024, 4096),
    (4096, 4096),
    (14_336, 4096),
    (14_336, 4096),
    (4096, 14_336),
];

/// NF4 with double quantisation, blocksize 64: (packed, state) bytes.
fn nf4_dq(n: u64) -> (u64, u64) {
    let blocks = n.div_ceil(64);
    (
        n.div_ceil(2),
        blocks + blocks.div_ceil(256) * 4 + 16 * 4 + 256 * 4 + 4,
    )
}

#[test]
fn a_pre_quantised_config_shows_packed_weights_and_their_state() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf");
    let file = format!("{dir}/llama-3-8b-bnb-4bit/config.json");
    let (code, out, err) = vramscope(&["model", &file, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    // transformers' count of Meta-Llama-3-8B (PEFT counts a 4-bit weight
    // as its values, as the plain model has them).
    assert_eq!(v["parameters"], 8_030_261_248u64);
    let (mut packed, mut state) = (0, 0);
    for (o, i) in LLAMA3_8B {
        let (p, s) = nf4_dq(o * i);
        packed += 32 * p;
        state += 32 * s;
    }
    let d = &v["bytes_by_dtype"];
    assert_eq!(d["nf4 packed (uint8)"], packed, "{d}");
    assert_eq!(d["quant state"], state, "{d}");
    // torch_dtype bfloat16: the untied embeddings and head, 65 RMSNorms,
    // and the rotary buffers `inv_freq` and `original_inv_freq` [128 / 2].
    let (vocab, h) = (128_256u64, 4096u64);
    assert_eq!(d["bfloat16"], 2 * (2 * vocab * h + 65 * h + 2 * 64), "{d}");
    let (code, out, err) = vramscope(&["model", &file]);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("parameters + buffers"))
        .expect("the per-dtype line");
    assert!(
        line.contains("nf4 packed (uint8) 3.25 GiB") && line.contains("quant state"),
        "{line}"
    );
}

#[test]
fn the_qlora_preset_shows_fp32_adapters_as_what_trains() {
    let (code, out, err) = vramscope(&["model", "qwen2.5-0.5b-qlora", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    // Qwen2.5-0.5B (494,032,768) + LoRA r 16 on all seven projections
    // (models.md §6.4: 8,798,208).
    assert_eq!(v["parameters"], 494_032_768u64 + 8_798_208);
    assert_eq!(v["trainable_parameters"], 8_798_208u64);
    let t = &v["trainable_bytes_by_dtype"];
    assert_eq!(t["float32"], 4 * 8_798_208u64, "{t}");
    // After prepare_model_for_kbit_training the embedding (tied) and the 49
    // norms are fp32; the q/k/v biases went back to bf16 in the forward
    // (`Linear4bit.forward` casts a bias to the compute dtype for good);
    // the rotary buffers [64 / 2] are not parameters and stay bf16.
    let (vocab, h, kv) = (151_936u64, 896u64, 128u64);
    let d = &v["bytes_by_dtype"];
    assert_eq!(d["float32"], 4 * (vocab * h + 49 * h + 8_798_208), "{d}");
    assert_eq!(d["bfloat16"], 2 * (24 * (h + 2 * kv) + 2 * 32), "{d}");
    let (code, out, err) = vramscope(&["model", "qwen2.5-0.5b-qlora"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("trainable") && l.contains("float32 33.56 MiB")),
        "{out}"
    );
}

/// A 4-bit MLP written in the module language: `check` refuses a block
/// size bitsandbytes refuses, at its line and column; a valid one runs, and
/// its 4-bit layer trains nothing (its weight is frozen) while the plain
/// head does.
const MLP4: &str = r#"Scenario(
    name: "mlp-4bit",
    description: "a 4-bit MLP",
    device: (name: "sim", capacity: "1GiB"),
    model: Modules(
        input: Features(256),
        net: Sequential([
            ("fc1", Linear4bit(in: 256, out: 512, quant_type: NF4, blocksize: BLOCK)),
            ("act", ReLU),
            ("fc2", Linear(in: 512, out: 10)),
        ]),
    ),
    model_dtype: BF16,
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

#[test]
fn a_4bit_layer_in_a_scenario_is_checked_and_runs() {
    let dir = temp_dir("mlp-4bit");
    let write = |block: &str| {
        let path = dir.join(format!("mlp-{block}.ron"));
        std::fs::write(&path, MLP4.replace("BLOCK", block)).expect("write");
        path.to_str().expect("utf-8").to_string()
    };
    let bad = write("100");
    let (code, _, err) = vramscope(&["check", &bad]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!("{bad}:8:")) && err.contains("fc1: blocksize: blocksize 100"),
        "{err}"
    );
    let good = write("128");
    let (code, out, err) = vramscope(&["run", &good, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(json(&out)["error"].is_null(), "{out}");
    let (code, out, err) = vramscope(&["model", &good, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    // fc1's 256 × 512 values + 512 bias, fc2's 512 × 10 + 10; only the
    // bias of fc1 and fc2 train (bitsandbytes freezes the 4-bit weight).
    assert_eq!(v["parameters"], 256 * 512 + 512 + 512 * 10 + 10);
    assert_eq!(v["trainable_parameters"], 512 + 512 * 10 + 10);
    assert_eq!(v["bytes_by_dtype"]["nf4 packed (uint8)"], 256 * 512 / 2);
}

/// bitsandbytes before 0.43.2 kept each 4-bit layer's input on `ctx`
/// (`bnb_keeps_input`). In the built-in QLoRA scenario the decoder layers
/// run under the reentrant checkpoint `prepare_model_for_kbit_training`
/// turns on (PEFT passes `gradient_checkpointing_kwargs={}`, so
/// `torch.utils.checkpoint` takes its default, `use_reentrant=True`; seen
/// in the real program on the CPU, docs/trace.md QLoRA): their forward runs
/// under `no_grad` and records no `MatMul4Bit`, so nothing is kept past the
/// forward, old release or new. With the layers checkpointed non-reentrant
/// (`use_reentrant=False`, as TRL's configs ask), per decoder layer and
/// token the inputs kept are the bf16 casts that Linear4bit makes of the
/// fp32 norm outputs (q, k, v each their own; gate and up each their own),
/// the bf16 attention output o_proj takes, and the bf16 [I] product
/// down_proj takes: (6 · H + I) · 2 bytes — what the model view said before
/// the preset checkpointed reentrant.
#[test]
fn old_bitsandbytes_keeps_every_4bit_input_and_the_model_view_says_so() {
    let builtin = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/qlora-finetune.ron");
    let text = std::fs::read_to_string(builtin).expect("built-in");
    let dir = temp_dir("qlora-keeps");
    let saved = |text: &str| {
        let path = dir.join("q.ron");
        std::fs::write(&path, text).expect("write");
        let (code, out, err) = vramscope(&["model", path.to_str().expect("utf-8"), "--json"]);
        assert_eq!(code, 0, "{err}");
        json(&out)["saved_bytes_per_sample"]
            .as_u64()
            .expect("saved")
    };
    let now = saved(&text);
    let old = text.replacen(
        "    env: {",
        "    engine: (bnb_keeps_input: true),\n    env: {",
        1,
    );
    assert_ne!(old, text);
    // Reentrant checkpointing: the layers save nothing in forward.
    assert_eq!(saved(&old), now);
    // Not checkpointed, two frozen 4-bit layers in a row: today's
    // MatMul4Bit keeps nothing (the weights are frozen, the input needs no
    // gradient); the old one keeps each layer's bf16 input, 256 + 512
    // values a sample.
    let two = MLP4.replace("BLOCK", "64").replace(
        r#"("act", ReLU),
            ("fc2", Linear(in: 512, out: 10)),"#,
        r#"("fc2", Linear4bit(in: 512, out: 10, quant_type: NF4, blocksize: 64)),"#,
    );
    assert!(two.contains("fc2\", Linear4bit"), "{two}");
    let now = saved(&two);
    let old = saved(&two.replacen(
        "    model_dtype: BF16,",
        "    engine: (bnb_keeps_input: true),\n    model_dtype: BF16,",
        1,
    ));
    assert_eq!(now, 0);
    assert_eq!(old, (256 + 512) * 2);
}

/// Llama-3-8B QLoRA as PEFT prints it: LoRA r 16 on the seven projections
/// adds r · (in + out) per projection, 32 layers (the figure PEFT's
/// `print_trainable_parameters` gives for this recipe, 41,943,040, with
/// transformers' 8,030,261,248 for the base).
#[test]
fn llama_3_8b_qlora_counts_as_peft_prints_it() {
    let (code, out, err) = vramscope(&["model", "llama-3-8b-qlora", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    let adapters: u64 = 32 * LLAMA3_8B.iter().map(|(o, i)| 16 * (o + i)).sum::<u64>();
    assert_eq!(adapters, 41_943_040);
    assert_eq!(v["trainable_parameters"], adapters);
    assert_eq!(v["parameters"], 8_030_261_248 + adapters);
}
