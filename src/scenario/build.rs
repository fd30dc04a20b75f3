//! A scenario turned into what the engine runs: its config, model, optimizer
//! and program.

use std::sync::Arc;

use super::conditions::Conditions;
use super::format::{Criterion, LayerSpec, ModelSpec, Scenario};
use super::steps::StepSites;
use crate::engine::hf_config::HfConfigError;
use crate::engine::model_lang::{LangModel, ModelError, ModelInput, Seg};
use crate::engine::{
    Engine, EngineConfig, EngineError, LossKind, ModelConfig, ModelKind, OptimizerConfig, Program,
    PRESET_CATALOGUE,
};

/// Why a scenario cannot be built, with the scenario field it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// A model in the language the build refuses (inside `model`).
    #[error("model: {0}")]
    Model(ModelError),
    /// A field's value, with the path of the field from the scenario's root.
    #[error("{message}")]
    Field { path: Vec<Seg>, message: String },
    /// `Layers([...])` that is not an MLP.
    #[error("model: {0}")]
    Layers(LayersError),
    #[error("{0}")]
    HfConfig(#[from] HfConfigError),
    /// Building the model to resolve `freeze` failed.
    #[error("model.freeze: {0}")]
    Freeze(EngineError),
    /// Building the model to resolve `dtypes` failed.
    #[error("model.dtypes: {0}")]
    Dtypes(EngineError),
}

impl BuildError {
    fn at(path: &[&'static str], message: impl Into<String>) -> BuildError {
        BuildError::Field {
            path: path.iter().map(|f| Seg::Field(f)).collect(),
            message: message.into(),
        }
    }

    /// Where in the scenario's value the error is, from its root.
    pub fn path(&self) -> Vec<Seg> {
        match self {
            BuildError::Model(e) => [vec![Seg::Field("model")], e.path()].concat(),
            BuildError::Field { path, .. } => path.clone(),
            // `Layers([…])`: the list, then the layer.
            BuildError::Layers(e) => match e.index() {
                Some(i) => vec![Seg::Field("model"), Seg::Index(0), Seg::Index(i)],
                None => vec![Seg::Field("model")],
            },
            BuildError::HfConfig(_) => vec![Seg::Field("model")],
            BuildError::Freeze(_) => vec![Seg::Field("model"), Seg::Field("freeze")],
            BuildError::Dtypes(_) => vec![Seg::Field("model"), Seg::Field("dtypes")],
        }
    }
}

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

/// Why `Layers([...])` is not an MLP: the index of the layer at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayersError {
    #[error("layer {index}: Linear({input}, {out}) takes {input} features but the layer before gives {before}")]
    Widths {
        index: usize,
        input: u64,
        out: u64,
        before: u64,
    },
    #[error("layer {0}: ReLU must follow a Linear")]
    ReluFirst(usize),
    #[error("layer {0}: put a ReLU between two Linear layers")]
    TwoLinears(usize),
    #[error("layers must start and end with a Linear")]
    Ends,
}

impl LayersError {
    /// The layer at fault, when one is.
    fn index(&self) -> Option<usize> {
        match self {
            LayersError::Widths { index, .. }
            | LayersError::ReluFirst(index)
            | LayersError::TwoLinears(index) => Some(*index),
            LayersError::Ends => None,
        }
    }
}

/// `Linear(a,b), ReLU, Linear(b,c), …` as MLP widths.
pub(crate) fn layers_to_dims(layers: &[LayerSpec]) -> Result<Vec<u64>, BuildError> {
    layer_dims(layers).map_err(BuildError::Layers)
}

fn layer_dims(layers: &[LayerSpec]) -> Result<Vec<u64>, LayersError> {
    let mut dims = Vec::new();
    let mut expect_linear = true;
    for (i, layer) in layers.iter().enumerate() {
        match (layer, expect_linear) {
            (LayerSpec::Linear(a, b), true) => {
                if let Some(&last) = dims.last() {
                    if last != *a {
                        return Err(LayersError::Widths {
                            index: i,
                            input: *a,
                            out: *b,
                            before: last,
                        });
                    }
                } else {
                    dims.push(*a);
                }
                dims.push(*b);
                expect_linear = false;
            }
            (LayerSpec::ReLU, false) => expect_linear = true,
            (LayerSpec::ReLU, true) => return Err(LayersError::ReluFirst(i)),
            (LayerSpec::Linear(..), false) => return Err(LayersError::TwoLinears(i)),
        }
    }
    if dims.len() < 2 || expect_linear {
        return Err(LayersError::Ends);
    }
    Ok(dims)
}

