//! bitsandbytes' weights moved to the GPU (models.md §13.1): a `Params4bit`
//! or `Int8Params` arrives in the dtype it was loaded in, is quantised on the
//! device, and the original goes; the quantisation state stays beside the
//! packed weight (not a parameter nor a buffer: attributes of its
//! `QuantState`, tagged here as the parameter's). Also `param.data =
//! param.data.to(dtype)`, which bitsandbytes (a bias cast to the compute
//! dtype) and PEFT (`prepare_model_for_kbit_training`'s fp32 cast) do.

use super::super::bnb::{
    blocks, Quant4, QuantLayer, QuantWeight, CODE_4BIT_VALUES, DYNAMIC_MAP_VALUES, NESTED_BLOCKSIZE,
};
use super::super::dtype::DType;
use super::super::error::Result;
use super::super::shape::Shape;
use super::super::tag::Category;
use super::super::tensor::TensorId;
use super::super::Engine;
use super::Linear;

impl Engine {
    /// `Linear4bit(in, out, bias)` / `Linear8bitLt(in, out, bias)` on the GPU:
    /// the quantised weight, then the bias (a plain parameter in the model's
    /// dtype), in `named_parameters()` order.
    pub(crate) fn new_quant_linear(
        &mut self,
        path: &str,
        fin: u64,
        fout: u64,
        bias: bool,
        layer: QuantLayer,
        params: &mut Vec<TensorId>,
    ) -> Result<Linear> {
        let module = self.tags.module(path);
        let prev = self.enter_module(module);
        let w = self.quant_weight(fout, fin, layer);
        self.exit_module(prev);
        let w = w?;
        params.push(w);
        let b = if bias {
            Some(self.new_param(&[fout], module, params)?)
        } else {
            None
        };
        Ok(Linear { w, b, module })
    }

    fn quant_weight(&mut self, out: u64, input: u64, layer: QuantLayer) -> Result<TensorId> {
        // transformers 5.x quantises as the checkpoint loads (`hf_load.rs`).
        let (w, state) = if self.on_meta() {
            let module = self.ctx.module;
            (self.meta_quant(out, input, layer, module)?, Vec::new())
        } else {
            self.quantize_weight(out, input, layer)?
        };
        let orig_dtype = self.param_dtype;
        self.bnb.weights.insert(
            w,
            QuantWeight {
                layer,
                out,
                input,
                orig_dtype,
                state,
                compute: None,
            },
        );
        Ok(w)
    }

    /// The weight quantised on the GPU: (packed weight, its state), kept.
    pub(crate) fn quantize_weight(
        &mut self,
        out: u64,
        input: u64,
        layer: QuantLayer,
    ) -> Result<(TensorId, Vec<TensorId>)> {
        let op = self.op_begin(match layer {
            QuantLayer::FourBit(_) => "Params4bit._quantize",
            QuantLayer::EightBit => "Int8Params._quantize",
        });
        let r = match layer {
            QuantLayer::FourBit(q) => self.quantize_4bit(out, input, &q),
            QuantLayer::EightBit => self.quantize_8bit(out, input),
        };
        self.op_end(op)?;
        let (w, state) = r?;
        self.keep(w);
        for s in &state {
            self.keep(*s);
        }
        Ok((w, state))
    }

