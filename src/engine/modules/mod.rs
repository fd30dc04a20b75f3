//! nn.Modules and the preset models (engine.md §10). Parameters are allocated
//! at build time in the order `.to("cuda")` visits them (children first,
//! registration order), which is also `named_parameters()` order.

mod backward_hooks;
pub(crate) use backward_hooks::GradHook;
pub mod bert;
mod bnb_params;
pub mod bottleneck;
pub mod decoder;
pub mod gpt2;
mod input_check;
pub mod lora;
mod lora_bnb;
pub mod lstm_lm;
pub mod resnet;

use std::sync::Arc;

use super::bindings::Value;
use super::dtype::DType;
use super::error::{EngineError, Result};
use super::presets::{LossKind, ModelConfig, ModelKind};
use super::program::KeepWhat;
use super::shape::Shape;
use super::tag::Category;
use super::tensor::TensorId;
use super::Engine;

/// `nn.Linear`: weight [out, in], optional bias [out].
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    pub w: TensorId,
    pub b: Option<TensorId>,
    pub module: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct LayerNorm {
    pub w: TensorId,
    pub b: Option<TensorId>,
    pub module: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct Embedding {
    pub w: TensorId,
    pub module: u32,
}

/// A tensor spec: shape and dtype.
type Spec = (Vec<u64>, DType);

#[derive(Debug)]
pub(crate) enum Net {
    Gpt2(gpt2::Gpt2),
    LstmLm(lstm_lm::LstmLm),
    Lang(crate::engine::model_lang::build::LangNet),
}

#[derive(Debug)]
pub(crate) struct Model {
    pub cfg: ModelConfig,
    pub net: Net,
    /// `model.parameters()` (tied weights once).
    pub params: Vec<TensorId>,
    /// Module buffers (batch-norm running stats and counters).
    pub buffers: Vec<(String, TensorId)>,
}

/// Whether module `path` is `prefix` or lies under it (at a `.`); `""` is the whole model.
pub(crate) fn under_path(prefix: &str, path: &str) -> bool {
    prefix.is_empty()
        || path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|r| r.starts_with('.'))
}

/// The value a CUDA run fills parameters with (the math is a stand-in).
pub(crate) const PARAM_INIT: f32 = 0.02;

impl Engine {
    /// Total parameter count (tied weights once).
    pub fn num_params(&self) -> u64 {
        self.parameters().iter().map(|p| self.param_numel(*p)).sum()
    }

    /// The module path a parameter was created in (`"transformer.h.0.attn"`).
    pub fn param_module(&self, p: TensorId) -> Arc<str> {
        let tag = self.storages[self.tensors[p.0].storage.0].tag;
        self.tags
            .info(tag)
            .map_or_else(|| Arc::from(""), |t| t.module)
    }

    /// `requires_grad_(value)` on every parameter under each module path in
    /// `modules` (a path or a prefix of one at a `.`; `""` is the whole model).
    /// A path that names no parameter is an error, not a silent no-op.
    pub fn set_requires_grad(&mut self, modules: &[String], value: bool) -> Result<()> {
        let params = self.parameters();
        for m in modules {
            let matching: Vec<TensorId> = params
                .iter()
                .copied()
                .filter(|p| under_path(m, &self.param_module(*p)))
                .collect();
            if matching.is_empty() {
                return Err(EngineError::Program(format!(
                    "no parameter under module `{m}`"
                )));
            }
            for p in matching {
                self.t_mut(p).requires_grad = value;
            }
        }
        Ok(())
    }

    /// `requires_grad_(False)` under each path of a language model's
    /// `freeze` list, on the parameters just built (the engine's own list
    /// is not set until the model is).
    fn model_params_for_freeze(&mut self, params: &[TensorId], freeze: &[String]) -> Result<()> {
        for m in freeze {
            let matching: Vec<TensorId> = params
                .iter()
                .copied()
                .filter(|p| under_path(m, &self.param_module(*p)))
                .collect();
            if matching.is_empty() {
                return Err(EngineError::Program(format!(
                    "freeze: no parameter under module `{m}`"
                )));
            }
            for p in matching {
                self.t_mut(p).requires_grad = false;
            }
        }
        Ok(())
    }

    /// A parameter: a leaf of the model's dtype that requires grad, owned by the model.
    pub(crate) fn new_param(
        &mut self,
        dims: &[u64],
        module: u32,
        params: &mut Vec<TensorId>,
    ) -> Result<TensorId> {
        if self.on_meta() {
            let t = self.meta_param(dims, module)?;
            self.t_mut(t).requires_grad = true;
            params.push(t);
            return Ok(t);
        }
        let prev = self.enter_module(module);
        let op = self.op_begin("param.to(cuda)");
        let r = self.empty(Shape::new(dims), self.param_dtype, Category::Parameter);
        self.exit_module(prev);
        self.op_end(op)?;
        let t = r?;
        self.keep(t);
        self.k_fill(t, PARAM_INIT);
        self.t_mut(t).requires_grad = true;
        params.push(t);
        Ok(t)
    }

