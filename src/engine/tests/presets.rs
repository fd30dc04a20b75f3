//! Presets (engine.md §10): parameter counts and saved bytes.

use rustc_hash::{FxHashMap, FxHashSet};

use super::super::{Category, DType, StorageId};
use super::*;

#[test]
fn parameter_counts_match_section_10() {
    // §10.1: 784·1024+1024 + 1024·1024+1024 + 1024·10+10.
    assert_eq!(engine(ModelConfig::mlp_mnist()).num_params(), 1_863_690);
    // §10.2: 12 blocks of 12d²+13d, wte, wpe, ln_f; 148 tensors.
    let d = 768u64;
    let e = engine(ModelConfig::gpt2_small(1, 64));
    assert_eq!(
        e.num_params(),
        12 * (12 * d * d + 13 * d) + 50_257 * d + 1024 * d + 2 * d
    );
    assert_eq!(e.num_params(), 124_439_808);
    assert_eq!(e.parameters().len(), 148);
    assert_eq!(engine(ModelConfig::gpt_tiny()).num_params(), 5_322_240);
    // §10.3: 10,000·200 + 2·(4·200·400 + 8·200) + 200·10,000 + 10,000.
    assert_eq!(engine(ModelConfig::lstm_lm_ptb()).num_params(), 4_653_200);
    assert_eq!(
        engine(ModelConfig::lstm_lm_medium()).num_params(),
        19_780_400
    );
    // §10.4
    assert_eq!(engine(ModelConfig::resnet18(1)).num_params(), 11_689_512);
}

#[test]
fn lstm_weights_share_one_flat_storage() {
    // §8.1 / §10.3: the LSTM's 643,200 params are one 2,572,800 B storage.
    let e = engine(ModelConfig::lstm_lm_ptb());
    let ps = e.parameters();
    let lstm = &ps[1..9];
    let st: FxHashSet<StorageId> = lstm.iter().map(|p| e.storage_of(*p)).collect();
    assert_eq!(st.len(), 1);
    let bytes = e
        .held_state()
        .storage(*st.iter().next().expect("one"))
        .map(|s| s.bytes);
    assert_eq!(bytes, Some(2_572_800));
}

/// Distinct storages referenced by live saved slots, each attributed to the
/// module of the first (lowest-sequence) Node that saved it.
fn saved_by_module(e: &Engine, keep: &[Category]) -> FxHashMap<String, u64> {
    let ls = e.held_state();
    let mut first: FxHashMap<StorageId, (u64, String)> = FxHashMap::default();
    for n in &ls.nodes {
        for s in &n.saved {
            if let Some(id) = s.storage {
                let ent = first.entry(id).or_insert((u64::MAX, String::new()));
                if n.seq < ent.0 {
                    *ent = (n.seq, n.module.to_string());
                }
            }
        }
    }
    let mut out = FxHashMap::default();
    for (id, (_, m)) in first {
        let st = ls.storage(id).expect("live");
        if keep.contains(&st.category) {
            *out.entry(m).or_insert(0) += st.bytes;
        }
    }
    out
}

fn block_bytes(map: &FxHashMap<String, u64>, i: usize) -> u64 {
    let p = format!("transformer.h.{i}.");
    map.iter()
        .filter(|(k, _)| k.starts_with(&p) || **k == p[..p.len() - 1])
        .map(|(_, v)| v)
        .sum()
}

fn gpt_forward(amp: bool, b: u64, t: u64) -> Engine {
    let mut e = engine(ModelConfig::gpt2_small(b, t));
    let mut steps = vec![];
    if amp {
        steps.push(Step::AutocastEnter { dtype: DType::F16 });
    }
    steps.extend(forward_steps());
    run(&mut e, &program(steps, 1));
    e
}

#[test]
fn gpt2_saved_bytes_per_block_fp32() {
    // §10.2: 64d + 16 + 4h bytes per B·T row (mem-efficient SDPA, T % 32 == 0).
    let (b, t, d, h) = (2u64, 64u64, 768u64, 12u64);
    let e = gpt_forward(false, b, t);
    let m = saved_by_module(&e, &[Category::Activation, Category::AutogradSaved]);
    for i in 0..12 {
        assert_eq!(
            block_bytes(&m, i),
            (64 * d + 16 + 4 * h) * b * t,
            "block {i}"
        );
    }
}

#[test]
fn gpt2_saved_bytes_per_block_amp() {
    // §10.2: AMP fp16 = 36d + 16 + 4h per B·T row (flash SDPA), plus flash's
    // RNG state ([2] int64) and `unused` int64 scalar per block, which it
    // saves even without dropout (PyTorch 2.11 on an H100, amp_fp16 fixture).
    let (b, t, d, h) = (2u64, 64u64, 768u64, 12u64);
    let e = gpt_forward(true, b, t);
    let m = saved_by_module(&e, &[Category::Activation, Category::AutogradSaved]);
    for i in 0..12 {
        assert_eq!(
            block_bytes(&m, i),
            (36 * d + 16 + 4 * h) * b * t + 16 + 8,
            "block {i}"
        );
    }
}

