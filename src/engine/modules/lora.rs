//! PEFT LoRA on a Linear (models.md §6): the frozen base layer plus
//! `lora_B(lora_A(dropout(x))) * scaling`, adapters in fp32 when PEFT
//! upcasts them (`autocast_adapter_dtype=True`, the default).

use super::super::dtype::DType;
use super::super::error::Result;
use super::super::presets_hf::LoraSpec;
use super::super::tensor::TensorId;
use super::super::Engine;
use super::Linear;

/// One adapter pair on a projection.
#[derive(Debug, Clone)]
pub(crate) struct Adapter {
    pub a: Linear,
    pub b: Linear,
    pub dropout: f64,
}

/// A projection: a Linear, with an adapter when LoRA targets it.
#[derive(Debug, Clone)]
pub(crate) struct Proj {
    pub base: Linear,
    pub adapter: Option<Adapter>,
}

impl Proj {
    pub fn plain(base: Linear) -> Proj {
        Proj {
            base,
            adapter: None,
        }
    }
}

impl Engine {
    /// `update_layer`: lora_A [r, in] and lora_B [out, r], no bias, in the
    /// adapter dtype (fp32 when a half-precision base is upcast, §6.1).
    pub(crate) fn new_adapter(
        &mut self,
        path: &str,
        fin: u64,
        fout: u64,
        spec: &LoraSpec,
        params: &mut Vec<TensorId>,
    ) -> Result<Adapter> {
        let base_dtype = self.param_dtype;
        if self.cfg.peft_upcast_adapters && base_dtype.is_half() {
            self.param_dtype = DType::F32;
        }
        let a = self.new_linear(&format!("{path}.lora_A"), fin, spec.r, false, params);
        let b = a.and_then(|a| {
            self.new_linear(&format!("{path}.lora_B"), spec.r, fout, false, params)
                .map(|b| (a, b))
        });
        self.param_dtype = base_dtype;
        let (a, b) = b?;
        Ok(Adapter {
            a,
            b,
            dropout: spec.dropout,
        })
    }

    /// The projection's forward: the Linear, or PEFT's `lora.Linear.forward`.
    pub(crate) fn apply_proj(&mut self, p: &Proj, x: TensorId) -> Result<TensorId> {
        match &p.adapter {
            None => self.apply_linear(&p.base, x),
            Some(ad) => self.in_module(p.base.module, |e| e.lora_forward(&p.base, ad, x)),
        }
    }

    /// `result = base_layer(x); x = _cast_input_dtype(x, lora_A.weight.dtype);
    /// result = result + lora_B(lora_A(dropout(x))) * scaling;
    /// result = result.to(torch_result_dtype)` (models.md §6.2).
    fn lora_forward(&mut self, base: &Linear, ad: &Adapter, x: TensorId) -> Result<TensorId> {
        let mark = self.locals.len();
        let r = self.lora_body(base, ad, x);
        if r.is_err() {
            self.unwind_locals(mark);
        }
        r
    }

    fn lora_body(&mut self, base: &Linear, ad: &Adapter, x: TensorId) -> Result<TensorId> {
        let result = self.linear(x, base.w, base.b)?;
        let result_dtype = self.dtype(result);
        let xa = self.to_dtype(x, self.dtype(ad.a.w))?;
        let dropped = self.dropout(xa, ad.dropout)?;
        let a = self.apply_linear(&ad.a, dropped);
        self.release(dropped);
        let a = a?;
        let b = self.apply_linear(&ad.b, a);
        self.release(a);
        let b = b?;
        // `* scaling` (alpha / r): a Python float, a new tensor all the same.
        let scaled = self.mul_scalar(b);
        self.release(b);
        let scaled = scaled?;
        let sum = self.add(result, scaled);
        self.release(scaled);
        let sum = self.rebind(result, sum)?;
        let out = self.to_dtype(sum, result_dtype);
        self.release(sum);
        // The frame's `x` (the cast input) goes at return.
        self.release(xa);
        out
    }
}
