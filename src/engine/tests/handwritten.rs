//! Hand-written ops in the model language (issue 42): the request sequences
//! PyTorch's saved-tensor rules give (tools/autograd/derivatives.yaml),
//! the model's own parameter's two orders, and what the analysis refuses.
//! The whole Transformer is held to its H100 capture in
//! tests/real_gpu_fixtures/handwritten.rs.

use super::super::model_lang::{Expr, LangModel, ModelInput, Module, SoftmaxKind};
use super::super::LossKind;
use super::*;

fn named(n: &str, m: Module) -> (String, Module) {
    (n.to_string(), m)
}

fn tokens_model(net: Vec<(String, Module)>, seq: u64, batch: u64) -> ModelConfig {
    ModelConfig {
        loss: LossKind::Sum,
        ..ModelConfig::modules(
            LangModel::new(ModelInput::Tokens { seq }, Module::Sequential(net)),
            batch,
        )
    }
}

/// `Embedding(100, 16)` then `module`, on ids [2, 8]: its forward's requests.
fn forward_after_embedding(module: Module) -> Vec<i64> {
    let net = vec![
        named("emb", Module::Embedding { num: 100, dim: 16 }),
        named("m", module),
    ];
    let mut e = engine(tokens_model(net, 8, 2));
    e.take_events();
    run(&mut e, &program(forward_steps(), 1));
    requests(&e.take_events())
}

const T: i64 = 2 * 8 * 16 * 4; // [2, 8, 16] fp32
const ROWS: i64 = 2 * 8 * 4; // [2, 8, 1] fp32

#[test]
fn a_manual_softmax_makes_each_ops_output() {
    // max(dim, keepdim): values, then int64 indices (MaxBackward0 saves
    // them); x - values (SubBackward0 saves nothing), the values then die;
    // exp (saves its result), the difference dies; sum(dim, keepdim)
    // (nothing saved); e / s (saves e and s): nothing of it is freed but
    // the embedding's output, which nothing saved, when `x = m(x)` rebinds.
    let want = vec![
        2 * 8 * 8, // token ids
        T,         // embedding
        ROWS,      // max values
        2 * ROWS,  // max indices (int64)
        T,         // x - max
        -ROWS,     // the values
        T,         // exp
        -T,        // x - max
        ROWS,      // e.sum(-1, keepdim=True)
        T,         // e / sum
        -T,        // the embedding's output, replaced
        4,         // out.sum()
    ];
    assert_eq!(
        forward_after_embedding(Module::Softmax(SoftmaxKind::Manual)),
        want
    );
}

#[test]
fn a_fused_softmax_makes_one_output() {
    let want = vec![2 * 8 * 8, T, T, -T, 4];
    assert_eq!(
        forward_after_embedding(Module::Softmax(SoftmaxKind::Fused)),
        want
    );
}

#[test]
fn sigmoid_mul_keeps_both_factors() {
    // sigmoid's output, then the product; sigmoid's output stays (the
    // product saved it, as sigmoid saved its result), and so does the input.
    let want = vec![2 * 8 * 8, T, T, T, 4];
    assert_eq!(forward_after_embedding(Module::SigmoidMul), want);
    // nn.SiLU keeps its input only: the input is freed by nothing either way,
    // but no second tensor is made.
    assert_eq!(
        forward_after_embedding(Module::SiLU),
        vec![2 * 8 * 8, T, T, 4]
    );
}

#[test]
fn the_models_own_parameter_moves_last_and_steps_first() {
    // `.cuda()` moves the children's parameters, then the model's own
    // (`nn.Module._apply`); `parameters()` yields the model's own first.
    let net = vec![
        named("emb", Module::Embedding { num: 100, dim: 16 }),
        named("pos", Module::Positions { seq: 8, dim: 16 }),
        named(
            "fc",
            Module::Linear {
                input: 16,
                out: 4,
                bias: true,
            },
        ),
    ];
    let mut e = engine(tokens_model(net, 8, 2));
    let moved = requests(&e.take_events());
    assert_eq!(moved, vec![100 * 16 * 4, 4 * 16 * 4, 4 * 4, 8 * 16 * 4]);
    let first = e.parameters()[0];
    assert_eq!(e.shape(first).dims(), [8, 16]);
    assert_eq!(e.num_params(), 100 * 16 + 8 * 16 + 4 * 16 + 4);
}

