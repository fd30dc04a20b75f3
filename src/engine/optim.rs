//! Optimizers (engine.md §5): lazy state at the first step, foreach /
//! for-loop / fused temporaries, `zero_grad`, CPU offload, grad clipping.

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::config::OptimImpl;
use super::dtype::DType;
use super::error::Result;
use super::shape::Shape;
use super::tag::Category;
use super::tensor::TensorId;
use super::Engine;
use crate::trace::Phase;

/// Elements per chunk of ATen's multi-tensor-apply kernels (`kChunkSize`).
pub(crate) const FOREACH_CHUNK: u64 = 65_536;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum OptimizerKind {
    Sgd {
        momentum: f64,
        weight_decay: f64,
    },
    /// L2-style decay (`grad + wd·param`).
    Adam {
        weight_decay: f64,
        amsgrad: bool,
    },
    /// Decoupled decay, in place on the params.
    AdamW {
        weight_decay: f64,
        amsgrad: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerConfig {
    pub kind: OptimizerKind,
    pub implementation: OptimImpl,
    /// `capturable=True`: the `step` tensors live on the GPU (§1.5).
    pub capturable: bool,
    /// Optimizer state in host memory, step on the CPU (§5.3).
    pub cpu_offload: bool,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        OptimizerConfig {
            kind: OptimizerKind::AdamW {
                weight_decay: 0.01,
                amsgrad: false,
            },
            implementation: OptimImpl::Foreach,
            capturable: false,
            cpu_offload: false,
        }
    }
}

impl OptimizerConfig {
    pub fn adamw() -> Self {
        Self::default()
    }

    pub fn adam() -> Self {
        OptimizerConfig {
            kind: OptimizerKind::Adam {
                weight_decay: 0.0,
                amsgrad: false,
            },
            ..Self::default()
        }
    }

    pub fn sgd(momentum: f64) -> Self {
        OptimizerConfig {
            kind: OptimizerKind::Sgd {
                momentum,
                weight_decay: 0.0,
            },
            ..Self::default()
        }
    }

    pub fn with_impl(mut self, i: OptimImpl) -> Self {
        self.implementation = i;
        self
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct ParamState {
    /// exp_avg, exp_avg_sq (, max_exp_avg_sq) — or SGD's momentum_buffer.
    pub bufs: Vec<TensorId>,
    pub step: Option<TensorId>,
}

#[derive(Debug, Clone)]
pub(crate) struct Optimizer {
    pub cfg: OptimizerConfig,
    pub state: FxHashMap<TensorId, ParamState>,
    pub steps: u64,
    /// `param_groups[0]["params"]` once they are no longer the model's (a
    /// model re-created after the optimizer was built: these keep their
    /// reference to each old parameter); None while they are the model's.
    pub params: Option<Vec<TensorId>>,
}

impl Optimizer {
    pub fn new(cfg: OptimizerConfig) -> Optimizer {
        Optimizer {
            cfg,
            state: FxHashMap::default(),
            steps: 0,
            params: None,
        }
    }
}

impl Engine {
    /// `model.parameters()`.
    pub fn parameters(&self) -> Vec<TensorId> {
        self.model
            .as_ref()
            .map(|m| m.params.clone())
            .unwrap_or_default()
    }

    /// The parameters the optimizer was built over: the model's, unless the
    /// model was re-created since (`RecreateModel`). (While it steps, the
    /// optimizer is out of the engine: `optimizer_step` reads its own.)
    pub(crate) fn optimizer_params(&self) -> Vec<TensorId> {
        match self.optimizer.as_ref().and_then(|o| o.params.as_ref()) {
            Some(p) => p.clone(),
            None => self.parameters(),
        }
    }

    /// `optimizer.zero_grad(set_to_none)` (§3.2): drop every grad (freed at
    /// once, in parameter order) or zero them in place (no allocation change).
    pub fn zero_grad(&mut self, set_to_none: bool) -> Result<()> {
        let prev = self.op_begin("zero_grad");
        for p in self.optimizer_params() {
            if set_to_none {
                if let Some(g) = self.t_mut(p).grad.take() {
                    self.decref(g);
                }
            } else if let Some(g) = self.grad(p) {
                self.k_fill(g, 0.0);
                self.bump_version(g);
            }
        }
        self.op_end(prev)
    }

    /// `optimizer.step()`.
    pub fn optimizer_step(&mut self) -> Result<()> {
        let Some(opt) = self.optimizer.take() else {
            return Ok(());
        };
        let prev_phase = self.phase_begin(Phase::Optimizer);
        let prev = self.op_begin("optimizer.step");
        let mut opt = opt;
        let r = self.scoped(|e| e.optim_step_inner(&mut opt));
        if r.is_ok() && !opt.cfg.cpu_offload {
            self.count_update_traffic(&opt);
        }
        opt.steps += 1;
        self.optimizer = Some(opt);
        let end = self.op_end(prev);
        self.phase_end(Phase::Optimizer, prev_phase);
        r.and(end)
    }

    /// An update reads each parameter, its gradient and its state and writes
    /// the parameter and the state back: memory-bound whatever the optimizer.
    fn count_update_traffic(&mut self, opt: &Optimizer) {
        let mut bytes = 0u64;
        for p in opt.params.clone().unwrap_or_else(|| self.parameters()) {
            let Some(g) = self.grad(p) else { continue };
            let state: u64 = opt
                .state
                .get(&p)
                .map_or(0, |st| st.bufs.iter().map(|b| self.gpu_bytes(*b)).sum());
            bytes = bytes
                .saturating_add(2 * self.gpu_bytes(p))
                .saturating_add(self.gpu_bytes(g))
                .saturating_add(2 * state);
        }
        self.count_bytes(bytes);
    }

    fn optim_step_inner(&mut self, opt: &mut Optimizer) -> Result<()> {
        // The optimizer is taken out of the engine while it steps.
        let params: Vec<TensorId> = opt
            .params
            .clone()
            .unwrap_or_else(|| self.parameters())
            .into_iter()
            .filter(|p| self.grad(*p).is_some())
            .collect();
        if opt.cfg.cpu_offload {
            return self.step_offload(opt, &params);
        }
        self.init_state(opt, &params)?;
        let imp = opt.cfg.implementation;
        match opt.cfg.kind {
            OptimizerKind::Adam { weight_decay, .. }
            | OptimizerKind::AdamW { weight_decay, .. } => {
                let l2 = matches!(opt.cfg.kind, OptimizerKind::Adam { .. }) && weight_decay != 0.0;
                match imp {
                    OptimImpl::Foreach => {
                        if l2 {
                            // device_grads = _foreach_add(grads, params, alpha=wd) … `del device_grads`
                            let tmp = self.temp_list(&params)?;
                            self.free_list(tmp);
                        }
                        // capturable: bias_correction1 and 2 as _foreach_pow lists
                        // of 0-dim fp32 tensors, one per parameter, before the sqrt
                        // list; they go first as the function returns (the H100
                        // optimizer sweep).
                        let corrections = if opt.cfg.capturable {
                            let bc1 = self.scalar_list(params.len())?;
                            let bc2 = self.scalar_list(params.len());
                            match bc2 {
                                Ok(bc2) => Some((bc1, bc2)),
                                Err(e) => {
                                    self.free_list(bc1);
                                    return Err(e);
                                }
                            }
                        } else {
                            None
                        };
                        // exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs): +1× until the step ends.
                        let sqrt = self.temp_list(&params);
                        let sqrt = match sqrt {
                            Ok(l) => l,
                            Err(e) => {
                                if let Some((bc1, bc2)) = corrections {
                                    self.free_list(bc1);
                                    self.free_list(bc2);
                                }
                                return Err(e);
                            }
                        };
                        for p in &params {
                            self.k_update(*p);
                            self.bump_version(*p);
                        }
                        if let Some((bc1, bc2)) = corrections {
                            self.free_list(bc1);
                            self.free_list(bc2);
                        }
                        self.free_list(sqrt);
                    }
                    OptimImpl::ForLoop if opt.cfg.capturable => {
                        self.adam_step_capturable_forloop(&params, l2)?;
                    }
                    OptimImpl::ForLoop => {
                        let mut prev_denom: Option<TensorId> = None;
                        let mut prev_grad: Option<TensorId> = None;
                        for p in &params {
                            // `grad = grads[i]` rebinding frees the previous decayed grad.
                            if let Some(g) = prev_grad.take() {
                                self.release(g);
                            }
                            if l2 {
                                prev_grad = Some(self.temp_like(*p)?);
                            }
                            // denom = (exp_avg_sq.sqrt() / bc2).add_(eps)
                            let s = self.temp_like(*p)?;
                            let d = self.temp_like(*p)?;
                            self.release(s);
                            if let Some(old) = prev_denom.replace(d) {
                                self.release(old);
                            }
                            self.k_update(*p);
                            self.bump_version(*p);
                        }
                        for t in [prev_denom, prev_grad].into_iter().flatten() {
                            self.release(t);
                        }
                    }
                    OptimImpl::Fused => {
                        for p in &params {
                            self.k_update(*p);
                            self.bump_version(*p);
                        }
                    }
                }
            }
            OptimizerKind::Sgd {
                weight_decay,
                momentum,
            } if imp == OptimImpl::ForLoop => {
                // _single_tensor_sgd, per parameter: `grad.add(param, alpha=wd)`,
                // on the first step the momentum buffer cloned from it, then
                // the decayed grad dropped as `grad = buf` (or the next
                // `grad = grads[i]`) rebinds (the H100 optimizer sweep).
                for p in &params {
                    let decayed = if weight_decay != 0.0 {
                        Some(self.temp_like(*p)?)
                    } else {
                        None
                    };
                    let fresh = opt.state.get(p).is_some_and(|s| s.bufs.is_empty());
                    if momentum != 0.0 && fresh {
                        let b =
                            self.empty(self.shape(*p), self.dtype(*p), Category::OptimizerState);
                        let b = match b {
                            Ok(b) => b,
                            Err(e) => {
                                if let Some(t) = decayed {
                                    self.release(t);
                                }
                                return Err(e);
                            }
                        };
                        self.k_fill(b, 0.0);
                        self.keep(b);
                        if let Some(st) = opt.state.get_mut(p) {
                            st.bufs.push(b);
                        }
                    }
                    self.k_update(*p);
                    self.bump_version(*p);
                    if let Some(t) = decayed {
                        self.release(t);
                    }
                }
            }
            OptimizerKind::Sgd { weight_decay, .. } => {
                let wd = if weight_decay != 0.0 && imp == OptimImpl::Foreach {
                    Some(self.temp_list(&params)?)
                } else {
                    None
                };
                for p in &params {
                    self.k_update(*p);
                    self.bump_version(*p);
                }
                if let Some(l) = wd {
                    self.free_list(l);
                }
            }
        }
        Ok(())
    }

    /// Lazy state (§5.1): params with a grad and no state get it now, in
    /// parameter order: `step` first (GPU only if fused/capturable), then
    /// exp_avg, exp_avg_sq (, max_exp_avg_sq); SGD clones the grad.
    fn init_state(&mut self, opt: &mut Optimizer, params: &[TensorId]) -> Result<()> {
        let prev = self.op_begin("_init_group");
        let r = (|| {
            for p in params {
                if opt.state.contains_key(p) {
                    continue;
                }
                let (shape, dtype) = (self.shape(*p), self.dtype(*p));
                let mut st = ParamState::default();
                let nbufs = match opt.cfg.kind {
                    // The for-loop SGD makes its buffer inside the update loop.
                    OptimizerKind::Sgd { .. } if opt.cfg.implementation == OptimImpl::ForLoop => 0,
                    OptimizerKind::Sgd { momentum, .. } => usize::from(momentum != 0.0),
                    OptimizerKind::Adam { amsgrad, .. } | OptimizerKind::AdamW { amsgrad, .. } => {
                        let gpu_step =
                            opt.cfg.implementation == OptimImpl::Fused || opt.cfg.capturable;
                        let step = if gpu_step {
                            self.empty(Shape::scalar(), DType::F32, Category::OptimizerState)?
                        } else {
                            self.empty_cpu(Shape::scalar(), DType::F32, Category::Cpu)
                        };
                        self.k_fill(step, 0.0);
                        self.keep(step);
                        st.step = Some(step);
                        2 + usize::from(amsgrad)
                    }
                };
                for _ in 0..nbufs {
                    let b = self.empty(shape, dtype, Category::OptimizerState)?;
                    self.k_fill(b, 0.0);
                    self.keep(b);
                    st.bufs.push(b);
                }
                opt.state.insert(*p, st);
            }
            Ok(())
        })();
        self.op_end(prev)?;
        r
    }

    /// Offloaded step (§5.3): grads copied to (pinned) host staging, state and
    /// update on the CPU, params copied back into their existing GPU storages.
    fn step_offload(&mut self, opt: &mut Optimizer, params: &[TensorId]) -> Result<()> {
        let nbufs = match opt.cfg.kind {
            OptimizerKind::Sgd { momentum, .. } => usize::from(momentum != 0.0),
            OptimizerKind::Adam { amsgrad, .. } | OptimizerKind::AdamW { amsgrad, .. } => {
                2 + usize::from(amsgrad)
            }
        };
        for p in params {
            let (shape, dtype) = (self.shape(*p), self.dtype(*p));
            if !opt.state.contains_key(p) {
                let mut st = ParamState::default();
                for _ in 0..nbufs {
                    let b = self.empty_cpu(shape, dtype, Category::Cpu);
                    self.keep(b);
                    st.bufs.push(b);
                }
                opt.state.insert(*p, st);
            }
            let staging = self.empty_cpu(shape, dtype, Category::Cpu);
            self.release(staging);
            self.bump_version(*p);
        }
        Ok(())
    }

    fn temp_like(&mut self, p: TensorId) -> Result<TensorId> {
        let (shape, dtype) = (self.shape(p), self.dtype(p));
        self.empty(shape, dtype, Category::Temporary)
    }

    /// A foreach op's result list, one temporary per parameter.
    fn temp_list(&mut self, params: &[TensorId]) -> Result<Vec<TensorId>> {
        self.foreach_list(params.len(), |e, i| e.temp_like(params[i]))
    }

    /// A foreach op's result list of `n` 0-dim fp32 tensors.
    fn scalar_list(&mut self, n: usize) -> Result<Vec<TensorId>> {
        self.foreach_list(n, |e, _| {
            e.empty(Shape::scalar(), DType::F32, Category::Temporary)
        })
    }

    /// `n` results made in order. If one does not fit, the C++ vector under
    /// construction dies first element first (store_outputs_bug's OOM in
    /// `_foreach_sqrt` on the H100), not last first as a finished Python
    /// list does.
    fn foreach_list(
        &mut self,
        n: usize,
        mut make: impl FnMut(&mut Engine, usize) -> Result<TensorId>,
    ) -> Result<Vec<TensorId>> {
        let mut v = Vec::with_capacity(n);
        for i in 0..n {
            match make(self, i) {
                Ok(t) => v.push(t),
                Err(e) => {
                    for t in v {
                        self.release(t);
                    }
                    return Err(e);
                }
            }
        }
        Ok(v)
    }

    /// `_single_tensor_adam` with `capturable=True`, per parameter (the H100
    /// optimizer sweep): `bias_correction1 = 1 - beta1 ** step` (the power
    /// through a float64 wrapped scalar) and the same for beta2; `step_size
    /// = lr / bias_correction1` (a reciprocal and a product); its negation;
    /// `bias_correction2.sqrt()`; `denom = (exp_avg_sq.sqrt() /
    /// (bias_correction2_sqrt * step_size_neg)).add_(eps / step_size_neg)`.
    /// Each local's rebinding frees the previous parameter's; at return the
    /// six go in the order they were first assigned.
    fn adam_step_capturable_forloop(&mut self, params: &[TensorId], l2: bool) -> Result<()> {
        let sc = Shape::scalar();
        // bias_correction1, bias_correction2, step_size, step_size_neg,
        // bias_correction2_sqrt, denom
        let mut locals: [Option<TensorId>; 6] = [None; 6];
        let mut prev_grad: Option<TensorId> = None;
        let r = (|| {
            for p in params {
                if let Some(g) = prev_grad.take() {
                    self.release(g);
                }
                if l2 {
                    prev_grad = Some(self.temp_like(*p)?);
                }
                let mut rebind = |e: &mut Engine, k: usize, t: TensorId| {
                    if let Some(old) = locals[k].replace(t) {
                        e.release(old);
                    }
                };
                for k in 0..2 {
                    let pow = self.empty(sc, DType::F32, Category::Temporary)?;
                    let wrapped = self.transient(8, Category::Temporary)?;
                    self.free_transient(wrapped);
                    let correction = self.empty(sc, DType::F32, Category::Temporary)?;
                    self.release(pow);
                    rebind(self, k, correction);
                }
                let recip = self.empty(sc, DType::F32, Category::Temporary)?;
                let step_size = self.empty(sc, DType::F32, Category::Temporary)?;
                self.release(recip);
                rebind(self, 2, step_size);
                let neg = self.empty(sc, DType::F32, Category::Temporary)?;
                rebind(self, 3, neg);
                let sqrt = self.empty(sc, DType::F32, Category::Temporary)?;
                rebind(self, 4, sqrt);
                let avg_sqrt = self.temp_like(*p)?;
                let product = self.empty(sc, DType::F32, Category::Temporary)?;
                let denom = self.temp_like(*p)?;
                self.release(avg_sqrt);
                self.release(product);
                let recip = self.empty(sc, DType::F32, Category::Temporary)?;
                let eps_term = self.empty(sc, DType::F32, Category::Temporary)?;
                self.release(recip);
                self.release(eps_term);
                rebind(self, 5, denom);
                self.k_update(*p);
                self.bump_version(*p);
            }
            Ok(())
        })();
        for t in prev_grad.into_iter().chain(locals.into_iter().flatten()) {
            self.release(t);
        }
        r
    }

    /// A Python list dies last element first (CPython `list_dealloc`).
    fn free_list(&mut self, l: Vec<TensorId>) {
        for t in l.into_iter().rev() {
            self.release(t);
        }
    }

    /// `clip_grad_norm_(params, max_norm, foreach=foreach)` (§5.2), as
    /// PyTorch 2.11 runs it on the H100 (tests/fixtures/clip). The norms,
    /// per dtype group: with `foreach`, `_foreach_norm` (a zeroed partials
    /// buffer of one fp32 per 65,536-element chunk of the largest grad per
    /// tensor, the 0-dim norms, the buffer freed); without, one
    /// `vector_norm` per grad (its 0-dim result, then the reduction's
    /// scratch for a large grad). Then `vector_norm(stack(norms))` (the
    /// stack dies with the expression, the norms as `_get_total_norm`
    /// returns); then `max_norm / (total + 1e-6)` through a reciprocal, the
    /// clamped coefficient, and both freed as `_clip_grads_with_norm_`
    /// returns. Scaling is in place. Returns the total norm (a local).
    pub fn clip_grad_norm(&mut self, foreach: bool) -> Result<TensorId> {
        let prev = self.op_begin("clip_grad_norm_");
        let r = (|| {
            let grads: Vec<TensorId> = self
                .parameters()
                .into_iter()
                .filter_map(|p| self.grad(p))
                .collect();
            let sc = Shape::scalar();
            let mut groups: Vec<(DType, Vec<TensorId>)> = Vec::new();
            for g in &grads {
                let dtype = self.dtype(*g);
                match groups.iter_mut().find(|(d, _)| *d == dtype) {
                    Some((_, v)) => v.push(*g),
                    None => groups.push((dtype, vec![*g])),
                }
            }
            let mut norms = Vec::with_capacity(grads.len());
            for (dtype, group) in &groups {
                if foreach {
                    self.foreach_norms(*dtype, group, &mut norms)?;
                } else {
                    self.vector_norms(*dtype, group, &mut norms)?;
                }
            }
            let dtype = groups.first().map_or(DType::F32, |g| g.0);
            let stacked = self.empty(
                Shape::new(&[norms.len() as u64]),
                dtype,
                Category::Temporary,
            )?;
            let total = self.empty(sc, dtype, Category::Temporary)?;
            self.release(stacked);
            self.free_list(norms);
            let shifted = self.empty(sc, dtype, Category::Temporary)?;
            let recip = self.empty(sc, dtype, Category::Temporary)?;
            let coef = self.empty(sc, dtype, Category::Temporary)?;
            self.release(recip);
            self.release(shifted);
            let clamped = self.empty(sc, dtype, Category::Temporary)?;
            for g in &grads {
                self.bump_version(*g);
            }
            self.release(coef);
            self.release(clamped);
            Ok(total)
        })();
        self.op_end(prev)?;
        r
    }

    /// `norms.extend(torch._foreach_norm(group))`: the partials buffer,
    /// then one 0-dim norm per tensor, then the buffer freed. On an OOM the
    /// C++ unwinding frees the norms made so far first to last (a
    /// `std::vector`'s order, where a step's locals unwind last first), then
    /// the buffer.
    fn foreach_norms(
        &mut self,
        dtype: DType,
        group: &[TensorId],
        norms: &mut Vec<TensorId>,
    ) -> Result<()> {
        let chunks = group
            .iter()
            .map(|g| self.shape(*g).numel().div_ceil(FOREACH_CHUNK))
            .max()
            .unwrap_or(0);
        let partials = self.empty(
            Shape::new(&[group.len() as u64 * chunks]),
            DType::F32,
            Category::Temporary,
        )?;
        let mut made = Vec::with_capacity(group.len());
        for _ in group {
            match self.empty(Shape::scalar(), dtype, Category::Temporary) {
                Ok(n) => made.push(n),
                Err(e) => {
                    made.into_iter().for_each(|n| self.release(n));
                    self.release(partials);
                    return Err(e);
                }
            }
        }
        self.release(partials);
        norms.extend(made);
        Ok(())
    }

    /// `norms.extend([torch.linalg.vector_norm(g) for g in group])`: each
    /// 0-dim norm, then its full reduction's scratch.
    fn vector_norms(
        &mut self,
        dtype: DType,
        group: &[TensorId],
        norms: &mut Vec<TensorId>,
    ) -> Result<()> {
        for g in group {
            let n = self.empty(Shape::scalar(), dtype, Category::Temporary)?;
            let reduction = self.full_reduction(*g);
            norms.push(self.scratch_after(n, reduction)?);
        }
        Ok(())
    }

    /// Optimizer-state bytes on the GPU.
    pub fn optimizer_state_bytes(&self) -> u64 {
        let Some(o) = &self.optimizer else { return 0 };
        o.state
            .values()
            .flat_map(|s| s.bufs.iter().chain(s.step.iter()))
            .filter(|t| self.is_cuda(**t))
            .map(|t| self.nbytes(*t))
            .sum()
    }
}
