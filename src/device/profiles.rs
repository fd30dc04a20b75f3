//! GPUs a scenario can name (`device: (gpu: "H100-SXM-80GB")`): what decides
//! memory behaviour on each — the architecture (cuBLAS/cuBLASLt workspace
//! sizes, engine.md §1.6), the SM count and threads per SM (the scratch of
//! ATen's reductions), the memory a program sees — and the vendor's peak
//! compute and bandwidth, for time estimates.
//!
//! Only the H100's memory figures are measured (the H100 captures under
//! `tests/fixtures/pytorch/captured`: `totalGlobalMem` and what the CUDA
//! context held before the first tensor). The others' capacities are the
//! vendor's nominal sizes, and their context is unknown: a profile says
//! which ([`GpuProfile::memory_measured`]), and reports repeat it.

use serde::{Deserialize, Serialize};

use super::Placement;

/// GPU architecture (compute capability): decides the cuBLAS / cuBLASLt
/// workspace sizes (engine.md §1.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GpuArch {
    Sm70,
    Sm75,
    Sm80,
    Sm86,
    Sm89,
    Sm90,
    Sm100,
}

impl GpuArch {
    pub fn major(self) -> u32 {
        match self {
            GpuArch::Sm70 | GpuArch::Sm75 => 7,
            GpuArch::Sm80 | GpuArch::Sm86 | GpuArch::Sm89 => 8,
            GpuArch::Sm90 => 9,
            GpuArch::Sm100 => 10,
        }
    }

    /// `sm_90`.
    pub fn name(self) -> &'static str {
        match self {
            GpuArch::Sm70 => "sm_70",
            GpuArch::Sm75 => "sm_75",
            GpuArch::Sm80 => "sm_80",
            GpuArch::Sm86 => "sm_86",
            GpuArch::Sm89 => "sm_89",
            GpuArch::Sm90 => "sm_90",
            GpuArch::Sm100 => "sm_100",
        }
    }
}

/// One GPU model. See the module docs for which figures are measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GpuProfile {
    /// What a scenario writes: `H100-SXM-80GB`.
    pub name: &'static str,
    /// What CUDA calls it.
    pub product: &'static str,
    pub arch: GpuArch,
    pub sm_count: u32,
    pub max_threads_per_sm: u32,
    /// `totalGlobalMem` (measured) or the vendor's nominal size.
    pub total_memory: u64,
    /// Whether `total_memory` and `context_bytes` were measured on the card.
    pub memory_measured: bool,
    /// Device memory the CUDA context holds before the first tensor, where measured.
    pub context_bytes: Option<u64>,
    /// How a simulated card lays out its segments: in request order unless
    /// a driver's rule is measured and chosen for the card
    /// (docs/driver_addresses.md).
    #[serde(skip)]
    pub placement: Placement,
    /// Vendor peak dense BF16 tensor throughput (FP16 where the card has no BF16), TFLOP/s.
    pub peak_tflops: f64,
    /// Vendor peak memory bandwidth, GB/s.
    pub bandwidth_gb_s: f64,
    /// Vendor peak FP32 on CUDA cores, TFLOP/s.
    pub fp32_tflops: f64,
    /// Vendor peak dense TF32 tensor throughput, TFLOP/s (the FP32 figure
    /// on cards without TF32).
    pub tf32_tflops: f64,
    /// Vendor peak FP64 (tensor cores where the card has them), TFLOP/s.
    pub fp64_tflops: f64,
}

const GIB: u64 = 1 << 30;

