//! The CUDA rules a traced program's ops follow, taken from the engine's
//! settings for the simulated GPU, the PyTorch release and the program's
//! environment, exactly as a scenario on that GPU gets them
//! (`scenario::apply_conditions`): the cuBLAS and cuBLASLt workspaces
//! (engine.md §1.6) and the SDPA backend (models.md §4.4).

use std::collections::BTreeMap;

use crate::alloc::TorchVersion;
use crate::device::GpuProfile;
use crate::engine::measured::{measured_on, Measured};
use crate::engine::ops::sdpa_select::SdpaCall;
use crate::engine::scratch::reduce::ReduceShape;
use crate::engine::{CublasLtWorkspace, CublasWorkspaceMode, DType, EngineConfig, SdpaBackend};
use crate::scenario::{apply_conditions, Conditions};

/// The aten ops (overload packets) that run a cuBLAS GEMM on the GPU and so
/// take the handle's workspace at their first call on a thread.
pub const GEMM_OPS: [&str; 8] = [
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot",
];

/// Fused SDPA backwards: after their q, k, v gradients each takes the
/// scratch the engine models ([`crate::engine::ops::attention::sdpa_backward_scratch`]).
pub const SDPA_BACKWARDS: [(&str, SdpaBackend); 3] = [
    (
        "_scaled_dot_product_efficient_attention_backward",
        SdpaBackend::Efficient,
    ),
    (
        "_scaled_dot_product_flash_attention_backward",
        SdpaBackend::Flash,
    ),
    (
        "_scaled_dot_product_cudnn_attention_backward",
        SdpaBackend::Cudnn,
    ),
];

/// Outputs that a CUDA kernel keeps on the host, by position: PyTorch's
/// meta kernels make them beside the others, the GPU does not.
/// Memory-efficient attention's philox seed and offset are CPU scalars
/// outside CUDA graph capture ("Note [Seed and Offset Device]";
/// tests/fixtures/pytorch/captured/gpt_dropout).
pub const HOST_OUTPUTS: [(&str, &[usize]); 1] =
    [("_scaled_dot_product_efficient_attention", &[2, 3])];

/// Reductions whose CUDA kernel may split across thread blocks and take a
/// staging buffer and semaphores (engine's `reduce_plan`).
pub const REDUCTIONS: [&str; 4] = ["sum", "mean", "argmax", "argmin"];

/// PyTorch 2.11's CUDA autocast policies (ATen/autocast_mode.h's
/// `AT_FORALL_*` lists, engine.md §6.1), each name both an aten op (the
/// helper applies the policy to the ops a backward formula calls, under the
/// autocast the backward inherited) and the name the helper finds a Python
/// function under (`torch.X`, `torch.Tensor.X`, `torch.nn.functional.X`,
/// `torch._C._nn.X`, `torch.linalg.X`): run in the autocast dtype (weights'
/// casts cached until the region ends), in fp32, in fp32 unless a dtype is
/// given (`fp32_set_opt_dtype`), or in the widest input type.
pub const AUTOCAST_LOWER: [&str; 32] = [
    "_convolution",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "convolution",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "__matmul__",
    "__rmatmul__",
    "einsum",
    "mm",
    "mv",
    "linalg_vecdot",
    "linear",
    "addbmm",
    "baddbmm",
    "bmm",
    "chain_matmul",
    "linalg_multi_dot",
    "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
];
pub const AUTOCAST_FP32: [&str; 55] = [
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow",
    "softplus",
    "layer_norm",
    "native_layer_norm",
    "group_norm",
    "frobenius_norm",
    "nuclear_norm",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
    "upsample_nearest1d",
    "_upsample_nearest_exact1d",
    "upsample_nearest2d",
    "_upsample_nearest_exact2d",
    "upsample_nearest3d",
    "_upsample_nearest_exact3d",
    "upsample_linear1d",
    "upsample_bilinear2d",
    "_upsample_bilinear2d_aa",
    "upsample_trilinear3d",
    "upsample_bicubic2d",
    "_upsample_bicubic2d_aa",
];
pub const AUTOCAST_FP32_UNLESS_DTYPE: [&str; 8] = [
    "prod",
    "softmax",
    "log_softmax",
    "cumprod",
    "cumsum",
    "linalg_vector_norm",
    "linalg_matrix_norm",
    "sum",
];
/// `cat` and `stack` are not on it (they promote by themselves, with no
/// casts).
pub const AUTOCAST_PROMOTE: [&str; 11] = [
    "addcdiv",
    "addcmul",
    "atan2",
    "bilinear",
    "cross",
    "dot",
    "vdot",
    "grid_sampler",
    "index_put",
    "tensordot",
    "scatter_add",
];

/// The autocast policies as the helper reads them, with the message of the
/// op autocast refuses (`binary_cross_entropy`).
pub fn autocast_table() -> serde_json::Value {
    serde_json::json!({
        "lower": &AUTOCAST_LOWER[..],
        "fp32": &AUTOCAST_FP32[..],
        "fp32_unless_dtype": &AUTOCAST_FP32_UNLESS_DTYPE[..],
        "promote": &AUTOCAST_PROMOTE[..],
        "banned": {"binary_cross_entropy": crate::engine::ops::loss::BCE_UNSAFE_TO_AUTOCAST},
    })
}

