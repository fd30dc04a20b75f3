//! PEFT LoRA on a Linear (models.md §6): the frozen base layer plus
//! `lora_B(lora_A(dropout(x))) * scaling`, adapters in fp32 when PEFT
//! upcasts them (`autocast_adapter_dtype=True`, the default).

use super::super::dtype::DType;
use super::super::error::Result;
use super::super::presets_hf::LoraSpec;
use super::super::tag::Category;
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
    /// `update_layer`: lora_A [r, in] and lora_B [out, r], no bias, moved to
    /// the base layer's device and dtype (`_move_adapter_to_device_of_base_layer`);
    /// [`Engine::upcast_adapter`] makes them fp32 afterwards where PEFT does.
    pub(crate) fn new_adapter(
        &mut self,
        path: &str,
        fin: u64,
        fout: u64,
        spec: &LoraSpec,
        params: &mut Vec<TensorId>,
    ) -> Result<Adapter> {
        let a = self.new_linear(&format!("{path}.lora_A"), fin, spec.r, false, params)?;
        let b = self.new_linear(&format!("{path}.lora_B"), spec.r, fout, false, params)?;
        Ok(Adapter {
            a,
            b,
            dropout: spec.dropout,
        })
    }

    /// Whether PEFT upcasts the adapters of a model in this parameter dtype
    /// (`autocast_adapter_dtype=True` and a half-precision base, §6.1).
    pub(crate) fn upcasts_adapters(&self) -> bool {
        self.cfg.peft_upcast_adapters && self.param_dtype.is_half()
    }

    /// `get_peft_model`'s `_cast_adapter_dtype`, once every adapter exists:
    /// `param.data = param.data.to(torch.float32)` for lora_A's and lora_B's
    /// weight in turn, the fp32 copy made before the half one goes (seen in
    /// captured/llama_lora_finetune, `tuners_utils.py` `cast_adapter_dtype`).
    pub(crate) fn upcast_adapter(&mut self, ad: &Adapter) -> Result<()> {
        for l in [&ad.a, &ad.b] {
            let prev = self.enter_module(l.module);
            let op = self.op_begin("param.to(float32)");
            let bytes = self.shape(l.w).numel() * DType::F32.size();
            let r = self.new_storage(bytes, Category::Parameter);
            self.exit_module(prev);
            self.op_end(op)?;
            let s = r?;
            self.storages[s.0].tensor_refs += 1;
            let t = self.t_mut(l.w);
            let old = std::mem::replace(&mut t.storage, s);
            t.dtype = DType::F32;
            self.release_storage_tensor(old);
            self.k_fill(l.w, super::PARAM_INIT);
        }
        Ok(())
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
        self.scoped(|e| {
            if e.bnb.weights.contains_key(&base.w) {
                e.lora_bnb_body(base, ad, x)
            } else {
                e.lora_body(base, ad, x)
            }
        })
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
