//! transformers 5.x's `from_pretrained` of a bitsandbytes model as memory
//! (transformers 5.16.1's source; the rule from 5.0 [inf: core_model_loading.py
//! is 5.0's loader; only 5.16.1 was read]): the model is built on `meta`
//! (no storage), the caching allocator is warmed with one block of the
//! model's size, then the checkpoint is loaded in its sorted key order, each
//! tensor copied to the GPU (`_materialize_copy`) and, for a 4-bit weight,
//! quantised there; non-persistent buffers come last.
//!
//! - `modeling_utils.py:4471-4473`: `caching_allocator_warmup` before any
//!   weight; `:5029-5060` `get_total_byte_count` (every parameter and
//!   persistent buffer but the tied ones, `numel × element size`, 0.5 for a
//!   4-bit weight, `quantizer_bnb_4bit.py:83-89`); `:5096-5136` the
//!   reserved-but-unused memory taken off, at most the device's memory less
//!   1.2 GiB, `torch.empty(byte_count // 2, dtype=float16)` freed at once.
//! - `core_model_loading.py:1647`: the state dict sorted by `dot_natural_key`
//!   (digits numerically, names alphabetically: `mlp.down_proj` before
//!   `self_attn.k_proj.bias`); `:1752-1776` each key materialised
//!   (`_materialize_copy`, `:1236-1241`, one copy in the load dtype) and set
//!   on its module, where bitsandbytes quantises it; on-the-fly quantisation
//!   loads one key at a time (`:1630-1638`: no thread pool).
//! - `modeling_utils.py:4815-4818` (`_move_missing_keys_from_meta_to_device`):
//!   non-persistent buffers (`inv_freq`, `original_inv_freq`) moved last, in
//!   the dtype they were made in (fp32: `modeling_qwen2.py:86`).

use super::bnb::QuantLayer;
use super::dtype::DType;
use super::error::Result;
use super::shape::Shape;
use super::tag::Category;
use super::tensor::{Layout, TensorId};
use super::Engine;

/// What one checkpoint key loads into.
#[derive(Debug)]
enum Load {
    Param {
        t: TensorId,
        dtype: DType,
    },
    Quant {
        w: TensorId,
        out: u64,
        input: u64,
        layer: QuantLayer,
        dtype: DType,
    },
}

/// A model built on `meta`, waiting for its checkpoint.
#[derive(Debug, Default)]
pub(crate) struct MetaModel {
    /// (key, module, what it loads).
    keys: Vec<(String, u32, Load)>,
    /// Non-persistent buffers: (tensor, module, dtype).
    buffers: Vec<(TensorId, u32, DType)>,
}

/// 1.2 GiB: what `caching_allocator_warmup` leaves of the device's memory.
const WARMUP_MARGIN: f64 = 1.2 * 1024.0 * 1024.0 * 1024.0;
/// 1.5 GiB: the least new allocation worth forcing when memory is cached.
const WARMUP_MIN_NEW: f64 = 1.5 * 1024.0 * 1024.0 * 1024.0;

/// `dot_natural_key`: split on `.`; a part of digits sorts as its number,
/// before any name; a name with trailing digits sorts by its stem, then the
/// number.
pub(crate) fn dot_natural_key(key: &str) -> Vec<(u8, String, u64)> {
    key.split('.')
        .map(|part| {
            if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
                (0, String::new(), part.parse().unwrap_or(u64::MAX))
            } else {
                let stem = part.trim_end_matches(|c: char| c.is_ascii_digit());
                let digits = &part[stem.len()..];
                (1, stem.to_string(), digits.parse().unwrap_or(0))
            }
        })
        .collect()
}

impl Engine {
    /// Whether parameters are being made on `meta` (a 5.x `from_pretrained`).
    pub(crate) fn on_meta(&self) -> bool {
        self.hf_meta.is_some()
    }

    /// A tensor with no storage yet.
    fn meta_tensor(&mut self, shape: Shape, dtype: DType, category: Category) -> Result<TensorId> {
        let s = self.new_storage(0, category)?;
        let t = self.wrap_storage(s, shape, dtype, Layout::Contiguous, false);
        self.keep(t);
        Ok(t)
    }