/// Every op the helper reports after it runs (op name, thread, arguments):
/// the GEMMs, SDPA backwards and reductions, and every planned op (its
/// last stage, [`super::plans::PLANNED_OPS`]).
pub fn after_ops() -> Vec<&'static str> {
    GEMM_OPS
        .iter()
        .copied()
        .chain(SDPA_BACKWARDS.iter().map(|(n, _)| *n))
        .chain(REDUCTIONS.iter().copied())
        .chain(super::plans::PLANNED_OPS.iter().copied())
        .collect()
}

/// A reduction of a contiguous `shape` over `dims` (None: everything) as
/// the engine's [`ReduceShape`]: the reduced dimensions must be leading
/// (a bias gradient) or trailing (a row sum) once size-1 ones are set
/// aside; other patterns are not modelled (None).
pub fn reduce_shape(
    shape: &[u64],
    dims: Option<&[i64]>,
    element_bytes: u64,
) -> Option<ReduceShape> {
    let rank = shape.len() as i64;
    let reduced: Vec<bool> = match dims {
        None => vec![true; shape.len()],
        Some([]) => vec![true; shape.len()],
        Some(d) => {
            let mut r = vec![false; shape.len()];
            for &x in d {
                let i = if x < 0 { x + rank } else { x };
                *r.get_mut(usize::try_from(i).ok()?)? = true;
            }
            r
        }
    };
    let big: Vec<(u64, bool)> = shape
        .iter()
        .zip(&reduced)
        .filter(|(s, _)| **s != 1)
        .map(|(s, r)| (*s, *r))
        .collect();
    let inputs: u64 = big.iter().filter(|(_, r)| *r).map(|(s, _)| s).product();
    let outputs: u64 = big.iter().filter(|(_, r)| !*r).map(|(s, _)| s).product();
    let first_kept = big.iter().position(|(_, r)| !*r).unwrap_or(big.len());
    let leading = big[first_kept..].iter().all(|(_, r)| !*r);
    let last_kept = big.iter().rposition(|(_, r)| !*r);
    let trailing = last_kept.is_none_or(|k| big[..=k].iter().all(|(_, r)| !*r));
    if !(leading || trailing) {
        return None;
    }
    Some(ReduceShape {
        outputs,
        inputs_per_output: inputs,
        contiguous_inputs: outputs == 1 || !leading,
        element_bytes,
    })
}

/// The release whose rules a traced PyTorch follows: its own minor version
/// when modelled (2.0 to 2.15), else the nearest, and a sentence saying so.
pub fn release_of(torch: &str) -> (TorchVersion, String) {
    match torch.parse::<TorchVersion>() {
        Ok(v) => (
            v,
            format!("PyTorch {v}'s rules (the traced program runs PyTorch {torch})"),
        ),
        Err(_) => {
            let minor = torch
                .strip_prefix("2.")
                .and_then(|r| r.split(['.', '+']).next())
                .and_then(|m| m.parse::<u32>().ok());
            let v = match minor {
                Some(m) if m > TorchVersion::NEWEST.0 => TorchVersion::NEWEST,
                Some(_) => TorchVersion::OLDEST,
                None => TorchVersion::DEFAULT,
            };
            (
                v,
                format!("PyTorch {v}'s rules, the nearest modelled release (the traced program runs PyTorch {torch})"),
            )
        }
    }
}

/// The engine's settings for one traced run.
#[derive(Debug, Clone)]
pub struct Rules {
    pub engine: EngineConfig,
    /// cuDNN's choices measured on this GPU and release, if any.
    pub measured: Option<&'static Measured>,
}

