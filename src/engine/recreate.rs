//! A model or an optimizer re-created inside the loop (issue 39):
//! `model = Net().cuda()` builds new parameters while an optimizer built
//! before still holds the old ones in its `param_groups` (and their
//! gradients and state with them), and `optimizer = torch.optim.SGD(
//! model.parameters(), …)` drops the old optimizer and what only it held.

use super::error::{EngineError, Result};
use super::modules::Model;
use super::optim::Optimizer;
use super::presets::ModelConfig;
use super::program::SecondModel;
use super::tensor::TensorId;
use super::Engine;
use crate::trace::Phase;

impl Engine {
    /// `model = Net().cuda()`: a new model of the same configuration, its
    /// parameters allocated in `.to("cuda")` order; then the old model
    /// goes as the name is rebound. Its parameters die with it unless
    /// something else holds them: an optimizer built over them (which
    /// keeps them, their `.grad` and their state), or a graph still bound
    /// (its AccumulateGrad nodes). Hooks registered on the old modules go
    /// with them; the new model has none.
    pub(crate) fn recreate_model(&mut self) -> Result<()> {
        let cfg = match &self.model {
            Some(m) => m.cfg.clone(),
            None => return Err(EngineError::Program("no model".into())),
        };
        let prev = self.phase_begin(Phase::User);
        let built = Model::build(self, &cfg);
        self.phase_end(Phase::User, prev);
        let new = built?;
        let Some(old) = self.model.replace(Box::new(new)) else {
            return Ok(());
        };
        self.forward_hooks.clear();
        self.backward_hooks.clear();
        // An optimizer built over the old model keeps its own list of them.
        if let Some(o) = self.optimizer.as_mut() {
            if o.params.is_none() {
                o.params = Some(old.params.clone());
                for p in &old.params {
                    self.retain(*p);
                }
            }
        }
        // The old Module's attributes go in order: each module's own
        // parameters (a parameter's .grad before its storage), then its
        // buffers.
        self.drop_model(&old);
        Ok(())
    }

    /// `optimizer = <the scenario's optimizer>(model.parameters(), …)`: a
    /// new optimizer over the model's current parameters (its state made
    /// at its first step), then the old one goes: its `state` first (each
    /// parameter's buffers, in the order they were made), then its
    /// `param_groups`, whose list lets go of its parameters last first
    /// (CPython's list_dealloc), each freed with its `.grad` if nothing
    /// else holds it.
    pub(crate) fn recreate_optimizer(&mut self) -> Result<()> {
        let Some(old) = self.optimizer.take() else {
            return Err(EngineError::Program("no optimizer".into()));
        };
        self.optimizer = Some(Optimizer::new(old.cfg.clone()));
        self.drop_optimizer(old);
        Ok(())
    }

    /// An optimizer's last reference goes: its state first (each
    /// parameter's buffers, in the order they were made), then its
    /// `param_groups`, whose list lets go of its parameters last first
    /// (CPython's list_dealloc), each freed with its `.grad` if nothing
    /// else holds it.
    pub(crate) fn drop_optimizer(&mut self, old: Optimizer) {
        let order = match &old.params {
            Some(p) => p.clone(),
            None => self.parameters(),
        };
        let mut state = old.state;
        for p in &order {
            if let Some(st) = state.remove(p) {
                for t in st.step.into_iter().chain(st.bufs) {
                    self.decref(t);
                }
            }
        }
        // State of parameters the list no longer names (none in practice).
        let mut rest: Vec<_> = state.into_iter().collect();
        rest.sort_by_key(|(p, _)| *p);
        for (_, st) in rest {
            for t in st.step.into_iter().chain(st.bufs) {
                self.decref(t);
            }
        }
        if let Some(params) = old.params {
            for p in params.into_iter().rev() {
                self.decref(p);
            }
        }
    }
}

impl Engine {
    /// `name = Net().cuda()`: a second model of the model's configuration
    /// (a teacher): its parameters are made after everything before it, no
    /// optimizer holds them, and they get a `.grad` only if a loss reaches
    /// them. A model already under that name goes once the new one exists.
    /// `shape` gives it its own layers (a GAN's generator beside its
    /// discriminator) instead of the model's.
    pub(crate) fn build_named_model(
        &mut self,
        name: &str,
        shape: Option<&SecondModel>,
    ) -> Result<()> {
        let mut cfg = match &self.model {
            Some(m) => m.cfg.clone(),
            None => return Err(EngineError::Program("no model".into())),
        };
        // Its own shape (a GAN's generator): parameters in the model's dtype.
        if let Some(SecondModel::Mlp { dims, inplace_relu }) = shape {
            let dtype = cfg.param_dtype;
            cfg = ModelConfig::mlp(dims, *inplace_relu);
            cfg.param_dtype = dtype;
        }
        // nanoGPT's checkpointed blocks and the LSTM's hidden state are the
        // model's own in the engine (its recomputation, `hidden`).
        if !matches!(cfg.kind, crate::engine::ModelKind::Modules(_)) {
            return Err(EngineError::Program(format!(
                "{name} = Net().cuda(): a second model is modelled for the module language's \
                 models (the MLP, ResNet, Layers, Modules), not this one"
            )));
        }
        let prev = self.phase_begin(Phase::User);
        let built = Model::build(self, &cfg);
        self.phase_end(Phase::User, prev);
        let new = Box::new(built?);
        let old = match self.named_models.iter_mut().find(|(n, _)| n == name) {
            Some((_, m)) => Some(std::mem::replace(m, new)),
            None => {
                self.named_models.push((name.to_string(), new));
                None
            }
        };
        if let Some(old) = old {
            self.drop_model(&old);
        }
        Ok(())
    }

    /// `del name` of a model `BuildModel` made: its parameters go (each
    /// `.grad` first) unless a graph still holds them.
    pub(crate) fn delete_named_model(&mut self, name: &str) {
        if let Some(i) = self.named_models.iter().position(|(n, _)| n == name) {
            let (_, m) = self.named_models.remove(i);
            self.drop_model(&m);
        }
    }

    /// A model object's last reference goes: its parameters, then its
    /// buffers, each freed unless something else holds it.
    fn drop_model(&mut self, m: &Model) {
        for p in &m.params {
            self.decref(*p);
        }
        for (_, b) in &m.buffers {
            self.decref(*b);
        }
    }

    /// `out = name(x)` for a model `BuildModel` made, with the model's own
    /// grad mode and train/eval flag (those are the loop's, here).
    pub(crate) fn named_model_forward(&mut self, name: &str, x: TensorId) -> Result<TensorId> {
        let Some(i) = self.named_models.iter().position(|(n, _)| n == name) else {
            return Err(EngineError::Program(format!(
                "name '{name}' is not defined"
            )));
        };
        let (n, model) = self.named_models.swap_remove(i);
        let phase = if self.ctx.training && self.ctx.grad_enabled {
            Phase::Forward
        } else {
            Phase::Eval
        };
        let prev = self.phase_begin(phase);
        let r = model.forward(self, x, None);
        self.phase_end(phase, prev);
        self.named_models.push((n, model));
        let last = self.named_models.len() - 1;
        self.named_models.swap(i, last);
        Ok(r?.0)
    }
}
