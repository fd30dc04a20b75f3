//! Which SDPA backend PyTorch 2.11 takes on sm90 (models.md §4.3–4.4,
//! `sdp_utils.cpp`): each backend's gates, tried in the configured order.

use super::super::config::{SdpaBackend, SdpaPriority};
use super::super::dtype::DType;

/// What the dispatcher looks at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SdpaCall {
    /// q's dtype after autocast.
    pub dtype: DType,
    /// An attention mask is passed (a padding mask; causal alone is not one).
    pub mask: bool,
    pub dropout: f64,
    pub head_dim: u64,
    /// `enable_gqa=True` with fewer key/value heads than query heads.
    pub gqa: bool,
}

impl SdpaCall {
    /// cuDNN: fp16/bf16; dropout a multiple of 1/16; head dim ≤ 128 and a
    /// multiple of 8; masks and GQA accepted (models.md §4.4).
    fn cudnn_ok(&self) -> bool {
        let sixteenths = self.dropout * 16.0;
        self.dtype.is_half()
            && (sixteenths - sixteenths.round()).abs() < 1e-9
            && self.head_dim <= 128
            && self.head_dim.is_multiple_of(8)
    }

    /// Flash: fp16/bf16, no mask, head dim ≤ 256; GQA native.
    fn flash_ok(&self) -> bool {
        self.dtype.is_half() && !self.mask && self.head_dim <= 256
    }

    /// Memory-efficient: fp16/bf16/fp32, head dim a multiple of 8 (half) or
    /// 4 (fp32); no `enable_gqa` in 2.11 (added after it, PR #191085).
    fn efficient_ok(&self) -> bool {
        let align = if self.dtype == DType::F32 { 4 } else { 8 };
        (self.dtype.is_half() || self.dtype == DType::F32)
            && self.head_dim.is_multiple_of(align)
            && !self.gqa
    }

    /// The first backend in `priority`'s order whose gates pass; math takes
    /// whatever none of the fused ones does.
    pub fn backend(&self, priority: SdpaPriority) -> SdpaBackend {
        self.backend_among(priority, |_| true)
    }

    /// [`SdpaCall::backend`] among the backends `enabled` lets through
    /// (`torch.backends.cuda.enable_*_sdp`, `sdpa_kernel(...)`): math takes
    /// what none of the enabled fused ones does.
    pub fn backend_among(
        &self,
        priority: SdpaPriority,
        enabled: impl Fn(SdpaBackend) -> bool,
    ) -> SdpaBackend {
        let order: &[SdpaBackend] = match priority {
            SdpaPriority::CudnnFirst => &[
                SdpaBackend::Cudnn,
                SdpaBackend::Flash,
                SdpaBackend::Efficient,
            ],
            // cuDNN comes after math, which always passes.
            SdpaPriority::FlashFirst => &[SdpaBackend::Flash, SdpaBackend::Efficient],
        };
        order
            .iter()
            .copied()
            .filter(|b| enabled(*b))
            .find(|b| match b {
                SdpaBackend::Cudnn => self.cudnn_ok(),
                SdpaBackend::Flash => self.flash_ok(),
                SdpaBackend::Efficient => self.efficient_ok(),
                SdpaBackend::Math => true,
            })
            .unwrap_or(SdpaBackend::Math)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(dtype: DType, mask: bool, dropout: f64, gqa: bool) -> SdpaCall {
        SdpaCall {
            dtype,
            mask,
            dropout,
            head_dim: 64,
            gqa,
        }
    }

    /// models.md §4.4's table of resulting choices, row by row.
    #[test]
    fn choices_follow_the_2_11_table() {
        use SdpaBackend::*;
        let rows = [
            (call(DType::BF16, false, 0.0, false), Cudnn, Flash),
            (call(DType::BF16, false, 0.0, true), Cudnn, Flash),
            (call(DType::F16, false, 0.1, false), Flash, Flash),
            (call(DType::BF16, true, 0.0, false), Cudnn, Efficient),
            (call(DType::BF16, true, 0.1, false), Efficient, Efficient),
            (call(DType::F32, false, 0.0, false), Efficient, Efficient),
            (call(DType::F32, true, 0.1, false), Efficient, Efficient),
            (call(DType::F32, false, 0.0, true), Math, Math),
        ];
        for (c, cu130, cu128) in rows {
            assert_eq!(c.backend(SdpaPriority::CudnnFirst), cu130, "{c:?}");
            assert_eq!(c.backend(SdpaPriority::FlashFirst), cu128, "{c:?}");
        }
    }

    #[test]
    fn head_dims_past_the_gates_fall_back() {
        let mut c = call(DType::BF16, false, 0.0, false);
        c.head_dim = 256;
        assert_eq!(c.backend(SdpaPriority::CudnnFirst), SdpaBackend::Flash);
        c.head_dim = 96;
        assert_eq!(c.backend(SdpaPriority::CudnnFirst), SdpaBackend::Cudnn);
        c.head_dim = 100;
        assert_eq!(
            c.backend(SdpaPriority::CudnnFirst),
            SdpaBackend::Flash,
            "not a multiple of 8"
        );
    }
}
