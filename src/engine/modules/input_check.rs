//! What each model's forward accepts, checked before the first op with the
//! error PyTorch would raise: a scenario may feed any tensor it bound (a
//! buffer, another model's output) to `Forward`.

use super::Model;
use crate::engine::dtype::DType;
use crate::engine::error::{EngineError, Result};
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
            ModelKind::Mlp { dims: widths, .. } => {
                let (fin, fout) = (widths.first(), widths.get(1));
                linear_input(
                    dims,
                    dtype,
                    weight,
                    mismatch,
                    *fin.unwrap_or(&0),
                    *fout.unwrap_or(&0),
                )
            }
            ModelKind::Linear {
                in_features,
                out_features,
                ..
            } => linear_input(dims, dtype, weight, mismatch, *in_features, *out_features),
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
                m.check_input(x)
                    .map(|_| ())
                    .map_err(|e| EngineError::Runtime(e.to_string()))
            }
            ModelKind::ResNet { .. } => {
                if dims.len() != 4 {
                    return runtime(format!(
                        "Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of size: {shape}"
                    ));
                }
                if !dtype.is_floating() || mismatch {
                    return runtime(format!(
                        "Input type ({}) and weight type ({}) should be the same",
                        dtype.cuda_type_name(),
                        weight.cuda_type_name()
                    ));
                }
                if dims[1] != 3 {
                    return runtime(format!(
                        "Given groups=1, weight of size [64, 3, 7, 7], expected input{shape} to have 3 channels, but got {} channels instead",
                        dims[1]
                    ));
                }
                if dims[2] < 32 || dims[3] < 32 {
                    return runtime(format!(
                        "Given input size {shape}: ResNet-18 downsamples by 32, so the output size is too small"
                    ));
                }
                Ok(())
            }
        }
    }
}

/// `F.linear(x, W)`: x at least 1-D, of W's dtype (`mismatch`: it is not,
/// outside autocast), last dimension `in_features`.
fn linear_input(
    dims: &[u64],
    dtype: DType,
    weight: DType,
    mismatch: bool,
    fin: u64,
    fout: u64,
) -> Result<()> {
    let runtime = |m: String| Err(EngineError::Runtime(m));
    let Some(&k) = dims.last() else {
        return runtime(
            "both arguments to linear need to be at least 1D, but they are 0D and 2D".into(),
        );
    };
    if !dtype.is_floating() || mismatch {
        return runtime(format!(
            "expected m1 and m2 to have the same dtype, but got: {} != {}",
            dtype.scalar_name(),
            weight.scalar_name()
        ));
    }
    if k != fin {
        let rows = dims[..dims.len() - 1]
            .iter()
            .fold(1, |n: u64, &d| n.saturating_mul(d));
        return runtime(format!(
            "mat1 and mat2 shapes cannot be multiplied ({rows}x{k} and {fin}x{fout})"
        ));
    }
    Ok(())
}
