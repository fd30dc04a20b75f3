//! `mlp-mnist` (engine.md §10.1): Linear → ReLU → … → Linear.

use super::super::error::Result;
use super::super::ops::elementwise::Unary;
use super::super::tensor::TensorId;
use super::super::Engine;
use super::Linear;

#[derive(Debug)]
pub(crate) struct Mlp {
    pub layers: Vec<Linear>,
    pub inplace_relu: bool,
    pub relu_modules: Vec<u32>,
}

impl Mlp {
    pub fn build(
        e: &mut Engine,
        dims: &[u64],
        inplace_relu: bool,
        params: &mut Vec<TensorId>,
    ) -> Result<Mlp> {
        let mut layers = Vec::new();
        let mut relu_modules = Vec::new();
        for (i, w) in dims.windows(2).enumerate() {
            layers.push(e.new_linear(&format!("fc{}", i + 1), w[0], w[1], true, params)?);
            relu_modules.push(e.tags.module(&format!("relu{}", i + 1)));
        }
        Ok(Mlp {
            layers,
            inplace_relu,
            relu_modules,
        })
    }

    /// fc outputs die after their ReLU (which saves its result, §10.1).
    pub fn forward(&self, e: &mut Engine, x: TensorId) -> Result<TensorId> {
        let mut h = e.local_ref(x);
        let n = self.layers.len();
        for (i, l) in self.layers.iter().enumerate() {
            let y = e.apply_linear(l, h);
            h = e.rebind(h, y)?;
            if i + 1 < n {
                if self.inplace_relu {
                    e.in_module(self.relu_modules[i], |e| e.relu_(h))?;
                } else {
                    let y = e.in_module(self.relu_modules[i], |e| e.unary(Unary::Relu, h));
                    h = e.rebind(h, y)?;
                }
            }
        }
        Ok(h)
    }
}
