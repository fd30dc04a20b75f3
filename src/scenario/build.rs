//! A scenario turned into what the engine runs: its config, model, optimizer
//! and program.

use std::sync::Arc;

use super::conditions::Conditions;
use super::format::{Criterion, LayerSpec, ModelSpec, Scenario};
use super::steps::StepSites;
use crate::engine::{EngineConfig, LossKind, ModelConfig, ModelKind, OptimizerConfig, Program};

#[derive(Debug, Clone)]
pub struct Built {
    /// What the run is under: the GPU, its memory, the release, the environment.
    pub conditions: Conditions,
    pub engine: EngineConfig,
    pub model: ModelConfig,
    pub optimizer: OptimizerConfig,
    pub program: Program,
    /// Where each step is written and what it stands for (empty until
    /// the loader, which has the text, fills it in).
    pub steps: Arc<StepSites>,
}

/// The preset names a scenario may use ([`ModelConfig::preset`] also takes
/// engine.md §10.4's `resnet-basic` for `resnet18`).
pub const PRESETS: [&str; 6] = [
    "mlp-mnist",
    "gpt2-small",
    "gpt-tiny",
    "lstm-lm-ptb",
    "lstm-lm-medium",
    "resnet18",
];

/// `Linear(a,b), ReLU, Linear(b,c), …` as MLP widths; `None` if not that shape.
pub(crate) fn layers_to_dims(layers: &[LayerSpec]) -> Result<Vec<u64>, String> {
    let mut dims = Vec::new();
    let mut expect_linear = true;
    for (i, layer) in layers.iter().enumerate() {
        match (layer, expect_linear) {
            (LayerSpec::Linear(a, b), true) => {
                if let Some(&last) = dims.last() {
                    if last != *a {
                        return Err(format!("layer {i}: Linear({a}, {b}) takes {a} features but the layer before gives {last}"));
                    }
                } else {
                    dims.push(*a);
                }
                dims.push(*b);
                expect_linear = false;
            }
            (LayerSpec::ReLU, false) => expect_linear = true,
            (LayerSpec::ReLU, true) => return Err(format!("layer {i}: ReLU must follow a Linear")),
            (LayerSpec::Linear(..), false) => {
                return Err(format!("layer {i}: put a ReLU between two Linear layers"))
            }
        }
    }
    if dims.len() < 2 || expect_linear {
        return Err("layers must start and end with a Linear".to_string());
    }
    Ok(dims)
}

pub(crate) fn model_config(s: &Scenario) -> Result<ModelConfig, String> {
    let mut model = match &s.model {
        ModelSpec::Preset(name) => ModelConfig::preset(name).ok_or_else(|| {
            format!(
                "unknown preset \"{name}\"; presets are {}",
                PRESETS.join(", ")
            )
        })?,
        ModelSpec::Mlp { dims, inplace_relu } => {
            let mut m = ModelConfig::mlp_mnist();
            m.kind = ModelKind::Mlp {
                dims: dims.clone(),
                inplace_relu: *inplace_relu,
            };
            m
        }
        ModelSpec::Layers(layers) => {
            let mut m = ModelConfig::mlp_mnist();
            m.kind = ModelKind::Mlp {
                dims: layers_to_dims(layers)?,
                inplace_relu: false,
            };
            m
        }
        ModelSpec::Gpt {
            layers,
            heads,
            width,
            vocab,
            block_size,
            dropout,
            checkpoint,
            checkpoint_segments,
            checkpoint_reentrant,
        } => {
            let mut m =
                ModelConfig::gpt(*layers, *heads, *width, *vocab, *block_size, 8, *block_size);
            if let ModelKind::Gpt2 {
                dropout: d,
                checkpoint: c,
                checkpoint_segments: segs,
                checkpoint_reentrant: reentrant,
                ..
            } = &mut m.kind
            {
                *d = *dropout;
                *c = *checkpoint;
                *segs = *checkpoint_segments;
                *reentrant = *checkpoint_reentrant;
            }
            m
        }
        ModelSpec::LstmLm {
            vocab,
            emb,
            hidden,
            layers,
            bptt,
            dropout,
            cudnn,
        } => {
            let mut m = ModelConfig::lstm_lm_ptb();
            m.kind = ModelKind::LstmLm {
                vocab: *vocab,
                emb: *emb,
                hidden: *hidden,
                layers: *layers,
                bptt: *bptt,
                dropout: *dropout,
                cudnn: *cudnn,
            };
            m
        }
        ModelSpec::ResNet18 { classes, image } => {
            let mut m = ModelConfig::resnet18(32);
            m.kind = ModelKind::ResNet {
                blocks: [2, 2, 2, 2],
                num_classes: *classes,
                image: *image,
            };
            m
        }
    };
    if let Some(b) = s.data.batch {
        model.batch = b;
    }
    if let Some(dtype) = s.model_dtype {
        model.param_dtype = dtype;
    }
    if let Some(c) = s.criterion {
        if !matches!(model.kind, ModelKind::Mlp { .. } | ModelKind::ResNet { .. }) {
            return Err(
                "criterion: applies to classifiers with a [batch, classes] output (MLP, ResNet); this model has its own loss".into(),
            );
        }
        model.loss = match c {
            Criterion::CrossEntropy => LossKind::CrossEntropy,
            Criterion::Mse => LossKind::Mse,
            Criterion::Bce => LossKind::Bce,
            Criterion::BceWithLogits => LossKind::BceWithLogits,
        };
    }
    let longest = s.data.seq_schedule.iter().chain(&s.data.seq).max();
    match (&mut model.kind, longest) {
        (_, None) => {}
        (ModelKind::Gpt2 { seq, block_size, .. }, Some(&t)) => {
            if t > *block_size {
                return Err(format!(
                    "data: sequence length {t} is longer than the model's block_size {block_size}"
                ));
            }
            *seq = s.data.seq.unwrap_or(*seq);
        }
        (ModelKind::LstmLm { bptt, .. }, Some(_)) => *bptt = s.data.seq.unwrap_or(*bptt),
        (_, Some(_)) => {
            return Err(
                "data: seq and seq_schedule apply to GPT and LSTM models only (this model has no sequence length)"
                    .into(),
            )
        }
    }
    Ok(model)
}

/// What the engine runs for `s` under `conditions`, whose settings `engine`
/// already holds.
pub(crate) fn build(
    s: &Scenario,
    conditions: Conditions,
    engine: EngineConfig,
) -> Result<Built, String> {
    let mut engine = engine;
    engine.alloc_conf = s.alloc_conf.clone();
    let model = model_config(s)?;
    let optimizer = s.optimizer.clone().unwrap_or_default();
    let epochs = s.epochs.unwrap_or(1).max(1);
    let program = Program {
        setup: s.setup.clone(),
        steps: s.steps.clone(),
        iterations: s.iterations.saturating_mul(epochs),
        batch_sizes: s.data.batch_schedule.clone(),
        seq_lens: s.data.seq_schedule.clone(),
        epoch_len: s.iterations,
    };
    Ok(Built {
        conditions,
        engine,
        model,
        optimizer,
        program,
        steps: Arc::default(),
    })
}