#[test]
fn positions_add_a_slice_of_the_parameter() {
    // x + pos[:t]: the sum only (the slice is a view).
    let want = vec![2 * 8 * 8, T, T, -T, 4];
    assert_eq!(
        forward_after_embedding(Module::Positions { seq: 8, dim: 16 }),
        want
    );
}

fn masked_attention() -> Module {
    Module::MaskedAttention {
        hidden: 16,
        heads: 2,
        softmax: SoftmaxKind::Manual,
    }
}

fn analysis_error(net: Vec<(String, Module)>) -> String {
    let m = LangModel::new(ModelInput::Tokens { seq: 8 }, Module::Sequential(net));
    m.check(2, None).expect_err("refused").to_string()
}

#[test]
fn masked_attention_needs_a_causal_mask_before_it() {
    let err = analysis_error(vec![
        named("emb", Module::Embedding { num: 100, dim: 16 }),
        named("attn", masked_attention()),
    ]);
    assert!(
        err.contains("attn: ") && err.contains("CausalMask"),
        "{err}"
    );
}

#[test]
fn masked_attention_in_a_checkpoint_is_refused() {
    let err = analysis_error(vec![
        named("mask", Module::CausalMask),
        named("emb", Module::Embedding { num: 100, dim: 16 }),
        named(
            "ckpt",
            Module::Checkpoint {
                module: Box::new(masked_attention()),
                reentrant: false,
            },
        ),
    ]);
    assert!(err.contains("inside a Checkpoint"), "{err}");
}

#[test]
fn positions_refuse_a_longer_sequence() {
    let err = analysis_error(vec![
        named("emb", Module::Embedding { num: 100, dim: 16 }),
        named("pos", Module::Positions { seq: 4, dim: 16 }),
    ]);
    assert!(err.contains("longer than max_positions 4"), "{err}");
}

#[test]
fn a_frame_keeps_the_attentions_locals_until_it_returns() {
    // Without a Frame, MaskedAttention's locals (qkv's output, the masked
    // scores, its output) go as it returns, before the residual add; in a
    // Frame they go after it, so the add finds them still held.
    let block = |framed: bool| {
        let inner = Module::Residual(Box::new(masked_attention()));
        let net = vec![
            named("mask", Module::CausalMask),
            named("emb", Module::Embedding { num: 100, dim: 16 }),
            named(
                "block",
                if framed {
                    Module::Frame(Box::new(inner))
                } else {
                    inner
                },
            ),
        ];
        let mut e = engine(tokens_model(net, 8, 2));
        e.take_events();
        run(&mut e, &program(forward_steps(), 1));
        requests(&e.take_events())
    };
    let (bare, framed) = (block(false), block(true));
    assert_eq!(bare.len(), framed.len());
    let qkv = 3 * T;
    let add = |r: &[i64]| r.iter().rposition(|&x| x == T).expect("the residual add");
    let freed_at = |r: &[i64]| r.iter().position(|&x| x == -qkv).expect("qkv freed");
    assert!(freed_at(&bare) < add(&bare), "{bare:?}");
    assert!(freed_at(&framed) > add(&framed), "{framed:?}");
}

#[test]
fn a_half_sum_under_autocast_is_fp32() {
    // Autocast's fp32_set_opt_dtype list has `sum`: a bf16 input sums into
    // an fp32 result; outside autocast the result keeps the input's dtype.
    use super::super::dtype::DType;
    use super::super::tag::Category;
    let mut e = engine(tokens_model(
        vec![named("emb", Module::Embedding { num: 100, dim: 16 })],
        8,
        2,
    ));
    let x = e
        .factory(
            crate::engine::shape::Shape::new(&[2, 8, 16]),
            DType::BF16,
            Category::Input,
        )
        .expect("x");
    let plain = e.sum_last_keepdim(x).expect("sum");
    assert_eq!(e.dtype(plain), DType::BF16);
    e.autocast_enter(DType::BF16);
    let cast = e.sum_last_keepdim(x).expect("sum");
    assert_eq!(e.dtype(cast), DType::F32);
    assert_eq!(e.shape(cast).dims(), [2, 8, 1]);
}

