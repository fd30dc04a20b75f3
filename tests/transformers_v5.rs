//! transformers 5.x's rules (issue 42), through the built-in
//! `qlora-finetune` (`transformers: "5.16"`): `from_pretrained` warms the
//! caching allocator with one block of the model's size and loads the
//! checkpoint in its sorted key order; the model's forward checks its
//! positions for packed sequences. Expected bytes are worked out here from
//! Qwen2.5-0.5B's shapes and transformers 5.16.1's source, not read from
//! the engine.

mod common;

use common::temp_dir;
use vramscope::alloc::Action;
use vramscope::trace::snapshot::import_file;

/// Qwen2.5-0.5B: hidden, intermediate, layers, vocabulary, kv width.
const H: u64 = 896;
const I: u64 = 4864;
const LAYERS: u64 = 24;
const V: u64 = 151_936;
const KV: u64 = 2 * 64;

/// `vramscope export` of a scenario: each allocation's size and the name
/// of its first frame, in order; and the frees between allocations.
fn exported(scenario: &str) -> Vec<(Action, u64, String)> {
    let dir = temp_dir("tf5");
    let path = dir.join("run.pickle");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["export", scenario, "-o"])
        .arg(&path)
        .output()
        .expect("vramscope runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snap = import_file(&path).expect("the export imports");
    let trace = snap.device_traces.first().expect("device 0");
    trace
        .iter()
        .filter(|e| matches!(e.action, Action::Alloc | Action::FreeRequested))
        .map(|e| {
            let name = snap
                .frames
                .resolve(e.frames)
                .next()
                .map(|f| f.name.to_string())
                .unwrap_or_default();
            (e.action, e.size, name)
        })
        .collect()
}

#[test]
fn from_pretrained_warms_the_allocator_then_loads_in_key_order() {
    let events = exported("qlora-finetune");
    // get_total_byte_count: the bf16 embedding (the tied head not again),
    // per layer two bf16 norms, the bf16 q/k/v biases and the seven
    // projections at half a byte a value; the final norm.
    let per_layer = 2 * H * 2 + (H + 2 * KV) * 2 + (H * H * 2 + 2 * KV * H + 3 * H * I) / 2;
    let warmup = V * H * 2 + LAYERS * per_layer + H * 2;
    assert_eq!(warmup, 451_325_696, "the block the trace shows");
    // `torch.empty(byte_count // 2, dtype=float16)`, allocated and freed.
    assert_eq!(events[0].0, Action::Alloc);
    assert_eq!(events[0].1, warmup);
    assert!(
        events[0].2.contains("caching_allocator_warmup"),
        "{:?}",
        events[0]
    );
    assert_eq!((events[1].0, events[1].1), (Action::FreeRequested, warmup));
    // Then the keys in dot_natural_key order: the embedding, layer 0's
    // input_layernorm, then its mlp.down_proj (quantised from a bf16 copy:
    // [H, I] · 2 bytes), before any self_attn key.
    let allocs: Vec<&(Action, u64, String)> =
        events.iter().filter(|e| e.0 == Action::Alloc).collect();
    assert_eq!(allocs[1].1, V * H * 2);
    assert!(
        allocs[1].2.contains("model.embed_tokens"),
        "{:?}",
        allocs[1]
    );
    assert_eq!(allocs[2].1, H * 2);
    assert!(
        allocs[2].2.contains("model.layers.0.input_layernorm"),
        "{:?}",
        allocs[2]
    );
    assert_eq!(allocs[3].1, H * I * 2);
    assert!(
        allocs[3]
            .2
            .contains("Params4bit._quantize in model.layers.0.mlp.down_proj"),
        "{:?}",
        allocs[3]
    );
    let first_attn = allocs
        .iter()
        .position(|e| e.2.contains("model.layers.0.self_attn"))
        .expect("layer 0's attention loads");
    let post_norm = allocs
        .iter()
        .position(|e| e.2.contains("model.layers.0.post_attention_layernorm"))
        .expect("layer 0's second norm loads");
    assert!(
        post_norm < first_attn,
        "post_attention_layernorm sorts before self_attn"
    );
    // Layer 10 after layer 9 (digits compare as numbers), not after layer 1.
    let layer = |n: u64| {
        allocs
            .iter()
            .position(|e| e.2.contains(&format!("model.layers.{n}.input_layernorm")))
            .expect("a layer's norm loads")
    };
    assert!(layer(1) < layer(2) && layer(9) < layer(10));
    // The rotary buffers last, fp32 as computed (32 values, 128 B each).
    let rotary: Vec<u64> = allocs
        .iter()
        .filter(|e| e.2.contains("model.rotary_emb"))
        .map(|e| e.1)
        .collect();
    assert_eq!(rotary, vec![32 * 4, 32 * 4]);
}

#[test]
fn the_forward_checks_for_packed_sequences_once_per_forward() {
    let events = exported("qlora-finetune");
    // find_packed_sequence_indices on [4, 512] positions: its first
    // temporary, `position_ids[:, :1] - 1`, is [4, 1] int64. Three
    // iterations, one forward each: reentrant recomputation reuses the
    // forward's keyword arguments and makes none.
    let checks = events
        .iter()
        .filter(|e| {
            e.0 == Action::Alloc && e.2.contains("find_packed_sequence_indices") && e.1 == 4 * 8
        })
        .count();
    assert_eq!(checks, 3);
}
