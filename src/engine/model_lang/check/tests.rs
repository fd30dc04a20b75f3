use super::*;
use crate::engine::model_lang::ModelInput;

fn repeat(n: u64, block: Module) -> Module {
    Module::Repeat {
        n,
        block: Box::new(block),
    }
}

#[test]
fn a_repeat_of_u64_max_shape_preserving_copies_is_one_walk() {
    let norm = Module::LayerNorm {
        dim: 64,
        bias: true,
    };
    let m = LangModel::new(
        ModelInput::Features(64),
        repeat(u64::MAX, repeat(u64::MAX, norm.clone())),
    );
    let started = std::time::Instant::now();
    let e = m.check(8, None).expect_err("too many to build");
    assert_eq!(e.problem, Problem::TooManyModules(u64::MAX));
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    // 200 × (300 + 1) + 1 modules: built one by one, walked once.
    let m = LangModel::new(ModelInput::Features(64), repeat(200, repeat(300, norm)));
    let a = m.analyse(8, None).expect("checks");
    assert_eq!(a.output.dims, [8, 64]);
    assert_eq!(a.modules, 200 * 301 + 1);
    assert_eq!(a.counts.parameters, 200 * 300 * 128);
}

#[test]
fn a_repeat_that_shrinks_its_input_fails_where_pytorch_would() {
    // 32 → 16 → 8 → 4 → 2 → 1, then a 2×2 window no longer fits.
    let pool = Module::MaxPool2d {
        kernel: 2,
        stride: 2,
        padding: 0,
    };
    let m = LangModel::new(
        ModelInput::Images {
            channels: 3,
            height: 32,
            width: 32,
        },
        repeat(u64::MAX, pool),
    );
    let e = m.check(1, None).expect_err("the window stops fitting");
    assert_eq!(e.module, "5", "{e}");
    assert!(matches!(e.problem, Problem::Shape(_)), "{e}");
}

#[test]
fn a_repeat_that_grows_its_input_for_ever_is_refused_at_n() {
    let grow = Module::Conv2d {
        input: 3,
        out: 3,
        kernel: 1,
        stride: 1,
        padding: 1,
        bias: false,
    };
    let m = LangModel::new(
        ModelInput::Images {
            channels: 3,
            height: 8,
            width: 8,
        },
        Module::Sequential(vec![("body".into(), repeat(u64::MAX, grow))]),
    );
    let e = m.check(1, None).expect_err("grows at every copy");
    assert_eq!(e.problem, Problem::RepeatDrifts);
    assert_eq!(e.field, Some("n"));
    assert_eq!(
        e.path(),
        [
            Seg::Field("net"),
            Seg::Index(0),
            Seg::Index(0),
            Seg::Index(1),
            Seg::Field("n")
        ]
    );
}

fn attention(hidden: u64, heads: u64) -> Module {
    Module::Sequential(vec![
        (
            "emb".into(),
            Module::Embedding {
                num: 10,
                dim: hidden,
            },
        ),
        (
            "attn".into(),
            Module::Attention {
                hidden,
                heads,
                kv_heads: None,
                head_dim: None,
                causal: true,
                rotary: false,
                bias: false,
                dropout: 0.0,
                sdpa: None,
            },
        ),
    ])
}

#[test]
fn attention_without_rotary_positions_takes_an_odd_head_dim_in_check_and_build() {
    use crate::engine::{Engine, EngineConfig, ModelConfig, OptimizerConfig};
    // hidden 6 over 2 heads: head_dim 3, which only rotate_half minds.
    let m = LangModel::new(ModelInput::Tokens { seq: 4 }, attention(6, 2));
    assert_eq!(m.check(2, None).expect("checks").dims, [2, 4, 6]);
    let cfg = ModelConfig::modules(m, 2);
    let built = Engine::new(EngineConfig::default(), &cfg, &OptimizerConfig::default());
    assert!(built.is_ok(), "{:?}", built.err());
}

#[test]
fn a_head_dim_that_rounds_to_zero_is_refused_at_heads() {
    let m = LangModel::new(ModelInput::Tokens { seq: 4 }, attention(2, 4));
    let e = m.check(2, None).expect_err("2 / 4 heads");
    assert_eq!(
        e.problem,
        Problem::ZeroHeadDim {
            hidden: 2,
            heads: 4
        }
    );
    assert_eq!(e.field, Some("heads"));
}

#[test]
fn heads_rules() {
    assert!(heads_rule(4, 2).is_ok());
    assert!(heads_rule(4, 4).is_ok());
    assert_eq!(
        heads_rule(3, 2).map_err(|e| e.1),
        Err(Problem::KvHeadsDivide {
            heads: 3,
            kv_heads: 2
        })
    );
    assert_eq!(
        heads_rule(4, 8).map_err(|e| e.1),
        Err(Problem::KvHeadsOverHeads {
            heads: 4,
            kv_heads: 8
        })
    );
}

#[test]
fn the_build_refuses_what_the_check_refuses_with_the_same_error() {
    use crate::engine::{Engine, EngineConfig, EngineError, ModelConfig, OptimizerConfig};
    let m = LangModel::new(
        ModelInput::Features(64),
        Module::Checkpoint {
            module: Box::new(Module::Checkpoint {
                module: Box::new(Module::ReLU),
                reentrant: false,
            }),
            reentrant: false,
        },
    );
    let checked = m.check(2, None).expect_err("nested");
    assert_eq!(checked.problem, Problem::NestedCheckpoint);
    assert_eq!(checked.path(), [Seg::Field("net"), Seg::Field("module")]);
    let mut cfg = ModelConfig::modules(m, 2);
    cfg.batch = 2;
    let built = Engine::new(EngineConfig::default(), &cfg, &OptimizerConfig::default());
    assert_eq!(built.err(), Some(EngineError::Model(checked)));
}
