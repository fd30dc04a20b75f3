//! Automatic mixed precision: autocast policies and the weight-cast cache
//! (engine.md §6.1–§6.2) and GradScaler (§6.3).

use rustc_hash::FxHashMap;

use super::dtype::DType;
use super::error::{EngineError, Result};
use super::shape::Shape;
use super::tag::Category;
use super::tensor::TensorId;
use super::Engine;

/// What autocast does to an op's floating inputs (§6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CastPolicy {
    /// Cast to the autocast dtype (matmul, linear, conv, SDPA, RNN cells).
    Lower,
    /// Cast up to fp32 (layer_norm, losses, exp/log, …).
    Fp32,
    /// Run in the inputs' dtype.
    None,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct AmpState {
    pub dtype: Option<DType>,
    pub depth: u32,
    pub cache_enabled: bool,
    /// Leaf → its cached cast (the cache holds one strong ref).
    pub cache: FxHashMap<TensorId, TensorId>,
}

impl AmpState {
    /// The autocast dtype if a region is open.
    pub fn active(&self, _inference: bool) -> Option<DType> {
        self.dtype
    }
}

/// GradScaler's persistent and per-step tensors (§6.3).
#[derive(Debug, Clone, Default)]
pub struct GradScalerState {
    pub scale: Option<TensorId>,
    pub growth_tracker: Option<TensorId>,
    /// `found_inf_per_device` kept in the optimizer state until `update()`.
    pub found_inf: Option<TensorId>,
    pub unscaled: bool,
}

impl Engine {
    /// `with torch.autocast("cuda", dtype)`: enter (nesting counts).
    pub fn autocast_enter(&mut self, dtype: DType) {
        self.amp.depth += 1;
        self.amp.dtype = Some(dtype);
        self.amp.cache_enabled = true;
    }

    /// Leave every open autocast region: the end of a `with torch.autocast`
    /// block that wrapped the whole loop (its cache goes with it).
    pub fn leave_autocast(&mut self) {
        while self.amp.depth > 0 {
            self.autocast_exit();
        }
    }

    /// Leave an autocast region; the outermost exit clears the cast cache (§6.2).
    pub fn autocast_exit(&mut self) {
        if self.amp.depth == 0 {
            return;
        }
        self.amp.depth -= 1;
        if self.amp.depth == 0 {
            self.amp.dtype = None;
            self.clear_autocast_cache();
        }
    }

    pub(crate) fn clear_autocast_cache(&mut self) {
        let mut entries: Vec<(TensorId, TensorId)> = self.amp.cache.drain().collect();
        entries.sort();
        for (_, cast) in entries {
            self.decref(cast);
        }
    }