    fn key_for(&self, module: u32, name: &str) -> String {
        let path = self.tags.module_path(module);
        if path.is_empty() {
            name.to_string()
        } else {
            format!("{path}.{name}")
        }
    }

    /// `nn.Parameter` on meta: its key is the module's `weight`, or `bias`
    /// after a weight.
    pub(crate) fn meta_param(&mut self, dims: &[u64], module: u32) -> Result<TensorId> {
        let dtype = self.param_dtype;
        let t = self.meta_tensor(Shape::new(dims), dtype, Category::Parameter)?;
        let had_weight = self
            .hf_meta
            .as_ref()
            .is_some_and(|m| m.keys.iter().any(|(_, md, _)| *md == module));
        let key = self.key_for(module, if had_weight { "bias" } else { "weight" });
        if let Some(m) = &mut self.hf_meta {
            m.keys.push((key, module, Load::Param { t, dtype }));
        }
        Ok(t)
    }

    /// A bitsandbytes weight on meta (quantised as it loads).
    pub(crate) fn meta_quant(
        &mut self,
        out: u64,
        input: u64,
        layer: QuantLayer,
        module: u32,
    ) -> Result<TensorId> {
        let n = out.saturating_mul(input);
        let dims = match layer {
            QuantLayer::FourBit(_) => [n.div_ceil(2), 1],
            QuantLayer::EightBit => [out, input],
        };
        let w = self.meta_tensor(Shape::new(&dims), DType::U8, Category::Parameter)?;
        let key = self.key_for(module, "weight");
        let dtype = self.param_dtype;
        if let Some(m) = &mut self.hf_meta {
            m.keys.push((
                key,
                module,
                Load::Quant {
                    w,
                    out,
                    input,
                    layer,
                    dtype,
                },
            ));
        }
        Ok(w)
    }

    /// A non-persistent buffer on meta.
    pub(crate) fn meta_buffer(
        &mut self,
        dims: &[u64],
        dtype: DType,
        module: u32,
    ) -> Result<TensorId> {
        let t = self.meta_tensor(Shape::new(dims), dtype, Category::Buffer)?;
        if let Some(m) = &mut self.hf_meta {
            m.buffers.push((t, module, dtype));
        }
        Ok(t)
    }

    /// Give `t` a storage of `bytes` made under `op` in `module`.
    fn materialize(
        &mut self,
        t: TensorId,
        module: u32,
        op: &'static str,
        category: Category,
    ) -> Result<()> {
        let bytes = self.shape(t).numel().saturating_mul(self.dtype(t).size());
        let prev = self.enter_module(module);
        let o = self.op_begin(op);
        let s = self.new_storage(bytes, category);
        self.exit_module(prev);
        self.op_end(o)?;
        self.put_storage(t, s?);
        Ok(())
    }

    /// Swap `s` in as `t`'s storage (the meta one goes).
    fn put_storage(&mut self, t: TensorId, s: super::storage::StorageId) {
        self.storages[s.0].tensor_refs += 1;
        let old = std::mem::replace(&mut self.t_mut(t).storage, s);
        self.release_storage_tensor(old);
    }

    /// The bytes `get_total_byte_count` counts for the GPU.
    fn warmup_bytes(m: &MetaModel, e: &Engine) -> f64 {
        m.keys
            .iter()
            .map(|(_, _, l)| match l {
                Load::Param { t, dtype } => (e.shape(*t).numel() * dtype.size()) as f64,
                Load::Quant {
                    out, input, layer, ..
                } => {
                    let n = out.saturating_mul(*input) as f64;
                    match layer {
                        QuantLayer::FourBit(_) => n * 0.5,
                        // `Bnb8BitHfQuantizer.param_element_size`: 1 byte.
                        QuantLayer::EightBit => n,
                    }
                }
            })
            .sum()
    }

