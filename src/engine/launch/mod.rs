//! Real kernels on the engine's tensors (a CUDA run): each op hands the
//! addresses the allocator gave its inputs and outputs to the engine's
//! [`KernelLauncher`]. Without a launcher (a simulated run) every helper here
//! returns at once. Launching never allocates and never frees, so it cannot
//! change an allocator decision.
//!
//! The kernels work on f32 elements; a tensor offers `min(numel, storage
//! bytes / 4)` of them from its storage's address, so no launch reaches past
//! the storage's own bytes (and the allocator's block is at least that big).
//! CPU tensors, 0-byte tensors and tensors under 4 bytes get no launch.

mod grad;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::device::kernels::{MAX_ELEMS, MAX_GEMM_ROWS};
use crate::device::{AnyLauncher, Kernel, Launch};
use crate::engine::storage::{DeviceKind, StorageId};
use crate::engine::tensor::TensorId;
use crate::engine::work::FlopKind;
use crate::engine::Engine;

/// `(device address, f32 elements)` an operand offers a kernel.
pub(crate) type Span = (u64, u64);

/// What the launcher did over a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LaunchStats {
    /// Successful launches per kernel.
    pub counts: BTreeMap<Kernel, u64>,
    /// Launches (and synchronisations) the device refused.
    pub failed: u64,
    /// The first refusal, for the report.
    pub first_error: Option<String>,
}

impl LaunchStats {
    pub fn count(&self, k: Kernel) -> u64 {
        self.counts.get(&k).copied().unwrap_or(0)
    }

    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }
}

/// `(m, n, k)` for `C[m,n] = A[m,k]·B[k,n]` shrunk until A, B and C fit in
/// `ca`, `cb` and `cc` elements (and m in one launch's grid); None when nothing fits.
pub(crate) fn fit_gemm(
    m: u64,
    n: u64,
    k: u64,
    ca: u64,
    cb: u64,
    cc: u64,
) -> Option<(u32, u32, u32)> {
    let k = k.min(ca).min(cb);
    if k == 0 {
        return None;
    }
    let n = n.min(cb / k).min(cc);
    if n == 0 {
        return None;
    }
    let m = m.min(ca / k).min(cc / n).min(MAX_GEMM_ROWS);
    if m == 0 {
        return None;
    }
    let cast = |x: u64| u32::try_from(x).ok();
    Some((cast(m)?, cast(n)?, cast(k)?))
}

impl Engine {
    /// Launch kernels on this engine's tensors from now on (None: stop).
    pub fn set_launcher(&mut self, launcher: Option<AnyLauncher>) {
        self.launcher = launcher;
    }

    pub fn has_launcher(&self) -> bool {
        self.launcher.is_some()
    }

    pub fn launch_stats(&self) -> &LaunchStats {
        &self.launch_stats
    }

    /// Wait for the launched work; a failure is counted like a failed launch.
    pub fn sync_launches(&mut self) {
        if let Some(l) = self.launcher.as_mut() {
            if let Err(e) = l.synchronize() {
                self.launch_failed(e.to_string());
            }
        }
    }

    fn launch_failed(&mut self, message: String) {
        self.launch_stats.failed += 1;
        self.launch_stats.first_error.get_or_insert(message);
    }

    fn launch(&mut self, l: Launch) {
        #[cfg(test)]
        if self.launch_violations.is_some() {
            let bad = super::tests::launches::violation(self, &l);
            if let (Some(v), Some(bad)) = (self.launch_violations.as_mut(), bad) {
                v.push(bad);
            }
        }
        let Some(launcher) = self.launcher.as_mut() else {
            return;
        };
        match launcher.launch(&l) {
            Ok(()) => *self.launch_stats.counts.entry(l.kernel()).or_default() += 1,
            Err(e) => self.launch_failed(e.to_string()),
        }
    }

    /// `(address, f32 elements)` of a tensor on the GPU, capped by its storage.
    pub(crate) fn span(&self, t: TensorId) -> Option<Span> {
        let x = self.tensors.get(t.0)?;
        self.storage_span(x.storage, x.shape.numel())
    }

    /// `(address, f32 elements)` of `numel` elements of a GPU storage, capped by its bytes.
    pub(crate) fn storage_span(&self, s: StorageId, numel: u64) -> Option<Span> {
        let s = self.storages.get(s.0)?;
        if s.device != DeviceKind::Cuda {
            return None;
        }
        let n = numel.min(s.bytes / 4).min(MAX_ELEMS);
        Some((s.addr?, n)).filter(|&(_, n)| n > 0)
    }

    /// `fill_f32` over a fresh tensor (parameter init, inputs, zeros, seeds).
    pub(crate) fn k_fill(&mut self, t: TensorId, value: f32) {
        self.count_bytes(self.gpu_bytes(t));
        self.launch_fill(t, value);
    }

    fn launch_fill(&mut self, t: TensorId, value: f32) {
        if self.launcher.is_none() {
            return;
        }
        if let Some((out, n)) = self.span(t) {
            self.launch(Launch::Fill { out, value, n });
        }
    }