impl Rules {
    /// The rules on `gpu` under `version` with the program's environment
    /// (`CUBLAS_WORKSPACE_CONFIG`, `CUBLASLT_WORKSPACE_SIZE`,
    /// `TORCH_CUBLAS_WORKSPACE_CACHE`); an unreadable variable is an error
    /// naming it.
    pub fn new(
        gpu: &GpuProfile,
        version: TorchVersion,
        env: &BTreeMap<String, String>,
        alloc_conf: &str,
    ) -> Result<Rules, String> {
        let conditions = Conditions {
            device_name: gpu.name.to_string(),
            gpu: Some(*gpu),
            capacity: gpu.total_memory,
            overhead: gpu.context_bytes.unwrap_or(0),
            torch: version.to_string(),
            transformers: None,
            env: env
                .iter()
                .filter(|(k, _)| crate::scenario::ENV_KEYS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            capture: None,
            awaiting_capture: None,
            as_shipped: false,
            stated_engine: Vec::new(),
            assumptions: Vec::new(),
        };
        let mut engine = EngineConfig {
            alloc_conf: alloc_conf.to_string(),
            torch_minor: Some(version.0),
            ..EngineConfig::default()
        };
        apply_conditions(&conditions, version, &mut engine).map_err(|(_, why)| why)?;
        Ok(Rules {
            engine,
            measured: measured_on(gpu.name, version),
        })
    }

    pub fn cublas_bytes(&self) -> u64 {
        self.engine.cublas_workspace_bytes()
    }

    pub fn cublas_cached(&self) -> bool {
        self.engine.workspace_mode() == CublasWorkspaceMode::Cached
    }

    pub fn lt_bytes(&self) -> u64 {
        self.engine.cublaslt_workspace_bytes()
    }

    pub fn lt_rule(&self) -> CublasLtWorkspace {
        self.engine.lt_workspace()
    }

    /// The backend PyTorch's dispatcher takes for `call` on this GPU, among
    /// the ones the program left enabled; an explicit `engine.sdpa_backend`
    /// would force one, a traced program forces through `sdpa_kernel`.
    pub fn sdpa_backend(
        &self,
        call: &SdpaCall,
        enabled: impl Fn(SdpaBackend) -> bool,
    ) -> SdpaBackend {
        call.backend_among(self.engine.sdpa_priority(), enabled)
    }
}

/// A dtype as the helper writes it (`float32`); None for one the engine
/// does not model.
pub fn dtype_named(name: &str) -> Option<DType> {
    [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F8,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::U8,
        DType::Bool,
    ]
    .into_iter()
    .find(|d| d.torch_name() == name)
}

/// `flash`, `efficient`, `math`, `cudnn`: the helper's names.
pub fn backend_name(b: SdpaBackend) -> &'static str {
    match b {
        SdpaBackend::Flash => "flash",
        SdpaBackend::Efficient => "efficient",
        SdpaBackend::Math => "math",
        SdpaBackend::Cudnn => "cudnn",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::profile;

    fn h100() -> &'static GpuProfile {
        profile("H100-SXM-80GB").expect("the H100 profile")
    }

    #[test]
    fn the_environment_sets_the_workspaces_as_a_scenario_env_does() {
        let env: BTreeMap<String, String> = [
            ("CUBLAS_WORKSPACE_CONFIG", ":4096:2:16:8"),
            ("CUBLASLT_WORKSPACE_SIZE", "1024"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let r = Rules::new(h100(), TorchVersion(11), &env, "").expect("valid env");
        assert_eq!(r.cublas_bytes(), 2 * 4096 * 1024 + 8 * 16 * 1024);
        assert_eq!(r.lt_bytes(), 1 << 20);
        assert_eq!(r.lt_rule(), CublasLtWorkspace::Cached);
        let bare = Rules::new(h100(), TorchVersion(11), &BTreeMap::new(), "").expect("no env");
        assert_eq!(bare.cublas_bytes(), 32 << 20, "Hopper's own default");
        let old = Rules::new(h100(), TorchVersion(8), &BTreeMap::new(), "").expect("2.8");
        assert_eq!(old.lt_rule(), CublasLtWorkspace::Transient);
    }

    #[test]
    fn a_bad_variable_is_named() {
        let env: BTreeMap<String, String> = [(
            "TORCH_CUBLAS_WORKSPACE_CACHE".to_string(),
            "yes".to_string(),
        )]
        .into();
        let e = Rules::new(h100(), TorchVersion(11), &env, "").expect_err("not 0 or 1");
        assert!(e.contains("TORCH_CUBLAS_WORKSPACE_CACHE"), "{e}");
    }

    #[test]
    fn reductions_read_as_the_engine_reads_them() {
        // A Linear bias gradient: [rows, out] summed over rows.
        let s = reduce_shape(&[1024, 768], Some(&[0]), 4).expect("leading");
        assert_eq!(
            (s.outputs, s.inputs_per_output, s.contiguous_inputs),
            (768, 1024, false)
        );
        // keepdim and a 3-D gradient summed over its first two dimensions.
        let s = reduce_shape(&[8, 128, 768], Some(&[0, 1]), 4).expect("leading");
        assert_eq!(
            (s.outputs, s.inputs_per_output, s.contiguous_inputs),
            (768, 1024, false)
        );
        // A row sum and a full sum read their inputs contiguously.
        let s = reduce_shape(&[64, 512], Some(&[-1]), 2).expect("trailing");
        assert_eq!(
            (s.outputs, s.inputs_per_output, s.contiguous_inputs),
            (64, 512, true)
        );
        let s = reduce_shape(&[64, 512], None, 4).expect("full");
        assert_eq!(
            (s.outputs, s.inputs_per_output, s.contiguous_inputs),
            (1, 32768, true)
        );
        assert!(
            reduce_shape(&[4, 5, 6], Some(&[1]), 4).is_none(),
            "a middle dimension"
        );
    }

    #[test]
    fn releases_map_to_the_modelled_ones() {
        assert_eq!(release_of("2.11.0+cu130").0, TorchVersion(11));
        assert_eq!(release_of("2.17.0").0, TorchVersion::NEWEST);
        assert!(release_of("2.17.0").1.contains("nearest"));
        assert_eq!(release_of("2.1.0").0, TorchVersion(1));
        assert!(!release_of("2.1.0").1.contains("nearest"));
    }
}
