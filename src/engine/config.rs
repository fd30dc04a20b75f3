//! Engine switches (engine.md §0.4) and device settings.

use serde::{Deserialize, Serialize};

pub use crate::device::GpuArch;
use crate::device::Placement;
pub use crate::engine::conv_workspace::ConvWorkspace;
pub use crate::engine::hf_switches::{HfCausalLoss, HfRmsNorm, RopeScope, SdpaPriority};
use crate::engine::scratch::reduce::ReduceDevice;
pub use crate::engine::transformers_release::{kv_path, KvPath, TransformersVersion};

/// `cublas_workspace_mode` (engine.md §1.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CublasWorkspaceMode {
    /// One workspace per (handle, stream), allocated at first GEMM, never freed.
    Cached,
    /// A transient workspace around every GEMM (2.15 docs).
    Eager,
}

/// `cublaslt_workspace` (engine.md §1.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CublasLtWorkspace {
    /// Every forward addmm-with-bias allocates and frees its own Lt workspace.
    Transient,
    /// Lt shares the cuBLAS workspace: no extra block.
    Unified,
    /// One Lt workspace per (handle, stream), taken at the first Lt call and
    /// kept until `clearCublasWorkspaces()` (`cublaslt_handle_stream_to_workspace`;
    /// what PyTorch 2.11 did on an H100 in `tests/fixtures/pytorch/captured`).
    Cached,
}

/// `optimizer_impl` (engine.md §5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OptimImpl {
    Foreach,
    ForLoop,
    Fused,
}