    /// `caching_allocator_warmup` (modeling_utils.py:5089-5136).
    fn allocator_warmup(&mut self, m: &MetaModel) -> Result<()> {
        let mut bytes = Self::warmup_bytes(m, self);
        if bytes <= 0.0 {
            return Ok(());
        }
        let stats = self.alloc.stats();
        let (reserved, allocated) = (stats.reserved_bytes(), stats.allocated_bytes());
        let unused = reserved.saturating_sub(allocated) as f64;
        let total = self.cfg.device_bytes as f64;
        let free = total - self.cfg.device_overhead as f64 - reserved as f64;
        if bytes - unused > unused {
            bytes -= unused;
        } else if bytes - unused > WARMUP_MIN_NEW {
            bytes = if unused + 1.0 > free {
                0.0
            } else {
                unused + 1.0
            };
        } else {
            bytes = 0.0;
        }
        bytes = bytes.min(total - WARMUP_MARGIN);
        // `torch.empty(int(byte_count // 2), dtype=torch.float16)`.
        let elements = (bytes / 2.0).floor().max(0.0) as u64;
        let o = self.op_begin("caching_allocator_warmup");
        let r = self.empty(Shape::new(&[elements]), DType::F16, Category::Temporary);
        self.op_end(o)?;
        let t = r?;
        self.release(t);
        Ok(())
    }

    /// Load the meta model: warm-up, every key in `dot_natural_key` order,
    /// then the non-persistent buffers.
    pub(crate) fn load_meta_model(&mut self) -> Result<()> {
        let Some(mut m) = self.hf_meta.take() else {
            return Ok(());
        };
        self.allocator_warmup(&m)?;
        m.keys.sort_by_cached_key(|(k, _, _)| dot_natural_key(k));
        for (_, module, load) in &m.keys {
            match *load {
                Load::Param { t, .. } => {
                    self.materialize(t, *module, "_materialize_copy", Category::Parameter)?;
                    self.k_fill(t, super::modules::PARAM_INIT);
                }
                Load::Quant {
                    w,
                    out,
                    input,
                    layer,
                    dtype,
                } => {
                    let model_dtype = std::mem::replace(&mut self.param_dtype, dtype);
                    let prev = self.enter_module(*module);
                    let r = self.quantize_into(w, out, input, layer);
                    self.exit_module(prev);
                    self.param_dtype = model_dtype;
                    r?;
                }
            }
        }
        for (t, module, _) in &m.buffers {
            self.materialize(
                *t,
                *module,
                "_move_missing_keys_from_meta_to_device",
                Category::Buffer,
            )?;
            self.k_fill(*t, 0.0);
        }
        Ok(())
    }

    /// A meta bitsandbytes weight `w` quantised on the GPU: its copy, the
    /// quantisation's requests, the packed storage moved into `w`.
    fn quantize_into(
        &mut self,
        w: TensorId,
        out: u64,
        input: u64,
        layer: QuantLayer,
    ) -> Result<()> {
        let (packed, state) = self.quantize_weight(out, input, layer)?;
        let s = self.t(packed).storage;
        self.put_storage(w, s);
        self.release(packed);
        let orig_dtype = self.param_dtype;
        if let Some(q) = self.bnb.weights.get_mut(&w) {
            q.state = state;
            q.orig_dtype = orig_dtype;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_as_transformers_sorts_them() {
        let mut keys = vec![
            "model.norm.weight",
            "model.layers.10.input_layernorm.weight",
            "model.layers.2.self_attn.q_proj.weight",
            "model.layers.2.self_attn.k_proj.bias",
            "model.layers.2.mlp.down_proj.weight",
            "model.embed_tokens.weight",
            "lm_head.weight",
            "model.layers.2.self_attn.k_proj.weight",
        ];
        keys.sort_by_key(|k| dot_natural_key(k));
        assert_eq!(
            keys,
            [
                "lm_head.weight",
                "model.embed_tokens.weight",
                "model.layers.2.mlp.down_proj.weight",
                "model.layers.2.self_attn.k_proj.bias",
                "model.layers.2.self_attn.k_proj.weight",
                "model.layers.2.self_attn.q_proj.weight",
                "model.layers.10.input_layernorm.weight",
                "model.norm.weight",
            ]
        );
        // A name's trailing digits sort by number after its stem.
        assert!(dot_natural_key("shard_2") < dot_natural_key("shard_11"));
    }
}
