//! What `vramscope model` reports: parameters (total, trainable, per module),
//! buffers, bytes per dtype, and the activation bytes autograd saves per
//! sample, measured by one forward pass at batch 1 through the engine.

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};

use super::dtype::DType;
use super::error::Result;
use super::tag::Category;
use super::{Engine, EngineConfig, ModelConfig, OptimizerConfig, Program, StorageId};

/// Where saved bytes that no module allocated (the input batch) are listed.
pub const INPUT_ROW: &str = "(input)";

/// One module that owns parameters or allocated saved activations.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ModuleRow {
    /// Its path (`layer1.0.conv1`; `(model)` for the root, `(input)` for the batch).
    pub module: String,
    pub parameters: u64,
    pub trainable_parameters: u64,
    /// Bytes of saved-for-backward storages its ops allocated, at batch 1.
    pub saved_bytes_per_sample: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ModelSummary {
    pub parameters: u64,
    pub trainable_parameters: u64,
    /// Parameter tensors.
    pub parameter_tensors: u64,
    /// Buffer tensors (BatchNorm running statistics and counters).
    pub buffers: u64,
    pub buffer_bytes: u64,
    /// Parameter and buffer bytes by dtype (`float32`, `int64`, …); a
    /// bitsandbytes weight under its format (`nf4 packed (uint8)`, `int8`)
    /// and its quantisation state under `quant state`.
    pub bytes_by_dtype: BTreeMap<String, u64>,
    /// The trainable parameters' bytes by dtype.
    pub trainable_bytes_by_dtype: BTreeMap<String, u64>,
    /// Saved-for-backward activation bytes after one forward at batch 1.
    pub saved_bytes_per_sample: u64,
    /// Inputs that checkpoint regions keep for their recomputation (not
    /// saved by any Node, so not in `saved_bytes_per_sample`).
    pub checkpoint_input_bytes: u64,
    /// The input that forward took (`[1, 3, 224, 224]`).
    pub sample_input: Vec<u64>,
    pub modules: Vec<ModuleRow>,
}

impl ModelSummary {
    /// Build `model` on a simulated device large enough for it, run
    /// `x = next(batches); out = model(x)` at batch 1, and read the result.
    pub fn measure(model: &ModelConfig) -> Result<ModelSummary> {
        ModelSummary::measure_with(model, EngineConfig::default())
    }

    /// As [`ModelSummary::measure`], under a scenario's engine switches
    /// (which change what is saved: `hf_rmsnorm`, `bnb_keeps_input`, …).
    pub fn measure_with(model: &ModelConfig, engine: EngineConfig) -> Result<ModelSummary> {
        let mut cfg = model.clone();
        cfg.batch = 1;
        let engine_cfg = EngineConfig {
            device_bytes: 1 << 50,
            device_overhead: 0,
            ..engine
        };
        let mut e = Engine::new(engine_cfg, &cfg, &OptimizerConfig::default())?;
        let program = Program {
            steps: Program::forward_steps()[..2].to_vec(),
            ..Program::training(1)
        };
        e.run_iteration(&program)?;
        Ok(e.summary())
    }

    fn row<'a>(rows: &'a mut FxHashMap<String, ModuleRow>, module: &str) -> &'a mut ModuleRow {
        rows.entry(module.to_string()).or_insert_with(|| ModuleRow {
            module: module.to_string(),
            parameters: 0,
            trainable_parameters: 0,
            saved_bytes_per_sample: 0,
        })
    }
}