pub(crate) fn model_config(s: &Scenario) -> Result<ModelConfig, BuildError> {
    let mut model = match &s.model {
        ModelSpec::Preset(name) => ModelConfig::preset(name).ok_or_else(|| {
            let names: Vec<&str> = PRESET_CATALOGUE.iter().map(|p| p.name).collect();
            BuildError::Field {
                // `Preset("name")`: the name.
                path: vec![Seg::Field("model"), Seg::Index(0)],
                message: format!(
                    "model: unknown preset \"{name}\"; presets are {}",
                    names.join(", ")
                ),
            }
        })?,
        ModelSpec::Mlp { dims, inplace_relu } => ModelConfig::mlp(dims, *inplace_relu),
        ModelSpec::Layers(layers) => ModelConfig::mlp(&layers_to_dims(layers)?, false),
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
        ModelSpec::Modules {
            input,
            net,
            freeze,
            dtypes,
            lora,
            quantization,
            kbit_training,
        } => ModelConfig::modules(
            LangModel {
                input: input.clone(),
                net: net.clone(),
                freeze: freeze.clone(),
                dtypes: dtypes.clone(),
                lora: lora.clone(),
                quantization: quantization.clone(),
                kbit_training: *kbit_training,
            },
            32,
        ),
        ModelSpec::HfConfig(path) => crate::engine::hf_config::read(std::path::Path::new(path))?,
        ModelSpec::ResNet18 { classes, image } => ModelConfig::resnet18_for(*classes, *image, 32),
    };
    if let Some(b) = s.data.batch {
        model.batch = b;
    }
    if let Some(dtype) = s.model_dtype {
        model.param_dtype = dtype;
    }
    if let Some(c) = s.criterion {
        if !matches!(model.kind, ModelKind::Modules(_)) {
            return Err(BuildError::at(
                &["criterion"],
                "criterion: applies to classifiers with a [batch, classes] output (MLP, ResNet) and to Modules models; this model has its own loss",
            ));
        }
        model.loss = match c {
            Criterion::CrossEntropy => LossKind::CrossEntropy,
            Criterion::Mse => LossKind::Mse,
            Criterion::Bce => LossKind::Bce,
            Criterion::BceWithLogits => LossKind::BceWithLogits,
            Criterion::Sum => LossKind::Sum,
            Criterion::CausalLm => LossKind::HfCausalLm,
        };
    }
    let longest = s.data.seq_schedule.iter().chain(&s.data.seq).max();
    match (&mut model.kind, longest) {
        (_, None) => {}
        (ModelKind::Gpt2 { seq, block_size, .. }, Some(&t)) => {
            if t > *block_size {
                return Err(BuildError::at(
                    &["data", "seq"],
                    format!("data: sequence length {t} is longer than the model's block_size {block_size}"),
                ));
            }
            *seq = s.data.seq.unwrap_or(*seq);
        }
        (ModelKind::LstmLm { bptt, .. }, Some(_)) => *bptt = s.data.seq.unwrap_or(*bptt),
        (
            ModelKind::Modules(LangModel {
                input: ModelInput::Tokens { seq },
                ..
            }),
            Some(_),
        ) => *seq = s.data.seq.unwrap_or(*seq),
        (_, Some(_)) => {
            return Err(BuildError::at(
                &["data"],
                "data: seq and seq_schedule apply to GPT and LSTM models only, and to Modules models with a Tokens input (this model has no sequence length)",
            ))
        }
    }
    if let ModelKind::Modules(m) = &model.kind {
        let kv = scenario_kv_path(s);
        // Every batch size and length the run will use must fit the modules.
        let batches = s.data.batch_schedule.iter().chain([&model.batch]);
        for &b in batches {
            for seq in s.data.seq_schedule.iter().map(|t| Some(*t)).chain([None]) {
                m.check_under(b, seq, kv).map_err(BuildError::Model)?;
            }
        }
        let room = EngineConfig {
            device_bytes: 1 << 50,
            ..EngineConfig::default()
        };
        if !m.dtypes.is_empty() {
            // Each dtypes path must name parameters: build the model (with
            // nothing frozen, so an error is the dtypes') to see.
            let mut unfrozen = model.clone();
            if let ModelKind::Modules(u) = &mut unfrozen.kind {
                u.freeze.clear();
            }
            Engine::new(room.clone(), &unfrozen, &OptimizerConfig::default()).map_err(
                |e| match e {
                    EngineError::Model(m) => BuildError::Model(m),
                    e => BuildError::Dtypes(e),
                },
            )?;
        }
        if !m.freeze.is_empty() {
            // Each freeze path must name parameters: build the model to see.
            Engine::new(room, &model, &OptimizerConfig::default()).map_err(|e| match e {
                EngineError::Model(m) => BuildError::Model(m),
                e => BuildError::Freeze(e),
            })?;
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
) -> Result<Built, BuildError> {
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

/// `s` at one point of a batch sweep: `data.batch` set to `batch` (and
/// `data.seq` to `seq` when given), built under `built`'s conditions and
/// engine settings. Schedules give way to the point's fixed values, and the
/// narration and expectations are dropped: they were written for the
/// scenario's own batch.
pub fn at_point(
    s: &Scenario,
    built: &Built,
    batch: u64,
    seq: Option<u64>,
) -> Result<(Scenario, Built), BuildError> {
    let mut point = s.clone();
    point.data.batch = Some(batch);
    point.data.batch_schedule.clear();
    if seq.is_some() {
        point.data.seq = seq;
        point.data.seq_schedule.clear();
    }
    point.narration.clear();
    point.expect.clear();
    if let Some(problem) = super::dims::problems(&point.model, &point.data)
        .into_iter()
        .next()
    {
        return Err(BuildError::at(&["data"], problem));
    }
    let mut rebuilt = build(&point, built.conditions.clone(), built.engine.clone())?;
    rebuilt.steps = built.steps.clone();
    Ok((point, rebuilt))
}

/// Whether the model has a sequence length a sweep may set (GPT's T, an
/// LSTM's BPTT length, a token-input Modules model's length).
pub fn has_seq(built: &Built) -> bool {
    matches!(
        built.model.kind,
        ModelKind::Gpt2 { .. }
            | ModelKind::LstmLm { .. }
            | ModelKind::Modules(LangModel {
                input: ModelInput::Tokens { .. },
                ..
            })
    )
}

/// How the scenario's releases (`torch:`, `transformers:`; load checked
/// both) hand grouped k and v to SDPA.
fn scenario_kv_path(s: &Scenario) -> crate::engine::config::KvPath {
    let torch = s
        .torch
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(crate::alloc::TorchVersion::DEFAULT);
    let transformers = s.transformers.as_deref().and_then(|v| v.parse().ok());
    crate::engine::config::kv_path(transformers, torch)
}
