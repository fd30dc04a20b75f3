//! What the engine does differently per PyTorch release, beside the
//! allocator's own rules (`alloc::TorchVersion`): what autograd saves and
//! what attention allocates (scenarios/README.md, Older releases).

use crate::alloc::TorchVersion;

/// The engine's rules of one PyTorch release.
pub trait EngineRules {
    /// MeanBackward0/1 keep their input (see the impl).
    fn mean_saves_self(self) -> bool;
    /// Flash attention's philox state lives on the GPU.
    fn flash_rng_on_gpu(self) -> bool;
    /// SDPA takes `enable_gqa=True`.
    fn has_enable_gqa(self) -> bool;
}

impl EngineRules for TorchVersion {
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
    fn mean_saves_self(self) -> bool {
        self.0 <= 1
    }
    /// FlashAttention's philox state (`rng_state` [2] and `unused`, both
    /// int64, saved for backward) is made on the GPU from 2.7 (PR #146372);
    /// before, outside CUDA-graph capture, they are CPU tensors
    /// (models.md §4.5).
    fn flash_rng_on_gpu(self) -> bool {
        self.0 >= 7
    }
    /// `scaled_dot_product_attention(..., enable_gqa=True)` exists from 2.5
    /// (pytorch/pytorch PR #132689, Aug 2024); transformers' `use_gqa_in_sdpa`
    /// asks for torch ≥ 2.5 before passing it (models.md §4.1).
    fn has_enable_gqa(self) -> bool {
        self.0 >= 5
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rule_turns_at_its_release() {
        let turns = |rule: fn(TorchVersion) -> bool| -> Vec<u32> {
            (0..15)
                .filter(|&m| rule(TorchVersion(m)) != rule(TorchVersion(m + 1)))
                .map(|m| m + 1)
                .collect()
        };
        // Kept in 2.0–2.1, not from 2.2 (PR #109935).
        assert_eq!(turns(EngineRules::mean_saves_self), [2]);
        assert!(TorchVersion(1).mean_saves_self());
        // On the GPU from 2.7 (PR #146372).
        assert_eq!(turns(EngineRules::flash_rng_on_gpu), [7]);
        assert!(!TorchVersion(6).flash_rng_on_gpu());
        // From 2.5 (PR #132689).
        assert_eq!(turns(EngineRules::has_enable_gqa), [5]);
        assert!(TorchVersion::DEFAULT.has_enable_gqa());
    }
}
