//! The model language (issue 28): parameter counts from the constructors'
//! formulas, the language's forward against the hand-written presets (same
//! requests, byte for byte), the Bottleneck's request sequence and saved
//! bytes (models.md §7.5), checkpointing and freezing by path.

use rustc_hash::FxHashSet;

use super::super::model_lang::presets::{deep_mlp, resnet, resnet50};
use super::super::model_lang::{count, LangModel, ModelInput, Module};
use super::super::{Category, LossKind, ModelKind, StorageId};
use super::*;

fn lin(i: u64, o: u64) -> Module {
    Module::Linear {
        input: i,
        out: o,
        bias: true,
    }
}

pub(super) fn named(n: &str, m: Module) -> (String, Module) {
    (n.to_string(), m)
}

pub(super) fn lang(net: Module, input: ModelInput, batch: u64, loss: LossKind) -> ModelConfig {
    ModelConfig {
        loss,
        ..ModelConfig::modules(LangModel::new(input, net), batch)
    }
}

/// The requests of `iterations` training iterations of `model`.
fn trained_requests(model: ModelConfig, iterations: u32) -> Vec<i64> {
    let mut e = engine(model);
    let mut evs = e.take_events();
    run(&mut e, &Program::training(iterations));
    evs.extend(e.take_events());
    requests(&evs)
}

/// Bytes of live storages that autograd saves, of the given categories.
fn saved_activation_bytes(e: &Engine) -> u64 {
    let ls = e.held_state();
    let ids: FxHashSet<StorageId> = ls
        .nodes
        .iter()
        .flat_map(|n| n.saved.iter().filter_map(|s| s.storage))
        .collect();
    ids.iter()
        .filter_map(|id| ls.storage(*id))
        .filter(|s| {
            matches!(
                s.category,
                Category::Activation | Category::AutogradSaved | Category::Input
            )
        })
        .map(|s| s.bytes)
        .sum()
}

#[test]
fn resnet50_has_torchvisions_parameter_count() {
    // models.md §7.1: torchvision resnet50() has 25,557,032 parameters and
    // 53 BatchNorm2d layers, each with three buffers.
    let m = resnet50();
    let c = count(&m.net);
    assert_eq!(c.parameters, 25_557_032);
    assert_eq!(c.buffers, 53 * 3);
    let e = engine(ModelConfig::preset("resnet50").expect("preset"));
    assert_eq!(e.num_params(), 25_557_032);
    // conv + bn weight + bn bias per conv/BN pair (53), and fc's two.
    assert_eq!(e.parameters().len(), 53 * 3 + 2);
}

#[test]
fn deep_mlp_has_twenty_4096_layers() {
    // 20 × (4096·4096 weights + 4096 biases), no head.
    let want = 20 * (4096 * 4096 + 4096);
    assert_eq!(want, 335_626_240);
    assert_eq!(count(&deep_mlp(false).net).parameters, want);
    assert_eq!(count(&deep_mlp(true).net).parameters, want);
    let e = engine(ModelConfig::preset("deep-mlp").expect("preset"));
    assert_eq!(e.num_params(), want);
    assert_eq!(e.param_module(e.parameters()[2]).as_ref(), "layers.1.fc");
}

#[test]
fn counts_follow_the_constructors() {
    // nn.Embedding(100, 8) + nn.LayerNorm(8) + nn.Linear(8, 3, bias=False).
    let m = Module::Sequential(vec![
        named("emb", Module::Embedding { num: 100, dim: 8 }),
        named("ln", Module::LayerNorm { dim: 8, bias: true }),
        named(
            "head",
            Module::Linear {
                input: 8,
                out: 3,
                bias: false,
            },
        ),
    ]);
    assert_eq!(count(&m).parameters, 800 + 16 + 24);
    let e = engine(lang(
        m,
        ModelInput::Tokens { seq: 4 },
        2,
        LossKind::CrossEntropy,
    ));
    assert_eq!(e.num_params(), 840);
    // Parameters in named_parameters() order, with their module paths.
    let paths: Vec<String> = e
        .parameters()
        .iter()
        .map(|p| e.param_module(*p).to_string())
        .collect();
    assert_eq!(paths, ["emb", "ln", "ln", "head"]);
}