    pub(crate) fn new_buffer(
        &mut self,
        name: String,
        dims: &[u64],
        dtype: DType,
        module: u32,
        bufs: &mut Vec<(String, TensorId)>,
    ) -> Result<TensorId> {
        if self.on_meta() {
            let t = self.meta_buffer(dims, dtype, module)?;
            bufs.push((name, t));
            return Ok(t);
        }
        let prev = self.enter_module(module);
        let op = self.op_begin("buffer.to(cuda)");
        let r = self.empty(Shape::new(dims), dtype, Category::Buffer);
        self.exit_module(prev);
        self.op_end(op)?;
        let t = r?;
        self.keep(t);
        self.k_fill(t, 0.0);
        bufs.push((name, t));
        Ok(t)
    }

    pub(crate) fn new_linear(
        &mut self,
        path: &str,
        fin: u64,
        fout: u64,
        bias: bool,
        params: &mut Vec<TensorId>,
    ) -> Result<Linear> {
        if let Some(layer) = self.bnb.loading {
            return self.new_quant_linear(path, fin, fout, bias, layer, params);
        }
        let module = self.tags.module(path);
        let w = self.new_param(&[fout, fin], module, params)?;
        let b = if bias {
            Some(self.new_param(&[fout], module, params)?)
        } else {
            None
        };
        Ok(Linear { w, b, module })
    }

    pub(crate) fn new_layer_norm(
        &mut self,
        path: &str,
        d: u64,
        bias: bool,
        params: &mut Vec<TensorId>,
    ) -> Result<LayerNorm> {
        let module = self.tags.module(path);
        let w = self.new_param(&[d], module, params)?;
        let b = if bias {
            Some(self.new_param(&[d], module, params)?)
        } else {
            None
        };
        Ok(LayerNorm { w, b, module })
    }

    pub(crate) fn new_embedding(
        &mut self,
        path: &str,
        n: u64,
        d: u64,
        params: &mut Vec<TensorId>,
    ) -> Result<Embedding> {
        let module = self.tags.module(path);
        let w = self.new_param(&[n, d], module, params)?;
        Ok(Embedding { w, module })
    }

    /// Run `f` inside module scope `module` (restored on every exit path).
    pub(crate) fn in_module<T>(
        &mut self,
        module: u32,
        f: impl FnOnce(&mut Engine) -> Result<T>,
    ) -> Result<T> {
        let prev = self.enter_module(module);
        let r = f(self);
        self.exit_module(prev);
        r
    }

    pub(crate) fn apply_linear(&mut self, l: &Linear, x: TensorId) -> Result<TensorId> {
        let xh = self.backward_hook_input(l.module, x);
        let wrapped = xh != x;
        let y = self.in_module(l.module, |e| e.linear(xh, l.w, l.b));
        self.release(xh);
        let y = y?;
        if self.forward_hooks.iter().any(|(m, _, _)| *m == l.module) {
            if let Err(e) = self.run_forward_hooks(l.module, y) {
                self.release(y);
                return Err(e);
            }
        }
        Ok(self.backward_hook_output(l.module, y, wrapped))
    }

    /// `register_forward_hook` on the Linear at `path`: a hook that appends
    /// what `what` keeps of each output to `list`.
    pub(crate) fn register_forward_hook(
        &mut self,
        path: &str,
        list: &str,
        what: KeepWhat,
    ) -> Result<()> {
        let module = self.hookable_linear(path, list, "register a forward hook on")?;
        self.forward_hooks.push((module, list.to_string(), what));
        Ok(())
    }

    /// `handle.remove()` for the hooks on the module at `path`.
    pub(crate) fn remove_forward_hooks(&mut self, path: &str) {
        let module = self.tags.module(path);
        self.forward_hooks.retain(|(m, _, _)| *m != module);
    }

    /// Each hook on `module` with the module's output `y`: the lambda's
    /// `list.append(o …)` (PyTorch calls hooks after the forward, in order).
    fn run_forward_hooks(&mut self, module: u32, y: TensorId) -> Result<()> {
        let hooks: Vec<(String, KeepWhat)> = self
            .forward_hooks
            .iter()
            .filter(|(m, _, _)| *m == module)
            .map(|(_, l, w)| (l.clone(), *w))
            .collect();
        for (list, what) in hooks {
            let v = match what {
                KeepWhat::Tensor => Value::Tensor(self.local_ref(y)),
                KeepWhat::Detach => Value::Tensor(self.detach(y)),
                KeepWhat::Cpu => Value::Tensor(self.cpu(y)),
                KeepWhat::Item => Value::Float(0.0),
            };
            self.append_value(&list, v)?;
        }
        Ok(())
    }

