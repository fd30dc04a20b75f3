//! A Hugging Face `config.json` as a model (models.md §0.3 shapes):
//! `model_type` llama, mistral and qwen2 become the language's causal LM
//! (`DecoderLm::to_lang`); gpt2 becomes nanoGPT's GPT (the same parameters;
//! HF's `gelu_new` composite is not modelled). A missing or malformed field
//! is an error naming the file and the field.

use std::path::Path;

use serde_json::{Map, Value};

use super::presets::ModelConfig;
use super::presets_hf::DecoderLm;

mod families;

/// Longest training sequence a config's `max_position_embeddings` is cut to.
pub const DEFAULT_SEQ: u64 = 2048;
/// Larger than any config.json: a wrong path is not read forever.
const MAX_CONFIG_BYTES: u64 = 4 << 20;
/// Layers a config may ask for: a scenario's `model.layers` bound (each
/// layer is engine bookkeeping for every op it runs; 65,536 grew to 4.5 GB).
/// The deepest released decoders have about 130.
pub const MAX_LAYERS: u64 = 1024;
/// A quoted value in an error: its first characters, not a 3 MB string.
const QUOTE_CHARS: usize = 40;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HfConfigError {
    #[error("{file}: {reason}")]
    Io { file: String, reason: String },
    #[error("{file}: line {line} column {column}: {message}")]
    Json {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{file}: missing field `{field}` (model_type \"{model_type}\")")]
    Missing {
        file: String,
        field: &'static str,
        model_type: String,
    },
    #[error("{file}: field `{field}`: {message}")]
    Bad {
        file: String,
        field: &'static str,
        message: String,
    },
    #[error("{file}: model_type \"{model_type}\" is not supported (supported: llama, mistral, qwen2, gpt2, mixtral, qwen2_moe, qwen3_moe, qwen3, phi3, gemma2, gemma3_text)")]
    Unsupported { file: String, model_type: String },
}

/// Read `path` and build its model.
pub fn read(path: &Path) -> Result<ModelConfig, HfConfigError> {
    read_with_notes(path).map(|(m, _)| m)
}

/// Read `path`: its model, and what of the family the model leaves out or
/// assumes (a MoE's routing), in sentences for the model view.
pub fn read_with_notes(path: &Path) -> Result<(ModelConfig, Vec<String>), HfConfigError> {
    let file = path.display().to_string();
    let io = |reason: String| HfConfigError::Io {
        file: file.clone(),
        reason,
    };
    let bytes = crate::files::read_bounded(path, MAX_CONFIG_BYTES).map_err(|e| match e {
        crate::files::BoundedReadError::Io(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            let kind =
                std::fs::metadata(path).map_or("not a plain file", |m| crate::files::kind_of(&m));
            io(format!("{kind}, not a config.json file"))
        }
        crate::files::BoundedReadError::Io(e) => io(e.to_string()),
        crate::files::BoundedReadError::TooLong => io(format!(
            "larger than {}, more than any config.json holds: not a config.json file",
            crate::alloc::format_size(MAX_CONFIG_BYTES)
        )),
    })?;
    let text = String::from_utf8(bytes).map_err(|e| {
        io(format!(
            "not UTF-8 text at byte {}",
            e.utf8_error().valid_up_to()
        ))
    })?;
    parse_with_notes(&text, &file)
}

/// The fields of one config, with the file for messages.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    file: &'a str,
    model_type: &'a str,
}

impl Fields<'_> {
    fn missing(&self, field: &'static str) -> HfConfigError {
        HfConfigError::Missing {
            file: self.file.into(),
            field,
            model_type: self.model_type.into(),
        }
    }

    fn bad(&self, field: &'static str, message: impl Into<String>) -> HfConfigError {
        HfConfigError::Bad {
            file: self.file.into(),
            field,
            message: message.into(),
        }
    }

    /// A positive integer, or None when absent or null.
    fn opt_count(&self, field: &'static str) -> Result<Option<u64>, HfConfigError> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(self.bad(
                    field,
                    format!("expected a positive integer, got {}", quote(v)),
                )),
            },
        }
    }

    fn count(&self, field: &'static str) -> Result<u64, HfConfigError> {
        self.opt_count(field)?.ok_or_else(|| self.missing(field))
    }

    /// A layer count, at most [`MAX_LAYERS`].
    fn layers(&self, field: &'static str) -> Result<u64, HfConfigError> {
        let n = self.count(field)?;
        if n > MAX_LAYERS {
            return Err(self.bad(
                field,
                format!("{n} layers is more than {MAX_LAYERS}, the most modelled"),
            ));
        }
        Ok(n)
    }

    fn flag(&self, field: &'static str, default: bool) -> Result<bool, HfConfigError> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.bad(field, format!("expected true or false, got {}", quote(v)))),
        }
    }

    /// A number the model reads but memory does not depend on.
    fn number(&self, field: &'static str) -> Result<(), HfConfigError> {
        match self.map.get(field) {
            None | Some(Value::Null) | Some(Value::Number(_)) => Ok(()),
            Some(v) => Err(self.bad(field, format!("expected a number, got {}", quote(v)))),
        }
    }
}