#[test]
fn language_mlp_makes_the_presets_requests() {
    // mlp-mnist (engine.md §10.1) written as nn.Sequential: the same
    // parameters, activations and frees, request for request.
    let net = Module::Sequential(vec![
        named("fc1", lin(784, 1024)),
        named("relu1", Module::ReLU),
        named("fc2", lin(1024, 1024)),
        named("relu2", Module::ReLU),
        named("fc3", lin(1024, 10)),
    ]);
    let written = lang(net, ModelInput::Features(784), 256, LossKind::CrossEntropy);
    let reqs = trained_requests(written, 2);
    assert!(reqs.len() > 20);
    assert_eq!(reqs, trained_requests(ModelConfig::mlp_mnist(), 2));
}

#[test]
fn the_resnet18_preset_is_torchvisions() {
    // torchvision resnet18(): 11,689,512 parameters, in named_parameters()
    // order under its module names, at any image size and class count.
    assert_eq!(
        count(&resnet([2, 2, 2, 2], false, 1000, 224).net).parameters,
        11_689_512
    );
    let e = engine(ModelConfig::resnet18_for(10, 64, 2));
    let paths: Vec<String> = e
        .parameters()
        .iter()
        .map(|p| e.param_module(*p).to_string())
        .collect();
    assert_eq!(paths[..3], ["conv1", "bn1", "bn1"]);
    assert_eq!(paths[3], "layer1.0.conv1");
    assert!(paths.contains(&"layer2.0.downsample.0".to_string()));
    assert_eq!(paths.last().map(String::as_str), Some("fc"));
    // 11,689,512 less the 1000-class head, plus a 10-class one.
    assert_eq!(e.num_params(), 11_689_512 - 513_000 + 5_130);
}

#[test]
fn bottleneck_request_sequence() {
    // models.md §7.5 at N = 2, 256 × 8 × 8 in, planes 64 (no downsample):
    // each conv allocates its output, then its cuDNN workspace
    // (min(64 MiB, input bytes), engine.md §1.6) freed at once; each BN its
    // output and save_mean / save_invstd [C] fp32; relu_ and `+=` nothing.
    let (n, hw) = (2i64, 64i64);
    let net = Module::Bottleneck {
        inplanes: 256,
        planes: 64,
        stride: 1,
    };
    let input = ModelInput::Images {
        channels: 256,
        height: 8,
        width: 8,
    };
    let mut e = engine(lang(net, input, 2, LossKind::Sum));
    e.take_events();
    run(&mut e, &program(forward_steps(), 1));
    let f = 4; // fp32
    let x = n * 256 * hw * f;
    let w = n * 64 * hw * f;
    let o = n * 256 * hw * f;
    let conv = |out: i64, input: i64| [out, input, -input];
    let bn = |out: i64, c: i64| [out, c * f, c * f];
    let mut want = vec![x];
    want.extend(conv(w, x));
    want.extend(bn(w, 64));
    want.extend(conv(w, w));
    want.extend(bn(w, 64));
    want.extend(conv(o, w));
    want.extend(bn(o, 256));
    want.push(4); // out.sum(): a 0-dim fp32
    assert_eq!(requests(&e.take_events()), want);
    // Saved: the input, conv1/conv2/conv3 outputs (by their BNs), bn1/bn2
    // outputs (relu_ results, conv inputs), the block output (relu_), and
    // the six statistics.
    assert_eq!(
        saved_activation_bytes(&e) as i64,
        x + 4 * w + 2 * o + 2 * (64 + 64 + 256) * f
    );
}

#[test]
fn resnet50_saves_the_section_7_5_bytes_per_image() {
    // models.md §7.5: 85,909,504 B per 224² image (input, stem, pool, four
    // stages, pooled features) — plus what the table leaves out: each BN's
    // save_mean / save_invstd, 2·C fp32 over C summed across the 53 BNs
    // (stem 64; per Bottleneck w + w + 4w, + 4w for a downsample).
    let stage = |blocks: u64, w: u64| blocks * 6 * w + 4 * w;
    let bn_c = 64 + stage(3, 64) + stage(4, 128) + stage(6, 256) + stage(3, 512);
    assert_eq!(bn_c, 26_560);
    let batch = 2;
    let mut cfg = ModelConfig::preset("resnet50").expect("preset");
    cfg.batch = batch;
    cfg.loss = LossKind::Sum;
    let mut e = engine(cfg);
    run(&mut e, &program(forward_steps(), 1));
    assert_eq!(
        saved_activation_bytes(&e),
        batch * 85_909_504 + bn_c * 2 * 4
    );
}