    /// An op's arguments under autocast, cast right to left: the autocast
    /// wrapper's `redispatch(cached_cast(args)...)` leaves the order to the
    /// compiler, and GCC (PyTorch's Linux builds) evaluates call arguments
    /// right to left. On PyTorch 2.11 a Linear casts bias, weight, input
    /// (tests/fixtures/pytorch/captured/amp_fp16). Local handles, as
    /// [`Engine::autocast_arg`] returns them.
    pub(crate) fn autocast_args<const N: usize>(
        &mut self,
        args: [Option<TensorId>; N],
        policy: CastPolicy,
    ) -> Result<[Option<TensorId>; N]> {
        let mut out = [None; N];
        for i in (0..N).rev() {
            let Some(t) = args[i] else { continue };
            match self.autocast_arg(t, policy) {
                Ok(c) => out[i] = Some(c),
                Err(e) => {
                    for c in out.into_iter().flatten() {
                        self.release(c);
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// [`Engine::autocast_args`] when every argument is there.
    pub(crate) fn autocast_all<const N: usize>(
        &mut self,
        args: [TensorId; N],
        policy: CastPolicy,
    ) -> Result<[TensorId; N]> {
        let cast = self.autocast_args(args.map(Some), policy)?;
        Ok(std::array::from_fn(|i| cast[i].unwrap_or(args[i])))
    }

    /// The argument an op sees under autocast: a local handle that the op
    /// releases when done (the original, the cached cast, or a fresh cast).
    pub(crate) fn autocast_arg(&mut self, t: TensorId, policy: CastPolicy) -> Result<TensorId> {
        let Some(target) = self.amp.dtype else {
            return Ok(self.local_ref(t));
        };
        let dt = self.dtype(t);
        if !dt.is_floating() || !self.is_cuda(t) {
            return Ok(self.local_ref(t));
        }
        match policy {
            CastPolicy::None => Ok(self.local_ref(t)),
            CastPolicy::Fp32 if dt.is_half() => self.to_dtype(t, DType::F32),
            CastPolicy::Fp32 => Ok(self.local_ref(t)),
            CastPolicy::Lower if dt == target || dt == DType::F64 => Ok(self.local_ref(t)),
            CastPolicy::Lower => {
                let x = self.t(t);
                // cached_cast: fp32 leaf, requires grad, not a view; not in
                // inference mode in recent releases (#158232) (§6.2).
                let cacheable = self.amp.cache_enabled
                    && !self.ctx.inference
                    && x.grad_fn.is_none()
                    && x.requires_grad
                    && !x.is_view
                    && dt == DType::F32;
                if !cacheable {
                    return self.to_dtype(t, target);
                }
                if let Some(c) = self.amp.cache.get(&t).copied() {
                    return Ok(self.local_ref(c));
                }
                let c = self.cast_tagged(t, target, Category::AmpCache)?;
                self.retain(c);
                self.amp.cache.insert(t, c);
                Ok(c)
            }
        }
    }

    /// `scaler.scale(loss)`: lazily creates `_scale` (fp32) and `_growth_tracker`
    /// (int32), then `loss * scale` (MulBackward0 saves the scale).
    pub fn scaler_scale(&mut self, loss: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("scaler.scale");
        let r = (|| {
            let mut st = self.scaler.take().unwrap_or_default();
            if st.scale.is_none() {
                let s = self.empty(Shape::scalar(), DType::F32, Category::Scaler);
                let s = match s {
                    Ok(s) => s,
                    Err(e) => {
                        self.scaler = Some(st);
                        return Err(e);
                    }
                };
                self.keep(s);
                st.scale = Some(s);
                let g = self.empty(Shape::scalar(), DType::I32, Category::Scaler);
                let g = match g {
                    Ok(g) => g,
                    Err(e) => {
                        self.scaler = Some(st);
                        return Err(e);
                    }
                };
                self.keep(g);
                st.growth_tracker = Some(g);
            }
            let scale = st.scale;
            self.scaler = Some(st);
            match scale {
                Some(s) => self.mul(loss, s),
                None => Err(EngineError::Program("GradScaler has no scale".into())),
            }
        })();
        self.op_end(prev)?;
        r
    }

    /// `scaler.unscale_(optimizer)` (§6.3): inv_scale via a float64 intermediate
    /// (3 transient 512 B blocks, one kept), found_inf, per-device copies of both;
    /// grads multiplied in place. FP16 grads raise once inv_scale and
    /// found_inf exist.
    pub fn scaler_unscale(&mut self) -> Result<()> {
        let prev = self.op_begin("scaler.unscale_");
        let r = self.unscale_inner();
        self.op_end(prev)?;
        r
    }

    fn unscale_inner(&mut self) -> Result<()> {
        if self.scaler.as_ref().is_some_and(|s| s.unscaled) {
            return Err(EngineError::Runtime(
                "unscale_() has already been called on this optimizer since the last update()."
                    .into(),
            ));
        }
        let params = self.optimizer_params();
        let sc = Shape::scalar();
        let a = self.empty(sc, DType::F64, Category::Scaler)?; // _scale.double()
        let b = self.empty(sc, DType::F64, Category::Scaler)?; // .reciprocal()
        self.release(a);
        let inv = self.empty(sc, DType::F32, Category::Scaler)?; // .float()
        self.release(b);
        let found = self.empty(sc, DType::F32, Category::Scaler)?;
        // _unscale_grads_ raises before it replicates either scalar; the
        // frame's locals go in order as the exception leaves unscale_.
        if params
            .iter()
            .any(|p| self.grad(*p).is_some_and(|g| self.dtype(g) == DType::F16))
        {
            self.release(inv);
            self.release(found);
            return Err(EngineError::Value(
                "Attempting to unscale FP16 gradients.".into(),
            ));
        }
        // _MultiDeviceReplicator.get(): `.to(device, copy=True)` of each.
        let found_copy = self.empty(sc, DType::F32, Category::Scaler)?;
        let inv_copy = self.empty(sc, DType::F32, Category::Scaler)?;
        for p in params {
            if let Some(g) = self.grad(p) {
                self.bump_version(g);
            }
        }
        self.release(inv_copy);
        self.release(inv);
        self.release(found);
        self.keep(found_copy);
        let st = self.scaler.get_or_insert_with(GradScalerState::default);
        if let Some(old) = st.found_inf.replace(found_copy) {
            self.decref(old);
        }
        if let Some(st) = self.scaler.as_mut() {
            st.unscaled = true;
        }
        Ok(())
    }

    /// `scaler.step(optimizer)`: unscale if not done, `found_inf.item()` (a host
    /// read), then `optimizer.step()` unless inf/NaN was found: in the
    /// iterations `grad_overflow_iterations` names. A skipped step creates no
    /// optimizer state and changes no parameter.
    pub fn scaler_step(&mut self) -> Result<()> {
        if !self.scaler.as_ref().is_some_and(|s| s.unscaled) {
            self.scaler_unscale()?;
        }
        if self
            .cfg
            .grad_overflow_iterations
            .contains(&self.ctx.iteration)
        {
            return Ok(());
        }
        self.optimizer_step()
    }

    /// `scaler.update()`: in-place scale update; the per-optimizer found_inf is dropped.
    pub fn scaler_update(&mut self) {
        let prev = self.op_begin("scaler.update");
        if let Some(st) = self.scaler.as_mut() {
            st.unscaled = false;
            if let Some(f) = st.found_inf.take() {
                self.decref(f);
            }
            if let Some(s) = self.scaler.as_ref().and_then(|s| s.scale) {
                self.bump_version(s);
            }
        }
        let _ = self.op_end(prev);
    }
}