/// The GPUs known well enough to simulate.
pub const PROFILES: [GpuProfile; 9] = [
    GpuProfile {
        name: "H100-SXM-80GB",
        product: "NVIDIA H100 80GB HBM3",
        arch: GpuArch::Sm90,
        sm_count: 132,
        max_threads_per_sm: 2048,
        // torch.cuda.get_device_properties(0).total_memory on the capture card.
        total_memory: 85_017_493_504,
        memory_measured: true,
        // total − cudaMemGetInfo's free, before the first tensor (the captures).
        context_bytes: Some(552_402_944),
        // The driver's rule measured on this card (docs/driver_addresses.md):
        // 90 of 95 traced captures exact (69 in request order), 25 built-ins
        // exact against their captures; four move away from theirs, each by
        // a named cause (reference-cycle-bug/-gc +64 MiB reserved,
        // attention-math-bf16 +4 MiB peak allocated, llama-lora-finetune
        // +2 MiB at iteration 1's reserved).
        placement: Placement::H100Driver,
        peak_tflops: 989.4,
        bandwidth_gb_s: 3352.0,
        fp32_tflops: 66.9,
        tf32_tflops: 494.7,
        fp64_tflops: 66.9,
    },
    GpuProfile {
        name: "A100-SXM-80GB",
        product: "NVIDIA A100-SXM4-80GB",
        arch: GpuArch::Sm80,
        sm_count: 108,
        max_threads_per_sm: 2048,
        total_memory: 80 * GIB,
        memory_measured: false,
        context_bytes: None,
        placement: Placement::InOrder,
        peak_tflops: 312.0,
        bandwidth_gb_s: 2039.0,
        fp32_tflops: 19.5,
        tf32_tflops: 156.0,
        fp64_tflops: 19.5,
    },
    GpuProfile {
        name: "A100-SXM-40GB",
        product: "NVIDIA A100-SXM4-40GB",
        arch: GpuArch::Sm80,
        sm_count: 108,
        max_threads_per_sm: 2048,
        total_memory: 40 * GIB,
        memory_measured: false,
        context_bytes: None,
        placement: Placement::InOrder,
        peak_tflops: 312.0,
        bandwidth_gb_s: 1555.0,
        fp32_tflops: 19.5,
        tf32_tflops: 156.0,
        fp64_tflops: 19.5,
    },
    GpuProfile {
        name: "L4",
        product: "NVIDIA L4",
        arch: GpuArch::Sm89,
        sm_count: 58,
        max_threads_per_sm: 1536,
        total_memory: 24 * GIB,
        memory_measured: false,
        context_bytes: None,
        placement: Placement::InOrder,
        peak_tflops: 121.0,
        bandwidth_gb_s: 300.0,
        fp32_tflops: 30.3,
        tf32_tflops: 60.0,
        fp64_tflops: 0.49,
    },
    GpuProfile {
        name: "RTX-4090",
        product: "NVIDIA GeForce RTX 4090",
        arch: GpuArch::Sm89,
        sm_count: 128,
        max_threads_per_sm: 1536,
        total_memory: 24 * GIB,
        memory_measured: false,
        context_bytes: None,
        placement: Placement::InOrder,
        peak_tflops: 165.2,
        bandwidth_gb_s: 1008.0,
        fp32_tflops: 82.6,
        tf32_tflops: 82.6,
        fp64_tflops: 1.29,
    },
    GpuProfile {
        name: "RTX-3090",
        product: "NVIDIA GeForce RTX 3090",
        arch: GpuArch::Sm86,
        sm_count: 82,
        max_threads_per_sm: 1536,
        total_memory: 24 * GIB,
        memory_measured: false,
        context_bytes: None,
        placement: Placement::InOrder,
        peak_tflops: 71.0,
        bandwidth_gb_s: 936.0,
        fp32_tflops: 35.6,
        tf32_tflops: 35.6,
        fp64_tflops: 0.56,
    },
    GpuProfile {
        name: "T4",
        product: "Tesla T4",
        arch: GpuArch::Sm75,
        sm_count: 40,
        max_threads_per_sm: 1024,
        total_memory: 16 * GIB,
        memory_measured: false,
        context_bytes: None,
        placement: Placement::InOrder,
        // FP16: Turing has no BF16.
        peak_tflops: 65.0,
        bandwidth_gb_s: 320.0,
        fp32_tflops: 8.1,
        tf32_tflops: 8.1,
        fp64_tflops: 0.25,
    },
    GpuProfile {
        name: "V100-SXM2-32GB",
        product: "Tesla V100-SXM2-32GB",
        arch: GpuArch::Sm70,
        sm_count: 80,
        max_threads_per_sm: 2048,
        total_memory: 32 * GIB,
        memory_measured: false,
        context_bytes: None,
        placement: Placement::InOrder,
        // FP16: Volta has no BF16.
        peak_tflops: 125.0,
        bandwidth_gb_s: 900.0,
        fp32_tflops: 15.7,
        tf32_tflops: 15.7,
        fp64_tflops: 7.8,
    },
    GpuProfile {
        name: "V100-SXM2-16GB",
        product: "Tesla V100-SXM2-16GB",
        arch: GpuArch::Sm70,
        sm_count: 80,
        max_threads_per_sm: 2048,
        total_memory: 16 * GIB,
        memory_measured: false,
        context_bytes: None,
        placement: Placement::InOrder,
        peak_tflops: 125.0,
        bandwidth_gb_s: 900.0,
        fp32_tflops: 15.7,
        tf32_tflops: 15.7,
        fp64_tflops: 7.8,
    },
];

/// The profile a scenario names (exact name, any case).
pub fn profile(name: &str) -> Option<&'static GpuProfile> {
    PROFILES.iter().find(|p| p.name.eq_ignore_ascii_case(name))
}

/// The names, for an error message.
pub fn profile_names() -> String {
    PROFILES
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found_in_any_case() {
        for p in &PROFILES {
            assert_eq!(
                profile(&p.name.to_lowercase()).map(|q| q.name),
                Some(p.name)
            );
            assert_eq!(PROFILES.iter().filter(|q| q.name == p.name).count(), 1);
        }
        assert!(profile("H200").is_none());
        // What the H100 captures recorded about the card.
        let h100 = profile("H100-SXM-80GB").expect("known");
        assert_eq!(h100.total_memory, 85_017_493_504);
        assert_eq!((h100.sm_count, h100.max_threads_per_sm), (132, 2048));
    }

    #[test]
    fn only_the_measured_card_lays_segments_out_by_its_driver() {
        // The rule was measured on the H100 SXM's captures alone; every
        // other card keeps request order until its driver is measured.
        for p in &PROFILES {
            let expected = if p.name == "H100-SXM-80GB" {
                Placement::H100Driver
            } else {
                Placement::InOrder
            };
            assert_eq!(p.placement, expected, "{}", p.name);
        }
    }
}