#[test]
fn checkpointing_an_mlp_layer_keeps_its_input_only() {
    // engine.md §7.1: inside a region every save is a placeholder; kept is
    // the region's input. 4 layers of Linear(64, 64) + GELU (GELU saves its
    // input, the Linear output, so each layer adds two saved [B, 64] tensors).
    let layer = Module::Sequential(vec![named("fc", lin(64, 64)), named("act", Module::GELU)]);
    let rows = 8u64;
    let t = rows * 64 * 4;
    let model = |ckpt: bool| {
        let block = if ckpt {
            Module::Checkpoint {
                module: Box::new(layer.clone()),
                reentrant: false,
            }
        } else {
            layer.clone()
        };
        let net = Module::Repeat {
            n: 4,
            block: Box::new(block),
        };
        lang(net, ModelInput::Features(64), rows, LossKind::Sum)
    };
    let mut plain = engine(model(false));
    run(&mut plain, &program(forward_steps(), 1));
    // Each Linear saves its input (x, then the first three GELU outputs)
    // and each GELU its input (the four Linear outputs).
    assert_eq!(saved_activation_bytes(&plain), 4 * t + 4 * t);
    let mut ck = engine(model(true));
    run(&mut ck, &program(forward_steps(), 1));
    assert_eq!(saved_activation_bytes(&ck), 0);
    let kept: u64 = ck
        .held_state()
        .roots
        .iter()
        .filter(|r| matches!(r.kind, super::super::RootKind::CheckpointInput))
        .map(|r| r.bytes)
        .sum();
    // Each region keeps its input: x and the first three layers' outputs.
    assert_eq!(kept, 4 * t);
    // Backward recomputes each region and every parameter gets its grad.
    let mut train = engine(model(true));
    run(&mut train, &Program::training(2));
    assert!(train.parameters().iter().all(|p| train.grad(*p).is_some()));
    assert_eq!(train.saved_storage_bytes(), 0);
}

#[test]
fn reentrant_checkpoint_of_a_module_trains_it() {
    // §7.3 reentrant: the region runs under no_grad and keeps its input;
    // backward recomputes it. The region's input (the first layer's output)
    // requires grad, so its parameters train.
    let net = Module::Sequential(vec![
        named("fc1", lin(32, 32)),
        named(
            "body",
            Module::Checkpoint {
                module: Box::new(Module::Sequential(vec![
                    named("fc2", lin(32, 32)),
                    named("relu", Module::ReLU),
                ])),
                reentrant: true,
            },
        ),
    ]);
    let mut e = engine(lang(net, ModelInput::Features(32), 4, LossKind::Sum));
    run(&mut e, &Program::training(2));
    assert!(e.parameters().iter().all(|p| e.grad(*p).is_some()));
}

#[test]
fn freezing_by_language_path() {
    // Freeze `layers.0` of a Repeat: its Linear gets no grad, the rest do.
    let net = Module::Sequential(vec![named(
        "layers",
        Module::Repeat {
            n: 3,
            block: Box::new(Module::Sequential(vec![
                named("fc", lin(16, 16)),
                named("relu", Module::ReLU),
            ])),
        },
    )]);
    let mut cfg = lang(net, ModelInput::Features(16), 4, LossKind::Sum);
    if let ModelKind::Modules(m) = &mut cfg.kind {
        m.freeze = vec!["layers.0".into()];
    }
    let mut e = engine(cfg.clone());
    run(&mut e, &Program::training(1));
    let trained: Vec<bool> = e
        .parameters()
        .iter()
        .map(|p| e.grad(*p).is_some())
        .collect();
    assert_eq!(trained, [false, false, true, true, true, true]);
    // The SetRequiresGrad step takes the same paths.
    if let ModelKind::Modules(m) = &mut cfg.kind {
        m.freeze.clear();
    }
    let mut e = engine(cfg);
    let mut p = Program::training(1);
    p.setup.push(Step::SetRequiresGrad {
        modules: vec!["layers.2.fc".into()],
        requires_grad: false,
    });
    run(&mut e, &p);
    let trained: Vec<bool> = e
        .parameters()
        .iter()
        .map(|p| e.grad(*p).is_some())
        .collect();
    assert_eq!(trained, [true, true, true, true, false, false]);
}

#[test]
fn freezing_a_path_that_names_nothing_is_an_error() {
    let mut cfg = lang(lin(4, 4), ModelInput::Features(4), 2, LossKind::Sum);
    if let ModelKind::Modules(m) = &mut cfg.kind {
        m.freeze = vec!["encoder".into()];
    }
    let err = Engine::new(EngineConfig::default(), &cfg, &OptimizerConfig::adamw())
        .err()
        .expect("an error");
    assert!(err.to_string().contains("encoder"), "{err}");
}