/// `sdpa_backend` (engine.md §0.4, table 1.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SdpaBackend {
    Flash,
    Efficient,
    Math,
    /// cuDNN attention (models.md §4.4–4.5): fp16/bf16 only.
    Cudnn,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct EngineConfig {
    // A scenario sets these four through `device`, `alloc_conf` and `torch`;
    // in its `engine` block they would be overwritten, so there they are
    // unknown fields (an error), not silently ignored ones.
    /// Simulated device capacity.
    #[serde(skip_deserializing)]
    pub device_bytes: u64,
    /// Non-PyTorch memory on the device (CUDA context, other processes).
    #[serde(skip_deserializing)]
    pub device_overhead: u64,
    /// `PYTORCH_CUDA_ALLOC_CONF`.
    #[serde(skip_deserializing)]
    pub alloc_conf: String,
    /// PyTorch 2.x release (minor number) whose allocator rules apply; None =
    /// [`TorchVersion::DEFAULT`](crate::alloc::TorchVersion::DEFAULT).
    #[serde(skip_deserializing)]
    pub torch_minor: Option<u32>,
    /// The transformers release the Hugging Face models follow (the
    /// scenario's `transformers:`); None = the newest modelled, GQA-aware.
    #[serde(skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub transformers: Option<TransformersVersion>,
    /// How the simulated device lays out its segments: the driver's rule of
    /// the scenario's `device.gpu` where one is modelled, else in order.
    #[serde(skip)]
    pub placement: Placement,
    /// None: `Sm80` (engine.md's default); a scenario's `device.gpu` sets it.
    pub gpu_arch: Option<GpuArch>,
    /// None: cached (one workspace per handle and stream, kept).
    pub cublas_workspace_mode: Option<CublasWorkspaceMode>,
    /// `CUBLAS_WORKSPACE_CONFIG` (`:SIZE_KiB:COUNT` pairs); None = the default.
    pub cublas_workspace_config: Option<String>,
    /// None: `Transient` (engine.md's default); a scenario fills in its
    /// release's rule (`scenario::build`).
    pub cublaslt_workspace: Option<CublasLtWorkspace>,
    /// `CUBLASLT_WORKSPACE_SIZE` (which PyTorch reads in KiB), as bytes; None =
    /// the architecture's default.
    pub cublaslt_workspace_size: Option<u64>,
    pub zero_grad_default_set_to_none: bool,
    /// None = the one PyTorch's dispatcher picks (`sdpa_priority`, models.md §4.4).
    pub sdpa_backend: Option<SdpaBackend>,
    /// `lstm_reserve_factor` k (engine.md §8.2) [unc].
    pub lstm_reserve_factor: u64,
    /// cuDNN's training reserve per LSTM call, where measured for the
    /// scenario's GPU and shape; None = `L·T·B·H·k` elements.
    pub rnn_reserve_bytes: Option<u64>,
    /// cuDNN RNN workspace per call (engine.md §1.6: ≈13–18 MB) [unc].
    pub rnn_workspace_bytes: u64,
    /// cuDNN dropout state, created once per device (engine.md §10.3) [unc].
    pub cudnn_dropout_state_bytes: u64,
    /// Cap on the cuDNN conv workspace: min(cap, input bytes) (engine.md §1.6) [unc].
    pub conv_workspace_cap: u64,
    /// cuDNN's conv workspaces per shape, as measured on the scenario's GPU;
    /// shapes not listed take the estimate above.
    pub conv_workspaces: Vec<ConvWorkspace>,
    /// Iterations (counted from 1) whose scaled gradients overflow: the
    /// engine computes no values, so the scenario says where GradScaler's
    /// `found_inf` is set and `scaler.step` skips `optimizer.step()` (§6.3).
    pub grad_overflow_iterations: Vec<u32>,
    /// The GPU's SM count and threads per SM. With them, a reduction that
    /// ATen splits across thread blocks (bias gradients, a loss's mean) takes
    /// its staging buffer and semaphores from the allocator, sized as
    /// `setReduceConfig` sizes them. None (the default, as engine.md has it):
    /// reductions take no scratch.
    pub reduce_device: Option<ReduceDevice>,
    /// models.md §0.4 switches for the Hugging Face blocks.
    pub hf_rmsnorm: HfRmsNorm,
    pub hf_rope_scope: RopeScope,
    pub hf_causal_loss: HfCausalLoss,
    /// PEFT `autocast_adapter_dtype`: fp16/bf16 adapters upcast to fp32 (§6.1).
    pub peft_upcast_adapters: bool,
    /// transformers' `use_cache=True` in training (its default outside
    /// gradient checkpointing): each Hugging Face attention layer passes k
    /// and v through `DynamicCache.update`, a `torch.cat` onto an empty
    /// tensor, so SDPA gets (and saves) copies. The cache's own hold on them
    /// after the layer, until the output goes, is not modelled.
    pub hf_use_cache: bool,
    /// bitsandbytes before 0.43.2 (PR #1270, July 2024): `MatMul4Bit` kept
    /// its input `A` on `ctx` (`ctx.tensors = (A, B)`) though no gradient
    /// needs it, so every frozen 4-bit layer's input lived as long as the
    /// graph (models.md §13.3).
    pub bnb_keeps_input: bool,
    /// bitsandbytes 0.50's 4-bit GEMM path (models.md §13.2): `Dequantize`
    /// (the default) or `Fused` at up to 1,536 rows.
    pub bnb_gemm_4bit: crate::engine::bnb::BnbGemm4bit,
    /// None: derived as models.md §4.4 says (cuDNN first from 2.11 on sm90
    /// and later, with the default cu130 wheel's cuDNN 9.17).
    pub sdpa_priority: Option<SdpaPriority>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            device_bytes: 16 << 30,
            device_overhead: 0,
            alloc_conf: String::new(),
            torch_minor: None,
            transformers: None,
            placement: Placement::InOrder,
            gpu_arch: None,
            cublas_workspace_mode: None,
            cublas_workspace_config: None,
            cublaslt_workspace: None,
            cublaslt_workspace_size: None,
            zero_grad_default_set_to_none: true,
            sdpa_backend: None,
            lstm_reserve_factor: 6,
            rnn_reserve_bytes: None,
            rnn_workspace_bytes: 16 << 20,
            cudnn_dropout_state_bytes: 4 << 20,
            conv_workspace_cap: 64 << 20,
            conv_workspaces: Vec::new(),
            grad_overflow_iterations: Vec::new(),
            reduce_device: None,
            hf_rmsnorm: HfRmsNorm::default(),
            hf_rope_scope: RopeScope::default(),
            hf_causal_loss: HfCausalLoss::default(),
            peft_upcast_adapters: true,
            hf_use_cache: false,
            bnb_keeps_input: false,
            bnb_gemm_4bit: crate::engine::bnb::BnbGemm4bit::Dequantize,
            sdpa_priority: None,
        }
    }
}

impl EngineConfig {
    pub fn arch(&self) -> GpuArch {
        self.gpu_arch.unwrap_or(GpuArch::Sm80)
    }

    /// The SDPA backend order (models.md §4.4): cuDNN first when the release
    /// is 2.11 or later and the GPU is sm90 or newer, unless set.
    /// The PyTorch release whose rules apply.
    pub fn torch(&self) -> crate::alloc::TorchVersion {
        self.torch_minor.map_or(
            crate::alloc::TorchVersion::DEFAULT,
            crate::alloc::TorchVersion,
        )
    }

    /// How a Hugging Face attention layer hands grouped k and v to SDPA under
    /// these releases (models.md §4.1–4.2).
    pub fn hf_kv_path(&self) -> KvPath {
        kv_path(self.transformers, self.torch())
    }

