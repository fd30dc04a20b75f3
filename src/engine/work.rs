//! The arithmetic and memory traffic of the kernels a run launches, counted
//! from their real shapes: what a compute-time estimate divides by a GPU's
//! peak throughput (`crate::engine::estimate`). Counting happens whether or
//! not kernels are really launched, and never touches the allocator.
//!
//! GEMMs, convolutions, attention and cuDNN's LSTM are counted in
//! floating-point operations (2 per multiply-add) by the math unit they run
//! on; every other kernel in bytes read and written.

use serde::Serialize;

use super::autograd::{BwdKind, NodeId};
use super::dtype::DType;
use super::shape::Shape;
use super::storage::DeviceKind;
use super::tensor::TensorId;
use super::Engine;
use crate::trace::Phase;

/// The math unit a floating-point kernel runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum MathUnit {
    /// FP32 on CUDA cores: fp32 matmuls under PyTorch's default
    /// `torch.backends.cuda.matmul.allow_tf32 = False`.
    Fp32,
    /// TF32 tensor cores: fp32 convolutions under the default
    /// `torch.backends.cudnn.allow_tf32 = True` (Ampere and later).
    Tf32,
    /// FP16/BF16 tensor cores.
    Half,
    /// FP64.
    Fp64,
}

impl MathUnit {
    pub const ALL: [MathUnit; 4] = [
        MathUnit::Fp32,
        MathUnit::Tf32,
        MathUnit::Half,
        MathUnit::Fp64,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// Which part of an iteration the work belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum WorkPart {
    Forward,
    /// A checkpointed region's forward, run again during backward.
    Recompute,
    Backward,
    Optimizer,
    /// Setup, evaluation and the loop's own bookkeeping.
    Other,
}

impl WorkPart {
    pub const ALL: [WorkPart; 5] = [
        WorkPart::Forward,
        WorkPart::Recompute,
        WorkPart::Backward,
        WorkPart::Optimizer,
        WorkPart::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            WorkPart::Forward => "forward",
            WorkPart::Recompute => "recompute",
            WorkPart::Backward => "backward",
            WorkPart::Optimizer => "optimizer",
            WorkPart::Other => "other",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What kind of floating-point kernel: decides the math unit for fp32, and
/// names a share of the estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum FlopKind {
    Matmul,
    Convolution,
    Attention,
    /// cuDNN's RNN kernels (`_cudnn_rnn`): their gate GEMMs.
    Rnn,
}

impl FlopKind {
    pub const ALL: [FlopKind; 4] = [
        FlopKind::Matmul,
        FlopKind::Convolution,
        FlopKind::Attention,
        FlopKind::Rnn,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FlopKind::Matmul => "matmul",
            FlopKind::Convolution => "convolution",
            FlopKind::Attention => "attention",
            FlopKind::Rnn => "cuDNN LSTM",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Work counted over some stretch of a run, by part (and FLOPs by kind of
/// kernel and math unit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkTally {
    flops: [[[u64; 4]; 4]; 5],
    bytes: [u64; 5],
}

impl WorkTally {
    pub fn flops(&self, part: WorkPart, unit: MathUnit) -> u64 {
        FlopKind::ALL
            .iter()
            .map(|k| self.kind_flops(part, *k, unit))
            .sum()
    }

    pub fn kind_flops(&self, part: WorkPart, kind: FlopKind, unit: MathUnit) -> u64 {
        self.flops[part.index()][kind.index()][unit.index()]
    }

    pub fn bytes(&self, part: WorkPart) -> u64 {
        self.bytes[part.index()]
    }

    pub fn total_flops(&self) -> u64 {
        self.flops.iter().flatten().flatten().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.total_flops() == 0 && self.bytes.iter().all(|b| *b == 0)
    }

    /// The work done since `earlier` (a tally taken from the same counter).
    pub fn since(&self, earlier: &WorkTally) -> WorkTally {
        let mut d = WorkTally::default();
        for p in 0..5 {
            for k in 0..4 {
                for u in 0..4 {
                    d.flops[p][k][u] = self.flops[p][k][u].saturating_sub(earlier.flops[p][k][u]);
                }
            }
            d.bytes[p] = self.bytes[p].saturating_sub(earlier.bytes[p]);
        }
        d
    }

    pub(crate) fn add_flops(&mut self, part: WorkPart, kind: FlopKind, unit: MathUnit, flops: u64) {
        let f = &mut self.flops[part.index()][kind.index()][unit.index()];
        *f = f.saturating_add(flops);
    }

    pub(crate) fn add_bytes(&mut self, part: WorkPart, bytes: u64) {
        let b = &mut self.bytes[part.index()];
        *b = b.saturating_add(bytes);
    }
}

impl Engine {
    /// The work counted since the engine was made.
    pub fn work(&self) -> WorkTally {
        self.work
    }

    fn work_part(&self) -> WorkPart {
        if self.ckpt.rebuilding() {
            return WorkPart::Recompute;
        }
        match self.ctx.phase {
            Phase::Forward => WorkPart::Forward,
            Phase::Backward => WorkPart::Backward,
            Phase::Optimizer => WorkPart::Optimizer,
            Phase::Setup | Phase::Eval | Phase::User => WorkPart::Other,
        }
    }

    /// `flops` of a `kind` kernel computing in `dtype`.
    pub(crate) fn count_flops(&mut self, kind: FlopKind, dtype: DType, flops: u64) {
        let unit = match dtype {
            DType::F16 | DType::BF16 | DType::F8 => MathUnit::Half,
            DType::F64 => MathUnit::Fp64,
            // cuDNN's TF32 needs Ampere's tensor cores. PyTorch gives fp32
            // RNNs CUDNN_DEFAULT_MATH (TF32 allowed) under the same default
            // `torch.backends.cudnn.allow_tf32 = True` as convolutions
            // (aten/src/ATen/cudnn/Descriptors.h, RNNDescriptor::set).
            _ if matches!(kind, FlopKind::Convolution | FlopKind::Rnn)
                && self.cfg.arch().major() >= 8 =>
            {
                MathUnit::Tf32
            }
            _ => MathUnit::Fp32,
        };
        let part = self.work_part();
        self.work.add_flops(part, kind, unit, flops);
    }

    /// The bytes a GPU kernel moves for tensor `t` (none for a CPU tensor).
    pub(crate) fn gpu_bytes(&self, t: TensorId) -> u64 {
        let storage = self.tensors[t.0].storage;
        match self.storages.get(storage.0) {
            Some(s) if s.device == DeviceKind::Cuda => self.nbytes(t),
            _ => 0,
        }
    }

    /// A memory-bound kernel moving `bytes`.
    pub(crate) fn count_bytes(&mut self, bytes: u64) {
        let part = self.work_part();
        self.work.add_bytes(part, bytes);
    }

    /// `out[.., N] = a[.., K] · b`: 2·rows·N·K.
    pub(crate) fn count_gemm(&mut self, kind: FlopKind, a: TensorId, out_numel: u64, k: u64) {
        let dtype = self.dtype(a);
        self.count_flops(kind, dtype, out_numel.saturating_mul(k).saturating_mul(2));
    }

    /// A fused attention forward on q [B, h, Tq, d] and k [B, h_kv, Tk, d]:
    /// QKᵀ and PV, 4·B·h·Tq·Tk·d, half of it under a causal mask.
    pub(crate) fn count_attention(&mut self, q: TensorId, k: TensorId, causal: bool) {
        let flops = attention_flops(self.shape(q), self.shape(k), causal);
        self.count_flops(FlopKind::Attention, self.dtype(q), flops);
    }

    /// One pass of a cuDNN LSTM over x [T, B, ·] computing in `dtype`: per
    /// layer the four gates' input and hidden GEMMs, 2·4H·(I_l + H)·B·T =
    /// 2·B·T·(numel(w_ih) + numel(w_hh)), `weights` the rank-2 parameters.
    /// The forward is one pass; backward one for dx, dhx, dcx and one for the
    /// weights' gradients. The gate nonlinearities and bias adds (about 10·H
    /// per step and sample against the GEMMs' 8·H·(I + H)) are fused into
    /// cuDNN's kernels and not counted.
    pub(crate) fn count_rnn(&mut self, x: Shape, dtype: DType, weights: &[Shape]) {
        let flops = rnn_flops(x, weights);
        self.count_flops(FlopKind::Rnn, dtype, flops);
    }

    /// One backward pass (data, or weights) of cuDNN LSTM node `n`: as much
    /// as its forward. Its inputs are x, hx, cx, then the parameters.
    pub(crate) fn count_rnn_backward(&mut self, n: NodeId) {
        let inputs = &self.nodes[n.0].inputs;
        let Some(x) = inputs.first() else { return };
        let (shape, dtype) = (x.shape, x.dtype);
        let weights: Vec<Shape> = inputs.iter().skip(3).map(|m| m.shape).collect();
        self.count_rnn(shape, dtype, &weights);
    }

    /// The arithmetic of a backward node's gradient for input `i` beyond
    /// the bytes its kernel moves: a GEMM operand's or a convolution's data
    /// and weight gradients each cost the forward's GEMM; a fused attention backward 2.5 times its
    /// forward (it recomputes the scores; FlashAttention-2's count), counted
    /// with the first gradient it makes.
    pub(crate) fn count_grad_work(
        &mut self,
        n: NodeId,
        kind: BwdKind,
        i: usize,
        g: Option<TensorId>,
    ) {
        let Some(g) = g else { return };
        let inputs = &self.nodes[n.0].inputs;
        match kind {
            BwdKind::Conv { .. } if i < 2 && inputs.len() > 1 => {
                let w = inputs[1].shape;
                let kdim = w.numel() / w.dim(0).max(1);
                let flops = self.shape(g).numel().saturating_mul(kdim).saturating_mul(2);
                self.count_flops(FlopKind::Convolution, self.dtype(g), flops);
            }
            // Each operand's gradient is a GEMM as large as the forward's:
            // 2·numel(a)·N, N the output's columns (a Linear's weight is
            // [out, in], used transposed).
            BwdKind::Gemm {
                has_bias,
                weight_transposed,
            } => {
                let first = usize::from(has_bias);
                if i < first || inputs.len() < first + 2 {
                    return;
                }
                let (a, b) = (inputs[first].shape, inputs[first + 1].shape);
                let n = if weight_transposed {
                    b.dim(0)
                } else {
                    b.last()
                };
                let flops = a.numel().saturating_mul(n).saturating_mul(2);
                self.count_flops(FlopKind::Matmul, inputs[first].dtype, flops);
            }
            BwdKind::Sdpa { causal, .. } if inputs.len() > 1 => {
                if (0..i).any(|j| inputs[j].edge.is_some()) {
                    return;
                }
                let forward = attention_flops(inputs[0].shape, inputs[1].shape, causal);
                let flops = forward.saturating_mul(5) / 2;
                self.count_flops(FlopKind::Attention, inputs[0].dtype, flops);
            }
            _ => {}
        }
    }
}

fn rnn_flops(x: Shape, weights: &[Shape]) -> u64 {
    if x.rank() < 2 {
        return 0;
    }
    let rows = x.dim(0).saturating_mul(x.dim(1));
    weights
        .iter()
        .filter(|w| w.rank() == 2)
        .fold(0u64, |sum, w| {
            sum.saturating_add(w.numel().saturating_mul(rows).saturating_mul(2))
        })
}

fn attention_flops(q: Shape, k: Shape, causal: bool) -> u64 {
    if q.rank() < 2 || k.rank() < 2 {
        return 0;
    }
    let (tq, d) = (q.dim(q.rank() - 2), q.last());
    let tk = k.dim(k.rank() - 2);
    let rows = q.numel() / (tq * d).max(1);
    let full = [4, rows, tq, tk, d]
        .iter()
        .fold(1u64, |p, x| p.saturating_mul(*x));
    if causal {
        full / 2
    } else {
        full
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_subtracts_part_by_part() {
        let mut a = WorkTally::default();
        a.add_flops(WorkPart::Forward, FlopKind::Matmul, MathUnit::Half, 10);
        a.add_bytes(WorkPart::Backward, 7);
        let mut b = a;
        b.add_flops(WorkPart::Forward, FlopKind::Matmul, MathUnit::Half, 5);
        b.add_flops(WorkPart::Recompute, FlopKind::Rnn, MathUnit::Fp32, 3);
        b.add_bytes(WorkPart::Backward, 1);
        let d = b.since(&a);
        assert_eq!(d.flops(WorkPart::Forward, MathUnit::Half), 5);
        assert_eq!(d.flops(WorkPart::Recompute, MathUnit::Fp32), 3);
        assert_eq!(
            d.kind_flops(WorkPart::Recompute, FlopKind::Rnn, MathUnit::Fp32),
            3
        );
        assert_eq!(
            d.kind_flops(WorkPart::Recompute, FlopKind::Matmul, MathUnit::Fp32),
            0
        );
        assert_eq!(d.bytes(WorkPart::Backward), 1);
        assert_eq!(d.total_flops(), 8);
    }
}