    pub(crate) fn apply_layer_norm(&mut self, l: &LayerNorm, x: TensorId) -> Result<TensorId> {
        self.in_module(l.module, |e| e.layer_norm(x, Some(l.w), l.b))
    }

    /// Replace a local `x` by `f(x)`: the old value dies only after the new one
    /// exists (rebinding, engine.md §0.3).
    pub(crate) fn rebind(&mut self, x: TensorId, new: Result<TensorId>) -> Result<TensorId> {
        self.release(x);
        new
    }
}

impl Model {
    pub(crate) fn build(e: &mut Engine, cfg: &ModelConfig) -> Result<Model> {
        e.param_dtype = cfg.param_dtype;
        let mut params = Vec::new();
        let mut buffers = Vec::new();
        let net = match &cfg.kind {
            ModelKind::Gpt2 { .. } => Net::Gpt2(gpt2::Gpt2::build(e, &cfg.kind, &mut params)?),
            ModelKind::LstmLm { .. } => {
                Net::LstmLm(lstm_lm::LstmLm::build(e, &cfg.kind, &mut params)?)
            }
            ModelKind::Modules(m) => {
                // The build refuses what `check` refuses, by the same walk.
                m.check_under(cfg.batch, None, e.cfg.hf_kv_path())
                    .map_err(EngineError::Model)?;
                use crate::engine::model_lang::kbit::checkpoint_layers;
                let tree = if m.kbit_training {
                    checkpoint_layers(&m.net)
                } else {
                    m.net.clone()
                };
                e.bnb.loading = m.quantization.as_ref().map(|q| q.layer());
                // transformers 5.x builds a quantised model on meta, then
                // loads its checkpoint (`hf_load.rs`).
                if m.quantization.is_some() && e.cfg.hf_v5() {
                    e.hf_meta = Some(Default::default());
                }
                let net = crate::engine::model_lang::build::LangNet::build(
                    e,
                    &tree,
                    &m.dtypes,
                    &mut params,
                    &mut buffers,
                );
                let net = net.and_then(|n| e.load_meta_model().map(|()| n));
                e.hf_meta = None;
                e.bnb.loading = None;
                let mut net = net?;
                if m.kbit_training {
                    net.prepare_kbit(e, &params)?;
                }
                if let Some(lora) = &m.lora {
                    net.add_lora(e, lora, &mut params)?;
                }
                net.loss_in_forward = cfg.loss == LossKind::HfCausalLm;
                Net::Lang(net)
            }
        };
        let model = Model {
            cfg: cfg.clone(),
            net,
            params,
            buffers,
        };
        if let ModelKind::Modules(m) = &cfg.kind {
            if !m.freeze.is_empty() {
                e.model_params_for_freeze(&model.params, &m.freeze)?;
            }
        }
        Ok(model)
    }

    /// The input batch and target for batch size `b`, allocated x then y.
    /// The batch's input and target; `made_x` is told of the input as soon
    /// as it is made, before the target is.
    pub(crate) fn make_batch(
        &self,
        e: &mut Engine,
        b: u64,
        seq_len: Option<u64>,
        made_x: &mut dyn FnMut(&mut Engine, TensorId),
    ) -> Result<(TensorId, Option<TensorId>)> {
        // Floating inputs arrive in the model's dtype (`x.to(device, dtype)`).
        let fp = self.cfg.param_dtype;
        let (xs, xd, ys): (Vec<u64>, DType, Option<Spec>) = match &self.cfg.kind {
            ModelKind::Gpt2 { seq, .. } => {
                let t = seq_len.unwrap_or(*seq);
                (vec![b, t], DType::I64, Some((vec![b, t], DType::I64)))
            }
            ModelKind::LstmLm { bptt, .. } => {
                let t = seq_len.unwrap_or(*bptt);
                (
                    vec![t, b],
                    DType::I64,
                    Some((vec![t.saturating_mul(b)], DType::I64)),
                )
            }
            ModelKind::Modules(m) => {
                let x = m.input.sig(b, seq_len);
                let out = m
                    .output(b, seq_len, e.cfg.hf_kv_path())
                    .map_err(EngineError::Model)?;
                let y = match self.cfg.loss {
                    LossKind::Sum => None,
                    LossKind::Mse | LossKind::Bce | LossKind::BceWithLogits => Some((out.dims, fp)),
                    LossKind::CrossEntropy | LossKind::Nll | LossKind::HfCausalLm => {
                        let rows = out.dims.split_last().map_or(&[][..], |(_, r)| r);
                        Some((rows.to_vec(), DType::I64))
                    }
                };
                (x.dims, if x.ids { DType::I64 } else { fp }, y)
            }
        };
        let x = e.factory(Shape::new(&xs), xd, Category::Input)?;
        e.k_fill(x, 1.0);
        made_x(e, x);
        let y = match ys {
            Some((s, d)) => Some(e.factory(Shape::new(&s), d, Category::Input)?),
            None => None,
        };
        if let Some(y) = y {
            e.k_fill(y, 0.0);
        }
        Ok((x, y))
    }