    /// Whether the scenario names a transformers 5.x release
    /// (`transformers_release.rs`); the default keeps 4.x's rules.
    pub fn hf_v5(&self) -> bool {
        self.transformers
            .is_some_and(|t| t >= TransformersVersion::FIVE)
    }

    pub fn sdpa_priority(&self) -> SdpaPriority {
        self.sdpa_priority.unwrap_or_else(|| {
            let minor = self
                .torch_minor
                .unwrap_or(crate::alloc::TorchVersion::DEFAULT.0);
            if minor >= 11 && self.arch().major() >= 9 {
                SdpaPriority::CudnnFirst
            } else {
                SdpaPriority::FlashFirst
            }
        })
    }

    /// How addmm-with-bias gets its cuBLASLt workspace.
    pub fn workspace_mode(&self) -> CublasWorkspaceMode {
        self.cublas_workspace_mode
            .unwrap_or(CublasWorkspaceMode::Cached)
    }

    pub fn lt_workspace(&self) -> CublasLtWorkspace {
        self.cublaslt_workspace
            .unwrap_or(CublasLtWorkspace::Transient)
    }

    /// cuBLAS workspace bytes (`parseChosenWorkspaceSize`,
    /// aten/src/ATen/cuda/CublasHandlePool.cpp): `:4096:2:16:8` = 8,519,680 B,
    /// 32 MiB on compute capability 9.x; `CUBLAS_WORKSPACE_CONFIG` overrides.
    /// (Blackwell's 32 MiB came and went in 2026, PRs #175344 and #182669;
    /// no profile here is Blackwell.)
    pub fn cublas_workspace_bytes(&self) -> u64 {
        if let Some(conf) = &self.cublas_workspace_config {
            if let Some(bytes) = parse_workspace_config(conf) {
                return bytes;
            }
        }
        if self.arch().major() == 9 {
            32 << 20
        } else {
            2 * 4096 * 1024 + 8 * 16 * 1024
        }
    }

    /// cuBLASLt workspace bytes (`getCUDABlasLtWorkspaceSize`): 1 MiB on every
    /// architecture (PR #120925's 4 MiB / 32 MiB was reverted), or
    /// `CUBLASLT_WORKSPACE_SIZE`; never more than the cuBLAS workspace (the
    /// unified-size rule, on unless `TORCH_CUBLASLT_UNIFIED_WORKSPACE=0`).
    pub fn cublaslt_workspace_bytes(&self) -> u64 {
        self.cublaslt_workspace_size
            .unwrap_or(1 << 20)
            .min(self.cublas_workspace_bytes())
    }
}

/// `:SIZE_KiB:COUNT` pairs → bytes; `:0:0` gives 0 (workspace disabled).
/// None for text that is not such pairs, or whose total passes 2^64 bytes.
pub fn parse_workspace_config(conf: &str) -> Option<u64> {
    let nums: Vec<u64> = conf
        .split(':')
        .filter(|s| !s.is_empty())
        .map(|s| s.trim().parse::<u64>())
        .collect::<Result<_, _>>()
        .ok()?;
    if nums.is_empty() || !nums.len().is_multiple_of(2) {
        return None;
    }
    nums.chunks(2).try_fold(0u64, |sum, p| {
        p[0].checked_mul(1024)?
            .checked_mul(p[1])
            .and_then(|b| sum.checked_add(b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_sizes_follow_1_6() {
        let mut c = EngineConfig::default();
        assert_eq!(c.cublas_workspace_bytes(), 8_519_680);
        assert_eq!(c.cublaslt_workspace_bytes(), 1_048_576);
        c.gpu_arch = Some(GpuArch::Sm90);
        assert_eq!(c.cublas_workspace_bytes(), 33_554_432);
        c.cublas_workspace_config = Some(":0:0".into());
        assert_eq!(c.cublas_workspace_bytes(), 0);
        c.cublas_workspace_config = Some(":4096:8".into());
        assert_eq!(c.cublas_workspace_bytes(), 4096 * 1024 * 8);
        c.gpu_arch = Some(GpuArch::Sm80);
        c.device_bytes = 40 << 30;
        assert_eq!(c.cublaslt_workspace_bytes(), 1 << 20);
        c.cublas_workspace_config = None;
        assert_eq!(c.cublas_workspace_bytes(), 8_519_680);
        c.cublaslt_workspace_size = Some(16 << 20);
        assert_eq!(
            c.cublaslt_workspace_bytes(),
            8_519_680,
            "capped at the cuBLAS workspace"
        );
    }
}
