//! PEFT LoRA on a bitsandbytes base (`peft/tuners/lora/bnb.py`, peft 0.21.2;
//! models.md §13.5): `Linear4bit.forward` (bnb.py:513-566) clones the base
//! layer's result ("defensively", for autograd on a manipulated view), then
//! adds `lora_B(lora_A(dropout(x))) * scaling` cast to the result's dtype
//! first (outside autocast); `Linear8bitLt.forward` (bnb.py:237-282) does
//! the same without the clone. The adapters are fp32: PEFT does not cast
//! them to an integer base's dtype (`_move_adapter_to_device_of_base_layer`,
//! tuners_utils.py:2182-2186).

use super::super::bnb::QuantLayer;
use super::super::error::Result;
use super::super::tag::Category;
use super::super::tensor::TensorId;
use super::super::Engine;
use super::lora::Adapter;
use super::Linear;

impl Engine {
    pub(crate) fn lora_bnb_body(
        &mut self,
        base: &Linear,
        ad: &Adapter,
        x: TensorId,
    ) -> Result<TensorId> {
        let four_bit = matches!(
            self.bnb.weights.get(&base.w).map(|q| q.layer),
            Some(QuantLayer::FourBit(_))
        );
        let mut result = self.linear(x, base.w, base.b)?;
        if four_bit {
            let op = self.op_begin("clone");
            let c = self.empty(self.shape(result), self.dtype(result), Category::Activation);
            let c = c.inspect(|&c| {
                self.k_unary(result, c);
                if self.records(&[result]) {
                    let node = self.new_node(
                        "CloneBackward0",
                        crate::engine::autograd::BwdKind::PassThrough,
                        &[Some(result)],
                    );
                    self.set_grad_fn(c, node, 0);
                }
            });
            let end = self.op_end(op);
            result = self.rebind(result, c)?;
            end?;
        }
        let autocast = self.amp.dtype.is_some();
        let expected = self.dtype(result);
        let xa = if autocast {
            self.local_ref(x)
        } else {
            self.to_dtype(x, self.dtype(ad.a.w))?
        };
        let dropped = self.dropout(xa, ad.dropout)?;
        let a = self.apply_linear(&ad.a, dropped);
        self.release(dropped);
        let a = a?;
        let b = self.apply_linear(&ad.b, a);
        self.release(a);
        let b = b?;
        let scaled = self.mul_scalar(b);
        self.release(b);
        let mut output = scaled?;
        if !autocast {
            let cast = self.to_dtype(output, expected);
            output = self.rebind(output, cast)?;
        }
        let sum = self.add(result, output);
        self.release(output);
        let sum = self.rebind(result, sum);
        self.release(xa);
        sum
    }
}
