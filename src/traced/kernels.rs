//! The CUDA kernels' own buffers for the ops a traced program reports:
//! GEMM workspaces, fused SDPA backwards' scratch, reductions' staging
//! buffers after the op, and the staged plans of [`super::plans`] before,
//! between and after its outputs. The sizes and orders are the engine's
//! ([`crate::engine::EngineConfig`], `SdpaScratch::steps`, `ReducePlan::steps`).

use std::io::Write;

use serde_json::{json, Value};

use super::args::{ok, stack_at, str_at, strides_at, tensor_arg};
use super::error::TraceError;
use super::plans::Stage;
use super::rules::{reduce_shape, GEMM_OPS, REDUCTIONS, SDPA_BACKWARDS};
use super::simulator::{Reply, Simulator};
use crate::engine::autograd::ScratchStep;
use crate::engine::ops::attention::sdpa_backward_scratch;
use crate::engine::ops::matmul::cublas_takes_as_is;
use crate::engine::ops::reduce_input::reduction_reads_as;
use crate::engine::scratch::reduce_split::reduce_plan;
use crate::engine::{CublasLtWorkspace, DType, SdpaBackend};

impl<W: Write> Simulator<W> {
    /// What the GPU's kernel takes beyond its outputs, for an op the
    /// helper reports after it ran; a planned op's last stage.
    pub(super) fn after_op(&mut self, v: &Value) -> Result<Reply, TraceError> {
        let name = str_at(v, 1);
        if let Some(plan) = self.plan.take() {
            let steps = plan.steps(Stage::After);
            let r = self.continue_steps(steps, stack_at(v, 4))?;
            self.release_pending()?;
            return Ok(r);
        }
        if GEMM_OPS.contains(&name.as_str()) {
            return self.gemm(v);
        }
        if let Some((_, backend)) = SDPA_BACKWARDS.iter().find(|(n, _)| *n == name) {
            return self.sdpa_scratch(*backend, v);
        }
        if REDUCTIONS.contains(&name.as_str()) {
            return self.reduction(v);
        }
        Ok(ok())
    }

    /// A planned op before it runs: its plan, the dropout state a cuDNN RNN
    /// creates once, and its first stage. The answer carries the outputs
    /// vramscope sizes (`sizes`).
    pub(super) fn before_op(&mut self, v: &Value) -> Result<Reply, TraceError> {
        self.release_pending()?;
        self.allocator()?;
        let plan = self.plan_for(v);
        let stack = stack_at(v, 4);
        for (what, bytes) in &plan.estimated {
            self.outcome_estimate(what, *bytes);
        }
        if let Some(bytes) = plan.dropout_state {
            // get_dropout_state: a 0-dim int64 seed drawn on the GPU, then
            // the state, cached for the process.
            match self.malloc(8, stack)? {
                Ok(seed) => self.free_block(seed)?,
                Err(m) => return Ok(Some(json!(["oom", m]))),
            }
            match self.malloc(bytes, stack)? {
                Ok(a) => self.ws.dropout_state = Some(a),
                Err(m) => return Ok(Some(json!(["oom", m]))),
            }
        }
        let steps = plan.steps(Stage::Before);
        let sizes: serde_json::Map<String, Value> = plan
            .sizes
            .iter()
            .map(|(i, b)| (i.to_string(), json!(b)))
            .collect();
        let rows = plan.rows.clone();
        let what = format!("aten.{}", str_at(v, 1));
        match &rows {
            Some((_, Some(assumption))) => self.outcome_assumed(&what, assumption, stack),
            Some((_, None)) => self.outcome_known(&what, stack),
            None => {}
        }
        self.plan = Some(plan);
        let r = self.continue_steps(steps, stack)?;
        if r.as_ref().is_some_and(|a| a[0] != "ok") {
            self.plan = None;
            return Ok(r);
        }
        Ok(Some(match rows {
            Some((n, _)) => json!(["ok", {"sizes": sizes, "rows": n}]),
            None => json!(["ok", {"sizes": sizes}]),
        }))
    }

    /// A staged op's output i exists: its plan's steps for that moment.
    pub(super) fn after_output(&mut self, v: &Value) -> Result<Reply, TraceError> {
        let i = v
            .get(5)
            .and_then(Value::as_u64)
            .and_then(|i| usize::try_from(i).ok());
        let steps = match (&self.plan, i) {
            (Some(plan), Some(i)) => plan.steps(Stage::Output(i)),
            _ => Vec::new(),
        };
        let r = self.continue_steps(steps, stack_at(v, 4))?;
        if r.as_ref().is_some_and(|a| a[0] != "ok") {
            self.plan = None;
        }
        Ok(r)
    }

    /// Buffers a plan left taken (an op that raised between its stages).
    fn release_pending(&mut self) -> Result<(), TraceError> {
        for a in std::mem::take(&mut self.pending)
            .into_iter()
            .rev()
            .flatten()
        {
            self.free_block(a)?;
        }
        Ok(())
    }

