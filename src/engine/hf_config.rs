//! A Hugging Face `config.json` as a model (models.md §0.3 shapes):
//! `model_type` llama, mistral and qwen2 become the language's causal LM
//! (`DecoderLm::to_lang`); gpt2 becomes nanoGPT's GPT (the same parameters;
//! HF's `gelu_new` composite is not modelled). A missing or malformed field
//! is an error naming the file and the field.

use std::path::Path;

use serde_json::{Map, Value};

use super::presets::ModelConfig;
use super::presets_hf::DecoderLm;

/// Longest training sequence a config's `max_position_embeddings` is cut to.
pub const DEFAULT_SEQ: u64 = 2048;
/// Larger than any config.json: a wrong path is not read forever.
const MAX_CONFIG_BYTES: u64 = 4 << 20;

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
    #[error("{file}: model_type \"{model_type}\" is not supported (supported: llama, mistral, qwen2, gpt2)")]
    Unsupported { file: String, model_type: String },
}

/// Read `path` and build its model.
pub fn read(path: &Path) -> Result<ModelConfig, HfConfigError> {
    let file = path.display().to_string();
    let io = |reason: String| HfConfigError::Io {
        file: file.clone(),
        reason,
    };
    let bytes = crate::files::read_bounded(path, MAX_CONFIG_BYTES).map_err(|e| match e {
        crate::files::BoundedReadError::Io(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            io("not a config.json file".into())
        }
        crate::files::BoundedReadError::Io(e) => io(e.to_string()),
        crate::files::BoundedReadError::TooLong => io("not a config.json file".into()),
    })?;
    let text = String::from_utf8(bytes).map_err(|e| {
        io(format!(
            "not UTF-8 text at byte {}",
            e.utf8_error().valid_up_to()
        ))
    })?;
    parse(&text, &file)
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
                _ => Err(self.bad(field, format!("expected a positive integer, got {v}"))),
            },
        }
    }

    fn count(&self, field: &'static str) -> Result<u64, HfConfigError> {
        self.opt_count(field)?.ok_or_else(|| self.missing(field))
    }

    fn flag(&self, field: &'static str, default: bool) -> Result<bool, HfConfigError> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.bad(field, format!("expected true or false, got {v}"))),
        }
    }

    /// A number the model reads but memory does not depend on.
    fn number(&self, field: &'static str) -> Result<(), HfConfigError> {
        match self.map.get(field) {
            None | Some(Value::Null) | Some(Value::Number(_)) => Ok(()),
            Some(v) => Err(self.bad(field, format!("expected a number, got {v}"))),
        }
    }
}

/// Parse a config.json's text (`file` names it in errors).
pub fn parse(text: &str, file: &str) -> Result<ModelConfig, HfConfigError> {
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
                message: format!("expected a string, got {v}"),
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
        model_type,
    };
    match model_type {
        "llama" | "mistral" | "qwen2" => decoder(&f).map(|lm| ModelConfig::causal_lm(&lm)),
        "gpt2" => gpt2(&f),
        other => Err(HfConfigError::Unsupported {
            file: file.into(),
            model_type: other.into(),
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
        layers: f.count("num_hidden_layers")?,
        heads,
        kv_heads,
        head_dim,
        vocab: f.count("vocab_size")?,
        tied: f.flag("tie_word_embeddings", false)?,
        qkv_bias,
        seq,
        lora: None,
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
        f.count("n_layer")?,
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
}
