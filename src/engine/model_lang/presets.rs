//! Presets written in the language: every preset model but nanoGPT and the
//! LSTM language model (hand-written in `engine::modules`) and the Hugging
//! Face shapes (`presets_hf.rs`, which write themselves in it too). Which of
//! them a capture checks is `engine::presets::PRESET_CATALOGUE`'s evidence.

use super::spec::{LangModel, ModelInput, Module, BOTTLENECK_EXPANSION};

fn named(name: &str, m: Module) -> (String, Module) {
    (name.to_string(), m)
}

/// torchvision `resnet50()` (v1.5, models.md §7.1): 25,557,032 parameters.
pub fn resnet50() -> LangModel {
    resnet([3, 4, 6, 3], true, 1000, 224)
}

/// torchvision's `ResNet(block, layers, num_classes)` on `image`² RGB
/// images: the stem, four stages (the first block of stages 2–4 has stride
/// 2), average pool, flatten and the classifier, with torchvision's names.
pub fn resnet(layers: [u64; 4], bottleneck: bool, classes: u64, image: u64) -> LangModel {
    let expansion = if bottleneck { BOTTLENECK_EXPANSION } else { 1 };
    let mut inplanes = 64;
    let mut net = vec![
        named(
            "conv1",
            Module::Conv2d {
                input: 3,
                out: 64,
                kernel: 7,
                stride: 2,
                padding: 3,
                bias: false,
            },
        ),
        named("bn1", Module::BatchNorm2d(64)),
        named("relu", Module::InplaceReLU),
        named(
            "maxpool",
            Module::MaxPool2d {
                kernel: 3,
                stride: 2,
                padding: 1,
            },
        ),
    ];
    for (li, n) in layers.iter().enumerate() {
        let planes = 64u64 << li;
        let mut blocks = Vec::new();
        for bi in 0..*n {
            let stride = if li > 0 && bi == 0 { 2 } else { 1 };
            let block = if bottleneck {
                Module::Bottleneck {
                    inplanes,
                    planes,
                    stride,
                }
            } else {
                Module::BasicBlock {
                    inplanes,
                    planes,
                    stride,
                }
            };
            blocks.push(named(&bi.to_string(), block));
            inplanes = planes * expansion;
        }
        net.push(named(
            &format!("layer{}", li + 1),
            Module::Sequential(blocks),
        ));
    }
    net.push(named("avgpool", Module::AdaptiveAvgPool2d));
    net.push(named("flatten", Module::Flatten));
    net.push(named(
        "fc",
        Module::Linear {
            input: inplanes,
            out: classes,
            bias: true,
        },
    ));
    LangModel::new(
        ModelInput::Images {
            channels: 3,
            height: image,
            width: image,
        },
        Module::Sequential(net),
    )
}

/// The width of the course's deep MLP.
pub const DEEP_MLP_WIDTH: u64 = 4096;
/// Its depth.
pub const DEEP_MLP_LAYERS: u64 = 20;

/// One layer of the deep MLP: `Sequential(fc: Linear(w, w), relu: ReLU())`.
pub fn deep_mlp_layer() -> Module {
    Module::Sequential(vec![
        named(
            "fc",
            Module::Linear {
                input: DEEP_MLP_WIDTH,
                out: DEEP_MLP_WIDTH,
                bias: true,
            },
        ),
        named("relu", Module::ReLU),
    ])
}

/// The caching-allocator course's exercise model: 20 layers of
/// Linear(4096, 4096) and ReLU under `layers`, on [B, 4096] float inputs,
/// no head (the exercise trains it with `model(x).sum().backward()`). With
/// `checkpoint`, every layer is its own non-reentrant checkpoint region.
pub fn deep_mlp(checkpoint: bool) -> LangModel {
    let layer = if checkpoint {
        Module::Checkpoint {
            module: Box::new(deep_mlp_layer()),
            reentrant: false,
        }
    } else {
        deep_mlp_layer()
    };
    LangModel::new(
        ModelInput::Features(DEEP_MLP_WIDTH),
        Module::Sequential(vec![named(
            "layers",
            Module::Repeat {
                n: DEEP_MLP_LAYERS,
                block: Box::new(layer),
            },
        )]),
    )
}

/// engine.md §10.1's MLP: `fc1`, `relu1`, `fc2`, … `fcN` (no ReLU after
/// the last Linear) on `[B, dims[0]]` float inputs; `inplace_relu`:
/// `nn.ReLU(inplace=True)`.
pub fn mlp(dims: &[u64], inplace_relu: bool) -> LangModel {
    let mut net = Vec::new();
    let last = dims.len().saturating_sub(2);
    for (i, w) in dims.windows(2).enumerate() {
        net.push(named(
            &format!("fc{}", i + 1),
            Module::Linear {
                input: w[0],
                out: w[1],
                bias: true,
            },
        ));
        if i < last {
            let relu = if inplace_relu {
                Module::InplaceReLU
            } else {
                Module::ReLU
            };
            net.push(named(&format!("relu{}", i + 1), relu));
        }
    }
    LangModel::new(
        ModelInput::Features(dims.first().copied().unwrap_or(1)),
        Module::Sequential(net),
    )
}

/// One `nn.Linear(in, out, bias)` as the whole model (engine.md §12's
/// golden trace): its parameters have the root's path.
pub fn linear(input: u64, out: u64, bias: bool) -> LangModel {
    LangModel::new(
        ModelInput::Features(input),
        Module::Linear { input, out, bias },
    )
}