#[test]
fn nested_checkpoints_are_refused() {
    let inner = Module::Checkpoint {
        module: Box::new(lin(4, 4)),
        reentrant: false,
    };
    let net = Module::Checkpoint {
        module: Box::new(Module::Sequential(vec![named("a", inner)])),
        reentrant: false,
    };
    let cfg = lang(net, ModelInput::Features(4), 2, LossKind::Sum);
    let err = Engine::new(EngineConfig::default(), &cfg, &OptimizerConfig::adamw())
        .err()
        .expect("an error");
    assert!(err.to_string().contains("a: a Checkpoint inside"), "{err}");
}

#[test]
fn shape_errors_name_the_module() {
    let m = LangModel::new(
        ModelInput::Features(8),
        Module::Sequential(vec![named("fc1", lin(8, 16)), named("fc2", lin(32, 4))]),
    );
    let err = m.check(2, None).expect_err("mismatch").to_string();
    assert!(err.starts_with("fc2: Linear(in: 32)"), "{err}");
    assert!(err.contains("[2, 16]"), "{err}");
    let out = resnet50().check(3, None).expect("resnet50");
    assert_eq!(out.dims, [3, 1000]);
}

#[test]
fn residual_norm_activation_dropout_request_sequence() {
    // engine.md §1.7 at B = 2, T = 8, d = 16 (fp32 [2, 8, 16] = 1,024 B):
    // embedding: out; layer_norm: out, mean [16] and rstd [16] fp32; gelu:
    // out (saves its input, the LN output); dropout (train, 0 < p < 1): the
    // bool mask first, then out. `x = child(x)` frees the GELU output (nothing
    // saved it) once dropout's exists; the residual add makes its out, then
    // the branch's output dies; out.sum() is a 0-dim fp32.
    let net = Module::Sequential(vec![
        named("emb", Module::Embedding { num: 100, dim: 16 }),
        named(
            "block",
            Module::Residual(Box::new(Module::Sequential(vec![
                named(
                    "ln",
                    Module::LayerNorm {
                        dim: 16,
                        bias: true,
                    },
                ),
                named("act", Module::GELU),
                named("drop", Module::Dropout(0.5)),
            ]))),
        ),
    ]);
    let mut e = engine(lang(net, ModelInput::Tokens { seq: 8 }, 2, LossKind::Sum));
    e.take_events();
    run(&mut e, &program(forward_steps(), 1));
    let t = 2 * 8 * 16;
    let want = vec![
        2 * 8 * 8, // token ids, int64
        t * 4,     // embedding
        t * 4,     // layer_norm out
        16 * 4,    // mean
        16 * 4,    // rstd
        t * 4,     // gelu
        t,         // dropout mask (bool)
        t * 4,     // dropout out
        -(t * 4),  // the gelu output, replaced
        t * 4,     // x + block(x)
        -(t * 4),  // the branch's output
        4,         // out.sum()
    ];
    assert_eq!(requests(&e.take_events()), want);
}

#[test]
fn global_average_pool_saves_nothing() {
    // A 1×1 adaptive_avg_pool2d is `x.mean((-1, -2), keepdim=True)` in ATen
    // (MeanBackward1 keeps only sizes): a conv output pooled straight away
    // is saved by nothing and dies when the pool's output replaces it.
    let net = Module::Sequential(vec![
        named(
            "conv",
            Module::Conv2d {
                input: 3,
                out: 8,
                kernel: 3,
                stride: 1,
                padding: 1,
                bias: false,
            },
        ),
        named("pool", Module::AdaptiveAvgPool2d),
        named("flat", Module::Flatten),
    ]);
    let input = ModelInput::Images {
        channels: 3,
        height: 16,
        width: 16,
    };
    let mut e = engine(lang(net, input, 2, LossKind::Sum));
    e.take_events();
    run(&mut e, &program(forward_steps(), 1));
    let x = 2 * 3 * 16 * 16 * 4;
    let conv = 2 * 8 * 16 * 16 * 4;
    // x; conv out, its workspace (min(64 MiB, input bytes)); the pooled
    // [2, 8, 1, 1]; the conv output freed; out.sum().
    let want = vec![x, conv, x, -x, 2 * 8 * 4, -conv, 4];
    assert_eq!(requests(&e.take_events()), want);
    // Saved: only the input, by the conv.
    assert_eq!(saved_activation_bytes(&e), x as u64);
    // Backward still reaches the conv's weight.
    let mut t = engine(lang(
        Module::Sequential(vec![
            named(
                "conv",
                Module::Conv2d {
                    input: 3,
                    out: 8,
                    kernel: 3,
                    stride: 1,
                    padding: 1,
                    bias: true,
                },
            ),
            named("pool", Module::AdaptiveAvgPool2d),
        ]),
        ModelInput::Images {
            channels: 3,
            height: 16,
            width: 16,
        },
        2,
        LossKind::Sum,
    ));
    run(&mut t, &Program::training(1));
    assert!(t.parameters().iter().all(|p| t.grad(*p).is_some()));
}

