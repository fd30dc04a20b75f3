//! The small ops the Hugging Face composites are made of (models.md §1–§2):
//! `pow(x, 2)`, `rsqrt`, `-x`, `mean(-1, keepdim=True)`, with the saves
//! derivatives.yaml gives them.

use super::super::amp::CastPolicy;
use super::super::error::Result;
use super::super::tensor::TensorId;
use super::super::Engine;
use crate::engine::autograd::BwdKind;
use crate::engine::torch_rules::EngineRules;

/// What a pointwise op's Node keeps for backward.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keeps {
    Input,
    Result,
    Nothing,
}

impl Engine {
    /// `pow(x, 2)`: PowBackward0 saves self; on autocast's fp32 list. Its
    /// backward, `grad * (2 * self.pow(1))`, makes two temporaries first.
    pub fn pow2(&mut self, x: TensorId) -> Result<TensorId> {
        self.pointwise("pow", "PowBackward0", x, Keeps::Input, CastPolicy::Fp32)
    }

    /// `rsqrt(x)`: RsqrtBackward0 saves its result; on autocast's fp32 list.
    /// Its backward, `-0.5 * grad * result.pow(3)`, makes two temporaries
    /// first.
    pub fn rsqrt(&mut self, x: TensorId) -> Result<TensorId> {
        self.pointwise(
            "rsqrt",
            "RsqrtBackward0",
            x,
            Keeps::Result,
            CastPolicy::Fp32,
        )
    }

    /// `-x`: NegBackward0 saves nothing.
    pub fn neg(&mut self, x: TensorId) -> Result<TensorId> {
        self.pointwise("neg", "NegBackward0", x, Keeps::Nothing, CastPolicy::None)
    }

    /// `x.mean(-1, keepdim=True)`: out [..., 1]; MeanBackward1 saves no
    /// tensor from 2.2 (only sizes and numel), its input in 2.0–2.1
    /// ([`EngineRules::mean_saves_self`](crate::engine::torch_rules::EngineRules::mean_saves_self)),
    /// and its backward makes a gradient of the input's shape.
    pub fn mean_last_keepdim(&mut self, x: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("mean");
        let shape = self.shape(x).with_last(1);
        let out = self.act(shape, self.dtype(x));
        let r = out.inspect(|&out| {
            self.k_sum(x, out);
            if self.records(&[x]) {
                let node = self.new_node("MeanBackward1", BwdKind::Alloc, &[Some(x)]);
                self.set_grad_fn(out, node, 0);
                self.save_mean_input(node, x);
            }
        });
        self.op_end(prev)?;
        r
    }

    /// What a MeanBackward0/1 Node keeps of its input under the run's
    /// release: the input itself in 2.0–2.1, nothing from 2.2.
    pub(crate) fn save_mean_input(&mut self, node: crate::engine::NodeId, x: TensorId) {
        if self.cfg.torch().mean_saves_self() {
            self.save(node, "self", x, false);
        }
    }

    fn pointwise(
        &mut self,
        op: &'static str,
        node_name: &'static str,
        x: TensorId,
        keeps: Keeps,
        policy: CastPolicy,
    ) -> Result<TensorId> {
        let prev = self.op_begin(op);
        let r = (|| {
            let xc = self.autocast_arg(x, policy)?;
            let out = self.act(self.shape(xc), self.dtype(xc));
            let out = match out {
                Ok(o) => o,
                Err(e) => {
                    self.release(xc);
                    return Err(e);
                }
            };
            self.k_unary(xc, out);
            if self.records(&[xc]) {
                let kind = match keeps {
                    Keeps::Nothing => BwdKind::Alloc,
                    Keeps::Input | Keeps::Result => BwdKind::AllocAfterTemps { temps: 2 },
                };
                let node = self.new_node(node_name, kind, &[Some(xc)]);
                self.set_grad_fn(out, node, 0);
                match keeps {
                    Keeps::Input => self.save(node, "self", xc, false),
                    Keeps::Result => self.save(node, "result", out, true),
                    Keeps::Nothing => {}
                }
            }
            self.release(xc);
            Ok(out)
        })();
        self.op_end(prev)?;
        r
    }
}