    /// A one-input elementwise op `out = f(x)` (`relu_f32` stands in for any f).
    pub(crate) fn k_unary(&mut self, x: TensorId, out: TensorId) {
        self.count_bytes(self.gpu_bytes(x).saturating_add(self.gpu_bytes(out)));
        self.launch_unary(x, out);
    }

    fn launch_unary(&mut self, x: TensorId, out: TensorId) {
        if self.launcher.is_none() {
            return;
        }
        if let (Some((x, nx)), Some((out, no))) = (self.span(x), self.span(out)) {
            self.launch(Launch::Relu {
                x,
                out,
                n: nx.min(no),
            });
        }
    }

    /// A two-input elementwise op `out = a ⊕ b` (`add_f32`): adds, muls,
    /// gradient accumulation, optimizer updates.
    pub(crate) fn k_binary(&mut self, a: TensorId, b: TensorId, out: TensorId) {
        let bytes = [a, b, out].map(|t| self.gpu_bytes(t));
        self.count_bytes(bytes.iter().fold(0u64, |s, b| s.saturating_add(*b)));
        self.launch_binary(a, b, out);
    }

    fn launch_binary(&mut self, a: TensorId, b: TensorId, out: TensorId) {
        if self.launcher.is_none() {
            return;
        }
        if let (Some((a, na)), Some((b, nb)), Some((out, no))) =
            (self.span(a), self.span(b), self.span(out))
        {
            let n = na.min(nb).min(no);
            self.launch(Launch::Add { a, b, out, n });
        }
    }

    /// A reduction into a 0-dim `out`: zero it, then `sum_f32` (atomic adds).
    pub(crate) fn k_sum(&mut self, x: TensorId, out: TensorId) {
        self.count_bytes(self.gpu_bytes(x));
        if self.launcher.is_none() {
            return;
        }
        if let (Some((x, n)), Some((out, _))) = (self.span(x), self.span(out)) {
            self.launch(Launch::Fill {
                out,
                value: 0.0,
                n: 1,
            });
            self.launch(Launch::Sum { x, out, n });
        }
    }

    /// `c = a · b` with `c` of `m` rows by `n` and `k` the inner dimension,
    /// shrunk to what the three storages hold.
    pub(crate) fn k_matmul(
        &mut self,
        a: TensorId,
        b: TensorId,
        c: TensorId,
        m: u64,
        n: u64,
        k: u64,
    ) {
        if self.launcher.is_none() {
            return;
        }
        if let (Some(a), Some(b), Some(c)) = (self.span(a), self.span(b), self.span(c)) {
            self.k_matmul_spans(a, b, c, (m, n, k));
        }
    }

    /// [`Engine::k_matmul`] on spans.
    pub(crate) fn k_matmul_spans(&mut self, a: Span, b: Span, c: Span, mnk: (u64, u64, u64)) {
        let (m, n, k) = mnk;
        if let Some((m, n, k)) = fit_gemm(m, n, k, a.1, b.1, c.1) {
            let (a, b, c) = (a.0, b.0, c.0);
            self.launch(Launch::Matmul { a, b, c, m, n, k });
        }
    }

    /// The forward GEMM `out[.., N] = a[.., K] · b`: N is out's last dim, K
    /// a's, and the rows are out's other dims.
    pub(crate) fn k_gemm_forward(&mut self, a: TensorId, b: TensorId, out: TensorId) {
        let (sa, so) = (self.shape(a), self.shape(out));
        self.count_gemm(FlopKind::Matmul, a, so.numel(), sa.last());
        if self.launcher.is_none() {
            return;
        }
        let n = so.last().max(1);
        self.k_matmul(a, b, out, so.numel() / n, n, sa.last());
    }
}

#[cfg(test)]
mod tests {
    use super::fit_gemm;

    #[test]
    fn fit_gemm_keeps_every_operand_inside_its_capacity() {
        let cases = [
            (64, 32, 16, 64 * 16, 16 * 32, 64 * 32),
            (64, 32, 16, 10, 10_000, 10_000),
            (64, 32, 16, 10_000, 7, 10_000),
            (64, 32, 16, 10_000, 10_000, 3),
            (1 << 20, 1 << 20, 1 << 20, 1 << 30, 1 << 30, 1 << 30),
            (1 << 21, 1, 1, 1 << 30, 1 << 30, 1 << 30),
        ];
        for (m, n, k, ca, cb, cc) in cases {
            let (fm, fn_, fk) = fit_gemm(m, n, k, ca, cb, cc).expect("something fits");
            let (fm, fn_, fk) = (u64::from(fm), u64::from(fn_), u64::from(fk));
            assert!(fm * fk <= ca && fk * fn_ <= cb && fm * fn_ <= cc);
            assert!(fm <= m && fn_ <= n && fk <= k);
            assert!(fm <= super::MAX_GEMM_ROWS);
        }
        // Nothing shrinks when everything fits.
        assert_eq!(
            fit_gemm(64, 32, 16, 64 * 16, 16 * 32, 64 * 32),
            Some((64, 32, 16))
        );
        assert_eq!(fit_gemm(4, 4, 4, 0, 16, 16), None);
    }
}
