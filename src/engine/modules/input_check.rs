//! What each model's forward accepts, checked before the first op with the
//! error PyTorch would raise: a scenario may feed any tensor it bound (a
//! buffer, another model's output) to `Forward`.

use super::Model;
use crate::engine::dtype::DType;
use crate::engine::error::{EngineError, Result};
use crate::engine::model_lang::kinds::Fed;
use crate::engine::presets::ModelKind;
use crate::engine::tensor::TensorId;
use crate::engine::Engine;

impl Model {
    pub(crate) fn check_input(&self, e: &Engine, x: TensorId) -> Result<()> {
        let (shape, dtype) = (e.shape(x), e.dtype(x));
        let dims = shape.dims();
        let runtime = |m: String| Err(EngineError::Runtime(m));
        let indices = || {
            runtime(format!(
                "Expected tensor for argument #1 'indices' to have one of the following scalar \
                 types: Long, Int; but got {} instead (while checking arguments for embedding)",
                dtype.cuda_type_name()
            ))
        };
        let integer = matches!(dtype, DType::I64 | DType::I32);
        // Under autocast the matmul and conv inputs are cast to one dtype first.
        let weight = self.cfg.param_dtype;
        let mismatch = e.amp.dtype.is_none() && dtype.is_floating() && dtype != weight;
        match &self.cfg.kind {
            ModelKind::Gpt2 { block_size, .. } => {
                // nanoGPT: `b, t = idx.size()`.
                if dims.len() < 2 {
                    return Err(EngineError::Value(format!(
                        "not enough values to unpack (expected 2, got {})",
                        dims.len()
                    )));
                }
                if dims.len() > 2 {
                    return Err(EngineError::Value(
                        "too many values to unpack (expected 2)".into(),
                    ));
                }
                if !integer {
                    return indices();
                }
                if dims[1] > *block_size {
                    return runtime(format!(
                        "Cannot forward sequence of length {}, block size is only {block_size}",
                        dims[1]
                    ));
                }
                Ok(())
            }
            ModelKind::LstmLm { .. } => {
                if !integer {
                    return indices();
                }
                if dims.len() != 2 {
                    // The example's batches are (seq_len, batch) token ids; other
                    // ranks break its hidden state or decoder view.
                    return runtime(format!(
                        "the LSTM language model takes token ids of shape (seq_len, batch), got {shape}"
                    ));
                }
                Ok(())
            }
            ModelKind::Modules(m) => {
                let fed = Fed {
                    dims,
                    shape: shape.to_string(),
                    dtype,
                    weight,
                    mismatch,
                };
                if let Some(said) = m.first_module().pytorch_refusal(&fed) {
                    return runtime(said);
                }
                let x = crate::engine::model_lang::Sig {
                    dims: dims.to_vec(),
                    ids: !dtype.is_floating(),
                };
                if mismatch {
                    return runtime(format!(
                        "the model's input is {} but its weights are {}",
                        dtype.cuda_type_name(),
                        weight.cuda_type_name()
                    ));
                }
                m.check_input(x, e.cfg.hf_kv_path())
                    .map(|_| ())
                    .map_err(|e| EngineError::Runtime(e.to_string()))
            }
        }
    }
}
