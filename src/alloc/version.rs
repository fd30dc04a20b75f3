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