#[test]
fn positions_take_embeddings_of_their_width() {
    let err = analysis_error(vec![
        named("emb", Module::Embedding { num: 100, dim: 16 }),
        named("pos", Module::Positions { seq: 8, dim: 32 }),
    ]);
    assert!(
        err.contains("pos: ") && err.contains("[B, T, 32], got [2, 8, 16]"),
        "{err}"
    );
}

/// Requests of two training iterations of `Embedding(100, 16)` then `m`.
fn trained_after_embedding(m: Module) -> Vec<i64> {
    let net = vec![
        named("emb", Module::Embedding { num: 100, dim: 16 }),
        named("m", m),
    ];
    let mut e = engine(tokens_model(net, 8, 2));
    let mut evs = e.take_events();
    run(&mut e, &Program::training(2));
    evs.extend(e.take_events());
    requests(&evs)
}

fn x() -> Box<Expr> {
    Box::new(Expr::X)
}

fn var(n: &str) -> Box<Expr> {
    Box::new(Expr::Var(n.into()))
}

#[test]
fn a_softmax_written_in_ops_is_the_manual_softmax() {
    // e = torch.exp(x - x.max(-1, keepdim=True).values); out = e / e.sum(-1, keepdim=True)
    let ops = Module::Ops(vec![
        (
            "e".into(),
            Expr::Exp(Box::new(Expr::Sub(x(), Box::new(Expr::Max(x()))))),
        ),
        (
            "out".into(),
            Expr::Div(var("e"), Box::new(Expr::Sum(var("e")))),
        ),
    ]);
    let manual = trained_after_embedding(Module::Softmax(SoftmaxKind::Manual));
    assert!(manual.len() > 20, "{manual:?}");
    assert_eq!(trained_after_embedding(ops), manual);
}

#[test]
fn x_times_sigmoid_x_in_ops_is_sigmoid_mul() {
    let ops = Module::Ops(vec![
        ("s".into(), Expr::Sigmoid(x())),
        ("out".into(), Expr::Mul(x(), var("s"))),
    ]);
    assert_eq!(
        trained_after_embedding(ops),
        trained_after_embedding(Module::SigmoidMul)
    );
}

#[test]
fn a_name_lives_until_ops_returns() {
    // d = x - x.max(...).values is named: it is freed as the module
    // returns, after exp's output exists, not as exp returns.
    let named_d = Module::Ops(vec![
        ("d".into(), Expr::Sub(x(), Box::new(Expr::Max(x())))),
        ("out".into(), Expr::Exp(var("d"))),
    ]);
    let r = forward_after_embedding(named_d);
    let want = vec![
        2 * 8 * 8, // token ids
        T,         // embedding
        ROWS,      // max values
        2 * ROWS,  // max indices
        T,         // d
        -ROWS,     // the values, as sub returns
        T,         // exp(d)
        -T,        // d, as the module returns
        -T,        // the embedding's output, replaced
        4,         // out.sum()
    ];
    assert_eq!(r, want);
}

#[test]
fn ops_refuse_an_unbound_name() {
    let unbound = analysis_error(vec![
        named("emb", Module::Embedding { num: 100, dim: 16 }),
        named("m", Module::Ops(vec![("out".into(), Expr::Exp(var("e")))])),
    ]);
    assert!(
        unbound.contains("m: ") && unbound.contains("`e` is not bound"),
        "{unbound}"
    );
    let empty = analysis_error(vec![
        named("emb", Module::Embedding { num: 100, dim: 16 }),
        named("m", Module::Ops(Vec::new())),
    ]);
    assert!(empty.contains("Ops has no statement"), "{empty}");
}
