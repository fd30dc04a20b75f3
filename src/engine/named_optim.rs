//! Second optimizers (issue 39: a GAN's generator and discriminator, each
//! with its own optimizer): `optimizerG = torch.optim.Adam(netG.parameters(),
//! …)` over a second model (`BuildModel`), of the scenario's optimizer
//! kind and settings. Its `param_groups` hold the model's parameters (they
//! outlive a `del netG`); its state is made at its first step, as the
//! scenario's optimizer's is. `ZeroGrad(optimizer:)` and
//! `OptimizerStepOf(optimizer:)` run the same code as the scenario's
//! optimizer does, on its own parameters and state.

use super::error::{EngineError, Result};
use super::optim::Optimizer;
use super::Engine;

impl Engine {
    /// `name = <the scenario's optimizer>(model.parameters(), …)` for a
    /// second model `model`. An optimizer already under that name goes once
    /// the new one exists (its state, then its parameters, last first).
    pub(crate) fn build_named_optimizer(&mut self, name: &str, model: &str) -> Result<()> {
        let Some(cfg) = self.optimizer.as_ref().map(|o| o.cfg.clone()) else {
            return Err(EngineError::Program("no optimizer".into()));
        };
        let Some((_, m)) = self.named_models.iter().find(|(n, _)| n == model) else {
            return Err(EngineError::Program(format!(
                "name '{model}' is not defined (a model BuildModel makes)"
            )));
        };
        let params = m.params.clone();
        for p in &params {
            self.retain(*p);
        }
        let mut new = Optimizer::new(cfg);
        new.params = Some(params);
        let old = match self.named_optimizers.iter_mut().find(|(n, _)| n == name) {
            Some((_, o)) => Some(std::mem::replace(o, new)),
            None => {
                self.named_optimizers.push((name.to_string(), new));
                None
            }
        };
        if let Some(old) = old {
            self.drop_optimizer(old);
        }
        Ok(())
    }

    /// Run `f` with the optimizer named `name` in the scenario optimizer's
    /// place (`zero_grad`, `step`), then put both back.
    pub(crate) fn with_named_optimizer<T>(
        &mut self,
        name: &str,
        f: impl FnOnce(&mut Engine) -> Result<T>,
    ) -> Result<T> {
        let Some(i) = self.named_optimizers.iter().position(|(n, _)| n == name) else {
            return Err(EngineError::Program(format!(
                "name '{name}' is not defined (an optimizer BuildOptimizer makes)"
            )));
        };
        let (n, o) = self.named_optimizers.remove(i);
        let main = self.optimizer.replace(o);
        let r = f(self);
        if let Some(o) = std::mem::replace(&mut self.optimizer, main) {
            self.named_optimizers.insert(i, (n, o));
        }
        r
    }

    /// Whether a second optimizer holds parameter `p`.
    pub(crate) fn named_optimizer_holds(&self, p: super::TensorId) -> bool {
        self.named_optimizers
            .iter()
            .any(|(_, o)| o.params.as_ref().is_some_and(|ps| ps.contains(&p)))
    }
}