/// Parse a config.json's text (`file` names it in errors).
pub fn parse(text: &str, file: &str) -> Result<ModelConfig, HfConfigError> {
    parse_with_notes(text, file).map(|(m, _)| m)
}

/// [`parse`], with the notes of [`read_with_notes`].
pub fn parse_with_notes(
    text: &str,
    file: &str,
) -> Result<(ModelConfig, Vec<String>), HfConfigError> {
    let value: Value = serde_json::from_str(text).map_err(|e| HfConfigError::Json {
        file: file.into(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    let Some(map) = value.as_object() else {
        return Err(HfConfigError::Bad {
            file: file.into(),
            field: "(top level)",
            message: "expected a JSON object".into(),
        });
    };
    let model_type = match map.get("model_type") {
        Some(Value::String(s)) => s.as_str(),
        Some(v) => {
            return Err(HfConfigError::Bad {
                file: file.into(),
                field: "model_type",
                message: format!("expected a string, got {}", quote(v)),
            })
        }
        None => {
            return Err(HfConfigError::Missing {
                file: file.into(),
                field: "model_type",
                model_type: "?".into(),
            })
        }
    };
    let f = Fields {
        map,
        file,
        model_type: &short(model_type),
    };
    match model_type {
        "llama" | "mistral" | "qwen2" => {
            let lm = decoder(&f)?;
            let mut m = ModelConfig::causal_lm(&lm);
            m.param_dtype = super::hf_quant::load_dtype(map, file, lm.quantization.is_some())?;
            Ok((m, Vec::new()))
        }
        "gpt2" => gpt2(&f).map(|m| (m, Vec::new())),
        t if families::FAMILIES.contains(&t) => {
            if super::hf_quant::quantization(map, file)?.is_some() {
                return Err(HfConfigError::Bad {
                    file: file.into(),
                    field: "quantization_config",
                    message: format!(
                        "a quantized {t} is not modelled (bitsandbytes is, for llama, mistral and qwen2)"
                    ),
                });
            }
            let param_dtype = super::hf_quant::load_dtype(map, file, false)?;
            families::read(&f).map(|fam| {
                let m = ModelConfig {
                    loss: super::presets::LossKind::HfCausalLm,
                    param_dtype,
                    ..ModelConfig::modules(fam.model, 1)
                };
                (m, fam.notes)
            })
        }
        other => Err(HfConfigError::Unsupported {
            file: file.into(),
            model_type: short(other),
        }),
    }
}

/// `LlamaConfig` / `MistralConfig` / `Qwen2Config` fields.
fn decoder(f: &Fields) -> Result<DecoderLm, HfConfigError> {
    let hidden = f.count("hidden_size")?;
    let heads = f.count("num_attention_heads")?;
    // HF: num_key_value_heads defaults to num_attention_heads.
    let kv_heads = f.opt_count("num_key_value_heads")?.unwrap_or(heads);
    let head_dim = f.opt_count("head_dim")?;
    if head_dim.is_none() && !hidden.is_multiple_of(heads) {
        return Err(f.bad(
            "num_attention_heads",
            format!("{heads} does not divide hidden_size {hidden} (and there is no head_dim)"),
        ));
    }
    if !heads.is_multiple_of(kv_heads) {
        return Err(f.bad(
            "num_key_value_heads",
            format!("{kv_heads} does not divide num_attention_heads {heads}"),
        ));
    }
    f.number("rms_norm_eps")?;
    f.number("rope_theta")?;
    // Qwen2's q/k/v always carry biases; Llama's follow `attention_bias`.
    let qkv_bias = f.model_type == "qwen2" || f.flag("attention_bias", false)?;
    let seq = f
        .opt_count("max_position_embeddings")?
        .map_or(DEFAULT_SEQ, |m| m.min(DEFAULT_SEQ));
    Ok(DecoderLm {
        hidden,
        intermediate: f.count("intermediate_size")?,
        layers: f.layers("num_hidden_layers")?,
        heads,
        kv_heads,
        head_dim,
        vocab: f.count("vocab_size")?,
        tied: f.flag("tie_word_embeddings", false)?,
        qkv_bias,
        seq,
        lora: None,
        quantization: super::hf_quant::quantization(f.map, f.file)?,
        kbit_training: false,
    })
}

/// `GPT2Config`: nanoGPT's GPT with the same shapes (tied head, biases).
fn gpt2(f: &Fields) -> Result<ModelConfig, HfConfigError> {
    let d = f.count("n_embd")?;
    let heads = f.count("n_head")?;
    if !d.is_multiple_of(heads) {
        return Err(f.bad("n_head", format!("{heads} does not divide n_embd {d}")));
    }
    if let Some(inner) = f.opt_count("n_inner")? {
        if inner != 4 * d {
            return Err(f.bad(
                "n_inner",
                format!("{inner}: only 4 × n_embd ({}) is modelled", 4 * d),
            ));
        }
    }
    let positions = f.count("n_positions")?;
    let mut m = ModelConfig::gpt(
        f.layers("n_layer")?,
        heads,
        d,
        f.count("vocab_size")?,
        positions,
        1,
        positions.min(DEFAULT_SEQ),
    );
    m.batch = 1;
    Ok(m)
}

/// A JSON value for an error: its JSON text, or its first
/// [`QUOTE_CHARS`] characters and its length.
fn quote(v: &Value) -> String {
    short(&v.to_string())
}

/// `text`, or its first [`QUOTE_CHARS`] characters and its length, with
/// control characters escaped.
fn short(text: &str) -> String {
    let mut cut: String = text.chars().take(QUOTE_CHARS).collect();
    if cut.len() < text.len() {
        cut = format!(
            "{}… ({} bytes)",
            cut,
            crate::units::format_count(text.len() as u64)
        );
    }
    crate::units::escape_line(&cut).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_file_and_the_field() {
        let e = parse(r#"{"model_type": "llama", "hidden_size": 64}"#, "c.json");
        assert_eq!(
            e.map_err(|e| e.to_string()).err().as_deref(),
            Some("c.json: missing field `num_attention_heads` (model_type \"llama\")")
        );
        let e = parse(r#"{"model_type": "t5"}"#, "t5/config.json").map_err(|e| e.to_string());
        assert!(e
            .err()
            .is_some_and(|m| m.starts_with("t5/config.json: model_type \"t5\"")));
        let e = parse("{\"model_type\": \n \"llama\",,}", "x.json");
        assert!(
            matches!(e, Err(HfConfigError::Json { line: 2, .. })),
            "{e:?}"
        );
        let e = parse(
            r#"{"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 3}"#,
            "q.json",
        );
        assert!(matches!(
            e,
            Err(HfConfigError::Bad {
                field: "num_key_value_heads",
                ..
            })
        ));
        let e = parse(
            r#"{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": -1}"#,
            "n.json",
        );
        assert!(matches!(
            e,
            Err(HfConfigError::Bad {
                field: "intermediate_size",
                ..
            })
        ));
    }

    #[test]
    fn a_long_value_is_quoted_by_its_first_characters() {
        let long = "x".repeat(3 << 20);
        let text = format!(
            r#"{{"model_type": "llama", "hidden_size": "{long}", "num_attention_heads": 4}}"#
        );
        let e = parse(&text, "c.json").map_err(|e| e.to_string());
        let e = e.err().unwrap_or_default();
        assert!(
            e.contains("c.json: field `hidden_size`: expected a positive integer, got \"xxx"),
            "{}",
            &e[..e.len().min(300)]
        );
        assert!(
            e.contains("… (3,145,730 bytes)"),
            "{}",
            &e[..e.len().min(300)]
        );
        assert!(e.len() < 200, "{} bytes", e.len());
        let text = format!(r#"{{"model_type": "{long}"}}"#);
        let e = parse(&text, "t.json").map_err(|e| e.to_string());
        let e = e.err().unwrap_or_default();
        assert!(
            e.contains("… (3,145,728 bytes)\" is not supported"),
            "{}",
            &e[..e.len().min(300)]
        );
        // The quote and the list of the eleven supported model types.
        assert!(e.len() < 260, "{} bytes", e.len());
    }

    #[test]
    fn more_layers_than_modelled_are_refused_by_field() {
        let llama = r#"{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
            "intermediate_size": 128, "vocab_size": 100, "num_hidden_layers": 65536}"#;
        let e = parse(llama, "l.json").map_err(|e| e.to_string());
        assert_eq!(
            e.err().as_deref(),
            Some("l.json: field `num_hidden_layers`: 65536 layers is more than 1024, the most modelled")
        );
        let gpt2 = r#"{"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_positions": 16,
            "vocab_size": 100, "n_layer": 2097152}"#;
        let e = parse(gpt2, "g.json").map_err(|e| e.to_string());
        assert!(e
            .err()
            .is_some_and(|m| m.contains("field `n_layer`: 2097152 layers")),);
        let fine = llama.replace("65536", "1024");
        assert!(parse(&fine, "l.json").is_ok());
    }
}
