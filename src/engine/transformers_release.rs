//! Which transformers release a Hugging Face model follows: how k and v
//! reach `scaled_dot_product_attention` under grouped-query attention
//! (models.md §4.1–4.2), and from 5.0 how `from_pretrained` loads a
//! bitsandbytes model (`hf_load.rs`) and what `Qwen2Model.forward`/
//! `LlamaModel.forward` make before the layers (`ops/hf_v5.rs`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::alloc::TorchVersion;
use crate::engine::torch_rules::EngineRules;

/// A transformers release, `major.minor` (`4.40`, `5.0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TransformersVersion {
    pub major: u32,
    pub minor: u32,
}

impl TransformersVersion {
    /// The first release whose Llama-family models run SDPA
    /// (`LlamaSdpaAttention`, `_supports_sdpa`): older ones have eager
    /// attention only, which the engine does not model for these models.
    pub const OLDEST: TransformersVersion = TransformersVersion::new(4, 36);
    /// 4.48 moved attention out of the modules into
    /// `integrations/sdpa_attention.py` (`sdpa_attention_forward`); the
    /// per-model `LlamaSdpaAttention` classes went.
    pub const INTEGRATION: TransformersVersion = TransformersVersion::new(4, 48);
    /// The first release with `use_gqa_in_sdpa` (transformers PR #39412,
    /// merged 2025-07-16, after 4.53.0) [inf: release placed by the merge
    /// date].
    pub const GQA_AWARE: TransformersVersion = TransformersVersion::new(4, 54);
    /// 5.0: the checkpoint loader `core_model_loading.py` (a quantised model
    /// built on meta, warmed, loaded in sorted key order) and the forward
    /// without `cache_position` that checks `position_ids` for packed
    /// sequences [inf: both read in 5.16.1 only, placed at 5.0 where the
    /// loader came in].
    pub const FIVE: TransformersVersion = TransformersVersion::new(5, 0);
    /// The newest release whose source was read (5.16.1, what CI pins with
    /// bitsandbytes 0.50.2): a later one is refused rather than assumed.
    pub const NEWEST: TransformersVersion = TransformersVersion::new(5, 16);

    pub const fn new(major: u32, minor: u32) -> Self {
        TransformersVersion { major, minor }
    }

    /// How k and v reach SDPA in a Hugging Face attention layer under
    /// `torch`, with no attention mask (the engine's causal LMs have none:
    /// no padding).
    pub fn kv_path(self, torch: TorchVersion) -> KvPath {
        kv_path(Some(self), torch)
    }
}

/// How a Hugging Face attention layer hands k and v with fewer heads than q
/// to SDPA (models.md §4.1–4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvPath {
    /// `enable_gqa=True`: k and v keep their heads (transformers ≥ 4.54 on
    /// torch ≥ 2.5, no mask).
    EnableGqa,
    /// `sdpa_attention_forward` (4.48 on) calls `repeat_kv` on its own
    /// arguments: the copies live until it returns, while the layer's
    /// un-repeated `key_states`, `value_states` stay bound to its end.
    RepeatInIntegration,
    /// `LlamaSdpaAttention.forward` (4.36–4.47) rebinds
    /// `key_states = repeat_kv(key_states, …)`, `value_states = …` before
    /// SDPA: the un-repeated tensors go at the rebinding, the copies stay to
    /// the layer's end.
    RepeatInModule,
}

/// [`KvPath`] for `transformers` (None: the newest, GQA-aware) under `torch`.
pub fn kv_path(transformers: Option<TransformersVersion>, torch: TorchVersion) -> KvPath {
    match transformers {
        Some(t) if t < TransformersVersion::INTEGRATION => KvPath::RepeatInModule,
        Some(t) if t < TransformersVersion::GQA_AWARE => KvPath::RepeatInIntegration,
        _ if !torch.has_enable_gqa() => KvPath::RepeatInIntegration,
        _ => KvPath::EnableGqa,
    }
}

impl fmt::Display for TransformersVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl FromStr for TransformersVersion {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.trim().split('.');
        let num = |p: Option<&str>| p.and_then(|x| x.parse::<u32>().ok());
        let (Some(major), Some(minor)) = (num(parts.next()), num(parts.next())) else {
            return Err(format!(
                "transformers version '{s}': expected MAJOR.MINOR, e.g. 4.40"
            ));
        };
        let v = TransformersVersion::new(major, minor);
        if v < TransformersVersion::OLDEST {
            return Err(format!(
                "transformers version '{s}': releases before {} have no SDPA attention for Llama-family models (only eager), which is not modelled",
                TransformersVersion::OLDEST
            ));
        }
        if v > TransformersVersion::NEWEST {
            return Err(format!(
                "transformers version '{s}': newer than {}, the newest release modelled",
                TransformersVersion::NEWEST
            ));
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_refuse_clearly() {
        let v: TransformersVersion = "4.40.2".parse().expect("a release");
        assert_eq!(v, TransformersVersion::new(4, 40));
        assert_eq!(v.to_string(), "4.40");
        assert_eq!(
            "5.0".parse::<TransformersVersion>(),
            Ok(TransformersVersion::new(5, 0))
        );
        let old = "4.35".parse::<TransformersVersion>().expect_err("no SDPA");
        assert!(old.contains("4.36") && old.contains("eager"), "{old}");
        assert_eq!(
            "5.16.1".parse::<TransformersVersion>(),
            Ok(TransformersVersion::new(5, 16))
        );
        let new = "5.17".parse::<TransformersVersion>().expect_err("unread");
        assert!(new.contains("5.16") && new.contains("newest"), "{new}");
        let bad = "four"
            .parse::<TransformersVersion>()
            .expect_err("not a version");
        assert!(bad.contains("MAJOR.MINOR"), "{bad}");
    }

    #[test]
    fn kv_paths_follow_both_releases() {
        let t = |s: &str| Some(s.parse::<TransformersVersion>().expect("version"));
        let (t21, t25, t211) = (TorchVersion(1), TorchVersion(5), TorchVersion(11));
        assert_eq!(kv_path(None, t211), KvPath::EnableGqa);
        assert_eq!(kv_path(None, t25), KvPath::EnableGqa);
        // torch 2.4 has no `enable_gqa`: even today's transformers repeats.
        assert_eq!(kv_path(None, TorchVersion(4)), KvPath::RepeatInIntegration);
        assert_eq!(kv_path(t("4.54"), t211), KvPath::EnableGqa);
        assert_eq!(kv_path(t("4.53"), t211), KvPath::RepeatInIntegration);
        assert_eq!(kv_path(t("4.48"), t211), KvPath::RepeatInIntegration);
        assert_eq!(kv_path(t("4.47"), t211), KvPath::RepeatInModule);
        assert_eq!(kv_path(t("4.40"), t21), KvPath::RepeatInModule);
    }
}
