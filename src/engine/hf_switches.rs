//! Switches for the Hugging Face / PEFT building blocks (models.md §0.4):
//! where library releases differ in what they allocate, the engine follows
//! the current one by default and a scenario can pick the other.

use serde::{Deserialize, Serialize};

/// `hf_rmsnorm` (models.md §1): which RMSNorm a decoder layer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum HfRmsNorm {
    /// `LlamaRMSNorm`'s Python composite (§1.1): pow, mean, rsqrt, two muls.
    #[default]
    HfComposite,
    /// `torch.nn.RMSNorm` dispatching to `_fused_rms_norm` (§1.2) when the
    /// weight's dtype is the input's, else ATen's composite.
    TorchFused,
    /// `torch.nn.RMSNorm` before the fused kernel (≤ 2.8): ATen's composite.
    TorchComposite,
}

/// `hf_rope_scope` (models.md §2.1): cos/sin once per forward or per layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum RopeScope {
    /// `LlamaModel.forward` computes `position_embeddings` once (≈4.45–4.5x).
    #[default]
    Model,
    /// Every attention layer computes its own pair (early 4.4x, 2026 Qwen2).
    Layer,
}

/// `hf_causal_loss` (models.md §5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum HfCausalLoss {
    /// transformers ≥ 4.49: labels padded with -100 and shifted, logits not copied.
    #[default]
    PadLabels,
    /// ≤ 4.48: `logits[..., :-1, :].contiguous()` — one more fp32 [B, T-1, V].
    ShiftCopy,
}

/// `sdpa_priority` (models.md §4.4): the order SDPA tries its backends in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SdpaPriority {
    /// cuDNN → flash → efficient → math (`check_prefer_cudnn_attention`).
    CudnnFirst,
    /// flash → efficient → math (cuDNN last, i.e. never).
    FlashFirst,
}
