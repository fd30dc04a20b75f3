//! A `config.json`'s dtype and `quantization_config` (bitsandbytes), as
//! `from_pretrained` reads them (models.md §13.6): `torch_dtype` (`dtype`
//! from transformers v5) is what the parameters load in under
//! `dtype="auto"`, v5's default; a bitsandbytes model without one loads in
//! fp16 (`Bnb4BitHfQuantizer.update_dtype`: "Overriding dtype=None with
//! `dtype=torch.float16` due to requirements of `bitsandbytes`"). The
//! `quantization_config` fields are `BitsAndBytesConfig.to_dict()`'s.

use serde_json::{Map, Value};

use super::bnb::{QuantType, Quantization};
use super::dtype::DType;
use super::hf_config::HfConfigError;

fn bad(file: &str, field: &'static str, message: String) -> HfConfigError {
    HfConfigError::Bad {
        file: file.into(),
        field,
        message,
    }
}

/// A dtype as transformers writes it (`"bfloat16"`, `"torch.float16"`).
fn dtype_named(v: &Value, file: &str, field: &'static str) -> Result<DType, HfConfigError> {
    let name = v.as_str().map(|s| s.trim_start_matches("torch."));
    match name {
        Some("float32") => Ok(DType::F32),
        Some("bfloat16") => Ok(DType::BF16),
        Some("float16") => Ok(DType::F16),
        _ => Err(bad(
            file,
            field,
            format!("expected \"float32\", \"bfloat16\" or \"float16\", got {v}"),
        )),
    }
}

/// The parameters' dtype: `dtype` or `torch_dtype`, else fp16 for a
/// bitsandbytes model and fp32 for any other.
pub(super) fn load_dtype(
    map: &Map<String, Value>,
    file: &str,
    quantized: bool,
) -> Result<DType, HfConfigError> {
    for field in ["dtype", "torch_dtype"] {
        match map.get(field) {
            None | Some(Value::Null) => continue,
            Some(v) => return dtype_named(v, file, field),
        }
    }
    Ok(if quantized { DType::F16 } else { DType::F32 })
}

fn flag(q: &Map<String, Value>, file: &str, field: &'static str) -> Result<bool, HfConfigError> {
    match q.get(field.rsplit('.').next().unwrap_or(field)) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(bad(file, field, format!("expected true or false, got {v}"))),
    }
}

/// `quantization_config`, when the config has one.
pub(super) fn quantization(
    map: &Map<String, Value>,
    file: &str,
) -> Result<Option<Quantization>, HfConfigError> {
    let q = match map.get("quantization_config") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(q)) => q,
        Some(v) => {
            return Err(bad(
                file,
                "quantization_config",
                format!("expected an object, got {v}"),
            ))
        }
    };
    match q.get("quant_method").and_then(Value::as_str) {
        None | Some("bitsandbytes") => {}
        Some(m) => {
            return Err(bad(
                file,
                "quantization_config.quant_method",
                format!("\"{m}\" is not modelled (bitsandbytes is)"),
            ))
        }
    }
    let four = flag(q, file, "quantization_config.load_in_4bit")?;
    let eight = flag(q, file, "quantization_config.load_in_8bit")?;
    match (four, eight) {
        (true, true) => Err(bad(
            file,
            "quantization_config.load_in_4bit",
            "load_in_4bit and load_in_8bit are both true (BitsAndBytesConfig refuses it)".into(),
        )),
        (false, false) => Err(bad(
            file,
            "quantization_config.load_in_4bit",
            "neither load_in_4bit nor load_in_8bit is true".into(),
        )),
        (false, true) => Ok(Some(Quantization::EightBit)),
        (true, false) => four_bit(q, file).map(Some),
    }
}

