//! A compute-time estimate: the work a run counted (`engine::work`) at a
//! GPU's vendor peak rates. GEMMs, convolutions and attention take their
//! FLOPs over the peak of the math unit they run on; every other kernel its
//! bytes over the memory bandwidth. Real kernels reach a fraction of peak and
//! launches cost time too, so this is a floor on the real time, good for
//! comparing two runs of the same model (what checkpointing recomputes),
//! never a measurement.

use serde::Serialize;

use super::work::{FlopKind, MathUnit, WorkPart, WorkTally};
use crate::device::GpuProfile;

/// What every view and report says of these figures.
pub const ESTIMATE_LABEL: &str =
    "estimate at the GPU's peak FLOP/s and bandwidth (a floor: real kernels are slower), not measured";

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PartEstimate {
    pub part: &'static str,
    pub flops: u64,
    pub bytes: u64,
    pub milliseconds: f64,
}

/// One kind of floating-point kernel's FLOPs over every part.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KindEstimate {
    /// `matmul`, `convolution`, `attention`, `cuDNN LSTM`.
    pub kind: &'static str,
    pub flops: u64,
    pub milliseconds: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ComputeEstimate {
    pub label: &'static str,
    /// The profile whose peaks were used.
    pub gpu: &'static str,
    pub flops: u64,
    pub bytes: u64,
    pub milliseconds: f64,
    /// Forward, recompute, backward, optimizer, other: the parts with work.
    pub parts: Vec<PartEstimate>,
    /// The FLOPs by kind of kernel (the kinds with work): the same FLOPs as
    /// `parts`, split the other way.
    pub kinds: Vec<KindEstimate>,
    /// Recomputed forward work as a share of all FLOPs (checkpointing's cost).
    pub recompute_share: f64,
}

impl ComputeEstimate {
    pub fn part(&self, part: WorkPart) -> Option<&PartEstimate> {
        self.parts.iter().find(|p| p.part == part.name())
    }

    pub fn kind(&self, kind: FlopKind) -> Option<&KindEstimate> {
        self.kinds.iter().find(|k| k.kind == kind.name())
    }
}

/// Seconds for `flops` on `unit` at its peak (none where the profile has no peak).
fn flop_seconds(gpu: &GpuProfile, unit: MathUnit, flops: u64) -> f64 {
    let peak = peak_tflops(gpu, unit);
    if flops > 0 && peak > 0.0 {
        flops as f64 / (peak * 1e12)
    } else {
        0.0
    }
}

fn kinds(work: &WorkTally, gpu: &GpuProfile) -> Vec<KindEstimate> {
    FlopKind::ALL
        .iter()
        .filter_map(|&kind| {
            let (mut flops, mut seconds) = (0u64, 0.0);
            for part in WorkPart::ALL {
                for unit in MathUnit::ALL {
                    let f = work.kind_flops(part, kind, unit);
                    flops = flops.saturating_add(f);
                    seconds += flop_seconds(gpu, unit, f);
                }
            }
            (flops > 0).then(|| KindEstimate {
                kind: kind.name(),
                flops,
                milliseconds: seconds * 1e3,
            })
        })
        .collect()
}

fn peak_tflops(gpu: &GpuProfile, unit: MathUnit) -> f64 {
    match unit {
        MathUnit::Fp32 => gpu.fp32_tflops,
        MathUnit::Tf32 => gpu.tf32_tflops,
        MathUnit::Half => gpu.peak_tflops,
        MathUnit::Fp64 => gpu.fp64_tflops,
    }
}

pub fn estimate(work: &WorkTally, gpu: &GpuProfile) -> ComputeEstimate {
    let mut parts = Vec::new();
    for part in WorkPart::ALL {
        let mut seconds = 0.0;
        let mut flops = 0u64;
        for unit in MathUnit::ALL {
            let f = work.flops(part, unit);
            flops = flops.saturating_add(f);
            seconds += flop_seconds(gpu, unit, f);
        }
        let bytes = work.bytes(part);
        if gpu.bandwidth_gb_s > 0.0 {
            seconds += bytes as f64 / (gpu.bandwidth_gb_s * 1e9);
        }
        if flops > 0 || bytes > 0 {
            parts.push(PartEstimate {
                part: part.name(),
                flops,
                bytes,
                milliseconds: seconds * 1e3,
            });
        }
    }
    let flops = work.total_flops();
    let recompute: u64 = MathUnit::ALL
        .iter()
        .map(|u| work.flops(WorkPart::Recompute, *u))
        .sum();
    ComputeEstimate {
        label: ESTIMATE_LABEL,
        gpu: gpu.name,
        flops,
        bytes: parts.iter().map(|p| p.bytes).sum(),
        milliseconds: parts.iter().map(|p| p.milliseconds).sum(),
        parts,
        kinds: kinds(work, gpu),
        recompute_share: if flops == 0 {
            0.0
        } else {
            recompute as f64 / flops as f64
        },
    }
}

/// `12.3 ms`, `850 µs`.
pub fn format_ms(ms: f64) -> String {
    if ms >= 100.0 {
        format!("{ms:.0} ms")
    } else if ms >= 1.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{:.0} µs", ms * 1e3)
    }
}

/// `1.23 TFLOP`, `45.6 GFLOP`.
pub fn format_flops(f: u64) -> String {
    let f = f as f64;
    if f >= 1e12 {
        format!("{:.2} TFLOP", f / 1e12)
    } else if f >= 1e9 {
        format!("{:.1} GFLOP", f / 1e9)
    } else {
        format!("{:.1} MFLOP", f / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::profile;

    #[test]
    fn each_unit_runs_at_its_own_peak_and_the_rest_at_bandwidth() {
        let h100 = profile("H100-SXM-80GB").expect("known");
        let mut w = WorkTally::default();
        // One second of each at the H100's vendor peaks.
        w.add_flops(
            WorkPart::Forward,
            FlopKind::Matmul,
            MathUnit::Half,
            989_400_000_000_000,
        );
        w.add_flops(
            WorkPart::Recompute,
            FlopKind::Rnn,
            MathUnit::Fp32,
            66_900_000_000_000,
        );
        w.add_bytes(WorkPart::Backward, 3_352_000_000_000);
        let e = estimate(&w, h100);
        let ms = |p| e.part(p).map(|p| p.milliseconds.round() as u64);
        assert_eq!(ms(WorkPart::Forward), Some(1000));
        assert_eq!(ms(WorkPart::Recompute), Some(1000));
        assert_eq!(ms(WorkPart::Backward), Some(1000));
        assert_eq!(ms(WorkPart::Optimizer), None);
        assert_eq!(e.milliseconds.round() as u64, 3000);
        // The same seconds split by kind of kernel.
        let kind_ms = |k| e.kind(k).map(|k| k.milliseconds.round() as u64);
        assert_eq!(kind_ms(FlopKind::Matmul), Some(1000));
        assert_eq!(kind_ms(FlopKind::Rnn), Some(1000));
        assert_eq!(e.kind(FlopKind::Attention), None);
        let share = 66.9 / (989.4 + 66.9);
        assert!((e.recompute_share - share).abs() < 1e-9);
        // TF32 (cuDNN's fp32 convolutions) at its own rate.
        let a100 = profile("A100-SXM-80GB").expect("known");
        let mut c = WorkTally::default();
        c.add_flops(
            WorkPart::Forward,
            FlopKind::Convolution,
            MathUnit::Tf32,
            156_000_000_000_000,
        );
        assert_eq!(estimate(&c, a100).milliseconds.round() as u64, 1000);
    }
}