    /// `Params4bit._quantize` (nn/modules.py:381-395): `w = data.to(device)`,
    /// then `quantize_4bit` (functional.py:929-960, backends/cuda/ops.py:384-392):
    /// fp32 absmax per block, the packed weight, the 16-value code (and its
    /// normalisation's two temporaries, functional.py:855); with
    /// double quantisation the absmax's mean (0-dim), `absmax - offset`
    /// (a temporary), and `quantize_blockwise(…, blocksize=256)`
    /// (functional.py:613-686, ops.py:299-311): its fp32 absmax, its uint8
    /// output, a copy of the dynamic map (made once per process first); then
    /// the temporary and the fp32 absmax go, and the original weight.
    fn quantize_4bit(
        &mut self,
        out: u64,
        input: u64,
        q: &Quant4,
    ) -> Result<(TensorId, Vec<TensorId>)> {
        let n = out.saturating_mul(input);
        let nblocks = blocks(n, q.blocksize);
        let f32v =
            |e: &mut Engine, len: u64| e.empty(Shape::new(&[len]), DType::F32, Category::Parameter);
        let orig = self.empty(
            Shape::new(&[out, input]),
            self.param_dtype,
            Category::Parameter,
        )?;
        // `quantize_4bit`'s CUDA op launches bitsandbytes' kernel
        // (backends/cuda/ops.py:410-418) after its absmax and output
        // (391-392): the program's first kernel when the model loads before
        // it runs anything else (the driver's layout, docs/driver_addresses.md;
        // the weight's copy above is a host-to-device copy, no kernel).
        self.alloc.device_mut().kernels_started();
        let absmax = f32v(self, nblocks)?;
        let packed = self.empty(
            Shape::new(&[n.div_ceil(2), 1]),
            DType::U8,
            Category::Parameter,
        )?;
        let code = f32v(self, CODE_4BIT_VALUES)?;
        // get_4bit_type's `data.div_(data.abs().max())` (functional.py:855):
        // the absolute values, their 0-dim max; the first goes as `max()`
        // returns, the second after the division.
        let abs = self.empty(
            Shape::new(&[CODE_4BIT_VALUES]),
            DType::F32,
            Category::Temporary,
        )?;
        let max = self.empty(Shape::scalar(), DType::F32, Category::Temporary)?;
        self.release(abs);
        self.release(max);
        let mut state = vec![code];
        if q.double_quant {
            let offset = self.empty(Shape::scalar(), DType::F32, Category::Parameter)?;
            let centred = self.empty(Shape::new(&[nblocks]), DType::F32, Category::Temporary)?;
            if self.bnb.dynamic_map.is_none() {
                let map = f32v(self, DYNAMIC_MAP_VALUES)?;
                self.keep(map);
                self.bnb.dynamic_map = Some(map);
            }
            let nested_absmax = f32v(self, blocks(nblocks, NESTED_BLOCKSIZE))?;
            let qabsmax = self.empty(Shape::new(&[nblocks]), DType::U8, Category::Parameter)?;
            let nested_code = f32v(self, DYNAMIC_MAP_VALUES)?;
            self.release(centred);
            self.release(absmax);
            state.extend([qabsmax, nested_absmax, nested_code, offset]);
        } else {
            state.insert(0, absmax);
        }
        self.release(orig);
        Ok((packed, state))
    }

    /// `Int8Params._quantize` (nn/modules.py:737-748): the weight to the
    /// device in fp16, `int8_vectorwise_quant` (backends/cuda/ops.py:213-225:
    /// the fp32 row scales, then the int8 rows), the fp16 copy freed.
    fn quantize_8bit(&mut self, out: u64, input: u64) -> Result<(TensorId, Vec<TensorId>)> {
        let half = self.empty(Shape::new(&[out, input]), DType::F16, Category::Parameter)?;
        // `int8_vectorwise_quant`'s CUDA op: its row statistics and output
        // (backends/cuda/ops.py:223-224), then the kernel (238-246): as for
        // 4-bit above.
        self.alloc.device_mut().kernels_started();
        let scb = self.empty(Shape::new(&[out]), DType::F32, Category::Parameter)?;
        // int8 has the size of uint8; the summary names it from the registry.
        let cb = self.empty(Shape::new(&[out, input]), DType::U8, Category::Parameter)?;
        self.release(half);
        Ok((cb, vec![scb]))
    }

    /// `param.data = param.data.to(dtype)`: the new storage is made before
    /// the old one goes, and the parameter keeps its identity (its id, its
    /// place in `parameters()`).
    pub(crate) fn param_data_to(&mut self, p: TensorId, dtype: DType) -> Result<()> {
        if self.dtype(p) == dtype {
            return Ok(());
        }
        let bytes = self.shape(p).numel().saturating_mul(dtype.size());
        let module = self.tags.module(&self.param_module(p));
        let prev = self.enter_module(module);
        let op = self.op_begin("param.data.to");
        let s = self.new_storage(bytes, Category::Parameter);
        self.exit_module(prev);
        self.op_end(op)?;
        let s = s?;
        self.storages[s.0].tensor_refs += 1;
        let t = self.t_mut(p);
        let old = std::mem::replace(&mut t.storage, s);
        t.dtype = dtype;
        self.release_storage_tensor(old);
        Ok(())
    }

    /// A Linear weight's [out, in], quantised or not.
    pub(crate) fn linear_dims(&self, w: TensorId) -> (u64, u64) {
        match self.bnb.weights.get(&w) {
            Some(q) => (q.out, q.input),
            None => {
                let s = self.shape(w);
                (s.dim(0), s.dim(1))
            }
        }
    }

    /// A parameter's element count as `nn.Linear` would have it: a packed
    /// 4-bit weight counts its values, as PEFT's `get_nb_trainable_parameters`
    /// counts a `Params4bit` (`num_params * 2 * num_bytes`, peft_model.py:947-954).
    pub(crate) fn param_numel(&self, p: TensorId) -> u64 {
        self.bnb
            .weights
            .get(&p)
            .map_or_else(|| self.shape(p).numel(), QuantWeight::numel)
    }
}