    /// `model(x)`; recurrent models also take and return a hidden state.
    pub(crate) fn forward(
        &self,
        e: &mut Engine,
        x: TensorId,
        hidden: Option<(TensorId, TensorId)>,
    ) -> Result<(TensorId, Option<(TensorId, TensorId)>)> {
        self.check_input(e, x)?;
        match &self.net {
            Net::Gpt2(m) => Ok((m.forward(e, x)?, None)),
            Net::Lang(m) => Ok((m.forward(e, x)?, None)),
            Net::LstmLm(m) => {
                let (out, h) = m.forward(e, x, hidden)?;
                Ok((out, Some(h)))
            }
        }
    }

    /// Re-run checkpointed `blocks` (engine.md §7.2).
    pub(crate) fn run_blocks(
        &self,
        e: &mut Engine,
        blocks: std::ops::Range<usize>,
        x: TensorId,
    ) -> Result<TensorId> {
        match &self.net {
            Net::Gpt2(m) if !blocks.is_empty() => m.run_blocks(e, blocks, x),
            Net::Lang(m) if !blocks.is_empty() => m.run_sites(e, blocks, x),
            _ => Ok(e.local_ref(x)),
        }
    }

    /// The criterion on the model output.
    pub(crate) fn loss(
        &self,
        e: &mut Engine,
        out: TensorId,
        target: Option<TensorId>,
    ) -> Result<TensorId> {
        let prev = e.enter_module(0);
        let r = self.loss_inner(e, out, target);
        e.exit_module(prev);
        r
    }

    fn loss_inner(
        &self,
        e: &mut Engine,
        out: TensorId,
        target: Option<TensorId>,
    ) -> Result<TensorId> {
        let need_target = || super::error::EngineError::Program("this loss needs a target".into());
        match self.cfg.loss {
            LossKind::Sum => e.sum(out),
            LossKind::HfCausalLm => e.hf_causal_lm_loss(out, target.ok_or_else(need_target)?),
            LossKind::Mse => e.mse_loss(out, target.ok_or_else(need_target)?),
            LossKind::Bce | LossKind::BceWithLogits => {
                let t = target.ok_or_else(need_target)?;
                let (s, ts) = (e.shape(out), e.shape(t));
                if s != ts {
                    return Err(super::error::EngineError::Value(
                        if self.cfg.loss == LossKind::Bce {
                            format!("Using a target size (torch.Size({ts})) that is different to the input size (torch.Size({s})) is deprecated. Please ensure they have the same size.")
                        } else {
                            format!("Target size (torch.Size({ts})) must be the same as input size (torch.Size({s}))")
                        },
                    ));
                }
                if self.cfg.loss == LossKind::BceWithLogits {
                    return e.binary_cross_entropy_with_logits(out, t);
                }
                let p = e.unary(super::ops::elementwise::Unary::Sigmoid, out)?;
                let r = e.binary_cross_entropy(p, t);
                e.release(p);
                r
            }
            LossKind::CrossEntropy | LossKind::Nll => {
                let t = target.ok_or_else(need_target)?;
                let s = e.shape(out);
                // Class indices (one per row of the flattened output) or, for
                // cross-entropy, class probabilities shaped like the output;
                // anything else goes to nll_loss as indices and fails there.
                let (rows, n, tdtype) = (s.leading(), e.shape(t).numel(), e.dtype(t));
                let probabilities = self.cfg.loss == LossKind::CrossEntropy && n == s.numel();
                if tdtype.is_floating() && !probabilities {
                    return Err(super::error::EngineError::Runtime(format!(
                        "\"nll_loss_forward_reduce_cuda_kernel_2d_index\" not implemented for '{}'",
                        tdtype.kernel_name()
                    )));
                }
                if !tdtype.is_floating() && n != rows {
                    return Err(super::error::EngineError::Value(format!(
                        "Expected input batch_size ({rows}) to match target batch_size ({n})."
                    )));
                }
                let flat = e.reshape(out, Shape::new(&[s.leading(), s.last()]))?;
                let tflat = e.reshape(t, Shape::new(&[e.shape(t).numel()]))?;
                let r = if self.cfg.loss == LossKind::Nll {
                    e.nll_loss(flat, tflat)
                } else {
                    e.cross_entropy(flat, tflat)
                };
                e.release(flat);
                e.release(tflat);
                r
            }
        }
    }
}