fn four_bit(q: &Map<String, Value>, file: &str) -> Result<Quantization, HfConfigError> {
    let quant_type = match q.get("bnb_4bit_quant_type") {
        None | Some(Value::Null) => QuantType::FP4,
        Some(Value::String(s)) if s == "fp4" => QuantType::FP4,
        Some(Value::String(s)) if s == "nf4" => QuantType::NF4,
        Some(v) => {
            return Err(bad(
                file,
                "quantization_config.bnb_4bit_quant_type",
                format!("expected \"nf4\" or \"fp4\", got {v}"),
            ))
        }
    };
    let compute_dtype = match q.get("bnb_4bit_compute_dtype") {
        None | Some(Value::Null) => DType::F32,
        Some(v) => dtype_named(v, file, "quantization_config.bnb_4bit_compute_dtype")?,
    };
    match q.get("bnb_4bit_quant_storage").and_then(Value::as_str) {
        None | Some("uint8") | Some("torch.uint8") => {}
        Some(s) => {
            return Err(bad(
                file,
                "quantization_config.bnb_4bit_quant_storage",
                format!("\"{s}\" is not modelled (uint8 is)"),
            ))
        }
    }
    Ok(Quantization::FourBit {
        quant_type,
        double_quant: flag(q, file, "quantization_config.bnb_4bit_use_double_quant")?,
        compute_dtype,
    })
}

#[cfg(test)]
mod tests {
    use super::super::hf_config::parse;
    use super::*;

    const LLAMA: &str = r#""model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
        "intermediate_size": 128, "vocab_size": 100, "num_hidden_layers": 2"#;

    fn with(extra: &str) -> String {
        format!("{{{LLAMA}, {extra}}}")
    }

    fn quant(extra: &str) -> Option<Quantization> {
        let m = parse(&with(extra), "c.json").unwrap_or_else(|e| panic!("{e}"));
        match m.kind {
            crate::engine::ModelKind::Modules(lm) => lm.quantization,
            _ => None,
        }
    }

    #[test]
    fn a_bitsandbytes_config_is_read_as_transformers_writes_it() {
        let q = quant(
            r#""quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": true,
            "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": true,
            "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8"}"#,
        );
        assert_eq!(
            q,
            Some(Quantization::FourBit {
                quant_type: QuantType::NF4,
                double_quant: true,
                compute_dtype: DType::BF16
            })
        );
        // BitsAndBytesConfig's defaults: FP4, no double quantisation, fp32.
        assert_eq!(
            quant(r#""quantization_config": {"load_in_4bit": true}"#),
            Some(Quantization::FourBit {
                quant_type: QuantType::FP4,
                double_quant: false,
                compute_dtype: DType::F32
            })
        );
        assert_eq!(
            quant(r#""quantization_config": {"load_in_8bit": true}"#),
            Some(Quantization::EightBit)
        );
    }

    #[test]
    fn the_load_dtype_is_the_configs_else_fp16_for_bitsandbytes() {
        let dtype = |extra: &str| {
            parse(&with(extra), "c.json")
                .map(|m| m.param_dtype)
                .unwrap_or_else(|e| panic!("{e}"))
        };
        assert_eq!(dtype(r#""torch_dtype": "bfloat16""#), DType::BF16);
        assert_eq!(dtype(r#""dtype": "float16""#), DType::F16);
        assert_eq!(dtype(r#""torch_dtype": null"#), DType::F32);
        assert_eq!(
            dtype(r#""quantization_config": {"load_in_4bit": true}"#),
            DType::F16
        );
    }

    #[test]
    fn what_is_not_modelled_is_refused_by_field() {
        let err = |extra: &str| {
            parse(&with(extra), "q.json")
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let e = err(r#""quantization_config": {"quant_method": "gptq", "bits": 4}"#);
        assert!(
            e.starts_with("q.json: field `quantization_config.quant_method`"),
            "{e}"
        );
        let e =
            err(r#""quantization_config": {"load_in_4bit": true, "bnb_4bit_quant_type": "int4"}"#);
        assert!(
            e.contains("`quantization_config.bnb_4bit_quant_type`"),
            "{e}"
        );
        let e = err(r#""quantization_config": {"load_in_4bit": true, "load_in_8bit": true}"#);
        assert!(e.contains("both true"), "{e}");
        let e = err(
            r#""quantization_config": {"load_in_4bit": true, "bnb_4bit_quant_storage": "bfloat16"}"#,
        );
        assert!(
            e.contains("`quantization_config.bnb_4bit_quant_storage`"),
            "{e}"
        );
        let e = err(r#""torch_dtype": "float8""#);
        assert!(e.contains("field `torch_dtype`"), "{e}");
    }
}
