//! cuDNN convolution workspaces as measured on a GPU (engine.md §1.6).
//!
//! Without `torch.backends.cudnn.benchmark`, PyTorch asks cuDNN's heuristics
//! for an execution plan per convolution shape and runs the first that works
//! (`get_configs_from_heuristics`, `try_configs` in
//! aten/src/ATen/native/cudnn/Conv_v8.cpp); `run_conv_plan` then allocates
//! `plan.getWorkspaceSize()` bytes through the caching allocator for the call
//! and frees them after. Which plan the heuristics pick, and so its
//! workspace, is decided inside cuDNN: a scenario measured on a GPU carries
//! the sizes per shape, and the engine estimates the rest.

use serde::{Deserialize, Serialize};

use super::dtype::DType;

/// One convolution shape's workspaces, in bytes, as a capture measured them.
/// A direction left out was not measured (the capture never ran it): the
/// engine's estimate stands in. 0 is a measurement: the plan needs no
/// workspace, and `allocate(0)` makes no request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConvWorkspace {
    /// `x` [N, C, H, W].
    pub input: [u64; 4],
    /// `w` [Cout, C, kh, kw].
    pub weight: [u64; 4],
    pub stride: u64,
    pub pad: u64,
    /// The dtype the convolution runs in (after autocast).
    #[serde(default = "f32_dtype")]
    pub dtype: DType,
    /// `cudnn_convolution` (forward).
    #[serde(default)]
    pub forward: Option<u64>,
    /// `cudnn_convolution_backward_input`.
    #[serde(default)]
    pub grad_input: Option<u64>,
    /// `cudnn_convolution_backward_weight`.
    #[serde(default)]
    pub grad_weight: Option<u64>,
}

fn f32_dtype() -> DType {
    DType::F32
}

/// The workspaces one convolution call takes: forward, then backward per
/// input (x, w, bias).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConvWorkspaces {
    pub(crate) forward: u64,
    pub(crate) backward: [u64; 3],
}

/// The convolution's workspaces: measured ones where the table has this
/// shape, else the estimate min(cap, input bytes) for each cuDNN direction
/// (engine.md §1.6). The bias gradient takes none either way:
/// `convolution_backward` sums `grad_output` for it outside cuDNN
/// (aten/src/ATen/native/Convolution.cpp).
pub(crate) fn conv_workspaces(
    table: &[ConvWorkspace],
    key: (&[u64; 4], &[u64; 4], u64, u64, DType),
    estimate: u64,
) -> ConvWorkspaces {
    let (input, weight, stride, pad, dtype) = key;
    let found = table.iter().find(|c| {
        &c.input == input
            && &c.weight == weight
            && c.stride == stride
            && c.pad == pad
            && c.dtype == dtype
    });
    match found {
        Some(c) => ConvWorkspaces {
            forward: c.forward.unwrap_or(estimate),
            backward: [
                c.grad_input.unwrap_or(estimate),
                c.grad_weight.unwrap_or(estimate),
                0,
            ],
        },
        None => ConvWorkspaces {
            forward: estimate,
            backward: [estimate, estimate, 0],
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> ConvWorkspace {
        ConvWorkspace {
            input: [32, 64, 56, 56],
            weight: [128, 64, 1, 1],
            stride: 2,
            pad: 0,
            dtype: DType::F32,
            forward: Some(0),
            grad_input: None,
            grad_weight: Some(41_484_432),
        }
    }

    #[test]
    fn a_measured_shape_takes_its_sizes_and_the_estimate_where_unmeasured() {
        let key = (&[32, 64, 56, 56], &[128, 64, 1, 1], 2, 0, DType::F32);
        let got = conv_workspaces(&[entry()], key, 7);
        assert_eq!(got.forward, 0);
        assert_eq!(got.backward, [7, 41_484_432, 0]);
    }

    #[test]
    fn another_stride_dtype_or_batch_is_another_shape() {
        let table = [entry()];
        for key in [
            (&[32, 64, 56, 56], &[128, 64, 1, 1], 1, 0, DType::F32),
            (&[32, 64, 56, 56], &[128, 64, 1, 1], 2, 0, DType::F16),
            (&[16, 64, 56, 56], &[128, 64, 1, 1], 2, 0, DType::F32),
        ] {
            let got = conv_workspaces(&table, key, 7);
            assert_eq!((got.forward, got.backward), (7, [7, 7, 0]), "{key:?}");
        }
    }
}
