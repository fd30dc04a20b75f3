//! Which PyTorch release the model follows where releases differ (allocator.md §0.3).

use std::fmt;
use std::str::FromStr;

/// A PyTorch 2.x release, by minor version (`TorchVersion(8)` is 2.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TorchVersion(pub u32);

impl TorchVersion {
    /// The release a run follows when nothing says otherwise: the newest
    /// whose rules are implemented and verified against captures (the H100
    /// fixtures ran PyTorch 2.11).
    pub const DEFAULT: TorchVersion = TorchVersion(11);
    /// The releases modelled: 2.0 to 2.15 (2.0–2.3's allocator as 2.4's:
    /// allocator.md §0.3 checked no wheel before 2.4.1).
    pub const OLDEST: TorchVersion = TorchVersion(0);
    pub const NEWEST: TorchVersion = TorchVersion(15);

    /// 2.0–2.9 use the classic `CUDAAllocatorConfig` parser; 2.10+ the unified tokenizer.
    pub fn classic_parser(self) -> bool {
        self.0 <= 9
    }
    /// `max_non_split_rounding_mb` exists from 2.6.
    pub fn has_max_non_split_rounding(self) -> bool {
        self.0 >= 6
    }
    /// `large_segment_size_mb`, `throw_on_cudamalloc_oom` and `num_oom_rejections` from 2.12.
    pub fn has_large_segment_size(self) -> bool {
        self.0 >= 12
    }
    /// 2.4–2.6 spell the power-of-two message "divisons".
    pub fn misspells_divisions(self) -> bool {
        self.0 <= 6
    }
    /// `mean` and `mean.dim` keep their input for backward (MeanBackward0/1
    /// `_saved_self`) in 2.0 and 2.1. Their derivatives.yaml formulas read
    /// `self.sym_numel()`, and the autograd codegen had no rule saving only
    /// that number, so it saved `self` (pytorch/pytorch issue #109876); PR
    /// #109935 (merged 2023-09-23, after 2.1's branch cut) added the
    /// `{}.sym_numel\(\)` → `self_sym_numel` rule to
    /// tools/autograd/load_derivatives.py's `saved_variables`, first
    /// released in 2.2. 2.0 is placed with 2.1 [inf]: its derivatives.yaml
    /// already reads `sym_numel()` (the SymInt formulas came before 2.0's
    /// branch cut), no 2.0 wheel was checked.
    pub fn mean_saves_self(self) -> bool {
        self.0 <= 1
    }
    /// FlashAttention's philox state (`rng_state` [2] and `unused`, both
    /// int64, saved for backward) is made on the GPU from 2.7 (PR #146372);
    /// before, outside CUDA-graph capture, they are CPU tensors
    /// (models.md §4.5).
    pub fn flash_rng_on_gpu(self) -> bool {
        self.0 >= 7
    }
    /// `scaled_dot_product_attention(..., enable_gqa=True)` exists from 2.5
    /// (pytorch/pytorch PR #132689, Aug 2024); transformers' `use_gqa_in_sdpa`
    /// asks for torch ≥ 2.5 before passing it (models.md §4.1).
    pub fn has_enable_gqa(self) -> bool {
        self.0 >= 5
    }
}

impl Default for TorchVersion {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for TorchVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "2.{}", self.0)
    }
}

impl FromStr for TorchVersion {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.trim().split(['.', '+']);
        let mut num = || parts.next().and_then(|p| p.parse::<u32>().ok());
        let (Some(major), Some(minor)) = (num(), num()) else {
            return Err(format!("torch version '{s}': expected 2.<minor>, e.g. 2.8"));
        };
        if major != 2 || !(Self::OLDEST.0..=Self::NEWEST.0).contains(&minor) {
            return Err(format!(
                "torch version '{s}': only 2.0 to 2.15 are modelled"
            ));
        }
        Ok(TorchVersion(minor))
    }
}