    /// Steps whose buffer numbers go on from the call's earlier stages.
    fn continue_steps(
        &mut self,
        steps: Vec<ScratchStep>,
        stack: Option<u32>,
    ) -> Result<Reply, TraceError> {
        let taken = std::mem::take(&mut self.pending);
        match self.take_steps(taken, steps, stack)? {
            Ok(taken) => {
                // Kept whole, freed slots too: a later stage counts from here.
                self.pending = taken;
                Ok(ok())
            }
            Err(m) => Ok(Some(json!(["oom", m]))),
        }
    }

    /// `steps` after the buffers `taken` so far (a `Free(i)` counts from
    /// the first of them): the buffers then, freed slots included, or the
    /// OOM's message with every buffer freed.
    fn take_steps(
        &mut self,
        mut taken: Vec<Option<u64>>,
        steps: Vec<ScratchStep>,
        stack: Option<u32>,
    ) -> Result<Result<Vec<Option<u64>>, String>, TraceError> {
        for step in steps {
            match step {
                ScratchStep::Take(0) => taken.push(None),
                ScratchStep::Take(bytes) => match self.malloc(bytes, stack)? {
                    Ok(a) => taken.push(Some(a)),
                    Err(m) => {
                        for a in taken.into_iter().rev().flatten() {
                            self.free_block(a)?;
                        }
                        return Ok(Err(m));
                    }
                },
                ScratchStep::Free(i) => {
                    if let Some(a) = taken.get_mut(i).and_then(Option::take) {
                        self.free_block(a)?;
                    }
                }
            }
        }
        Ok(Ok(taken))
    }

    /// A fused SDPA backward's scratch after its gradients (the engine's
    /// steps, `SdpaScratch::steps`), for q = its second argument.
    fn sdpa_scratch(&mut self, backend: SdpaBackend, v: &Value) -> Result<Reply, TraceError> {
        let (Some((q, Some(dtype), _)), Some((k, _, _))) = (tensor_arg(v, 1), tensor_arg(v, 2))
        else {
            return self.run_steps(Vec::new(), None);
        };
        let ([b, h, t, hd], [_, kv, _, _]) = (q.as_slice(), k.as_slice()) else {
            return self.run_steps(Vec::new(), None);
        };
        let scratch = sdpa_backward_scratch(backend, dtype, [*b, *h, *t, *hd], *kv);
        self.run_steps(scratch.steps(), stack_at(v, 4))
    }

    /// A reduction's staging buffers (the engine's `reduce_plan`), when the
    /// GPU's SMs are known and the pattern is one the engine models.
    fn reduction(&mut self, v: &Value) -> Result<Reply, TraceError> {
        let Some((shape, Some(dtype), contiguous)) = tensor_arg(v, 0) else {
            return self.run_steps(Vec::new(), None);
        };
        // sum and mean reduce `self.to(out dtype)` where it differs
        // (`make_reduction_from_out_ty`, the engine's `reduce_whole_into`):
        // a bool or integer sum is int64, read from an int64 copy.
        let name = str_at(v, 1);
        let out = if dtype.is_floating() {
            dtype
        } else {
            DType::I64
        };
        let reads_as = if name == "sum" || name == "mean" {
            reduction_reads_as(dtype, out)
        } else {
            dtype
        };
        let copy = reads_as != dtype;
        if !contiguous && !copy {
            return self.run_steps(Vec::new(), None);
        }
        // sum/mean take a list of dims; argmax/argmin one (None: all).
        let dims: Option<Vec<i64>> = v.get(3).and_then(|a| a.get(1)).and_then(|d| {
            d.as_array()
                .map(|d| d.iter().filter_map(Value::as_i64).collect())
                .or_else(|| d.as_i64().map(|x| vec![x]))
        });
        let mut steps = Vec::new();
        if copy {
            steps.push(ScratchStep::Take(
                shape.iter().product::<u64>() * reads_as.size(),
            ));
        }
        let device = self.rules.as_ref().and_then(|r| r.engine.reduce_device);
        if let (Some(device), Some(rs)) = (
            device,
            reduce_shape(&shape, dims.as_deref(), reads_as.size()),
        ) {
            let shift = usize::from(copy);
            steps.extend(
                reduce_plan(rs, device)
                    .steps()
                    .into_iter()
                    .map(|s| match s {
                        ScratchStep::Free(i) => ScratchStep::Free(i + shift),
                        take => take,
                    }),
            );
        }
        if copy {
            steps.push(ScratchStep::Free(0));
        }
        self.run_steps(steps, stack_at(v, 4))
    }