impl Engine {
    fn summary(&self) -> ModelSummary {
        let mut rows: FxHashMap<String, ModuleRow> = FxHashMap::default();
        let mut by_dtype: BTreeMap<String, u64> = BTreeMap::new();
        let mut trainable_by_dtype: BTreeMap<String, u64> = BTreeMap::new();
        let (mut total, mut trainable) = (0, 0);
        let params = self.parameters();
        for &p in &params {
            let n = self.param_numel(p);
            let train = if self.requires_grad(p) { n } else { 0 };
            total += n;
            trainable += train;
            let path = display(&self.param_module(p));
            let row = ModelSummary::row(&mut rows, &path);
            row.parameters += n;
            row.trainable_parameters += train;
            let (name, state) = self.param_format(p);
            *by_dtype.entry(name.clone()).or_default() += self.nbytes(p);
            if state > 0 {
                *by_dtype.entry(QUANT_STATE.to_string()).or_default() += state;
            }
            if train > 0 {
                *trainable_by_dtype.entry(name).or_default() += self.nbytes(p);
            }
        }
        let buffers: Vec<_> = self
            .model
            .as_ref()
            .map(|m| m.buffers.iter().map(|(_, t)| *t).collect())
            .unwrap_or_default();
        let mut buffer_bytes = 0;
        for &b in &buffers {
            buffer_bytes += self.nbytes(b);
            *by_dtype.entry(dtype_name(self.dtype(b))).or_default() += self.nbytes(b);
        }
        let saved = self.saved_activation_storages();
        let mut saved_total = 0;
        let ls = self.held_state();
        for id in saved {
            let Some(st) = ls.storage(id) else { continue };
            let module = if st.category == Category::Input {
                INPUT_ROW.to_string()
            } else {
                self.tag_info(st.tag)
                    .map_or_else(|| display(""), |t| display(&t.module))
            };
            saved_total += st.bytes;
            ModelSummary::row(&mut rows, &module).saved_bytes_per_sample += st.bytes;
        }
        let order = |m: &ModuleRow| match m.module.as_str() {
            INPUT_ROW => 0,
            "(model)" => 1,
            path => 2 + self.tags.module_id(path).map_or(u64::MAX - 2, u64::from),
        };
        let mut modules: Vec<ModuleRow> = rows.into_values().collect();
        modules.sort_by_key(order);
        let checkpoint_input_bytes = ls
            .roots
            .iter()
            .filter(|r| r.kind == super::RootKind::CheckpointInput)
            .map(|r| r.bytes)
            .sum();
        let sample_input = self
            .binding_tensor("x")
            .map(|x| self.shape(x).to_vec())
            .unwrap_or_default();
        ModelSummary {
            parameters: total,
            trainable_parameters: trainable,
            parameter_tensors: params.len() as u64,
            buffers: buffers.len() as u64,
            buffer_bytes,
            bytes_by_dtype: by_dtype,
            trainable_bytes_by_dtype: trainable_by_dtype,
            saved_bytes_per_sample: saved_total,
            checkpoint_input_bytes,
            sample_input,
            modules,
        }
    }

    /// Live activation storages (the batch included) that a saved slot holds.
    fn saved_activation_storages(&self) -> Vec<StorageId> {
        let ls = self.held_state();
        let mut seen = FxHashSet::default();
        let mut out = Vec::new();
        for n in &ls.nodes {
            for id in n.saved.iter().filter_map(|s| s.storage) {
                let activation = ls.storage(id).is_some_and(|s| {
                    matches!(
                        s.category,
                        Category::Activation | Category::AutogradSaved | Category::Input
                    )
                });
                if activation && seen.insert(id) {
                    out.push(id);
                }
            }
        }
        out
    }
}

fn display(path: &str) -> String {
    if path.is_empty() {
        "(model)".to_string()
    } else {
        path.to_string()
    }
}

fn dtype_name(d: DType) -> String {
    d.torch_name().to_string()
}

/// The bytes-per-dtype key of a bitsandbytes weight's quantisation state.
pub const QUANT_STATE: &str = "quant state";

impl Engine {
    /// A parameter's format for the bytes-per-dtype table, and the bytes of
    /// its quantisation state (0 for a plain parameter).
    fn param_format(&self, p: super::tensor::TensorId) -> (String, u64) {
        use super::bnb::QuantLayer;
        match self.bnb.weights.get(&p) {
            None => (dtype_name(self.dtype(p)), 0),
            Some(q) => {
                let state = q.state.iter().map(|t| self.nbytes(*t)).sum();
                let name = match q.layer {
                    QuantLayer::FourBit(q4) => format!("{} packed (uint8)", q4.quant_type.name()),
                    QuantLayer::EightBit => "int8".to_string(),
                };
                (name, state)
            }
        }
    }
}
