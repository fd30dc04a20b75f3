//! PEFT's `prepare_model_for_kbit_training(model)` (peft 0.21.2,
//! `utils/other.py:158-258`; models.md §13.4) on a built model, and the
//! gradient checkpointing it turns on.

use super::build::LangNet;
use super::spec::Module;
use crate::engine::dtype::DType;
use crate::engine::error::Result;
use crate::engine::tensor::TensorId;
use crate::engine::Engine;

/// `model.gradient_checkpointing_enable()`: every decoder layer runs
/// through `torch.utils.checkpoint` (transformers' `GradientCheckpointingLayer`),
/// non-reentrant as current transformers calls it (models.md §9.3).
pub fn checkpoint_layers(net: &Module) -> Module {
    match net {
        Module::Sequential(children) => Module::Sequential(
            children
                .iter()
                .map(|(n, c)| (n.clone(), checkpoint_layers(c)))
                .collect(),
        ),
        Module::Repeat { n, block } => Module::Repeat {
            n: *n,
            block: Box::new(checkpoint_layers(block)),
        },
        layer if layer.hf_checkpoint_layer() => Module::Checkpoint {
            module: Box::new(layer.clone()),
            reentrant: true,
        },
        other => other.clone(),
    }
}

impl LangNet {
    /// The rest of `prepare_model_for_kbit_training`, in its order: every
    /// parameter frozen (other.py:193-195); every fp16/bf16 parameter that
    /// is not a `Params4bit` cast to fp32 (`param.data =
    /// param.data.to(torch.float32)`, other.py:204-209: norms, embeddings,
    /// the head, biases; int8 weights are not half and stay); then
    /// `torch.cuda.empty_cache()` (`auto_clear_cache`, other.py:214-216); then,
    /// with the default `gradient_checkpointing_kwargs` (no `use_reentrant`),
    /// `enable_input_require_grads()` (other.py:229-233): the input
    /// embeddings' output requires grad, so the first layer records.
    pub(crate) fn prepare_kbit(&mut self, e: &mut Engine, params: &[TensorId]) -> Result<()> {
        for p in params {
            e.t_mut(*p).requires_grad = false;
        }
        for p in params {
            if e.dtype(*p).is_half() && !e.bnb.weights.contains_key(p) {
                e.param_data_to(*p, DType::F32)?;
            }
        }
        e.empty_cache();
        self.input_grads = self.embedding;
        Ok(())
    }
}