    /// A kernel's scratch, step by step; an OOM frees what was taken. The
    /// steps are a function of the op's report alone (its shapes, dtypes
    /// and arguments), so the answer says what the same report takes again
    /// (`same`: its bytes and storages in all), which the helper may then
    /// send within its headroom without waiting.
    fn run_steps(
        &mut self,
        steps: Vec<ScratchStep>,
        stack: Option<u32>,
    ) -> Result<Reply, TraceError> {
        let (bytes, count) = steps.iter().fold((0u64, 0u64), |(b, n), s| match s {
            ScratchStep::Take(t) if *t > 0 => (b + t, n + 1),
            _ => (b, n),
        });
        Ok(Some(match self.take_steps(Vec::new(), steps, stack)? {
            Ok(_) => json!(["ok", {"same": [bytes, count]}]),
            Err(m) => json!(["oom", m]),
        }))
    }

    /// A GEMM's workspaces, in the engine's order (engine.md §1.6,
    /// `Engine::addmm_nd`): a transient cuBLASLt one (older releases), the
    /// thread's cuBLAS one at its first GEMM (or one per call in eager
    /// mode), the thread's cached cuBLASLt one; the per-call ones freed.
    fn gemm(&mut self, v: &Value) -> Result<Reply, TraceError> {
        let name = str_at(v, 1);
        let thread = usize::from(v.get(2).and_then(Value::as_bool).unwrap_or(false));
        let stack = stack_at(v, 4);
        // addmm with a 1-D bias is Linear's epilogue: cublasLt's gemm_and_bias.
        let lt = name == "addmm" && tensor_arg(v, 0).is_some_and(|(shape, _, _)| shape.len() == 1);
        self.allocator()?;
        let Some(rules) = self.rules.clone() else {
            return Ok(ok());
        };
        let mut transient = Vec::new();
        let take = |me: &mut Self, bytes: u64| -> Result<Result<u64, String>, TraceError> {
            me.malloc(bytes, stack)
        };
        // Operands cuBLAS cannot take as they are: cloned for the call.
        let operands: &[usize] = match name.as_str() {
            "mm" => &[0, 1],
            "addmm" => &[1, 2],
            _ => &[],
        };
        let mut copies = Vec::new();
        for &i in operands {
            let (Some((shape, dtype, _)), Some(strides)) = (tensor_arg(v, i), strides_at(v, i))
            else {
                continue;
            };
            let (Ok(sizes), Ok(strides)) = (
                <[u64; 2]>::try_from(shape.as_slice()),
                <[u64; 2]>::try_from(strides.as_slice()),
            ) else {
                continue;
            };
            if !cublas_takes_as_is(sizes, strides) {
                let bytes = sizes[0] * sizes[1] * dtype.map_or(4, DType::size);
                match take(self, bytes)? {
                    Ok(a) => copies.push(a),
                    Err(m) => {
                        for a in copies {
                            self.free_block(a)?;
                        }
                        return Ok(Some(json!(["oom", m])));
                    }
                }
            }
        }
        if lt && rules.lt_rule() == CublasLtWorkspace::Transient {
            match take(self, rules.lt_bytes())? {
                Ok(a) => transient.push(a),
                Err(m) => return Ok(Some(json!(["oom", m]))),
            }
        }
        let cublas = rules.cublas_bytes();
        let mut failed = None;
        if cublas > 0 {
            if !rules.cublas_cached() {
                match take(self, cublas)? {
                    Ok(a) => transient.insert(0, a),
                    Err(m) => failed = Some(m),
                }
            } else if self.ws.cublas[thread].is_none() {
                match take(self, cublas)? {
                    Ok(a) => self.ws.cublas[thread] = Some(a),
                    Err(m) => failed = Some(m),
                }
            }
        }
        let lt_cached = rules.lt_rule() == CublasLtWorkspace::Cached;
        if failed.is_none() && lt && lt_cached && self.ws.lt[thread].is_none() {
            match take(self, rules.lt_bytes())? {
                Ok(a) => self.ws.lt[thread] = Some(a),
                Err(m) => failed = Some(m),
            }
        }
        if let Some(m) = failed {
            for a in transient.into_iter().chain(copies) {
                self.free_block(a)?;
            }
            return Ok(Some(json!(["oom", m])));
        }
        let cloned = !copies.is_empty();
        for a in transient.into_iter().chain(copies) {
            self.free_block(a)?;
        }
        // From here a GEMM on this thread takes no workspace (both cached):
        // at most clones of its operands, which the helper counts against
        // its headroom, so it need not wait (`quiet`).
        // (Any addmm may be Linear's epilogue, which takes the cuBLASLt one.)
        let lt_ready = name != "addmm"
            || rules.lt_rule() == CublasLtWorkspace::Unified
            || (lt_cached && self.ws.lt[thread].is_some());
        let quiet = rules.cublas_cached()
            && (cublas == 0 || self.ws.cublas[thread].is_some())
            && rules.lt_rule() != CublasLtWorkspace::Transient
            && lt_ready;
        // Quiet, and this call's operands cuBLAS takes as they are: a call
        // with the same shapes and strides on this thread takes nothing at
        // all, and the helper need not report it (`still`).
        Ok(Some(
            json!(["ok", {"quiet": quiet, "still": quiet && !cloned}]),
        ))
    }
}