#[test]
fn gpt2_worked_numbers_b8_t1024() {
    // §10.2 worked numbers: 403,177,472 B per block fp32, 227,016,704 B AMP.
    let (b, t, d, h) = (8u64, 1024u64, 768u64, 12u64);
    assert_eq!((64 * d + 16 + 4 * h) * b * t, 403_177_472);
    assert_eq!((36 * d + 16 + 4 * h) * b * t, 227_016_704);
    let mut e = engine_with(
        ModelConfig::gpt2_small(b, t),
        OptimizerConfig::adamw(),
        EngineConfig {
            device_bytes: 80 << 30,
            ..EngineConfig::default()
        },
    );
    run(&mut e, &program(forward_steps(), 1));
    let m = saved_by_module(&e, &[Category::Activation, Category::AutogradSaved]);
    assert_eq!(block_bytes(&m, 0), 403_177_472);
    // The user-held logits [B, T, V] (1,646,821,376 B) and saved log-probs [B·T, V].
    let out = e.binding_tensor("out").expect("out");
    assert_eq!(e.nbytes(out), 1_646_821_376);
    let ls = e.held_state();
    let loss_root = ls.root("loss").expect("loss");
    assert!(loss_root
        .saved_storages
        .iter()
        .any(|s| ls.storage(*s).map(|x| x.bytes) == Some(b * t * 50_257 * 4)));
}

#[test]
fn mlp_saved_bytes_section_10_1() {
    let mut e = engine(ModelConfig::mlp_mnist());
    run(&mut e, &program(forward_steps(), 1));
    let ls = e.held_state();
    let loss = ls.root("loss").expect("loss root");
    // Kept only by the graph: relu1 out, relu2 out, log-probs, total_weight.
    assert_eq!(
        loss.exclusive_saved_bytes,
        2 * 256 * 1024 * 4 + 256 * 10 * 4 + 4
    );
    // Plus the user-held x [256, 784] and target [256] int64, and the fc2/fc3
    // weights that addmm saves as mat2 because their input requires grad (§2.2).
    let weights = 1024 * 1024 * 4 + 10 * 1024 * 4;
    assert_eq!(
        loss.saved_bytes,
        2 * 256 * 1024 * 4 + 256 * 10 * 4 + 4 + 256 * 784 * 4 + 256 * 8 + weights
    );
}

#[test]
fn resnet18_saved_activations_section_10_4() {
    let mut e = engine(ModelConfig::resnet18(32));
    run(&mut e, &program(forward_steps(), 1));
    let ls = e.held_state();
    let mut ids: FxHashSet<StorageId> = ls
        .root("loss")
        .expect("loss")
        .saved_storages
        .iter()
        .copied()
        .collect();
    ids.insert(ls.root("out").expect("out").storage);
    let total: u64 = ids
        .iter()
        .filter_map(|id| ls.storage(*id))
        .filter(|s| {
            matches!(
                s.category,
                Category::Activation | Category::AutogradSaved | Category::Input
            )
        })
        .map(|s| s.bytes)
        .sum();
    // Table §10.4 (710,010,880 B) plus what the table leaves out but §1.7/2.2
    // mandate: BN save_mean/save_invstd (2·C fp32 per BN; C summed over the 20
    // BNs = 64 + 4·64 + 5·128 + 5·256 + 5·512), nll's total_weight and target.
    let bn_c: u64 = 64 + 4 * 64 + 5 * 128 + 5 * 256 + 5 * 512;
    assert_eq!(total, 710_010_880 + bn_c * 2 * 4 + 4 + 32 * 8);
}

#[test]
fn lstm_ptb_saved_bytes_section_10_3() {
    let mut e = engine(ModelConfig::lstm_lm_ptb());
    run(&mut e, &program(forward_steps(), 1));
    let ls = e.held_state();
    let loss = ls.root("loss").expect("loss");
    let (t, b, h, v) = (35u64, 20u64, 200u64, 10_000u64);
    let reserve = 2 * t * b * h * 6 * 4;
    assert_eq!(reserve, 6_720_000);
    assert!(loss
        .saved_storages
        .iter()
        .any(|s| ls.storage(*s).map(|x| x.bytes) == Some(reserve)));
    // §10.3 S_iter: two dropout outs + masks, LSTM output, reserve, log-probs.
    let s_iter = 2 * (t * b * h * 4 + t * b * h) + t * b * h * 4 + reserve + t * b * v * 4;
    assert_eq!(s_iter, 36_680_000); // "S_iter ≈ 37 MB"
                                    // Kept only by the graph: all of it but the log-probs (the user's `out`),
                                    // plus the zero h0/c0 saved as hx/cx and nll's total_weight.
    assert_eq!(
        loss.exclusive_saved_bytes,
        s_iter - t * b * v * 4 + 2 * 2 * b * h * 4 + 4
    );
}