#[test]
fn resnet50_sum_backward_leaves_only_model_state_and_the_loop_names() {
    // models.md §7.6: after `model(x).sum().backward()` every saved storage
    // is released; what stays is the weights, BN buffers, grads, and what
    // the loop's names hold (x, out, loss) — no activation of the forward.
    let batch = 2u64;
    let mut cfg = ModelConfig::preset("resnet50").expect("preset");
    cfg.batch = batch;
    cfg.loss = LossKind::Sum;
    let mut e = engine_with(cfg, OptimizerConfig::sgd(0.0), EngineConfig::default());
    let mut p = Program::training(2);
    p.steps.pop(); // no optimizer step: grads stay as backward made them
    run(&mut e, &p);
    assert_eq!(e.saved_storage_bytes(), 0);
    let ls = e.held_state();
    let bytes = |c: Category| -> u64 {
        ls.storages
            .iter()
            .filter(|s| s.category == c)
            .map(|s| s.bytes)
            .sum()
    };
    let params = 25_557_032 * 4;
    assert_eq!(bytes(Category::Parameter), params);
    assert_eq!(bytes(Category::Gradient), params);
    // running_mean/var over 26,560 channels, 53 int64 counters.
    assert_eq!(bytes(Category::Buffer), 2 * 26_560 * 4 + 53 * 8);
    // x [2, 3, 224, 224], out [2, 1000] and the 0-dim loss.
    let loop_names = batch * 3 * 224 * 224 * 4 + batch * 1000 * 4 + 4;
    assert_eq!(
        bytes(Category::Input) + bytes(Category::Activation),
        loop_names
    );
}

#[test]
fn a_checkpointed_bottleneck_keeps_its_input() {
    // models.md §9.1: a user-checkpointed Bottleneck keeps only the block
    // input; backward rebuilds the block and trains every parameter in it.
    let stem = Module::Conv2d {
        input: 3,
        out: 64,
        kernel: 3,
        stride: 1,
        padding: 1,
        bias: false,
    };
    let block = Module::Checkpoint {
        module: Box::new(Module::Bottleneck {
            inplanes: 64,
            planes: 16,
            stride: 1,
        }),
        reentrant: false,
    };
    let net = Module::Sequential(vec![named("stem", stem), named("block", block)]);
    let input = ModelInput::Images {
        channels: 3,
        height: 8,
        width: 8,
    };
    let cfg = lang(net, input, 2, LossKind::Sum);
    let mut e = engine(cfg.clone());
    run(&mut e, &program(forward_steps(), 1));
    // Saved: only x, by the stem conv (the block saves placeholders).
    assert_eq!(saved_activation_bytes(&e), 2 * 3 * 64 * 4);
    let kept: u64 = e
        .held_state()
        .roots
        .iter()
        .filter(|r| matches!(r.kind, super::super::RootKind::CheckpointInput))
        .map(|r| r.bytes)
        .sum();
    // The block input: the stem's output [2, 64, 8, 8] fp32.
    assert_eq!(kept, 2 * 64 * 64 * 4);
    let mut t = engine(cfg);
    run(&mut t, &Program::training(2));
    assert!(t.parameters().iter().all(|p| t.grad(*p).is_some()));
    assert_eq!(t.saved_storage_bytes(), 0);
}

#[test]
fn absurd_dimensions_saturate_the_count() {
    // 2^21 in, out and kernel: 2^84 weights, more than u64 holds.
    let big = 1u64 << 21;
    let m = Module::Repeat {
        n: 3,
        block: Box::new(Module::Conv2d {
            input: big,
            out: big,
            kernel: big,
            stride: 1,
            padding: 0,
            bias: true,
        }),
    };
    assert_eq!(count(&m).parameters, u64::MAX);
}
